"""docs/versions.md is the record of every pin: its table agrees with the settings' defaults and
guards, each pin lies in its upstream's tested Kubernetes range, and the reference article's set
renders."""

import re
import shlex
from pathlib import Path

import pytest

from core import settings
from stacks.offline import reveal
from tests import tokens
from tests.conftest import by_type, run_program, step_args

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "versions.md").read_text()
COLUMNS = ("component", "setting", "pin", "article", "newest", "tested", "fixes", "why")
# The settings of what the program installs on the cluster; the node software (kubelet, Flannel,
# the container toolkit) is pinned by the kubeadm config and apt, not by an upstream's test matrix.
PLATFORM = {
    "slinkyVersion",
    "slurmImageTag",
    "kedaVersion",
    "trainingOperatorVersion",
    "kueueVersion",
    "certManagerVersion",
    "devicePluginVersion",
    "dcgmExporterVersion",
    "kubePrometheusStackVersion",
}
BY_KEY = {s.key: s for s in settings.SETTINGS}


def rows(page: str = PAGE) -> dict[str, dict[str, str]]:
    found = {}
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == len(COLUMNS) and cells[1].startswith("`"):
            row = dict(zip(COLUMNS, cells, strict=True))
            found[row["setting"].strip("`")] = row
    return found


def minor(version: str) -> tuple[int, int]:
    major, minor_, *_ = version.lstrip("v").split(".")
    return int(major), int(minor_)


def in_tested_range(kubernetes: str, tested: str) -> bool:
    """`A-B`: minors A to B; `A+`: A or later."""
    m = re.fullmatch(r"(\d+\.\d+)(?:-(\d+\.\d+)|\+)", tested)
    if not m:
        raise ValueError(f"tested range {tested!r}: expected A-B or A+")
    low, high = minor(m[1]), minor(m[2]) if m[2] else (99, 99)
    return low <= minor(kubernetes) <= high


def article_config(page: str = PAGE) -> dict[str, str]:
    (line,) = [
        line for line in page.splitlines() if line.startswith("venv/bin/python -m cli render --out /tmp/article")
    ]
    words = shlex.split(line)
    return dict(words[i + 1].split("=", 1) for i, word in enumerate(words) if word == "--config")


def test_one_row_per_platform_component_and_each_names_a_setting():
    assert set(rows()) == PLATFORM


def test_each_pin_is_its_settings_default_and_the_articles_value_is_accepted():
    for key, row in rows().items():
        s = BY_KEY[key]
        assert row["pin"] == s.default, key
        assert s.rule is not None and s.rule(row["article"]) is None, key


def test_each_pin_lies_in_its_upstreams_tested_kubernetes_range():
    kubernetes = BY_KEY["kubernetesVersion"].default
    for key, row in rows().items():
        assert in_tested_range(kubernetes, row["tested"]), f"{key}: Kubernetes {kubernetes} outside {row['tested']}"


def test_the_range_check_refuses_a_pin_outside_it():
    # KEDA 2.16.1 was smoke-tested on 1.28-1.30: its row would fail the check above
    assert not in_tested_range("1.34.7", "1.28-1.30")
    assert in_tested_range("1.34.7", "1.34-1.34") and in_tested_range("1.34.7", "1.29+")
    assert not in_tested_range("1.34.7", "1.35+")
    with pytest.raises(ValueError, match="tested range"):
        in_tested_range("1.34.7", "1.34 to 1.36")


def test_a_table_that_disagrees_with_the_settings_is_caught():
    row = rows()["kedaVersion"]
    line = "| " + " | ".join(row[c] for c in COLUMNS) + " |"
    stale = rows(line.replace("| 2.20.2 |", "| 2.16.1 |", 1))["kedaVersion"]
    assert stale["pin"] != BY_KEY["kedaVersion"].default


def test_the_articles_set_is_the_article_column_and_renders():
    config = article_config()
    assert config == {key: row["article"] for key, row in rows().items()}
    rec = run_program(**config)
    releases = {r.inputs["name"]: r.inputs["version"] for r in by_type(rec, tokens.RELEASE)}
    assert {releases[n] for n in ("slurm-operator-crds", "slurm-operator", "slurm")} == {config["slinkyVersion"]}
    assert releases["keda"] == config["kedaVersion"] and releases["kueue"] == config["kueueVersion"]
    assert releases["cert-manager"] == config["certManagerVersion"]
    assert releases["nvidia-device-plugin"] == config["devicePluginVersion"]
    assert releases["dcgm-exporter"] == config["dcgmExporterVersion"]
    assert releases["monitoring"] == config["kubePrometheusStackVersion"]
    overlay = step_args(rec, "testbed-training-operator-install")["OVERLAY"]
    assert overlay.endswith(f"?ref={config['trainingOperatorVersion']}")
    slurm = reveal(rec.named("testbed-slinky-cluster").inputs["values"])
    assert slurm["controller"]["slurmctld"]["image"]["tag"] == config["slurmImageTag"]

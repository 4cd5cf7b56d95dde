"""One names contract: a renamed NodeSet and a smaller cluster reach every artifact, the printed
commands and the runner alike, and the contract itself loads without Pulumi."""

import ast
import json
import re
import subprocess
import sys

import pytest

from cli import artifacts
from cli.validate import main as validate
from core.names import SLINKY_OPERATOR_NAMESPACE, Names
from stacks import offline
from stacks.offline import ROOT
from tests.conftest import config, run_program, step_args

SETTINGS = {"nodesetName": "gpu", "workerCount": 2}
DEFAULT_NODESET = "slurm-worker-slinky"


@pytest.fixture(scope="module")
def renamed(tmp_path_factory):
    rec = run_program(**SETTINGS)
    out = tmp_path_factory.mktemp("render")
    artifacts.render(rec, out)
    return rec, out


def test_no_artifact_names_the_default_nodeset_or_four_gpus(renamed):
    rec, out = renamed
    texts = {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*") if p.is_file()}
    assert texts
    for path, text in texts.items():
        assert DEFAULT_NODESET not in text, path
        # `slinky` survives only as the chart's own (disabled) NodeSet entry and the operator namespace
        assert "partition=slinky" not in text and "slinky-0" not in text, path
    plan = artifacts.plan_text(rec)
    assert DEFAULT_NODESET not in plan
    assert DEFAULT_NODESET not in json.dumps(offline.reveal(rec.outputs))

    scaled_object = texts["manifests/ScaledObject-slurm-slurmd.yaml"]
    assert "name: slurm-worker-gpu" in scaled_object and "maxReplicaCount: 2" in scaled_object  # both GPUs
    (dashboard,) = [t for p, t in texts.items() if p.startswith("manifests/ConfigMap-monitoring-dashboard")]
    assert "slurm-worker-gpu-.*" in dashboard and "NodeSet slurm-worker-gpu" in dashboard
    values = texts["values/slurm.yaml"]
    assert "gpu:\n" in values and "slinky:\n    enabled: false" in values


def test_the_readiness_gate_waits_for_exactly_the_configured_nodes(renamed):
    rec, _ = renamed

    assert len(step_args(rec, "testbed-readiness-wait")["NODES"].splitlines()) == 1 + SETTINGS["workerCount"]


def test_the_runner_dry_run_agrees_with_the_artifacts(capsys):
    argv = ["--scenario", "mixed", "--dry-run", *(f"--config={k}={v}" for k, v in SETTINGS.items())]
    # with two workers HPC's default share is one GPU, too few for `mixed` (a 2-node MPI job)
    assert validate([*argv, "--config=hpcBorrowsAiGpus=true"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("stack dev: NodeSet slurm/slurm-worker-gpu, 2 GPUs, cooldown 300 s")
    assert "the testbed has 2 GPUs" in out and "NodeSet slurm/slurm-worker-gpu replicas" in out
    assert DEFAULT_NODESET not in out and "4 GPUs" not in out


def test_the_runner_refuses_bad_settings_like_plan(capsys):
    assert validate(["--scenario", "mixed", "--dry-run", "--config", "workerCount=0", "--config", "bogus=1"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(line.startswith("validate: ") for line in lines)
    assert any("workerCount" in line for line in lines) and any("bogus" in line for line in lines)


def test_the_runner_refuses_names_a_deployed_stack_contradicts(monkeypatch, capsys):
    from cli import validate as cli

    deployed = {
        "workerPrivateIps": ["10.0.0.20"] * 4,
        "sbatchCommand": "... exec -i slurm-controller-0 -c slurmctld ...",
    }
    monkeypatch.setattr(cli, "read_stack_outputs", lambda stack: deployed)
    assert validate(["--scenario", "mixed", "--dry-run", "--config", "workerCount=2"]) == 2
    assert "the deployed stack has 4 GPU workers but the settings give 2" in capsys.readouterr().err
    assert validate(["--scenario", "mixed", "--dry-run"]) == 0
    assert "cross-checked with its deployed outputs" in capsys.readouterr().out


def test_names_follow_the_settings():
    from core import settings

    n = Names.from_settings(settings.load(config(**SETTINGS, kedaCooldownSeconds=120), offline=True))
    assert (n.slurm.nodeset_resource, n.slurm.slurmd_pod_prefix) == ("slurm-worker-gpu", "slurm-worker-gpu-")
    assert (n.gpus_total, n.slurmd_max_replicas, n.cooldown_seconds) == (2, 2, 120)  # slurmd may borrow AI's half
    assert n.slurm.partitions == ("all", "gpu")
    assert (n.slurm.controller_service, n.slurm.restapi_service) == ("slurm-controller", "slurm-restapi")
    assert n.keda_hpa == "keda-hpa-slurmd" and SLINKY_OPERATOR_NAMESPACE == "slinky"


def test_the_contract_loads_without_pulumi():
    probe = "import sys, core.names; print(sorted(m for m in sys.modules if m.startswith('pulumi')))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


PRODUCT = ("components", "stacks", "core", "cli", "twin", "validation", "tools")


def _name_constants() -> dict[str, list[str]]:
    """Module-level string constants that look like names (a label, a resource, a type token:
    they hold '.', '/' or ':'), by value: where each is defined."""
    where: dict[str, list[str]] = {}
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.parse(path.read_text()).body:
                if (
                    isinstance(node, ast.Assign)
                    and all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets)
                    and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str)
                    and re.fullmatch(r"[\w.-]+[./:][\w./:-]+", node.value.value)
                ):
                    where.setdefault(node.value.value, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return where


def test_each_name_is_defined_by_one_module():
    twice = {v: places for v, places in _name_constants().items() if len({p.split(":")[0] for p in places}) > 1}
    assert not twice, f"defined in several modules (keep one, in core/names.py): {twice}"

"""`python -m cli plan|render` as a user runs them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cli import __main__ as cli
from cli import artifacts
from components import helm, kueue
from core import trusted_yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def unwrapped_plan(monkeypatch):
    """These tests read the plan's lines whole; its wrapping to the terminal is test_plan's."""
    monkeypatch.setenv("COLUMNS", "1000")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_plan_json_shape_and_secrets_redacted(capsys):
    assert cli.main(["plan", "--json"]) == 0
    elements = json.loads(capsys.readouterr().out)
    options = {"deletedWith", "ignoreChanges", "replaceOnChanges", "replaceWith", "replacementTrigger"}
    options |= {"deleteBeforeReplace", "protect", "retainOnDelete"}
    assert all({"urn", "type", "name", "parent", "dependsOn", "inputs"} <= set(e) for e in elements)
    assert all(set(e) - {"urn", "type", "name", "parent", "dependsOn", "inputs"} <= options for e in elements)
    by_name = {e["name"]: e for e in elements}
    control = by_name["testbed-control-instance"]
    assert control["deleteBeforeReplace"] is True and "ami" in control["ignoreChanges"]
    assert by_name["testbed-keda-release"]["deletedWith"] == control["urn"]
    assert by_name["testbed-evidence-workspace"]["retainOnDelete"] is True  # managedPrometheusKeep
    assert by_name["testbed-readiness-wait"]["replaceOnChanges"] == ["triggers[*]"]
    assert not [e["name"] for e in elements if "protect" in e]  # nothing protected: destroy always finishes
    instances = [e for e in elements if e["type"] == "aws:ec2/instance:Instance"]
    assert sorted(i["inputs"]["instanceType"] for i in instances) == ["g4dn.xlarge"] * 4 + ["t3.medium"]
    assert all(i["inputs"]["userData"] == "[secret]" for i in instances)
    urns = {e["urn"] for e in elements}
    assert all(set(e["dependsOn"]) <= urns for e in elements)
    assert "BEGIN RSA PRIVATE KEY" not in json.dumps(elements) and "BEGIN PRIVATE KEY" not in json.dumps(elements)


def test_plan_config_override_changes_the_worker_count(capsys):
    assert cli.main(["plan", "--json", "--config", "gpu-testbed:workerCount=2"]) == 0
    elements = json.loads(capsys.readouterr().out)
    assert sum(e["inputs"].get("instanceType") == "g4dn.xlarge" for e in elements) == 2


def test_plan_text_groups_by_component_and_prices_the_hour(capsys):
    assert cli.main(["plan"]) == 0
    out = capsys.readouterr().out
    assert "testbed-control (testbed:aws:ControlNode)" in out and "aws:ec2/instance:Instance  t3.medium" in out
    assert "estimated cost: $" in out and "/hour" in out


def test_render_writes_user_data_and_scripts(tmp_path):
    assert cli.main(["render", "--out", str(tmp_path)]) == 0
    cloud_init = sorted(p.name for p in (tmp_path / "cloud-init").iterdir())
    assert cloud_init == ["testbed-control.yaml"] + [f"testbed-worker-{i}.yaml" for i in range(4)]
    scripts = {p.name for p in (tmp_path / "scripts").iterdir()}
    assert {
        "node-common.sh",
        "control-plane.sh",
        "gpu-worker.sh",
        "testbed-lib.sh",
        "wait-cluster-ready.sh",
        "wait-webhook.sh",
        "training-operator.sh",
    } <= scripts
    assert yaml.safe_load((tmp_path / "cloud-init" / "testbed-control.yaml").read_text())["runcmd"]


def test_two_renders_are_byte_identical(tmp_path, monkeypatch):
    # Two processes with different hash seeds: nothing may depend on dict or set order. One is a
    # fresh process under a fixed seed; the other is this one (its recording made by a pytest
    # process too), under its own seed: random, or, where PYTHONHASHSEED fixes it, another one.
    # And two YAML paths: the fresh process reads and writes trusted YAML with libyaml where it can
    # (core/trusted_yaml.py), this one with the pure-Python classes, its program run afresh (the
    # shared recordings are kept by YAML classes, tests/conftest.py) and the values files parsed
    # again: libyaml's text must be the pure classes', byte for byte.
    monkeypatch.setattr(trusted_yaml, "Loader", yaml.SafeLoader)
    monkeypatch.setattr(trusted_yaml, "Dumper", yaml.SafeDumper)
    for cached in (helm._values_file, kueue._manager_config, kueue._values):
        cached.cache_clear()
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    result = subprocess.run(
        [sys.executable, "-m", "cli", "render", "--out", str(tmp_path / "a")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "PYTHONHASHSEED": seed},
    )
    assert result.returncode == 0, result.stderr
    assert cli.main(["render", "--out", str(tmp_path / "b")]) == 0
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert files_a == files_b
    for rel in files_a:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel


def test_bad_settings_exit_2_with_one_line_each_and_nothing_rendered(tmp_path):
    result = run_cli(
        "render", "--out", str(tmp_path / "r"), "--config", "workerCount=zero", "--config", "adminCidr=0.0.0.0/0"
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["workerCount", "adminCidr"]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "r").exists()


def test_plan_lists_the_cluster_install_order(capsys):
    assert cli.main(["plan"]) == 0
    lines = capsys.readouterr().out.splitlines()
    order = [line for line in lines if " <- " in line]

    def position(fragment: str) -> int:
        (index,) = [i for i, line in enumerate(order) if fragment in line.split("<-")[0]]
        return index

    # over SSH before anything else: the CA key kubeadm init waits for, each worker's join token
    # and the step that waits for the worker to have joined
    workers = [f"testbed-worker-{i}-{step}" for i in range(4) for step in ("join-token", "joined")]
    first = ["testbed-ca-key", *workers]
    assert sorted(position(step) for step in first) == list(range(9))
    assert position("testbed-readiness-wait") == 9
    assert position("helm cert-manager") < position("cert-manager-webhook-gate") < position("helm slurm-operator 1")
    assert position("helm slurm-operator 1") < position("operator-webhook-gate") < position("helm slurm 1")
    assert position("PersistentVolume") < position("helm slurm 1") < position("ScaledObject")
    assert position("helm monitoring") < position("helm slurm 1")


def test_render_onto_a_file_or_a_foreign_directory_is_refused_in_one_line(tmp_path, capsys):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    foreign = tmp_path / "project"
    (foreign / "src").mkdir(parents=True)
    for out, fragment in ((target, "is a file"), (foreign, "holds no previous render")):
        assert cli.main(["render", "--out", str(out), "--config", "workerCount=x"]) == 2
        lines = capsys.readouterr().err.splitlines()
        assert lines[0].startswith("--out: ") and fragment in lines[0], lines
        assert lines[1].startswith("workerCount: "), lines  # reported together with the settings
    assert target.read_text() == "mine" and sorted(p.name for p in foreign.iterdir()) == ["src"]


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("n" * 300, "has a name of 300 bytes; expected names of at most 241 bytes"),
        ("n" * 242, "has a name of 242 bytes"),  # fits alone, not with render's temporary names beside it
        ("file/sub", "which is a file; expected a directory path"),
        ("/".join(["d" * 200] * 25), "is a path of 4082 bytes or more; expected a shorter one"),
    ],
    ids=["300", "242", "under-a-file", "5000-path"],
)
def test_render_out_that_the_file_system_cannot_hold_is_one_line_before_the_run(
    name, fragment, tmp_path, capsys, monkeypatch
):
    def no_render(*args, **kwargs):
        raise AssertionError("the render started")

    monkeypatch.setattr(artifacts, "render_replacing", no_render)
    (tmp_path / "file").write_text("mine")
    assert cli.main(["render", "--out", str(tmp_path / name)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith('--out: "') and fragment in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_render_out_with_the_longest_name_is_written_and_replaced(tmp_path, capsys):
    out = tmp_path / ("n" * 241)
    for _ in range(2):  # the second replaces the first through ".<name>.old.XXXXXXXX"
        assert cli.main(["render", "--out", str(out)]) == 0
    assert (out / "cloud-init").is_dir() and sorted(p.name for p in tmp_path.iterdir()) == [out.name]


def test_render_replaces_a_previous_render_whole(tmp_path, capsys):
    out = tmp_path / "render"
    assert cli.main(["render", "--out", str(out)]) == 0
    assert (out / artifacts.RENDER_MARK).is_file() and (out / "cloud-init" / "testbed-worker-3.yaml").is_file()
    (out / "scripts" / "stale.sh").write_text("left from an older render\n")
    assert cli.main(["render", "--out", str(out), "--config", "workerCount=2"]) == 0
    cloud_init = sorted(p.name for p in (out / "cloud-init").iterdir())
    assert cloud_init == ["testbed-control.yaml", "testbed-worker-0.yaml", "testbed-worker-1.yaml"]
    assert not (out / "scripts" / "stale.sh").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["render"]  # no temporary directory left
    assert out.stat().st_mode & 0o077 == 0  # user-data holds join tokens
    capsys.readouterr()


@pytest.mark.parametrize(
    "args, fragment",
    [
        ([], "arguments are required: command"),
        (["plann"], "invalid choice: 'plann'"),
        (["plan", "--bogus", "\x1b[2J"], "unrecognized arguments: --bogus \\x1b[2J"),
        (["render"], "arguments are required: --out"),
        (["plan", "--stack"], "expected one argument"),
        # a secret typed where an argument goes is not echoed
        (["plan", "ghp_aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6"], "arguments: (hidden: looks like a GitHub token)"),
        (["wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"], "(hidden: looks like a secret key or token)"),
    ],
)
def test_a_usage_mistake_exits_2_with_one_escaped_line(args, fragment, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(args)
    assert stopped.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert fragment in line and "--help" in line
    assert "aB3dE6gH9jK2" not in line and "K7MDENG" not in line


@pytest.mark.parametrize("zone", ["us-east-1e", "us-east-1f"])
def test_the_offline_plan_states_no_zone_offering_it_cannot_know(zone, capsys):
    """Which zones offer a type is AWS's fact: offline, a zone the settings accept is planned,
    and the plan says preflight checks the offering (the mock once offered a-d and refused e)."""
    assert cli.main(["plan", "--config", f"availabilityZone={zone}"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"stack dev: region us-east-1, zone {zone} (configured; whether it offers g4dn.xlarge and t3.medium is "
        "not known offline: `python -m cli preflight` checks it)\n"
    )
    assert "does not offer" not in out


def test_output_cut_short_by_a_closed_pipe_ends_with_1_and_no_traceback(monkeypatch, capsys):
    """`python -m cli plan --json | head -1`: the reader goes away mid-output."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with os.fdopen(write_end, "w") as closed_pipe:
        monkeypatch.setattr(sys, "stdout", closed_pipe)
        monkeypatch.setattr(cli, "main", lambda argv: print("{}\n" * 100_000) or 0)
        assert cli.run_as_command() == 1
        # the quiet end points stdout at /dev/null, so the interpreter's last flush succeeds
        print("x" * 100_000, flush=True)
    assert capsys.readouterr().err == ""


def test_render_names_its_out_escaped(tmp_path, capsys):
    """A directory name may hold a terminal escape; the line that names it shows it escaped."""
    assert cli.main(["render", "--out", str(tmp_path / "r\x1b[2Jx")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and out.rstrip().endswith("r\\x1b[2Jx")

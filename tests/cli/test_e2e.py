"""`python -m cli e2e` through the real Automation API against a stub `pulumi` on PATH, with
fakes for preflight, doctor and the validation runner: phase order, destroy on every failure
path, the report."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
from pulumi import automation as auto

from cli import e2e
from cli import validate as validation_cli
from stacks import offline

# The stub is a shell script: the Automation API runs it 8 times a test (version, select, up,
# outputs, history, destroy), and a Python stub's start cost the file about 1.5 CPU-s.
STUB = r"""#!/bin/sh
printf '%s\n' "$*" >>"$STUB_PULUMI_LOG"
log='' previous='' words=''
for arg in "$@"; do
  [ "$previous" != --event-log ] || log=$arg
  previous=$arg
  case $arg in -*) ;; *) words="$words $arg" ;; esac
done
# the engine events the Automation API tails from --event-log (given with on_event), then the end
event() {  # KEY OP TYPE NAME
  [ -z "$log" ] || printf '{"%s": {"metadata": {"op": "%s", "urn": "urn:pulumi:dev::gpu-testbed::%s::%s", "type": "%s"}}}\n' \
    "$1" "$2" "$3" "$4" "$3" >>"$log"
}
end_events() { [ -z "$log" ] || printf '{"cancelEvent": {}}\n' >>"$log"; }
case $words in
  " version"*) echo v3.200.0 ;;
  " stack select"*) ;;
  " up"*)
    echo " +  aws:ec2:Vpc testbed-network-vpc creating (0s)"
    echo " +  aws:ec2:Vpc testbed-network-vpc created (1s)"
    echo " +  command:remote:Command testbed-readiness-wait created (600s)"
    echo " +  kubernetes:helm.sh/v3:Release testbed-keda-release created (40s)"
    event resOutputsEvent create pulumi:pulumi:Stack gpu-testbed-dev
    event resOutputsEvent create pulumi:providers:aws default
    event resOutputsEvent create aws:ec2/vpc:Vpc testbed-network-vpc
    event resOutputsEvent create command:remote:Command testbed-readiness-wait
    event resOpFailedEvent create kubernetes:helm.sh/v3:Release testbed-keda-release
    end_events
    exit "${STUB_UP_RC:-0}" ;;
  " destroy"*)
    echo " -  aws:ec2:Vpc testbed-network-vpc deleted (1s)"
    event resOutputsEvent delete aws:ec2/vpc:Vpc testbed-network-vpc
    end_events
    exit "${STUB_DESTROY_RC:-0}" ;;
  " stack output"*) echo "{}" ;;
  " stack history"*)
    echo '[{"kind": "update", "startTime": "2026-12-01T10:00:00.000Z", "message": "", "environment": {}, "config": {},'\
' "result": "succeeded", "endTime": "2026-12-01T10:30:00.000Z", "resourceChanges": {"create": 56}}]' ;;
esac
"""


@pytest.fixture
def stub_pulumi(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pulumi").write_text(STUB)
    (bin_dir / "pulumi").chmod(0o755)
    log = tmp_path / "pulumi-calls"
    log.touch()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STUB_PULUMI_LOG", str(log))
    monkeypatch.setenv("PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK", "true")
    return log


class Fakes:
    def __init__(self, doctor_rc=0, failing_scenario=None, interrupt_in=None):
        self.calls: list[str] = []
        self.doctor_rc, self.failing, self.interrupt_in = doctor_rc, failing_scenario, interrupt_in
        self.preflight_rc = 0

    def tools(self) -> e2e.Tools:
        def preflight(argv):
            self.calls.append("preflight")
            return self.preflight_rc

        def doctor(argv):
            self.calls.append("doctor")
            if self.interrupt_in == "doctor":
                raise KeyboardInterrupt
            return self.doctor_rc

        def validate(argv):
            scenario, out = argv[argv.index("--scenario") + 1], Path(argv[argv.index("--out") + 1])
            self.calls.append(f"validate {scenario}")
            out.mkdir(parents=True)
            (out / "timeline.json").write_text("{}")
            (out / "summary.txt").write_text(f"{scenario}: first slurmd Ready after 95 s\n")
            return 1 if scenario == self.failing else 0

        return e2e.Tools(
            preflight=preflight,
            doctor=doctor,
            validate=validate,
            scenarios=["hpc-parallel", "mixed"],
            select_stack=lambda name: auto.select_stack(stack_name=name, work_dir=str(offline.ROOT)),
            planned_resources=lambda stack: 3,
        )


def pulumi_verbs(log: Path) -> list[str]:
    verbs = []
    for line in log.read_text().splitlines():
        words = [w for w in line.split() if not w.startswith("-")]
        if words and words[0] in ("up", "destroy"):
            verbs.append(words[0])
    return verbs


def phases(out: Path) -> list[tuple[str, str]]:
    return [(p["name"], p["status"]) for p in json.loads((out / "report.json").read_text())["phases"]]


def test_a_passing_run_in_order_with_its_report(tmp_path, stub_pulumi):
    fakes = Fakes()
    out = tmp_path / "report"
    assert e2e.Run("dev", False, out, fakes.tools()).execute() == 0
    assert fakes.calls == ["preflight", "doctor", "validate hpc-parallel", "validate mixed"]
    assert pulumi_verbs(stub_pulumi) == ["up", "destroy"]
    assert phases(out) == [
        ("preflight", "passed"),
        ("select stack", "passed"),
        ("pulumi up", "passed"),
        ("doctor", "passed"),
        ("validate hpc-parallel", "passed"),
        ("validate mixed", "passed"),
        ("pulumi destroy", "passed"),
    ]
    report = json.loads((out / "report.json").read_text())
    assert report["phases"][2]["detail"] == "create 56"
    assert set(report["up_by_provider"]) == {"aws", "command", "kubernetes"}
    assert report["up_by_provider"]["aws"]["count"] == 1  # "creating" lines are not completions
    assert report["artifacts"]["mixed"] == ["validate-mixed/summary.txt", "validate-mixed/timeline.json"]
    text = (out / "report.txt").read_text()
    assert "mixed: first slurmd Ready after 95 s" in text and "pulumi destroy" in text
    assert "testbed-network-vpc created" in (out / "pulumi.log").read_text()


def test_a_scenario_the_stack_cannot_run_is_skipped_with_the_reason_and_the_rest_run(
    tmp_path, stub_pulumi, monkeypatch
):
    fakes = Fakes()
    tools = fakes.tools()
    tools.scenarios = ["leak-probe", "mixed"]
    tools.scenario_blocker = validation_cli.scenario_blocker  # the real one, on a stack dev that keeps slurmd
    stacks = tmp_path / "stacks"  # to HPC's half
    stacks.mkdir()
    dev = (offline.ROOT / "Pulumi.dev.yaml").read_text() + "  gpu-testbed:hpcBorrowsAiGpus: false\n"
    (stacks / "Pulumi.dev.yaml").write_text(dev)
    monkeypatch.setattr(offline, "STACKS_DIR", stacks)
    out = tmp_path / "report"
    assert e2e.Run("dev", False, out, tools).execute() == 0
    assert fakes.calls == ["preflight", "doctor", "validate mixed"]
    (skipped,) = [
        p for p in json.loads((out / "report.json").read_text())["phases"] if p["name"] == "validate leak-probe"
    ]
    assert skipped["status"] == "skipped" and "lets slurmd hold 2 (HPC's share)" in skipped["detail"]
    assert pulumi_verbs(stub_pulumi) == ["up", "destroy"]


@pytest.mark.parametrize(
    ("fakes", "env", "last_before_destroy"),
    [
        (Fakes(), {"STUB_UP_RC": "1"}, ("validate mixed", "skipped")),
        (Fakes(doctor_rc=1), {}, ("validate mixed", "skipped")),
        (Fakes(failing_scenario="hpc-parallel"), {}, ("validate mixed", "passed")),
    ],
    ids=["up-fails", "doctor-fails", "a-scenario-fails"],
)
def test_destroy_runs_after_every_failure(tmp_path, stub_pulumi, monkeypatch, fakes, env, last_before_destroy):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "report"
    assert e2e.Run("dev", False, out, fakes.tools()).execute() == 1
    assert pulumi_verbs(stub_pulumi) == ["up", "destroy"]
    assert phases(out)[-2:] == [last_before_destroy, ("pulumi destroy", "passed")]


def test_ctrl_c_still_destroys_and_says_so(tmp_path, stub_pulumi):
    out = tmp_path / "report"
    assert e2e.Run("dev", False, out, Fakes(interrupt_in="doctor").tools()).execute() == e2e.EXIT_INTERRUPTED
    assert pulumi_verbs(stub_pulumi) == ["up", "destroy"]
    assert ("doctor", "interrupted") in phases(out) and phases(out)[-1] == ("pulumi destroy", "passed")


def test_keep_leaves_the_stack_and_a_failed_destroy_fails_the_run(tmp_path, stub_pulumi, monkeypatch):
    out = tmp_path / "kept"
    assert e2e.Run("dev", True, out, Fakes(doctor_rc=1).tools()).execute() == 1
    assert pulumi_verbs(stub_pulumi) == ["up"]
    assert phases(out)[-1] == ("pulumi destroy", "skipped")
    monkeypatch.setenv("STUB_DESTROY_RC", "255")
    out = tmp_path / "stuck"
    assert e2e.Run("dev", False, out, Fakes().tools()).execute() == 1
    assert phases(out)[-1] == ("pulumi destroy", "failed")


def test_a_failed_preflight_creates_and_destroys_nothing(tmp_path, stub_pulumi):
    fakes = Fakes()
    fakes.preflight_rc = 2
    out = tmp_path / "report"
    assert e2e.Run("dev", False, out, fakes.tools()).execute() == 2
    assert pulumi_verbs(stub_pulumi) == [] and phases(out) == [("preflight", "failed")]


@pytest.mark.parametrize(
    "name, fragment", [("file", "is a file"), ("file/sub", "which is a file"), ("n" * 300, "300 bytes")]
)
def test_an_out_that_cannot_take_the_report_is_refused_before_anything_runs(name, fragment, tmp_path, capsys):
    (tmp_path / "file").write_text("mine")

    def no_tools():
        raise AssertionError("a tool ran")

    assert e2e.main(["--out", str(tmp_path / name)], tools=no_tools) == 2  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    (line,) = err.splitlines()
    assert out == "" and line.startswith('--out: "') and fragment in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_config_overrides_are_refused_in_one_line_before_anything_runs(tmp_path, capsys):
    """`pulumi up` reads only Pulumi.<stack>.yaml: an override for one run cannot be honoured."""

    def no_tools():
        raise AssertionError("a tool ran")

    argv = ["--stack", "prod", "--config", "workerCount=2", "--out", str(tmp_path / "o")]
    assert e2e.main(argv, tools=no_tools) == 2  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    (line,) = err.splitlines()
    assert out == "" and line.startswith("--config: not accepted by e2e") and "Pulumi.prod.yaml" in line
    assert not (tmp_path / "o").exists()


def test_doctor_and_validate_read_the_deployed_stack_not_kubeconfig(tmp_path, stub_pulumi, monkeypatch):
    """$KUBECONFIG would come before the stack's output in doctor and validate: during e2e it may
    name another cluster, so their phases run without it, and it is back afterwards."""
    monkeypatch.setenv("KUBECONFIG", "/somewhere/else")
    seen = []
    tools = Fakes().tools()

    def record(tool):
        def run(argv):
            seen.append(os.environ.get("KUBECONFIG"))
            return tool(argv)

        return run

    tools = dataclasses.replace(tools, doctor=record(tools.doctor), validate=record(tools.validate))
    assert e2e.Run("dev", False, tmp_path / "report", tools).execute() == 0
    assert seen == [None, None, None]
    assert os.environ["KUBECONFIG"] == "/somewhere/else"


def test_up_and_destroy_show_each_resource_done_with_the_count_and_time(tmp_path, stub_pulumi, capsys):
    """Through the real Automation API, whose on_event tails the engine's event log (the stub
    writes one): a line per resource done, not for the stack or a provider, and a failed step."""
    assert e2e.Run("dev", False, tmp_path / "r", Fakes().tools()).execute() == 0
    shown = [line for line in capsys.readouterr().out.splitlines() if re.match(r"pulumi (up|destroy) \[", line)]
    step = r" +\d+m\d\ds  "
    expected = [
        rf"pulumi up \[1/3\]{step}create aws:ec2/vpc:Vpc testbed-network-vpc",
        rf"pulumi up \[2/3\]{step}create command:remote:Command testbed-readiness-wait",
        rf"pulumi up \[2/3\]{step}FAILED kubernetes:helm.sh/v3:Release testbed-keda-release",
        rf"pulumi destroy \[1/3\]{step}delete aws:ec2/vpc:Vpc testbed-network-vpc",
    ]
    assert len(shown) == len(expected) and all(re.fullmatch(p, line) for p, line in zip(expected, shown, strict=True))


def test_progress_counts_against_the_plan_and_times_from_the_start():
    from pulumi.automation import events

    def done(op, kind, name):
        meta = events.StepEventMetadata(
            op=events.OpType(op), urn=f"urn:pulumi:dev::p::{kind}::{name}", type=kind, provider=""
        )
        return events.EngineEvent(0, 0, res_outputs_event=events.ResOutputsEvent(meta))

    clock, lines = iter([0.0, 65.0, 3725.0]), []
    progress = e2e.ResourceProgress("pulumi up", 12, lambda: next(clock), lines.append)
    progress.on_event(done("same", "aws:ec2/vpc:Vpc", "vpc"))
    progress.on_event(done("create", "pulumi:providers:tls", "default"))  # not counted, no time read
    progress.on_event(done("update", "tls:index/privateKey:PrivateKey", "key"))
    assert lines == [
        "pulumi up [ 1/12]   1m05s  unchanged aws:ec2/vpc:Vpc vpc",
        "pulumi up [ 2/12]  62m05s  update tls:index/privateKey:PrivateKey key",
    ]


def test_the_total_is_the_plans_count_of_resources(default_run, monkeypatch):
    monkeypatch.setattr(e2e.offline, "run", lambda *args, **kwargs: default_run)
    assert e2e.plan_count("dev") == sum(1 for r in default_run.resources if not r.type.startswith("pulumi:providers:"))

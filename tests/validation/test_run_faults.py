"""A run that survives faults, and writes what it saw on every ending."""

from __future__ import annotations

import json

import pytest
from test_runner import DURATIONS, replay
from validation_fakes import FakeClock, FakeCluster, Faults

from cli import validate as cli
from core.settings import show
from tests.conftest import write_kubeconfig
from validation import runner
from validation.timeline import Timeline

OUTPUTS = ("timeline.json", "summary.txt", "timeline.png")
pytestmark = pytest.mark.xdist_group("matplotlib")  # each run draws timeline.png: see test_plot_and_cli


def test_flaky_reads_are_retried_and_the_run_still_passes():
    timeline, checks, _, _ = replay("mixed", Faults(flaky_pod_lists=4))
    assert [n for n, c in checks.items() if not c.passed] == []
    assert timeline.errors and all("503" in e.message for e in timeline.errors)
    assert all(e.during.startswith("sample (try 1 of") for e in timeline.errors)  # the second try worked


def test_a_short_outage_leaves_a_gap_and_the_run_goes_on():
    timeline, checks, _, log = replay("mixed", Faults(api_down=(40.0, 70.0)))
    assert timeline.outcome == "completed"
    gap = [s.t for s in timeline.samples if 35 <= s.t <= 80]
    assert gap and min(gap) < 40 and max(gap) >= 70 and not [t for t in gap if 40 <= t < 70]
    assert 3 <= len(timeline.errors) < runner.ERROR_BUDGET
    assert checks["every job succeeded"].passed and checks["no GPU held twice"].passed
    assert any("sample (try 3 of 3) failed" in line for line in log)


def test_a_long_outage_spends_the_budget_ends_the_run_and_says_cleanup_needs_a_hand():
    timeline, checks, cluster, log = replay("mixed", Faults(api_down=(40.0, 4000.0)))
    assert timeline.outcome == "error"
    assert timeline.ended.startswith("gave up after") and f"{runner.ERROR_BUDGET} cluster errors" in timeline.ended
    assert not checks["run completed"].passed
    cleanup = [e for e in timeline.errors if e.during.startswith("cleanup: ")]
    assert [e.during for e in cleanup] == [
        "cleanup: scancel 100",
        "cleanup: delete PyTorchJob default/pytorchjob-ddp-t1-2",
        "cleanup: delete the process probe",
    ]
    assert any("do it by hand" in line for line in log)
    assert cluster.cancelled == [] and cluster.deleted == []  # the fake's API never came back


def test_a_lost_sbatch_reply_does_not_submit_the_job_twice():
    timeline, checks, cluster, _ = replay("mixed", Faults(lost_sbatch_reply=True))
    assert cluster.sbatch_calls == 1 and len(cluster.twin.slurm.jobs) == 1
    (slurm,) = [s for s in timeline.submissions if s.kind == "slurm"]
    assert slurm.ref == str(cluster.twin.slurm.jobs[0].job_id)
    assert [n for n, c in checks.items() if not c.passed] == []


def test_a_previous_runs_slurmd_is_waited_out_before_anything_is_submitted():
    timeline, checks, _, _ = replay("handoff", Faults(leftover_slurmd_until=200.0))
    assert 200 <= timeline.waited_for_idle <= 270  # then KEDA and the NodeSet take it down (30 s grace)
    assert timeline.submissions[0].t == 0 and not timeline.samples[0].slurmd_pods()
    assert [n for n, c in checks.items() if not c.passed] == []


def test_a_cluster_that_stays_busy_submits_nothing():
    clock = FakeClock()
    cluster = FakeCluster(clock, durations=DURATIONS, faults=Faults(leftover_slurmd_until=10_000.0))
    from validation.scenarios import SCENARIOS, plan

    timeline = runner.run(
        plan(SCENARIOS["handoff"], "t1"),
        cluster,
        clock,
        scenario="handoff",
        gpus_total=4,
        interval=5,
        timeout=100,
        started_at="x",
        idle_timeout=60,
        log=lambda _: None,
    )
    assert timeline.outcome == "not-idle" and not timeline.submissions and cluster.twin.slurm.jobs == []
    assert "still busy after 60 s: slurmd replicas 1, pods 1" in timeline.ended


# ------------------------------------------------------------------ the command line, end to end


@pytest.fixture
def fake_cli(monkeypatch):
    """`python -m cli validate` against the fake cluster on a fake clock."""
    made = {}

    def use(faults: Faults | None = None):
        clock = FakeClock()
        made["cluster"] = FakeCluster(clock, durations=DURATIONS, faults=faults or Faults())
        monkeypatch.setattr("validation.cluster.WallClock", lambda: clock)
        monkeypatch.setattr(cli, "client_for", lambda kubeconfig, names: made["cluster"])
        return made

    return use


def kubeconfig(tmp_path, server: str = "https://198.51.100.7:6443"):
    return write_kubeconfig(tmp_path / "kubeconfig", server)


@pytest.mark.parametrize(
    "faults, code, ended",
    [
        (Faults(), 0, "every job finished after"),
        (Faults(interrupt_at=50), 1, "interrupted (Ctrl-C) after"),
        (Faults(api_down=(40.0, 9000.0)), 1, "gave up after"),
    ],
    ids=["passes", "ctrl-c", "outage"],
)
def test_every_ending_writes_the_results_and_exits_0_or_1(fake_cli, tmp_path, capsys, faults, code, ended):
    fake_cli(faults)
    out = tmp_path / "out"
    argv = ["--scenario", "mixed", "--kubeconfig", str(kubeconfig(tmp_path)), "--out", str(out), "--timeout", "900"]
    assert cli.main(argv) == code
    assert all((out / name).is_file() for name in OUTPUTS)
    summary = (out / "summary.txt").read_text()
    assert summary.splitlines()[1].startswith("ended: ") and ended in summary.splitlines()[1]
    saved = Timeline.load(out / "timeline.json")
    assert saved.ended in summary and saved.samples


def test_an_unreachable_cluster_is_bad_input_in_one_line(fake_cli, tmp_path, capsys):
    fake_cli(Faults(unreachable=True))
    assert cli.main(["--scenario", "mixed", "--kubeconfig", str(kubeconfig(tmp_path)), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == "validate: the cluster does not answer: fake: the API server does not answer\n"


def test_the_real_client_against_a_closed_port_is_bad_input_in_one_line(tmp_path, capsys):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    path = kubeconfig(tmp_path, f"http://127.0.0.1:{port}")
    assert cli.main(["--scenario", "mixed", "--kubeconfig", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"validate: the cluster does not answer: http://127.0.0.1:{port}: read NodeSet slurm/")
    assert err.count("\n") == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "content, says",
    [
        ("clusters: [\n", "is not readable YAML at line 2, column 1"),
        ("apiVersion: v1\nkind: Config\n", "names no clusters"),
        (
            "clusters: [{name: t, cluster: {server: 'https://x'}}]\ncontexts: []\ncurrent-context: nope\n",
            "the kubernetes client refuses it",
        ),
    ],
)
def test_a_bad_kubeconfig_is_bad_input_in_one_line(tmp_path, capsys, content, says):
    path = tmp_path / "kubeconfig"
    path.write_text(content)
    assert cli.main(["--scenario", "mixed", "--kubeconfig", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(("validate: --kubeconfig: ", "validate: kubeconfig: ")) and says in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("content", ["{not json", json.dumps({"scenario": "mixed"}), json.dumps([1, 2])])
def test_a_bad_timeline_is_bad_input_in_one_line(tmp_path, capsys, content):
    path = tmp_path / "timeline.json"
    path.write_text(content)
    assert cli.main(["--scenario", "mixed", "--from-timeline", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    shown = show(str(path))
    assert err.startswith(f"validate: --from-timeline: {shown}")
    assert f"{shown} is not a timeline.json (" in err or ": missing" in err or "expected a JSON object" in err


FIXTURE = __import__("pathlib").Path(__file__).parent / "fixtures" / "handoff-timeline.json"


def _changed(change) -> str:
    data = json.loads(FIXTURE.read_text())
    change(data)
    return json.dumps(data)


def _set(path: str, value):
    """A change that sets one field, by a dotted path with list indexes (samples.3.t)."""

    def change(data):
        *parents, last = path.split(".")
        for key in parents:
            data = data[int(key)] if key.isdigit() else data[key]
        data[int(last) if last.isdigit() else last] = value

    return change


# issue 31: each was read as a run (9 of 9 checks passed, a failed experiment, or a traceback)
BAD_TIMELINES = [
    (_set("scenario", "mixed"), 'recorded under scenario "mixed", not --scenario handoff'),
    (_set("samples.3.t", float("nan")), "samples[3].t: nan: expected a number of seconds"),
    (_set("submissions.0.gpus", 10**9), "submissions[0].gpus: 1000000000: expected at most gpus_total (4)"),
    (_set("gpus_total", 10**9), "recorded with 1000000000 GPUs, but the stack's settings give 4"),
    (_set("interval", 0), "interval: 0: expected seconds between samples above 0"),
    (_set("interval", 3600), "interval 3600 s; expected 1 to 600 s"),
    (_set("started_at", "yesterday"), 'started_at: "yesterday": expected an ISO time'),
    (_set("samples.0.t", "10"), 'samples[0].t: "10": expected a number of seconds'),
    (lambda d: d["samples"].reverse(), "comes before the previous sample's"),
    (_set("waited_for_idle", float("inf")), "timeline.waited_for_idle: inf: expected a number of seconds"),
    (_set("samples.2.gpu_pods", "none"), "samples[2].gpu_pods: expected a list"),
    (_set("samples.1.extra", 1), "samples[1].extra: not a field of Sample"),
]


@pytest.mark.parametrize("change, fragment", BAD_TIMELINES, ids=[str(i) for i in range(len(BAD_TIMELINES))])
def test_a_malformed_timeline_is_refused_before_any_check(change, fragment, tmp_path, capsys):
    path = tmp_path / "timeline.json"
    path.write_text(_changed(change))
    assert cli.main(["--scenario", "handoff", "--from-timeline", str(path), "--out", str(tmp_path / "o")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and not (tmp_path / "o").exists()
    lines = err.splitlines()
    assert all(line.startswith(f"validate: --from-timeline: {show(str(path))}") for line in lines), lines
    assert any(fragment in line for line in lines), lines


def test_a_timeline_with_every_sample_wrong_is_shown_in_21_lines(tmp_path, capsys):
    path = tmp_path / "timeline.json"
    path.write_text(_changed(lambda d: [s.update(t=-1.0) for s in d["samples"]]))
    assert cli.main(["--scenario", "handoff", "--from-timeline", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 21 and lines[-1].endswith(
        f"and {len(json.loads(path.read_text())['samples']) - 20} more problems"
    )


def test_pods_of_a_previous_runs_finished_jobs_do_not_keep_the_cluster_busy():
    from validation_builders import kube_pod, sample

    done = kube_pod("old", "master-0", 0, "GPU-a", phase="Succeeded")
    assert runner.busy(sample(0, pods=[done])) == []
    assert runner.busy(sample(0, pods=[kube_pod("new", "master-0", 0, phase="Pending")])) == [
        "GPU pods default/new-master-0"
    ]

"""`python -m cli simulate` and the twin's building blocks against the
upstream behaviour they cite."""

import io
import json
from pathlib import Path

import pytest
import yaml

from cli.__main__ import main
from stacks import offline
from twin import program
from twin.autoscale import Hpa, Keda, Trigger
from twin.kube import KUBERNETES, SLURMD, Kubernetes, Pod
from twin.promql import TSDB, Evaluator, PromQLError, parse
from twin.scenario import JobSpec
from twin.slurm import PENDING, REQUEUE_DELAY, RUNNING, SlurmConfig, Slurmctld

ROOT = Path(__file__).resolve().parents[2]
RESULT_KEYS = {"jobs", "killed", "double_held", "unfinished", "end", "latency", "slurmd_starts"}


@pytest.mark.xdist_group("matplotlib")  # it draws timeline.png: see tests/validation/test_plot_and_cli.py
def test_simulate_json_contract_and_exit_status(capsys, tmp_path):
    assert (
        main(["simulate", "--scenario", str(ROOT / "scenarios/restapi-down.yaml"), "--json", "--out", str(tmp_path)])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= RESULT_KEYS
    assert set(out["end"]) == {"slurmd_replicas", "gpus_held_by_slurmd"}
    assert set(out["latency"]) == {"scale_up_s", "gpu_return_s"}
    for job in out["jobs"]:
        assert {"name", "kind", "outcome", "submitted", "started", "finished"} <= set(job)
    assert json.loads((tmp_path / "result.json").read_text()) == out
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["simulate", "--scenario", str(ROOT / "scenarios/restapi-down.yaml"), "--policy", "previous"]) == 1
    assert "killed: b" in capsys.readouterr().out


def test_bad_scenario_one_line_per_field_no_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "duration": -5,
                "images": "lukewarm",
                "jobs": [
                    {"name": "a", "kind": "slurm", "submit": 0, "runtime": 10, "nodes": 0},
                    {"name": "b", "kind": "mpi", "submit": 0, "runtime": 10},
                    {"name": "c", "kind": "slurm", "submit": 0, "runtime": 10, "after": "zz"},
                ],
                "faults": [{"kind": "restapi-down", "start": 50, "end": 10}],
            }
        )
    )
    assert main(["simulate", "--scenario", str(bad), "--policy", "nope"]) == 2  # an exception would fail here
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.strip().splitlines()
    for needle in (
        "--policy",
        "duration",
        "images",
        "jobs[0] (a).nodes",
        "jobs[1] (b).kind",
        "jobs[2] (c).after",
        "faults[0].end",
    ):
        assert sum(needle in line for line in lines) == 1, (needle, lines)


def test_unreadable_and_invalid_yaml_are_one_line(capsys, tmp_path):
    assert main(["simulate", "--scenario", str(tmp_path / "missing.yaml")]) == 2
    (tmp_path / "x.yaml").write_text("jobs: [\n")
    assert main(["simulate", "--scenario", str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "cannot be read" in err[0] and "is not readable YAML at line 2" in err[1]


# ------------------------------------------------------------------ PromQL evaluator


def test_evaluator_refuses_what_it_does_not_implement():
    with pytest.raises(PromQLError):
        parse('rate(slurm_x{partition="all"}[5m])')
    with pytest.raises(PromQLError):
        parse('slurm_x{partition=~"a.*"}')


def test_staleness_marker_ends_a_series_at_once_and_lookback_is_five_minutes():
    db = TSDB()
    db.add({"__name__": "m", "i": "1"}, 0, 1.0)
    db.add({"__name__": "m", "i": "2"}, 0, 2.0)
    db.mark_stale([frozenset({"__name__": "m", "i": "1"}.items())], 30)
    ev = Evaluator(db)
    assert ev.instant("sum(m)", 29) == {frozenset(): 3.0}
    assert ev.instant("sum(m)", 30) == {frozenset(): 2.0}
    assert ev.instant("sum(m)", 301) == {}  # the other one is past the 5 m lookback


# ------------------------------------------------------------------ KEDA and the HPA


def _keda(query_values: dict[str, float | None], **spec) -> tuple[Keda, Evaluator]:
    db = TSDB()
    triggers = []
    for i, (name, value) in enumerate(query_values.items()):
        for t in range(0, 1200, 60) if value is not None else ():
            db.add({"__name__": name}, t, value)
        triggers.append(Trigger(f"t{i}", f"max({name})", 1.0, 0.0, ignore_null=spec.get("ignore_null", False)))
    k = Keda(triggers, spec.get("min", 1), spec.get("max", 4), 0, spec.get("cooldown", 300), 30)
    return k, Evaluator(db)


def test_keda_error_without_fallback_leaves_the_scale():
    k, ev = _keda({"busy": None})
    k.last_active = 0
    assert k.poll(ev, 1000, 3) == 3  # would be 0 after the cooldown if the empty result read as 0
    k, ev = _keda({"busy": None}, ignore_null=True)
    k.last_active = 0
    assert k.poll(ev, 1000, 3) == 0


def test_keda_2_20_reads_a_nan_result_as_an_empty_one():
    """NaN (0 / 0) errs with ignoreNullValues "false" and reads 0 with "true", as Inf does
    (kedacore/keda@v2.20.2:pkg/scalers/prometheus_scaler.go ExecutePromQuery)."""
    for ignore_null, expected in ((False, 3), (True, 0)):
        k, ev = _keda({"busy": 0.0})
        k.triggers = [Trigger("t0", "max(busy) / max(busy)", 1.0, 0.0, ignore_null=ignore_null)]
        k.last_active = 0
        assert k.poll(ev, 1000, 3) == expected, ignore_null


def test_keda_scales_to_idle_only_after_the_cooldown_and_wakes_to_min():
    k, ev = _keda({"busy": 0.0})
    k.last_active = 100
    assert k.poll(ev, 399, 2) == 2 and k.poll(ev, 400, 2) == 0
    k, ev = _keda({"busy": 3.0}, min=1)
    assert k.poll(ev, 0, 0) == 1


def test_hpa_downscale_keeps_the_highest_recommendation_of_300_s_and_limits_scale_up():
    k, ev = _keda({"want": 1.0})
    hpa = Hpa(k)
    hpa.recommendations = [(0.0, 4)]
    assert hpa.sync(ev, 299, 4) == 4 and hpa.sync(ev, 301, 4) == 1
    k, ev = _keda({"want": 40.0}, max=64)
    assert Hpa(k).sync(ev, 0, 1) == 5  # max(2 x 1, 1 + 4)


def test_hpa_does_not_scale_down_on_an_invalid_metric():
    k, ev = _keda({"want": 1.0, "broken": None})
    assert Hpa(k).sync(ev, 0, 3) == 3


# ------------------------------------------------------------------ Kubernetes, Slurm


def test_the_device_plugin_never_gives_one_gpu_to_two_pods():
    kube = Kubernetes(gpus=1, cold=False)
    for i in range(3):
        kube.create_pod(Pod(f"p{i}", KUBERNETES if i else SLURMD, "x", "job", float(i)))
    for t in range(10):
        kube.step(t)
    assert [p.gpu for p in kube.pods] == [0, None, None] and kube.double_held == set()


def test_a_throttled_array_counts_every_pending_task_and_runs_one_at_a_time():
    slurm = Slurmctld(SlurmConfig("all", "slinky"))
    for i in range(3):
        slurm.register(f"slinky-{i}", 0)
    tasks = slurm.submit(JobSpec("t", "slurm", 0, 100, nodes=1, array=4, throttle=1), 0)
    slurm.step(0)
    assert [t.state for t in tasks].count(RUNNING) == 1
    metrics = slurm.partition_metrics(0)["all"]
    assert metrics["slurm_partition_jobs_pending"] == 3 and metrics["slurm_partition_nodes_idle"] == 2


@pytest.mark.parametrize("return_to_service", [0, 1, 2])
def test_a_node_set_down_under_a_job_is_back_only_under_return_to_service_2(return_to_service):
    """Its job requeued either way; the slurmd answering the kill brings it back only under
    ReturnToService=2, and then the job waiting runs there (seen on slurmctld 26.05.5,
    tests/engines/test_slurm_states.py)."""
    slurm = Slurmctld(SlurmConfig("all", "slinky", return_to_service=return_to_service))
    slurm.register("slinky-0", 0)
    first = slurm.submit(JobSpec("first", "slurm", 0, 600), 0)[0]
    slurm.step(0)
    waits = slurm.submit(JobSpec("waits", "slurm", 1, 600), 1)[0]
    assert slurm.set_down("slinky-0", 2) == [first]
    slurm.step(2)
    back = return_to_service == 2
    assert (slurm.nodes["slinky-0"].down, waits.state) == (not back, RUNNING if back else PENDING)
    assert first.state == PENDING and first.eligible_at == 2 + REQUEUE_DELAY


def test_the_twin_returns_nodes_as_the_programs_slurm_conf_says():
    """The twin reads ReturnToService from the slurm.conf the program renders (2: slurm_config.py)."""
    assert program.setup(offline.stack_settings("dev", [])).slurm.return_to_service == 2


def test_the_scenarios_workers_are_the_stacks_worker_count(capsys, tmp_path):
    """`workers: 2` renders the ScaledObject and partition limits for two workers: slurmd may hold
    both (it borrows AI's idle half), so a 3-node job is refused with MaxNodes=2."""
    path = tmp_path / "two.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "workers": 2,
                "duration": 300,
                "jobs": [{"name": "b", "kind": "slurm", "submit": 0, "runtime": 60, "nodes": 3}],
            }
        )
    )
    assert main(["simulate", "--scenario", str(path), "--json"]) == 0
    (b,) = json.loads(capsys.readouterr().out)["jobs"]
    assert b["outcome"] == "refused" and "MaxNodes=2" in b["reason"]


def test_problem_lines_escape_what_they_echo(capsys):
    assert main(["simulate", "--scenario", "/tmp/no\nsuch.yaml", "--policy", "a\x1bb"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 2 and "\x1b" not in err and "no\\nsuch" in err


def test_a_shipped_scenario_runs_by_name_as_by_path(capsys):
    assert main(["simulate", "--scenario", "restapi-down", "--json"]) == 0
    by_name = capsys.readouterr().out
    assert main(["simulate", "--scenario", str(ROOT / "scenarios/restapi-down.yaml"), "--json"]) == 0
    assert capsys.readouterr().out == by_name


def test_an_unknown_scenario_name_lists_the_shipped_ones(capsys):
    assert main(["simulate", "--scenario", "handof"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith('--scenario: "handof" is neither a file nor a shipped scenario; expected a path or one of ')
    assert ", handoff, " in line and "restapi-down" in line


def test_the_picture_states_the_latencies_the_text_states(tmp_path, capsys, monkeypatch):
    """One number each: the picture's headline takes the twin's latencies (exact to the second),
    not a second reading from its 15 s samples, which gave 75 s for a 63 s scale-up. The exact
    value lies within the sampled bounds: the samples only round it up to the next sample."""
    from validation import checks, plot

    drawn = {}
    monkeypatch.setattr(plot, "draw", lambda timeline, path, title, modelled: drawn.update(t=timeline, m=modelled))
    assert main(["simulate", "--scenario", "handoff", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out.splitlines()[-1]
    headline, _ = plot.verdict(drawn["t"], None, drawn["m"])
    up, back = drawn["m"]["scale_up_s"], drawn["m"]["gpu_return_s"]
    assert f"scale-up {up:g} s, GPU return {back:g} s (modelled)" in text
    assert f"scale-up {up:g} s (modelled); GPU return {back:g} s (modelled)" in headline
    sampled = checks.scale_up_bounds(drawn["t"])
    assert sampled.low <= up <= sampled.high and sampled.value != up  # what the picture said before


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def slow_clock(monkeypatch):
    """Each reading of the clock a second later: a run of the twin lasts long enough to show."""
    from cli import progress

    seconds = iter(range(10**6))
    monkeypatch.setattr(progress, "clock", lambda: float(next(seconds)))


@pytest.mark.parametrize(
    ("stream", "argv", "shown"),
    [
        (Terminal, [], True),
        (Terminal, ["--json"], False),  # what a script reads, on stdout; and nothing on stderr
        (io.StringIO, [], False),  # not a terminal: a pipe, a file, a CI log
    ],
)
def test_simulate_shows_progress_on_a_terminal_only(stream, argv, shown, slow_clock, monkeypatch, capsys):
    err = stream()
    monkeypatch.setattr("sys.stderr", err)
    assert main(["simulate", "--scenario", "handoff", *argv]) == 0
    text = err.getvalue()
    assert ("simulate: handoff: 1800 of 1800 modelled s" in text) is shown
    if shown:
        assert text.startswith("\r\x1b[K") and text.endswith("\r\x1b[K"), "rewritten in place, cleared at the end"
        assert "simulate: handoff: 1 of 1800" not in text, "nothing in the first seconds"
    else:
        assert text == ""
    out = capsys.readouterr().out
    assert "\r" not in out and (json.loads(out) if "--json" in argv else out.startswith("smoke "))


def test_a_phase_sweep_names_the_set_it_runs(slow_clock, monkeypatch, capsys):
    err = Terminal()
    monkeypatch.setattr("sys.stderr", err)
    assert main(["simulate", "--scenario", "handoff", "--phases", "2", "--phase-set", "5"]) == 0
    assert "simulate: handoff, phase set 6 (2 of 2): 1800 of 1800 modelled s" in err.getvalue()

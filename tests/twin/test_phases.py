"""An honest twin: each scrape target, KEDA's poll and the HPA's sync fire at their own
phases, drawn as a numbered phase set, and a scenario swept over phase sets reports its latencies
as p50/p95 over them and the sets under which a job was killed. Modelled, from the program's own ScaledObject on the
default stack."""

import functools
from pathlib import Path

import pytest

from cli.__main__ import main
from components import slurmd_scaling as scaling
from stacks import offline
from tests.twin import runs
from twin import program, scenario, sim
from twin.autoscale import HPA_SYNC

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
SETS = range(16)
RESTAPI_DOWN = ("restapi-down", "restapi-down-race")
RETURN_BOUND_S = 90  # tests/twin/test_return.py: the GPUs go back within 90 s when Kubernetes waits


@functools.cache
def setup(policy: str) -> sim.Setup:
    return program.setup(offline.stack_settings("dev", []), policy)


def load(name: str) -> scenario.Scenario:
    return scenario.load(SCENARIOS / f"{name}.yaml")


def swept(name: str, policy: str, sets: range = SETS) -> dict:
    return runs.sweep(setup(policy), load(name), sets)


def test_each_loop_fires_at_its_own_phase_drawn_from_the_phase_set():
    assert sim.Phases.drawn(3, 4, 30, 30) == sim.Phases.drawn(3, 4, 30, 30)
    assert len({sim.Phases.drawn(n, 4, 30, 30) for n in SETS}) == len(SETS)
    run = sim.Run(setup(scaling.DEMAND_AWARE), load("handoff"), phase_set=3)
    polls, syncs = [], []
    poll, sync = run.keda.poll, run.hpa.sync
    run.keda.poll = lambda ev, now, current: polls.append(now) or poll(ev, now, current)
    run.hpa.sync = lambda ev, now, current: syncs.append(now) or sync(ev, now, current)
    run.run()
    assert {t % run.keda.polling for t in polls} == {run.phases.poll}
    assert {t % HPA_SYNC for t in syncs} == {run.phases.sync}
    for target, offset in zip(run.prom.targets, run.phases.scrape, strict=True):
        times = {t for s in run.prom.db.series.values() if s.labels["instance"] == target.instance for t in s.times}
        assert {t % run.prom.interval for t in times} <= {offset}, target.instance
        if target.job != "slurm-controller" or "dup" not in target.instance:  # the duplicate is off here
            assert min(times) == offset - run.prom.interval, "scraped once before the run, on its phase"
    assert len({run.phases.poll, run.phases.sync, *run.phases.scrape}) > 1


@pytest.mark.slow
@pytest.mark.parametrize("name", RESTAPI_DOWN)
def test_a_restapi_outage_kills_nothing_under_any_phase_with_the_default_policy(name):
    s = swept(name, scaling.DEFAULT_POLICY)
    assert s["killed"] == {} and s["double_held"] == {} and s["not_ok"] == [], s


@pytest.mark.slow
@pytest.mark.parametrize("name", RESTAPI_DOWN)
def test_the_previous_policy_kills_the_busy_pod_under_every_phase(name):
    s = swept(name, scaling.PREVIOUS, range(6))
    assert s["killed"] == {n: ["b"] for n in range(6)}


@pytest.mark.slow
def test_the_outage_just_before_safes_scale_in_kills_under_some_phases_only():
    """The window the README names (an outage after kube-state-metrics' last scrape and before the
    HPA's scale-in): with the loops aligned it killed every time; with real phases only where the
    outage's start falls between that scrape and that sync."""
    s = swept("restapi-down-race", scaling.SAFE)
    assert s["killed"] and len(s["killed"]) < len(SETS), s["killed"]
    assert set(map(tuple, s["killed"].values())) == {("b",)}
    assert swept("restapi-down", scaling.SAFE)["killed"] == {}


@pytest.mark.slow
def test_gpus_go_back_within_the_bound_under_every_phase():
    """ai-waits: the last Slurm job ends while AI waits; p95 over phases, and the worst phase."""
    s = swept("ai-waits", scaling.DEMAND_AWARE, range(12))
    last = s["returns"]["last"]
    for name in ("gpu_freed_s", "kube_running_s"):
        assert last[name]["none"] == 0 and last[name]["p50"] <= last[name]["p95"] <= last[name]["max"]
        assert last[name]["max"] <= RETURN_BOUND_S, (name, last[name])
    assert s["not_ok"] == []


def test_percentiles_are_nearest_rank():
    assert sim.percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert sim.percentile([float(v) for v in range(1, 21)], 95) == 19.0
    assert sim.percentile([7.0], 95) == 7.0


@pytest.mark.slow
def test_simulate_sweeps_phases_and_names_the_sets_that_kill(capsys):
    sweep = ["--phases", "3", "--phase-set", "3"]
    code = main(["simulate", "--scenario", "restapi-down-race", "--policy", "safe", *sweep])
    out = capsys.readouterr().out
    assert code == 1 and "3 phase sets (3 to 5)" in out and "killed: phase set 4: b" in out
    assert "not ok: phase set 4\n" in out
    assert "scale-up: p50 " in out and "p95 " in out
    assert main(["simulate", "--scenario", "restapi-down-race", "--phase-set", "4"]) == 0  # the default policy
    assert main(["simulate", "--scenario", "restapi-down-race", "--policy", "safe", "--phase-set", "4"]) == 1
    capsys.readouterr()


@pytest.mark.parametrize(
    "args, problem",
    [
        (["--phases", "0"], '--phases: "0" is not allowed'),
        (["--phases", "101"], '--phases: "101" is not allowed'),
        (["--phase-set", "-1"], '--phase-set: "-1" is not allowed'),
        # issue 31: int() took these; the range is stated
        (
            ["--phase-set", "\u0661\u0660"],
            '--phase-set: "\\u0661\\u0660" is not allowed; expected a whole number from 0 to 999999',
        ),
        (["--phase-set", "1_0"], '--phase-set: "1_0" is not allowed'),
        (["--phase-set", str(2**32 - 1)], '--phase-set: "4294967295" is not allowed'),
        (["--phase-set", "1000000"], '--phase-set: "1000000" is not allowed'),
        (["--phase-set", "010"], '--phase-set: "010" is not allowed'),
        (["--phases", "\u0662"], '--phases: "\\u0662" is not allowed'),
        (
            ["--phases", "2", "--phase-set", "999999"],
            "--phases: 2 from --phase-set 999999 would reach phase set 1000000",
        ),
        (["--phases", "2", "--out", "x"], "--out: not allowed with --phases"),
    ],
)
def test_bad_sweep_options_are_one_line_each(args, problem, capsys):
    assert main(["simulate", "--scenario", "handoff", *args]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(problem), err

"""Bounds that survive one fault (issue 28): each scenario loses one input of the scaler while a
side waits for its lent share. The default policy's formula as it was before (git main at 41d0e5b,
restored by putting back its three helpers) breaks the stated bound; the formula now keeps it, with
nothing killed, no GPU held twice and no drained node un-drained while AI waits for it. Modelled,
from the program's own rendered objects."""

import functools
from pathlib import Path

import pytest

from components import slurmd_scaling as scaling
from core import settings
from stacks import offline
from tests.twin import runs
from twin import program, scenario, sim

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
PHASE_SETS = range(6)
# scenario -> (the wait it is about, the bound row of the lost input, the AI job)
CASES = {
    "slurm-metrics-lost-ai-waits": (scaling.AI_GANG_START, "slurmctld's metrics (slurmctld up)", "gang"),
    "kueue-metrics-lost-reclaim": (scaling.AI_SHARE_BACK, "Kueue's metrics", "ai"),
}


def dev() -> settings.Settings:
    return offline.stack_settings("dev", [])


@functools.cache
def setup(before: bool = False) -> sim.Setup:
    """The default policy's setup; `before`: with the formula's lost-input handling as it was."""
    if not before:
        return program.setup(dev(), scaling.DEFAULT_POLICY)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scaling, "_ai_held_when_kueue_lost", lambda t: 0)  # Kueue lost: AI holds nothing
        mp.setattr(scaling, "_zero_when_slurm_lost", lambda query: query)  # Slurm lost: a trigger error
        mp.setattr(scaling, "_unless_slurm_lost", lambda capped, cap: capped)
        return program.setup(dev(), scaling.DEFAULT_POLICY)


def load(name: str) -> scenario.Scenario:
    return scenario.load(SCENARIOS / f"{name}.yaml")


def bound(name: str) -> float:
    which, lost, _ = CASES[name]
    s = dev()
    b = scaling.reclaim_bounds(
        s.slurm_metrics_interval_seconds, s.keda_polling_seconds, s.slurm_job_max_minutes, s.ai_job_max_minutes
    )
    (row,) = [r for r in scaling.outage_bounds(b) if r.lost == lost]
    (fault,) = load(name).faults
    return row.wait(which, fault.end - fault.start)


def ai_wait(name: str, before: bool = False, phase_set: int = sim.DEFAULT_PHASE_SET) -> tuple[float, list, sim.Run]:
    """The AI job's wait from submit to start, the un-drains during the outage while it waited, and
    the run. (Outside an outage a sync may swap a victim, un-draining one node for another whose job
    ends sooner: tests/twin/test_nodeset.py.)"""
    sc = load(name)
    run = runs.run(setup(before), sc, phase_set)
    r = run.result()
    (job,) = [j for j in r["jobs"] if j["name"] == CASES[name][2]]
    assert job["outcome"] == "completed", job
    (fault,) = sc.faults
    start, end = max(job["submitted"], fault.start), min(job["started"], fault.end)
    undrained = [(t, node) for t, node in run.nodeset.undrained if start <= t < end]
    return job["started"] - job["submitted"], undrained, run


def test_the_bound_under_each_lost_input_is_stated_and_the_outage_counts_only_where_the_scaler_waits():
    b = scaling.reclaim_bounds(30, 30, 60, 60)
    rows = {r.lost: r for r in scaling.outage_bounds(b)}
    assert rows["Kueue's metrics"].wait(scaling.AI_SHARE_BACK, 5400) == b.ai_share_back_s
    assert rows["Kueue's metrics"].wait(scaling.AI_GANG_START, 5400) == b.ai_gang_start_s + 5400
    assert rows["slurmctld's metrics (slurmctld up)"].wait(scaling.AI_GANG_START, 6100) == b.ai_gang_start_s
    assert rows["kube-state-metrics"].plus_outage == (
        scaling.AI_SHARE_BACK,
        scaling.AI_GANG_START,
        scaling.HPC_SHARE_BACK,
    )
    assert {r.alert for r in rows.values()} == {
        scaling.METRICS_MISSING_ALERT,
        scaling.KUEUE_METRICS_MISSING_ALERT,
        scaling.KUBE_STATE_METRICS_MISSING_ALERT,
        scaling.RESTAPI_DOWN_ALERT,
    }


@pytest.mark.parametrize("name", CASES)
def test_ai_waits_within_the_stated_bound_through_the_outage_and_did_not_before(name):
    wait, undrained, run = ai_wait(name)
    r = run.result()
    assert wait <= bound(name), (wait, bound(name))
    assert r["killed"] == [] and r["double_held"] == [] and sim.ok(r), r
    assert undrained == [], "a node drained for AI was un-drained while AI waited"
    before, undrained_before, _ = ai_wait(name, before=True)
    assert before > bound(name), (before, bound(name))
    if name == "kueue-metrics-lost-reclaim":  # the cap rose to every GPU and un-drained AI's two nodes
        assert len(undrained_before) == 2, undrained_before


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_under_every_phase_set_the_bound_holds_now_and_broke_before(name):
    """Each scenario under a few draws of the scrape, poll and sync phases: the bound holds under
    every set with nothing killed or double-held and no un-drain while AI waits; before, it broke
    under every set."""
    for n in PHASE_SETS:
        wait, undrained, run = ai_wait(name, phase_set=n)
        r = run.result()
        assert wait <= bound(name) and undrained == [], (n, wait, undrained)
        assert r["killed"] == [] and r["double_held"] == [] and sim.ok(r), (n, r)
        before, undrained_before, _ = ai_wait(name, before=True, phase_set=n)
        assert before > bound(name), (n, before)
        if name == "kueue-metrics-lost-reclaim":
            assert len(undrained_before) == 2, (n, undrained_before)

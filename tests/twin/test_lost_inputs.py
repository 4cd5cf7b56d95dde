"""Bounds that survive one fault (issue 28): each scenario loses one input of the scaler while a
side waits for its lent share. The default policy's formula as it was before (git main at 41d0e5b,
restored by putting back its three helpers) breaks the stated bound; the formula now keeps it, with
nothing killed, no GPU held twice and no drained node un-drained while AI waits for it. Modelled,
from the program's own rendered objects."""

import dataclasses
import functools
from pathlib import Path

import pytest

from components import fair_share, runnable_exporter
from components import slurmd_scaling as scaling
from core import settings
from core.names import Names
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


# Each case under both policies: the default (fair-share) in the fast set, lend-and-reclaim with
# the slow sweeps (a plain pytest and CI), which run every policy
POLICIES = (pytest.param(scaling.LEND_RECLAIM, marks=pytest.mark.slow), scaling.FAIR_SHARE)
EXPORTER_ROW = "the runnable-jobs exporter"


@functools.cache
def setup(policy: str = scaling.DEFAULT_POLICY, before: bool = False) -> sim.Setup:
    """A policy's setup; `before`: with the formula's lost-input handling as it was."""
    if not before:
        return program.setup(dev(), policy)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scaling, "_ai_held_when_kueue_lost", lambda t: 0)  # Kueue lost: AI holds nothing
        mp.setattr(scaling, "_zero_when_slurm_lost", lambda query: query)  # Slurm lost: a trigger error
        mp.setattr(scaling, "_unless_slurm_lost", lambda capped, lost_cap: capped)
        return program.setup(dev(), policy)


def load(name: str) -> scenario.Scenario:
    return scenario.load(SCENARIOS / f"{name}.yaml")


@functools.cache
def bounds() -> scaling.ReclaimBounds:
    """The default stack's bounds."""
    return scaling.stack_reclaim_bounds(Names.from_settings(dev()))


def outage_row(lost: str) -> scaling.OutageBound:
    """`outage_bounds`' row of the lost input, on the default stack."""
    (row,) = [r for r in scaling.outage_bounds(bounds()) if r.lost == lost]
    return row


def bound(name: str) -> float:
    which, lost, _ = CASES[name]
    (fault,) = load(name).faults
    return outage_row(lost).wait(which, fault.end - fault.start)


def ai_wait(
    name: str,
    before: bool = False,
    phase_set: int = sim.DEFAULT_PHASE_SET,
    policy: str = scaling.DEFAULT_POLICY,
    outage_start: float | None = None,
) -> tuple[float, list, sim.Run]:
    """The AI job's wait from submit to start, the un-drains during the outage while it waited, and
    the run. (Outside an outage a sync may swap a victim, un-draining one node for another whose job
    ends sooner: tests/twin/test_nodeset.py.)"""
    sc = load(name)
    if outage_start is not None:
        (fault,) = sc.faults
        sc = dataclasses.replace(sc, faults=(dataclasses.replace(fault, start=outage_start),))
    run = runs.run(setup(policy, before), sc, phase_set)
    r = run.result()
    (job,) = [j for j in r["jobs"] if j["name"] == CASES[name][2]]
    assert job["outcome"] == "completed", job
    (fault,) = sc.faults
    start, end = max(job["submitted"], fault.start), min(job["started"], fault.end)
    undrained = [(t, node) for t, node in run.nodeset.undrained if start <= t < end]
    return job["started"] - job["submitted"], undrained, run


def late(undrained: list[tuple[float, str]], name: str, policy: str) -> list[tuple[float, str]]:
    """The un-drains that break the promise. Under fair-share a node drained on AI's turn (its quota
    above its share) is given back when slurmctld's metrics are lost before lend-and-reclaim's
    reservation, which the cap then follows, has formed: up to RESERVE_AFTER_SECONDS after the AI
    job's submit plus the Kueue scrape and the subquery step that see it (60 s). A Slurm job it
    takes then ends within the job's first-in-line bound, which counts from the submit
    (test_under_fair_share_a_turn_lost_...)."""
    if policy not in scaling.QUOTA_POLICIES or name != "slurm-metrics-lost-ai-waits":
        return undrained
    (job,) = [j for j in load(name).jobs if j.name == CASES[name][2]]
    return [(t, node) for t, node in undrained if t > job.submit + scaling.RESERVE_AFTER_SECONDS + 60]


def test_the_bound_under_each_lost_input_is_stated_and_the_outage_counts_only_where_the_scaler_waits():
    b = scaling.reclaim_bounds(30, 30, 60, 60)
    rows = {r.lost: r for r in scaling.outage_bounds(b)}
    assert rows["Kueue's metrics"].wait(scaling.AI_SHARE_BACK, 5400) == b.ai_share_back_s
    assert rows["Kueue's metrics"].wait(scaling.AI_GANG_START, 5400) == b.ai_gang_start_s + 5400
    assert rows["slurmctld's metrics (slurmctld up)"].wait(scaling.AI_GANG_START, 6100) == b.ai_gang_start_s
    assert rows["kube-state-metrics"].plus_outage == scaling.WAITS
    assert {r.alert for r in rows.values()} == {
        scaling.METRICS_MISSING_ALERT,
        scaling.KUEUE_METRICS_MISSING_ALERT,
        scaling.KUBE_STATE_METRICS_MISSING_ALERT,
        scaling.RESTAPI_DOWN_ALERT,
        runnable_exporter.MISSING_ALERT,  # the exporter's own rule group names the same alert
    }
    # Without the runnable-jobs exporter (or slurmrestd, which it reads) the stall memory, not the
    # outage, is what work that became runnable, and HPC work hidden by the remembered count, wait.
    assert b.runnable_start_s == b.handoff_s
    for lost in (EXPORTER_ROW, "slurmrestd"):
        assert rows[lost].wait(scaling.RUNNABLE_START, 5400) == b.handoff_s + scaling.STALL_MEMORY_SECONDS
        assert rows[lost].wait(scaling.HPC_SHARE_BACK, 5400) == b.hpc_share_back_s + scaling.STALL_MEMORY_SECONDS
    assert rows[EXPORTER_ROW].wait(scaling.AI_SHARE_BACK, 5400) == b.ai_share_back_s
    assert rows[EXPORTER_ROW].alert == scaling.RUNNABLE_JOBS_MISSING_ALERT
    assert rows["kube-state-metrics"].wait(scaling.RUNNABLE_START, 5400) == 5400 + b.handoff_s


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", CASES)
def test_ai_waits_within_the_stated_bound_through_the_outage_and_did_not_before(name, policy):
    wait, undrained, run = ai_wait(name, policy=policy)
    r = run.result()
    assert wait <= bound(name), (wait, bound(name))
    assert r["killed"] == [] and r["double_held"] == [] and sim.ok(r), r
    assert late(undrained, name, policy) == [], "a node drained for AI was un-drained while AI waited"
    before, undrained_before, _ = ai_wait(name, before=True, policy=policy)
    assert before > bound(name), (before, bound(name))
    if name == "kueue-metrics-lost-reclaim":  # the cap rose to every GPU and un-drained AI's two nodes
        assert len(undrained_before) == 2, undrained_before


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", CASES)
def test_under_every_phase_set_the_bound_holds_now_and_broke_before(name, policy):
    """Each scenario under a few draws of the scrape, poll and sync phases: the bound holds under
    every set with nothing killed or double-held and no un-drain while AI waits; before, it broke
    under every set."""
    for n in PHASE_SETS:
        wait, undrained, run = ai_wait(name, phase_set=n, policy=policy)
        r = run.result()
        assert wait <= bound(name) and late(undrained, name, policy) == [], (n, wait, undrained)
        assert r["killed"] == [] and r["double_held"] == [] and sim.ok(r), (n, r)
        before, undrained_before, _ = ai_wait(name, before=True, phase_set=n, policy=policy)
        assert before > bound(name), (n, before)
        if name == "kueue-metrics-lost-reclaim":
            assert len(undrained_before) == 2, (n, undrained_before)


def test_under_fair_share_a_turn_lost_with_slurms_metrics_costs_at_most_the_reservations_window():
    """Under fair-share, slurmd's cap follows AI's quota, which the controller raises on AI's turn
    and sets back to the split once slurmctld's metrics are lost; the cap then follows
    lend-and-reclaim's reservation, which forms RESERVE_AFTER_SECONDS after the AI job is first in
    line. An outage starting after the turn drained every node and before that (here 100 s after the
    gang's submit) gives HPC's two nodes back for that while: any Slurm job they take then ends
    within the gang's bound, which counts from its submit. Lend-and-reclaim has no turn to lose."""
    name = "slurm-metrics-lost-ai-waits"
    (gang,) = [j for j in load(name).jobs if j.name == "gang"]
    wait, undrained, run = ai_wait(name, policy=scaling.FAIR_SHARE, outage_start=gang.submit + 100)
    assert run.quota_changes and wait <= bound(name), (run.quota_changes, wait)
    assert undrained and late(undrained, name, scaling.FAIR_SHARE) == [], undrained
    assert ai_wait(name, policy=scaling.LEND_RECLAIM, outage_start=gang.submit + 100)[1] == []


def test_the_handoff_doc_states_each_bound_under_one_lost_input_as_outage_bounds_gives_it():
    """docs/handoff.md "One input lost": one row per lost input, its alert and each of its four
    bounds as `outage_bounds` gives them for the default stack ("D + " where the outage counts)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "handoff.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and ("Missing`)" in line or "Down`)" in line)]
    wanted = scaling.outage_bounds(bounds())
    assert len(rows) == len(wanted)
    for line, row in zip(rows, wanted, strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert f"(`{row.alert}`)" in cells[0], (cells[0], row.alert)
        want = [
            ("D + " if which in row.plus_outage else "") + scaling._minutes(getattr(row, which))
            for which in scaling.WAITS
        ]
        assert cells[2:] == want, (row.lost, cells[2:], want)


@pytest.mark.parametrize("phase_set", [sim.DEFAULT_PHASE_SET, pytest.param(3, marks=pytest.mark.slow)])
@pytest.mark.parametrize(
    "kind, lost", [("kube-state-metrics-outage", "kube-state-metrics"), ("restapi-down", "slurmrestd")]
)
@pytest.mark.parametrize("policy", POLICIES)
def test_with_kube_state_metrics_or_slurmrestd_lost_nothing_is_scaled_in_and_ais_wait_grows_by_the_outage_only(
    phase_set, kind, lost, policy
):
    """kube-state-metrics-lost: the restapi-down trigger errs, so nothing is scaled in while the
    outage lasts (the scaler cannot see slurmrestd); with slurmrestd itself down instead, that
    trigger asks for every pod. Either way the AI job runs after the outage, within D plus AI's
    share-back bound, and nothing is killed."""
    sc = load("kube-state-metrics-lost")
    (fault,) = sc.faults
    fault = dataclasses.replace(fault, kind=kind)
    sc = dataclasses.replace(sc, faults=(fault,))
    run = runs.run(setup(policy), sc, phase_set)
    r = run.result()
    (job,) = [j for j in r["jobs"] if j["name"] == "ai"]
    row = outage_row(lost)
    assert fault.end <= job["started"], "frozen: the idle slurmd pods kept the GPUs through the outage"
    assert job["started"] - job["submitted"] <= row.wait(scaling.AI_SHARE_BACK, fault.end - fault.start)
    assert r["killed"] == [] and r["double_held"] == [] and sim.ok(r), r


@pytest.mark.parametrize(
    "phase_set", [sim.DEFAULT_PHASE_SET, *(pytest.param(n, marks=pytest.mark.slow) for n in (1, 2, 3))]
)
@pytest.mark.parametrize("policy", POLICIES)
def test_with_slurmctld_down_nothing_is_scaled_in_and_the_gang_waits_the_outage_plus_its_bound(phase_set, policy):
    """slurmctld-down-ai-waits: every NodeSet sync fails at RefreshNodeCache, so the idle slurmd
    pods stay until slurmctld is back (the scaler's outage branch asks for none); the gang then
    starts within D plus its first-in-line bound, the "slurmctld itself" row of outage_bounds."""
    sc = load("slurmctld-down-ai-waits")
    (fault,) = sc.faults
    run = runs.run(setup(policy), sc, phase_set)
    r = run.result()
    (gang,) = [j for j in r["jobs"] if j["name"] == "gang"]
    (row,) = [row for row in scaling.outage_bounds(bounds()) if row.lost.startswith("slurmctld (down")]
    assert all(j["finished"] < fault.end for j in r["jobs"] if j["kind"] == "slurm"), "idle pods through the outage"
    assert fault.end <= gang["started"], "no slurmd pod went while slurmctld was down"
    assert gang["started"] - gang["submitted"] <= row.wait(scaling.AI_GANG_START, fault.end - fault.start)
    assert r["killed"] == [] and r["double_held"] == [] and sim.ok(r), r


# ------------------------------------------------------------------ the runnable-jobs exporter lost

EXPORTER_LOST = "runnable-exporter-lost"


def exporter_run(policy: str, phase_set: int = sim.DEFAULT_PHASE_SET, fault: bool = True) -> sim.Run:
    sc = load(EXPORTER_LOST)
    return runs.run(setup(policy), sc if fault else dataclasses.replace(sc, faults=()), phase_set)


def became_runnable(r: dict) -> dict[str, float]:
    """When each job that pended not runnable became runnable (b: its --begin; c: the end of a,
    its afterok parent)."""
    jobs = {j["name"]: j for j in r["jobs"]}
    specs = {j.name: j for j in load(EXPORTER_LOST).jobs}
    became = {"b": specs["b"].begin, "c": jobs[specs["c"].after]["finished"]}
    assert all(jobs[name]["submitted"] < t for name, t in became.items()), "each pended before it was runnable"
    return became


def runnable_waits(r: dict) -> dict[str, float]:
    """Each such job's wait from becoming runnable to its start."""
    jobs = {j["name"]: j for j in r["jobs"]}
    return {name: jobs[name]["started"] - t for name, t in became_runnable(r).items()}


def check_exporter_lost(policy: str, phase_set: int) -> None:
    """The row's bounds hold through the outage (AI's share back, work that became runnable, any
    wait of HPC for its share), nothing killed or held twice; the waits of what became runnable
    exceed the hand-off they get with the exporter, and outlast the outage: the row is not vacuous."""
    run = exporter_run(policy, phase_set)
    r = run.result()
    (fault,) = load(EXPORTER_LOST).faults
    outage = fault.end - fault.start
    row = outage_row(EXPORTER_ROW)
    assert all(fault.start <= t < fault.end for t in became_runnable(r).values()), "runnable during the outage"
    waits = runnable_waits(r)
    for name, wait in waits.items():
        assert bounds().runnable_start_s < wait <= row.wait(scaling.RUNNABLE_START, outage), (phase_set, name, wait)
    jobs = {j["name"]: j for j in r["jobs"]}
    assert min(jobs[name]["started"] for name in waits) > fault.end + bounds().handoff_s, "the memory outlives it"
    assert r["reclaim_waits"]["kubernetes"], "AI waited for its share lent to Slurm"
    for side, which in (("kubernetes", scaling.AI_SHARE_BACK), ("slurm", scaling.HPC_SHARE_BACK)):
        assert all(w <= row.wait(which, outage) for w in r["reclaim_waits"][side]), (side, r["reclaim_waits"])
    assert r["killed"] == [] and r["double_held"] == [] and sim.ok(r), r


@pytest.mark.parametrize("policy", POLICIES)
def test_with_the_runnable_jobs_exporter_lost_work_that_becomes_runnable_waits_the_stall_memory_not_more(policy):
    """runnable-exporter-lost: c's parent ends and b's --begin comes while the exporter is lost;
    both had brought up pods, idled beside them for STALL_SECONDS and been discounted, so the
    remembered count hides them until STALL_MEMORY_SECONDS have passed, after the outage too."""
    check_exporter_lost(policy, sim.DEFAULT_PHASE_SET)


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_with_the_runnable_jobs_exporter_lost_the_bounds_hold_under_every_phase_set(policy):
    for n in PHASE_SETS:
        check_exporter_lost(policy, n)


@pytest.mark.parametrize("policy", POLICIES)
def test_with_the_runnable_jobs_exporter_up_the_same_work_starts_within_the_handoff(policy):
    """The same scenario without the fault: the outage is what the row's wait is about."""
    r = exporter_run(policy, fault=False).result()
    waits = runnable_waits(r)
    assert all(wait <= bounds().runnable_start_s for wait in waits.values()), waits
    assert r["killed"] == [] and r["double_held"] == [] and sim.ok(r), r


def controller_waiting(run: sim.Run, start: float, end: float) -> list[float | None]:
    """HPC's waiting as the fair-share controller reads it (its queries on the run's Prometheus,
    components/fair_share.py `reading`) at each of its periods in [start, end)."""
    return [run.fair_share_reading(t).waiting[fair_share.HPC] for t in range(int(start), int(end), fair_share.PERIOD_S)]


def test_with_the_runnable_jobs_exporter_lost_the_fair_share_controller_reads_slurmctlds_counts():
    """While a runs, b (--begin ahead) and c (after a) cannot run. With the exporter the controller
    never counts them as HPC waiting; without it, it reads slurmctld's pending minus held (both of
    them) until their stall is found, and no input is lost: it keeps deciding, no split forced."""
    specs = {j.name: j for j in load(EXPORTER_LOST).jobs}
    lost, up = exporter_run(scaling.FAIR_SHARE), exporter_run(scaling.FAIR_SHARE, fault=False)
    a = [{j["name"]: j for j in run.result()["jobs"]}["a"] for run in (lost, up)]
    # a's start seen by a scrape and a period, b and c pending
    window = (max(j["started"] for j in a) + 2 * fair_share.PERIOD_S, min(j["finished"] for j in a))
    assert set(controller_waiting(up, *window)) == {0.0}
    waiting = controller_waiting(lost, *window)
    assert None not in waiting and max(waiting) >= specs["c"].nodes, waiting
    assert waiting[-1] == 0.0, "the stall found, the remembered count takes them out"
    assert not any("input lost" in reason for _, _, reason in lost.quota_changes), lost.quota_changes


# b stalls beside its idle pod at about 200 s and is left out for STALL_MEMORY_SECONDS; AI borrows
# HPC's idle share; n (runnable) waits for it from 600 s; b's --begin comes at 1400 s. When AI's
# first jobs end (about 1505 s) b and n are two pending jobs less one remembered: one slurmd pod
# waits in Kueue, b takes it, and AI's k7 borrows HPC's other GPU for its 3500 s. n is counted
# again once the memory ends, and then waits for k7: past HPC's no-outage bound, within the row's.
HIDDEN_HPC_WORK = {
    "workers": 4,
    "duration": 7200,
    "images": "warm",
    "jobs": [
        {"name": "b", "kind": "slurm", "submit": 0, "runtime": 3500, "nodes": 1, "begin": 1400},
        *({"name": f"k{i}", "kind": "job", "submit": 300, "runtime": 1200, "gpus": 1} for i in range(1, 5)),
        *({"name": f"k{i}", "kind": "job", "submit": 400, "runtime": 3500, "gpus": 1} for i in range(5, 8)),
        {"name": "n", "kind": "slurm", "submit": 600, "runtime": 600, "nodes": 1},
    ],
    "faults": [{"kind": "runnable-exporter-down", "start": 0, "end": 3000}],
}


@pytest.mark.parametrize("policy", POLICIES)
def test_with_the_runnable_jobs_exporter_lost_the_remembered_stall_can_hide_hpc_work_from_its_share_back(policy):
    """HPC's share back grows by the stall memory in the exporter's row: n waits past the bound
    it has with the exporter (where it starts with b, when AI's first jobs end), within the row's."""
    row = outage_row(EXPORTER_ROW)
    waits = {}
    for fault in (True, False):
        sc = scenario.parse(HIDDEN_HPC_WORK if fault else {**HIDDEN_HPC_WORK, "faults": []})
        r = runs.result(setup(policy), sc)
        (n,) = [j for j in r["jobs"] if j["name"] == "n"]
        waits[fault] = n["started"] - n["submitted"]
        assert r["killed"] == [] and r["double_held"] == [] and sim.ok(r), r
    (fault,) = HIDDEN_HPC_WORK["faults"]
    assert waits[False] <= bounds().hpc_share_back_s < waits[True], waits
    assert waits[True] <= row.wait(scaling.HPC_SHARE_BACK, fault["end"] - fault["start"]), waits


@pytest.mark.slow
def test_with_the_runnable_jobs_exporter_lost_the_runnable_bound_holds_wherever_the_begin_falls():
    """A --begin job alone on the idle cluster, its begin swept across the stall and the pod's
    going, under four phase sets: every wait from its begin is within the row's bound, and the
    longest comes within a hand-off of it (the memory is what the bound is about)."""
    row = outage_row(EXPORTER_ROW)
    bound = row.wait(scaling.RUNNABLE_START, 1200)
    waits = []
    for phase_set in range(4):
        for begin in range(150, 700, 50):
            job = {"name": "b", "kind": "slurm", "submit": 0, "runtime": 300, "nodes": 1, "begin": begin}
            fault = {"kind": "runnable-exporter-down", "start": 0, "end": 1200}
            sc = scenario.parse({"workers": 4, "duration": 3600, "images": "warm", "jobs": [job], "faults": [fault]})
            r = runs.result(setup(scaling.DEFAULT_POLICY), sc, phase_set)
            (b,) = r["jobs"]
            waits.append(b["started"] - begin)
            assert r["killed"] == [] and r["double_held"] == [], r
    assert bound - bounds().handoff_s < max(waits) <= bound, (max(waits), bound)

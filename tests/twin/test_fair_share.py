"""Fair share over time (issue 28), modelled: each shape of the issue's "Why" fails its contract
under the default before (lend-and-reclaim) and holds under the default, the fair-share policy,
whose controller (components/fair_share.py) the twin runs as is and the program deploys
(components/fair_share_controller.py), under a few phase sets. The contract is
docs/handoff.md's "Fair share over time": while both sides have work, each side gets its share
(half) of the contended GPU time within 5 points, overall and over every 2 h window at least half
contended, when no single job holds more than an eighth of a window's GPU time."""

from __future__ import annotations

import dataclasses
import functools
import random

import pytest

from components import fair_share
from components import slurmd_scaling as scaling
from core.names import Names
from stacks import offline
from tests.twin import runs
from twin import program, scenario, sim

PHASE_SETS = range(2)
# Each shape is 6 or 24 simulated hours, under two policies and two phase sets: a sweep.
SWEEP = pytest.mark.slow
BAND = fair_share.BAND  # 5 points either side of the guaranteed half


@functools.cache
def setup(policy: str) -> sim.Setup:
    return program.setup(offline.stack_settings("dev", []), policy)


def gangs_against_a_stream() -> scenario.Scenario:
    """AI 4-GPU gangs, one every 15 min for 15 min (each a reservation of every GPU), against a
    1-node Slurm job every 150 s for 15 min: each side alone offers more than the 4 GPUs."""
    hours = 6 * 3600
    jobs = [
        {"name": f"g{i}", "kind": "pytorchjob", "submit": i * 900, "runtime": 900, "replicas": 4}
        for i in range(hours // 900)
    ]
    jobs += [
        {"name": f"s{i}", "kind": "slurm", "submit": i * 150, "runtime": 900, "nodes": 1} for i in range(hours // 150)
    ]
    return scenario.parse({"workers": 4, "duration": hours, "images": "warm", "jobs": jobs})


def wide_slurm_against_a_stream() -> scenario.Scenario:
    """3- and 4-node Slurm jobs, one every 30 min, against a 1-GPU AI job every 4 min for 20 min."""
    hours = 6 * 3600
    jobs = [
        {"name": f"w{i}", "kind": "slurm", "submit": i * 1800, "runtime": 1800, "nodes": 3 + i % 2}
        for i in range(hours // 1800)
    ]
    jobs += [
        {"name": f"a{i}", "kind": "job", "submit": i * 240, "runtime": 1200, "gpus": 1} for i in range(hours // 240)
    ]
    return scenario.parse({"workers": 4, "duration": hours, "images": "warm", "jobs": jobs})


def wide_behind_its_own_stream() -> scenario.Scenario:
    """A 4-node Slurm job every 90 min among HPC's own 1-node jobs (one every 700 s for 20 min:
    with the 4-node ones, about HPC's half), against a 1-GPU AI job every 4 min for 20 min. Once
    first in line, the 4-node job is passed over while fewer than 4 nodes exist, the 1-node jobs
    behind it take HPC's 2, and HPC, at its share, is not behind: nothing gives it a turn."""
    hours = 6 * 3600
    jobs = [
        {"name": f"w{i}", "kind": "slurm", "submit": 60 + i * 5400, "runtime": 900, "nodes": 4}
        for i in range(hours // 5400)
    ]
    jobs += [
        {"name": f"s{i}", "kind": "slurm", "submit": i * 700, "runtime": 1200, "nodes": 1} for i in range(hours // 700)
    ]
    jobs += [
        {"name": f"a{i}", "kind": "job", "submit": i * 240, "runtime": 1200, "gpus": 1} for i in range(hours // 240)
    ]
    return scenario.parse({"workers": 4, "duration": hours, "images": "warm", "jobs": jobs})


def busy_day() -> scenario.Scenario:
    """A day of 170 jobs, 55 % Slurm of 1-4 nodes, 45 % AI of 1-4 GPUs, 15-40 min each: about 1.6x
    the GPU-hours 4 workers have, so not everything can run."""
    rng, day = random.Random(28), 24 * 3600
    gap, jobs = day * 0.9 / 170, []
    for i in range(170):
        job = {"name": f"b{i:03d}", "submit": round(i * gap + rng.uniform(0, gap / 2))}
        job["runtime"] = rng.choice((900, 1200, 1800, 2400))
        width = rng.choice((1, 1, 2, 2, 3, 4))
        if rng.random() < 0.55:
            job |= {"kind": "slurm", "nodes": width}
        else:
            job |= {"kind": "pytorchjob", "replicas": width} if width > 1 else {"kind": "job", "gpus": 1}
        jobs.append(job)
    return scenario.parse({"workers": 4, "duration": day, "images": "warm", "jobs": jobs})


def result(shape, policy: str, phase_set: int = sim.DEFAULT_PHASE_SET) -> dict:
    return runs.result(setup(policy), shape(), phase_set)


def within_band(share: float | None) -> bool:
    return share is not None and 0.5 - BAND <= share <= 0.5 + BAND


def started(r: dict, prefix: str, nodes: int | None = None, sc: scenario.Scenario | None = None) -> int:
    widths = {j.name: j.gpus_wanted for j in sc.jobs} if sc else {}
    return sum(
        1
        for j in r["jobs"]
        if j["name"].startswith(prefix) and j["started"] is not None and (nodes is None or widths[j["name"]] == nodes)
    )


def no_harm(r: dict) -> bool:
    return not r["killed"] and not r["double_held"]


@SWEEP
def test_gangs_first_in_line_take_most_of_the_time_under_lend_and_reclaim():
    r = result(gangs_against_a_stream, scaling.LEND_RECLAIM)
    assert r["sides"]["slurm"]["share"] < 0.5 - BAND and no_harm(r), r["sides"]["slurm"]["share"]  # 0.32


@SWEEP
@pytest.mark.parametrize("phase_set", PHASE_SETS)
def test_gangs_and_a_stream_share_the_time_within_the_band_over_every_window(phase_set):
    r = result(gangs_against_a_stream, scaling.DEFAULT_POLICY, phase_set)
    slurm = r["sides"]["slurm"]
    assert within_band(slurm["share"]), slurm["share"]  # 0.48 at phase set 0
    assert slurm["window_share"]["windows"] > 100 and within_band(slurm["window_share"]["min"]), slurm
    assert within_band(slurm["window_share"]["max"]) and no_harm(r)
    assert r["sides"]["kubernetes"]["waits_by_width"]["4"]["jobs"] >= 10, "the gangs kept running"


@SWEEP
@pytest.mark.parametrize("phase_set", PHASE_SETS)
def test_gangs_and_a_stream_share_the_time_when_hpc_may_not_borrow(phase_set):
    """hpcBorrowsAiGpus false: AI's queue lends nothing, so Kueue admits a gang up to AI's whole
    quota on AI's turn while slurmd pods still hold some of those GPUs. The controller counts the
    gang's pods still waiting for a GPU as waiting, not used, and AI's turn lasts until they run
    (before, Kueue's admitted usage ended the turn at once and the gang idled half the GPUs: Slurm
    got 91-92 %)."""
    fair = program.setup(offline.stack_settings("dev", ["hpcBorrowsAiGpus=false"]), scaling.DEFAULT_POLICY)
    r = runs.result(fair, gangs_against_a_stream(), phase_set)
    assert within_band(r["sides"]["slurm"]["share"]) and no_harm(r), r["sides"]["slurm"]["share"]  # 0.492
    # 8 of the 24 gangs ran (1 before); AI's share here is its 4-GPU gangs' alone
    assert r["sides"]["kubernetes"]["waits_by_width"]["4"]["jobs"] >= 6, "the gangs kept running"


@SWEEP
def test_wide_slurm_jobs_hardly_run_against_a_stream_of_small_ai_jobs_under_lend_and_reclaim():
    sc = wide_slurm_against_a_stream()
    r = runs.result(setup(scaling.LEND_RECLAIM), sc)
    assert started(r, "w") <= 1 and r["sides"]["slurm"]["share"] < 0.2, r["sides"]["slurm"]  # 1 of 12; 0.10
    assert r["sides"]["slurm"]["held_for_reservation_gpu_s"] > 5 * 3600, "a slurmd pod held a GPU for hours"


def starvation_bounds() -> dict[str, int]:
    """components/fair_share.py's bounds for the dev stack's run limits, as `plan` prints them."""
    names = Names.from_settings(offline.stack_settings("dev", []))
    handoff = scaling.stack_reclaim_bounds(names).handoff_s
    slurm_run = 60 * names.slurm_job_max_minutes + scaling.SLURM_LIMIT_CHECK_SECONDS + scaling.SLURM_KILL_WAIT_SECONDS
    return fair_share.no_starvation_bounds(slurm_run, 60 * names.ai_job_max_minutes, handoff)


@SWEEP
@pytest.mark.parametrize("phase_set", PHASE_SETS)
def test_wide_slurm_jobs_get_their_turn_against_a_stream_of_small_ai_jobs(phase_set):
    sc = wide_slurm_against_a_stream()
    run = runs.run(setup(scaling.DEFAULT_POLICY), sc, phase_set)
    r = run.result()
    # 4-node jobs run now (3 of 6; 0 before the turn and the backfill plan): a 3-node job may still
    # take the 3 nodes there are while the 4th is on its way (a dynamic node that has not joined
    # is not planned for), but the turn keeps HPC's quota until the 4-node job holds all 4.
    assert started(r, "w", 4, sc) >= 3 and started(r, "w", 3, sc) >= 3, r["sides"]["slurm"]["waits_by_width"]
    # Above the band (0.603 at both phase sets; 0.566 while HPC's queue still lent on its turn): each
    # turn holds a 3-node job's idle 4th node for the 4-node one behind it, and every job here is
    # wider than HPC's share, so HPC reserves whenever it is back at its share. These jobs (1.5-2
    # GPU-hours) are far over the contract's 1/8 of a window.
    assert 0.45 <= r["sides"]["slurm"]["share"] <= 0.62 and no_harm(r), r["sides"]["slurm"]["share"]
    # No starvation, as stated: each 4-node job first in line starts within the bound of HPC's turn
    bounds = starvation_bounds()
    turns = [
        t
        for t, _, why in run.quota_changes
        if why.startswith((f"{fair_share.HPC} behind", f"{fair_share.HPC} reserves"))
    ]
    for job in run.slurm.jobs:
        if job.nodes_needed == 4 and job.started is not None:
            turn = max(t for t in turns if t <= job.started)
            assert job.started - turn <= bounds["turn_start_s"], (job.spec.name, job.started, turn)
    assert r["slurm_plan_hold_max_s"] <= bounds["plan_hold_s"], r["slurm_plan_hold_max_s"]  # 1732 s


def first_in_line_waits(r: dict, prefix: str, end: float) -> list[float]:
    """Each job's wait from when it first was first in line to its start (to the run's `end` if it
    never started); the jobs that never were first in line are left out."""
    return [
        (j["started"] if j["started"] is not None else end) - j["first_in_line"]
        for j in r["jobs"]
        if j["name"].startswith(prefix) and j.get("first_in_line") is not None
    ]


def without_the_reservation(monkeypatch) -> None:
    """The rule before HPC's reservation for a wide job first in line: the reading knows no job
    first in line, and a queue lends all of its quota on its turn too."""
    reading = fair_share.reading
    monkeypatch.setattr(fair_share, "reading", lambda values: dataclasses.replace(reading(values), hpc_first=0.0))
    monkeypatch.setattr(fair_share, "lending_limit", lambda side, lends, nominal, turn: nominal if lends else 0)


@SWEEP
def test_a_wide_job_first_in_line_starves_behind_its_own_sides_stream_without_the_reservation(monkeypatch):
    without_the_reservation(monkeypatch)
    sc = wide_behind_its_own_stream()
    r = sim.Run(setup(scaling.DEFAULT_POLICY), sc).run()
    # a 4-node job first in line waits past the bound: HPC, at its share with the 1-node jobs behind
    # it, is never behind
    waits = first_in_line_waits(r, "w", sc.duration)
    assert max(waits) > starvation_bounds()["turn_start_s"] and no_harm(r), waits


@SWEEP
@pytest.mark.parametrize("phase_set", PHASE_SETS)
def test_a_wide_job_first_in_line_gets_hpcs_reservation_within_the_bound(phase_set):
    sc = wide_behind_its_own_stream()
    r = runs.result(setup(scaling.DEFAULT_POLICY), sc, phase_set)
    waits = first_in_line_waits(r, "w", sc.duration)
    # 3 of the 4 ran (none waited past the bound: 8,698-9,208 s before); the last was first in line
    # near the end
    assert len(waits) == 4 and started(r, "w") >= 3, waits
    assert max(waits) <= starvation_bounds()["turn_start_s"], waits  # 2,537-2,540 s
    assert within_band(r["sides"]["slurm"]["share"]) and no_harm(r), r["sides"]["slurm"]["share"]  # 0.516-0.517
    # per window, within the band plus the largest job's share of a window (41-59 %)
    assert sc.workers is not None
    largest = max(j.runtime * j.gpus_wanted for j in sc.jobs) / (fair_share.WINDOW_S * sc.workers)
    windows = r["sides"]["slurm"]["window_share"]
    assert 0.5 - BAND - largest <= windows["min"] and windows["max"] <= 0.5 + BAND + largest, windows


@SWEEP
def test_the_controller_counts_the_gpu_time_the_contract_counts(monkeypatch):
    """What the controller adds up from its readings (undecayed, while both sides have work) is each
    side's contended GPU time as the twin's ledger counts it, within a scrape's lag: Slurm's busy
    nodes (not its slurmd pods, idle ones in a backfill plan included) and Kueue's admitted AI usage
    (no queue admits beyond the GPUs free here: the AI queue lends its quota, so Kueue's cohort
    counts the slurmd pods still over HPC's lowered quota)."""
    counted = {fair_share.HPC: 0.0, fair_share.AI: 0.0}
    last: list[float] = []
    step = fair_share.FairShare.step

    def counting(self, now: float, r: fair_share.Reading) -> fair_share.Quotas:
        known = last and None not in (*r.used.values(), *r.waiting.values())
        if known and all((r.used[side] or 0) + (r.waiting[side] or 0) > 0 for side in counted):
            for side in counted:
                counted[side] += (r.used[side] or 0) * (now - last[0])
        last[:] = [now]
        return step(self, now, r)

    monkeypatch.setattr(fair_share.FairShare, "step", counting)
    r = sim.Run(setup(scaling.DEFAULT_POLICY), wide_behind_its_own_stream()).run()
    ledger = r["contention"]["gpu_s"]
    assert counted[fair_share.HPC] == pytest.approx(ledger["slurm"], rel=0.02), (counted, ledger)
    assert counted[fair_share.AI] == pytest.approx(ledger["kubernetes"], rel=0.02), (counted, ledger)


@SWEEP
@pytest.mark.parametrize("policy", [scaling.LEND_RECLAIM, scaling.DEFAULT_POLICY])
def test_a_gpu_held_idle_for_a_backfill_plan_is_held_within_the_bound(policy):
    r = result(busy_day, policy)
    assert 0 < r["slurm_plan_hold_max_s"] <= starvation_bounds()["plan_hold_s"], r["slurm_plan_hold_max_s"]


@SWEEP
def test_under_overload_width_decides_who_runs_under_lend_and_reclaim():
    sc = busy_day()
    r = runs.result(setup(scaling.LEND_RECLAIM), sc)
    assert r["sides"]["slurm"]["share"] < 0.5 - BAND and no_harm(r), r["sides"]["slurm"]["share"]  # 0.38
    four_wide = {j.name: j.kind for j in sc.jobs if j.gpus_wanted == 4}
    ran = [four_wide[j["name"]] for j in r["jobs"] if j["name"] in four_wide and j["started"] is not None]
    # AI's 4-GPU gangs run (9 of 14 on Slinky 1.0.5); of the 4-node Slurm jobs, 1 of 9 (0 before the
    # twin's Slurm planned as sched/backfill does: twin/slurm.py)
    assert ran.count("pytorchjob") >= 5 and ran.count("slurm") <= 1, ran


@SWEEP
@pytest.mark.parametrize("phase_set", PHASE_SETS)
def test_under_overload_each_side_gets_its_share_of_the_day(phase_set):
    sc = busy_day()
    r = runs.result(setup(scaling.DEFAULT_POLICY), sc, phase_set)
    assert within_band(r["sides"]["slurm"]["share"]) and no_harm(r), r["sides"]["slurm"]["share"]  # 0.49
    assert r["sides"]["slurm"]["waits_by_width"].get("3", {}).get("jobs", 0) >= 2, "3-node Slurm jobs ran"


def test_the_controller_moves_quotas_toward_the_side_behind_and_back():
    """The rule alone: a side waiting while under its share less the margin gets a quota of what
    it holds and waits for; inputs lost or both within the margin: the program's split."""
    fs = fair_share.FairShare(4, {fair_share.HPC: 2, fair_share.AI: 2})
    ai_only = fair_share.Reading({fair_share.HPC: 0, fair_share.AI: 4}, {fair_share.HPC: 3, fair_share.AI: 1})
    assert fs.step(0, ai_only).nominal == {fair_share.HPC: 2, fair_share.AI: 2}  # no history yet
    quotas = fs.step(30, ai_only)
    assert quotas.nominal == {fair_share.HPC: 3, fair_share.AI: 1} and quotas.reason.startswith("hpc behind")
    lost = fair_share.Reading({fair_share.HPC: None, fair_share.AI: 4}, {fair_share.HPC: 3, fair_share.AI: 1})
    assert fs.step(60, lost).nominal == {fair_share.HPC: 2, fair_share.AI: 2}
    usage = dict(fs.usage)
    fs.step(90, lost)
    assert fs.usage == usage, "a lost input neither adds nor decays usage"
    # A side the other lends nothing to claims at most its share: HPC behind gets a turn on the
    # split (its queue lends nothing meanwhile)
    capped = fair_share.FairShare(
        4, {fair_share.HPC: 2, fair_share.AI: 2}, {fair_share.HPC: True, fair_share.AI: False}
    )
    capped.step(0, ai_only)
    assert capped.step(30, ai_only).nominal == {fair_share.HPC: 2, fair_share.AI: 2} and capped.turn == (
        fair_share.HPC,
        2,
    )
    # A wide Slurm job first in line while HPC has at most its share: HPC's reservation, and HPC's
    # queue lends nothing on it
    even = fair_share.FairShare(4, {fair_share.HPC: 2, fair_share.AI: 2})
    both = fair_share.Reading({fair_share.HPC: 2, fair_share.AI: 2}, {fair_share.HPC: 4, fair_share.AI: 1}, hpc_first=4)
    quotas = even.step(0, both)
    assert quotas.nominal == {fair_share.HPC: 4, fair_share.AI: 0} and quotas.reason.startswith("hpc reserves")
    assert fair_share.lending_limit(fair_share.HPC, True, 4, quotas.turn) == 0
    narrow_first = fair_share.FairShare(4, {fair_share.HPC: 2, fair_share.AI: 2})
    assert narrow_first.step(0, dataclasses.replace(both, hpc_first=1)).reason == "the guaranteed split"
    # Slurm's and Kueue's decay: half the usage after a half-life with nothing used
    idle = fair_share.Reading({fair_share.HPC: 0, fair_share.AI: 0}, {fair_share.HPC: 0, fair_share.AI: 0})
    fs.step(90 + fair_share.HALF_LIFE_S, idle)
    assert fs.usage[fair_share.AI] == pytest.approx(usage[fair_share.AI] / 2)

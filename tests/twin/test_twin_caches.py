"""The twin keeps answers between the changes they follow (issue 27: a cheaper simulated second
with every result unchanged). Each test compares a kept answer with a fresh one, tick by tick,
so a change that forgets to renew it fails here."""

from __future__ import annotations

import functools
import math
import random

import pytest

from stacks import offline
from twin import program, sim
from twin.prometheus import Prometheus, Target
from twin.promql import Evaluator
from twin.scenario import FAULTS, Fault, JobSpec, Scenario, parse
from twin.slurm import PENDING, RUNNING, Plan, SlurmConfig, Slurmctld


@functools.cache
def setup() -> sim.Setup:
    return program.setup(offline.stack_settings("dev", []))


def _work() -> Scenario:
    """Slurm jobs that start, end, time out, wait on a dependency and a begin time, and lose their
    node to a failure; a PyTorchJob and a Job besides."""
    return parse(
        {
            "duration": 1500,
            "jobs": [
                {"name": "a", "kind": "slurm", "submit": 5, "runtime": 200, "nodes": 2},
                {"name": "b", "kind": "slurm", "submit": 10, "runtime": 900, "time": 5},
                {"name": "c", "kind": "slurm", "submit": 20, "runtime": 100, "after": "a"},
                {"name": "d", "kind": "slurm", "submit": 30, "runtime": 60, "begin": 400},
                {"name": "p", "kind": "pytorchjob", "submit": 50, "runtime": 300, "replicas": 2},
                {"name": "j", "kind": "job", "submit": 60, "runtime": 120},
            ],
            "faults": [{"kind": "node-failure", "start": 250, "end": 700, "node": 0}],
        }
    )


def test_the_fault_windows_answer_as_the_faults_for_every_kind_and_second():
    """Scenario.fault_active keeps each kind's windows: the same answer as a walk of the faults, at
    the edges too (a window is [start, end)), with overlapping and repeated windows of a kind."""
    faults = [
        Fault("kueue-down", 10, 20),
        Fault("kueue-down", 15, 40),
        Fault("metrics-outage", 30, 31),
        Fault("restapi-down", 0, 5),
        Fault("node-failure", 50, 60, node=1),
    ]
    sc = Scenario(duration=100, faults=tuple(faults))
    for kind in FAULTS:
        for t in range(-5, 105):
            for at in (float(t), t + 0.5):
                walked = any(f.kind == kind and f.start <= at < f.end for f in faults)
                assert sc.fault_active(kind, at) == walked, (kind, at)


def test_a_scrape_is_skipped_only_where_no_target_is_due():
    """World._scrape_phases, drawn with the targets' offsets, against Prometheus.due."""
    for phase_set in range(5):
        world = sim.Run(setup(), Scenario(duration=10), phase_set)
        interval = world.prom.interval
        for tick in range(3 * interval):
            assert (tick % interval in world._scrape_phases) == bool(world.prom.due(tick)), (phase_set, tick)


def test_busy_nodes_the_earliest_end_and_the_slurm_waits_follow_every_second():
    """Slurmctld.busy_nodes and earliest_end (kept per change of `running`) and the ledger's
    _slurm_waits (once per second) equal a fresh walk after every tick."""
    run = sim.Run(setup(), _work())
    slurm, ledger = run.slurm, run.ledger
    seen_busy = set()
    for tick in range(int(run.scenario.duration) + 1):
        run.tick(tick)
        now = float(tick)
        busy = {n for j in slurm.running for n in j.nodes}
        assert slurm.busy_nodes() == busy, tick
        assert slurm.earliest_end() == min((j.ends_at for j in slurm.running), default=math.inf), tick
        eligible = [j for j in slurm.open_jobs if slurm.eligible(j, now)]
        fitting = any(j.nodes_needed <= run.kube.gpus for j in eligible)
        assert ledger._slurm_waits(now) == (bool(eligible), fitting), tick
        seen_busy.add(frozenset(busy))
    assert len(seen_busy) > 3  # the jobs started and ended: the kept answers were renewed


def test_a_job_waiting_for_its_begin_time_starts_then_with_nothing_else_changing():
    """`step` skips a main scheduling pass while nothing changed, until a pending job's begin time."""
    slurm = Slurmctld(SlurmConfig("all", "slinky"))
    slurm.register("slinky-0", 0)
    (job,) = slurm.submit(JobSpec("late", "slurm", 0, 60, begin=100), 0)
    for t in range(150):
        slurm.step(float(t))
        slurm.step(float(t))  # as the world steps it, twice a second
        assert job.state == (RUNNING if t >= 100 else PENDING), t
    assert job.started == 100


def _earliest_by_walking_every_plan(
    slurm: Slurmctld, need: int, length: float, now: float, free_at: dict[str, float], usable: list[str]
) -> tuple[float | None, list[str]]:
    """The earliest start as backfill.c tests it: every plan, at every candidate time."""
    times = sorted({now, *free_at.values(), *(p.end for p in slurm.plans)})
    for t in times:
        if t < now:
            continue
        nodes = [
            n
            for n in usable
            if free_at[n] <= t and not any(n in p.nodes and p.end > t and p.start <= t + length for p in slurm.plans)
        ]
        if len(nodes) >= need:
            return t, nodes[:need]
    return None, []


@pytest.mark.parametrize("seed", range(20))
def test_the_earliest_start_is_the_one_a_walk_of_every_plan_finds(seed):
    rng = random.Random(seed)
    slurm = Slurmctld(SlurmConfig("all", "slinky"))
    usable = [f"slinky-{i}" for i in range(rng.randint(1, 6))]
    now = 600.0
    free_at = {n: now + rng.choice((0, 0, 60, 300, 1200)) for n in usable}
    job = slurm.submit(JobSpec("held", "slurm", 0, 60), 0)[0]
    for _ in range(rng.randint(0, 12)):
        start = now + 60 * rng.randint(0, 40)
        nodes = frozenset(rng.sample(usable, rng.randint(1, len(usable))))
        slurm.plans.append(Plan(job, nodes, start, start + 60 * rng.randint(1, 30)))
    for need in range(1, len(usable) + 1):
        for length in (60.0, 600.0, 3600.0):
            want = _earliest_by_walking_every_plan(slurm, need, length, now, free_at, usable)
            assert slurm._earliest(need, length, now, free_at, usable) == want, (need, length)


def test_a_window_is_the_builtin_min_or_max_of_its_steps_in_order():
    """Evaluator._whole keeps a series' first value until a later one is below (above) it, as
    builtins.min (max) of the two: NaN and -0.0 included, whose answer depends on the order."""
    ev = Evaluator(Prometheus().db)
    inner = ("sel", "m", ())
    steps = [math.nan, 0.0, -0.0, 2.0, math.nan, -1.0, 2.0]
    for t, value in enumerate(steps):
        ev._memo[(id(inner), float(t))] = {frozenset(): value}
    ev.final_before = len(steps)
    for lowest, pick in ((True, min), (False, max)):
        for first in range(len(steps)):
            for count in range(1, len(steps) - first + 1):
                want = functools.reduce(pick, steps[first : first + count])
                got = ev._whole(lowest, inner, float(first), count, 1.0)[frozenset()]
                assert repr(got) == repr(want), (lowest, first, count)


def test_each_target_keeps_its_own_series_for_the_same_exposed_labels():
    """Prometheus._series_keys is kept by target and labels: a duplicate target's samples are
    series of their own (its instance), not the first target's."""
    prom = Prometheus()
    exposed = [({"__name__": "m", "partition": "all"}, 1.0)]
    prom.targets = [Target("slurm", "a:1", lambda now: exposed), Target("slurm", "b:1", lambda now: exposed)]
    for now in (0.0, 30.0):
        prom.scrape(now, prom.targets, lambda target, now: False)
    assert sorted(dict(key)["instance"] for key in prom.db.series) == ["a:1", "b:1"]
    assert all(s.times == [0.0, 30.0] for s in prom.db.series.values())


def test_a_cancelled_running_job_frees_its_nodes_at_once():
    """scancel changes `running` outside a step: busy_nodes and earliest_end follow it at once."""
    slurm = Slurmctld(SlurmConfig("all", "slinky"))
    for i in range(2):
        slurm.register(f"slinky-{i}", 0)
    first, second = (slurm.submit(JobSpec(name, "slurm", 0, runtime), 0)[0] for name, runtime in (("a", 60), ("b", 90)))
    slurm.step(0.0)
    assert slurm.busy_nodes() == {"slinky-0", "slinky-1"} and slurm.earliest_end() == 60
    slurm.cancel(first, 5.0)
    assert slurm.busy_nodes() == set(second.nodes) and slurm.earliest_end() == 90


def test_a_node_answering_again_takes_the_waiting_job_in_that_second():
    """The world changes `unreachable` outside Slurmctld (a failed node and its return): the main
    pass skipped while nothing changed runs again as soon as the set does, not at the next backfill."""
    slurm = Slurmctld(SlurmConfig("all", "slinky"))
    slurm.register("slinky-0", 0)
    slurm.unreachable.add("slinky-0")
    (job,) = slurm.submit(JobSpec("waits", "slurm", 0, 60), 0)
    for t in range(5):
        slurm.step(float(t))
        assert job.state == PENDING, t
    slurm.unreachable.discard("slinky-0")
    slurm.step(5.0)
    assert job.state == RUNNING and job.started == 5

"""The twin's Slurm schedules as the program's slurmctld does (twin/slurm.py): the main scheduler in
queue order, stopping at a job that waits for busy nodes, and sched/backfill's plans every 30 s.
The engine rows in tests/engines/test_slurm_states.py compare the first two shapes with the real
slurmctld 26.05.5; these run the twin alone, in the fast suite."""

from __future__ import annotations

import pytest

from twin.scenario import JobSpec
from twin.slurm import BF_INTERVAL, BF_WINDOW, PENDING, RUNNING, SlurmConfig, Slurmctld


def _slurm(nodes: int, max_minutes: int | None = 60) -> Slurmctld:
    slurm = Slurmctld(SlurmConfig("all", "slinky", max_minutes=max_minutes))
    for i in range(nodes):
        slurm.register(f"slinky-{i}", 0)
    return slurm


def _submit(slurm: Slurmctld, name: str, at: float, nodes: int, time: int | None) -> object:
    (job,) = slurm.submit(JobSpec(name, "slurm", at, 3600, nodes=nodes, time=time), at)
    return job


def _run(slurm: Slurmctld, start: int, end: int) -> None:
    for t in range(start, end):
        slurm.step(float(t))


def test_a_later_job_that_would_delay_the_wide_head_waits_and_one_that_ends_first_starts():
    """The engine row's shape: 4 nodes, 2 busy until their 5 min limits, a 4-node head planned then.
    `late` (10 min) would reach that start: it waits on an idle node; `short` (1 min) starts."""
    slurm = _slurm(4)
    running = [_submit(slurm, f"run-{i}", 0, 1, 5) for i in range(2)]
    _run(slurm, 0, 2)
    wide, late, short = (_submit(slurm, n, 2, w, m) for n, w, m in (("wide", 4, 10), ("late", 1, 10), ("short", 1, 1)))
    _run(slurm, 2, 2 + int(BF_INTERVAL) + 1)
    assert [j.state for j in running] == [RUNNING, RUNNING]
    assert (wide.state, late.state, short.state) == (PENDING, PENDING, RUNNING)
    (plan, *_) = slurm.plans
    assert plan.job is wide and plan.start == 300 and len(plan.nodes) == 4  # the limits, not the real ends
    # The main scheduler alone (between backfill cycles) starts nothing behind the head.
    (later,) = slurm.submit(JobSpec("later", "slurm", 40, 60, nodes=1, time=1), 40)
    slurm.step(40.0)
    assert later.state == PENDING


def test_a_head_wider_than_the_registered_nodes_holds_none_of_them():
    """Dynamic nodes: a 3-node head with 2 nodes there is never runnable now, so the jobs behind it
    take the nodes there are, at once (the main scheduler passes it) and nothing is planned."""
    slurm = _slurm(2)
    wide = _submit(slurm, "wide", 0, 3, 10)
    small = [_submit(slurm, f"small-{i}", 0, 1, 10) for i in range(2)]
    slurm.step(0.0)
    assert wide.state == PENDING and [j.state for j in small] == [RUNNING, RUNNING]
    _run(slurm, 1, 40)
    assert slurm.plans == []


def test_with_no_time_limit_the_plan_is_past_the_window_and_later_jobs_start():
    """MaxTime UNLIMITED (the older policies): a running job's end is a year out, past bf_window,
    so the wide head gets no plan and a later job takes the idle node at the next cycle."""
    slurm = _slurm(2, max_minutes=None)
    _submit(slurm, "run", 0, 1, None)
    slurm.step(0.0)
    wide, late = _submit(slurm, "wide", 1, 2, None), _submit(slurm, "late", 1, 1, None)
    slurm.step(1.0)
    assert late.state == PENDING, "the main scheduler stops at the head"
    _run(slurm, 2, int(BF_INTERVAL) + 1)
    assert (wide.state, late.state) == (PENDING, RUNNING) and slurm.plans == []
    assert BF_WINDOW == 24 * 3600


@pytest.mark.parametrize("change", ["register", "undrain", "release", "cancel"])
def test_a_change_between_the_two_passes_of_a_second_starts_the_job_in_that_second(change):
    """The twin runs slurmctld's pass twice a second (twin/world.py advance: before and after the
    NodeSet) and skips the second when nothing changed since the first (Slurmctld._changes): each
    change that can let a job start must count as one."""
    slurm = Slurmctld(SlurmConfig("all", "slinky"))
    if change != "register":
        slurm.register("slinky-0", 0)
    blocker = slurm.submit(JobSpec("blocker", "slurm", 0, 600), 0)[0] if change == "cancel" else None
    if change == "undrain":
        slurm.set_drain("slinky-0", True)
    job = slurm.submit(JobSpec("job", "slurm", 0, 600, hold=change == "release"), 0)[0]
    slurm.step(5)  # the first pass starts nothing (or only the blocker)
    assert job.state != RUNNING
    if change == "register":
        slurm.register("slinky-0", 5)
    elif change == "undrain":
        slurm.set_drain("slinky-0", False)
    elif change == "release":
        slurm.release("job")
    else:
        slurm.cancel(blocker, 5)
    slurm.step(5)  # the second pass, in the same second
    assert job.state == RUNNING and job.started == 5

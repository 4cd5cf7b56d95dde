"""Work that cannot start yet (a future --begin, an unmet dependency, an array's throttled tasks) is
counted as pending by slurmctld's metrics, which have no pending reason but held (docs/handoff.md,
"What the metrics can tell apart"). The runnable-jobs exporter (components/runnable_jobs.py) reads
each job's reason from slurmrestd, so such work holds no GPU at all. With the exporter lost, what it
costs is bounded by the stall term: each wasted start of a slurmd pod lasts at most STALL_SECONDS
plus one hand-off, and comes at most once per STALL_MEMORY_SECONDS. Measured in the twin against
the same scenario without that work."""

from __future__ import annotations

import functools
import math

import pytest

from components import slurmd_scaling as scaling
from stacks import offline
from tests.twin import runs
from twin import program, scenario

pytestmark = pytest.mark.slow  # five hour-long twin runs: outside the fast set, in CI and a plain run
DURATION = 3600


@functools.cache
def _setup():
    return program.setup(offline.stack_settings("dev", []))


EXPORTER_DOWN = [{"kind": "runnable-exporter-down", "start": 0, "end": DURATION}]


def _idle_gpu_s(jobs: list[dict], faults: list[dict] | None = None, duration: int = DURATION) -> float:
    """slurmd's GPU-seconds with no job, over a run of `duration`."""
    sc = scenario.parse({"workers": 4, "duration": duration, "images": "warm", "jobs": jobs, "faults": faults or []})
    return runs.result(_setup(), sc)["slurmd_idle_gpu_s"]


def _bound(pods: int, wait_s: float) -> float:
    """The documented cost: per pod, one short start per stall memory window while it waits."""
    s = offline.stack_settings("dev", [])
    handoff = scaling.reclaim_bounds(s.slurm_metrics_interval_seconds, s.keda_polling_seconds, 60, 60).handoff_s
    return pods * math.ceil(wait_s / scaling.STALL_MEMORY_SECONDS) * (scaling.STALL_SECONDS + handoff)


BUSY = {"name": "a", "kind": "slurm", "submit": 0, "runtime": 3000, "nodes": 1}


BEGIN = {"name": "g", "kind": "slurm", "submit": 0, "runtime": 60, "nodes": 1, "begin": 3400}
AFTER = {"name": "e", "kind": "slurm", "submit": 0, "runtime": 60, "nodes": 1, "after": "a"}
ARRAY = {"name": "t", "kind": "slurm", "submit": 0, "runtime": 900, "nodes": 1, "array": 8, "throttle": 2}


# Runs that end while the work still waits (and `a` still runs): the idle GPU time is the same as without it.
WAITING = BUSY["runtime"] - 100


def test_a_future_begin_holds_no_gpu():
    begin = {**BEGIN, "begin": WAITING - 1}
    assert _idle_gpu_s([BUSY, begin], duration=WAITING) == _idle_gpu_s([BUSY], duration=WAITING)


def test_an_unmet_dependency_holds_no_gpu():
    assert _idle_gpu_s([BUSY, AFTER], duration=WAITING) == _idle_gpu_s([BUSY], duration=WAITING)


def test_an_array_s_throttled_tasks_hold_no_gpu():
    """--array=0-7%2 on 4 GPUs: 2 tasks run, the 6 throttled ones ask for nothing more."""
    two_tasks = {k: v for k, v in ARRAY.items() if k != "throttle"} | {"array": 2}
    waiting = ARRAY["runtime"] - 100
    assert _idle_gpu_s([ARRAY], duration=waiting) == _idle_gpu_s([two_tasks], duration=waiting)


def test_without_the_exporter_a_future_begin_costs_at_most_one_short_start_per_stall_window():
    extra = _idle_gpu_s([BUSY, BEGIN], EXPORTER_DOWN) - _idle_gpu_s([BUSY], EXPORTER_DOWN)
    assert 0 < extra <= _bound(1, 3400), extra


def test_without_the_exporter_an_unmet_dependency_costs_at_most_one_short_start_per_stall_window():
    extra = _idle_gpu_s([BUSY, AFTER], EXPORTER_DOWN) - _idle_gpu_s([BUSY], EXPORTER_DOWN)
    assert 0 < extra <= _bound(1, BUSY["runtime"]), extra


def test_without_the_exporter_an_array_s_throttled_tasks_cost_at_most_the_pods_beyond_the_throttle():
    """--array=0-7%2 on 4 GPUs: 2 tasks run, the 6 pending ones ask for the 2 other pods."""
    unthrottled = {**ARRAY, "throttle": 8}
    extra = _idle_gpu_s([ARRAY], EXPORTER_DOWN) - _idle_gpu_s([unthrottled], EXPORTER_DOWN)
    assert extra <= _bound(2, DURATION), extra

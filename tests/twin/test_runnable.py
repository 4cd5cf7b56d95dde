"""Work that becomes runnable (its --begin comes, its dependency is met, its hold is released) gets
a GPU within the hand-off bound, on an otherwise idle cluster, under several phase sets: the
scaler counts it from the runnable-jobs exporter (components/runnable_jobs.py), which the twin runs
on its own job list. With the exporter lost, the rule falls back to slurmctld's pending counts
and the stall term, today's bound: --begin work then waits most of the 30 min stall memory, which
is what these tests would see without the exporter (the `_without_the_exporter` cases)."""

from __future__ import annotations

import functools

import pytest

from components import slurmd_scaling as scaling
from stacks import offline
from tests.twin import runs
from twin import program, scenario

pytestmark = pytest.mark.slow  # hour-long runs under every phase set
PHASE_SETS = range(4)
DURATION = 3600
EXPORTER_DOWN = {"kind": "runnable-exporter-down", "start": 0, "end": DURATION}


@functools.cache
def _setup():
    return program.setup(offline.stack_settings("dev", []))


def _bounds() -> scaling.ReclaimBounds:
    s = offline.stack_settings("dev", [])
    return scaling.reclaim_bounds(s.slurm_metrics_interval_seconds, s.keda_polling_seconds, 60, 60)


def _handoff_s() -> int:
    return _bounds().handoff_s


def _result(jobs: list[dict], phase_set: int, faults: tuple[dict, ...] = ()) -> dict:
    sc = scenario.parse({"workers": 4, "duration": DURATION, "images": "warm", "jobs": jobs, "faults": list(faults)})
    return runs.result(_setup(), sc, phase_set)


def _started(result: dict, name: str) -> float:
    (job,) = [j for j in result["jobs"] if j["name"] == name]
    assert job["started"] is not None, job
    return job["started"]


# --begin 400 s after submit: under the stall term the job's pod comes up, idles next to it for
# STALL_SECONDS, and the work is discounted for STALL_MEMORY_SECONDS from then on.
BEGIN = {"name": "b", "kind": "slurm", "submit": 0, "runtime": 300, "nodes": 1, "begin": 400}
# A 2-node job after a 1-node one: when the parent ends, its warm node is not enough.
PARENT = {"name": "a", "kind": "slurm", "submit": 0, "runtime": 600, "nodes": 1}
CHILD = {"name": "c", "kind": "slurm", "submit": 0, "runtime": 300, "nodes": 2, "after": "a"}
HELD = {"name": "h", "kind": "slurm", "submit": 0, "runtime": 300, "nodes": 2, "hold": True, "release": 900}


@pytest.mark.parametrize("phase_set", PHASE_SETS)
def test_begin_work_starts_within_the_handoff_bound_of_its_begin(phase_set):
    result = _result([BEGIN], phase_set)
    assert _started(result, "b") - BEGIN["begin"] <= _handoff_s()
    # It holds no GPU before then: the run is the same as the job submitted at its begin time.
    at_begin = _result([{**BEGIN, "submit": BEGIN["begin"]}], phase_set)
    assert _started(at_begin, "b") == _started(result, "b")
    assert result["slurmd_idle_gpu_s"] == at_begin["slurmd_idle_gpu_s"]


@pytest.mark.parametrize("phase_set", PHASE_SETS)
def test_without_the_exporter_begin_work_waits_for_the_stall_memory(phase_set):
    """The bound the fallback keeps (the exporter's row of `outage_bounds`): the proof that the
    test above can fail."""
    waited = _started(_result([BEGIN], phase_set, (EXPORTER_DOWN,)), "b") - BEGIN["begin"]
    assert waited > scaling.STALL_MEMORY_SECONDS - BEGIN["begin"], waited
    (row,) = [row for row in scaling.outage_bounds(_bounds()) if row.alert == scaling.RUNNABLE_JOBS_MISSING_ALERT]
    assert waited <= row.wait(scaling.RUNNABLE_START, DURATION), waited


@pytest.mark.parametrize("phase_set", PHASE_SETS)
def test_a_dependency_met_gets_its_nodes_within_the_handoff_bound(phase_set):
    result = _result([PARENT, CHILD], phase_set)
    assert _started(result, "c") - (_started(result, "a") + PARENT["runtime"]) <= _handoff_s()


@pytest.mark.parametrize("phase_set", PHASE_SETS)
def test_without_the_exporter_a_dependency_met_waits_for_the_stall_memory(phase_set):
    result = _result([PARENT, CHILD], phase_set, (EXPORTER_DOWN,))
    assert _started(result, "c") - (_started(result, "a") + PARENT["runtime"]) > _handoff_s()


@pytest.mark.parametrize("phase_set", PHASE_SETS)
def test_a_released_hold_gets_its_nodes_within_the_handoff_bound(phase_set):
    result = _result([HELD], phase_set)
    assert _started(result, "h") - HELD["release"] <= _handoff_s()
    plain = {k: v for k, v in HELD.items() if k not in ("hold", "release")} | {"submit": HELD["release"]}
    assert result["slurmd_starts"] == _result([plain], phase_set)["slurmd_starts"]


@pytest.mark.parametrize("phase_set", PHASE_SETS)
def test_nothing_is_killed_or_double_held(phase_set):
    for jobs in ([BEGIN], [PARENT, CHILD], [HELD]):
        result = _result(jobs, phase_set)
        assert not result["killed"] and not result["double_held"], result

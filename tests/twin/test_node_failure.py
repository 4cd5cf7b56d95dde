"""Fault node-failure (twin/world.py `_node_failures`), on the shipped scenario `node-failure`: two
GPU workers fail for 20 minutes, one under a Slurm job, one under an AI job. What must hold: Slurm
sets the node DOWN after SlurmdTimeout and requeues the job, which completes later elsewhere;
Kubernetes evicts the pods after the NotReady grace and the toleration, and they keep their GPU,
and Kueue their quota, until the node is back; no GPU ever has two owners; nothing is killed by
the hand-off."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.names import AI_CLUSTER_QUEUE, HPC_CLUSTER_QUEUE
from stacks import offline
from twin import program, scenario, sim
from twin.slurm import SLURMD_TIMEOUT
from twin.world import NODE_NOT_READY_S, UNREACHABLE_TOLERATION_S

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "node-failure.yaml"
# One worker runs the module, so `watched` (a run watched second by second) runs once, not once per worker.
pytestmark = pytest.mark.xdist_group("node-failure")


@pytest.fixture(scope="module")
def watched():
    """The run, and what each second showed: the owners of each failed GPU and Kueue's usage."""
    run = sim.Run(program.setup(offline.stack_settings("dev", [])), scenario.load(SCENARIO))
    seen: list[tuple[int, dict[int, list[str]], int, int]] = []

    def on_tick(tick: int, last: int) -> None:
        owners = {g: sorted(p.name for p in run.kube.live_pods() if p.gpu == g) for g in range(run.kube.gpus)}
        assert run.kueue is not None
        seen.append((tick, owners, run.kueue.usage(HPC_CLUSTER_QUEUE), run.kueue.usage(AI_CLUSTER_QUEUE)))

    return run, run.run(on_tick), seen


def test_the_slurm_job_on_the_failed_node_is_requeued_after_slurmd_timeout_and_completes(watched):
    run, r, _ = watched
    (fault, *_) = [f for f in run.scenario.faults if f.kind == "node-failure"]
    requeued = [(t, name) for t, what, name in r["failure_events"] if what == "requeued"]
    assert requeued == [(fault.start + SLURMD_TIMEOUT, "s0")]
    s0 = next(j for j in r["jobs"] if j["name"] == "s0")
    assert s0["outcome"] == "completed" and s0["requeued_by_node_failure"] == 1
    assert s0["started"] >= fault.end, "it ran again only once a node was free: the failed one came back"
    assert sim.ok(r) and r["killed"] == [] and r["unfinished"] == []


def test_pods_on_the_failed_node_are_evicted_after_the_toleration_and_hold_their_gpu_until_it_is_back(watched):
    run, r, seen = watched
    faults = [f for f in run.scenario.faults if f.kind == "node-failure"]
    evicted = sorted(name for t, what, name in r["failure_events"] if what == "evicted")
    assert evicted == ["k0-0", "slurm-worker-slinky-0"]
    evicted_at = {t for t, what, _ in r["failure_events"] if what == "evicted"}
    assert evicted_at == {faults[0].start + NODE_NOT_READY_S + UNREACHABLE_TOLERATION_S}
    for fault in faults:
        during = [owners[fault.node] for t, owners, _, _ in seen if fault.start <= t < fault.end]
        assert all(len(o) == 1 for o in during), "the stuck pod, and no other, on the failed GPU throughout"
        assert len({o[0] for o in during}) == 1
    assert r["double_held"] == [] and all(len(o) <= 1 for _, owners, _, _ in seen for o in owners.values())


def test_kueue_keeps_counting_the_stuck_pods_quota_until_they_are_gone(watched):
    run, _, seen = watched
    (fault, *_) = [f for f in run.scenario.faults if f.kind == "node-failure"]
    during = {(hpc, ai) for t, _, hpc, ai in seen if fault.start <= t < fault.end}
    # the slurmd pod's workload (1 GPU) and the AI job's (its replacement pod waits) stay admitted
    assert during == {(2, 2)}
    k0 = next(j for j in run.kube.jobs if j.name == "k0")
    assert k0.started is not None and k0.started >= fault.end, "the replacement ran only once a GPU was back"


@pytest.mark.parametrize(
    "fault, problem",
    [
        ({"kind": "node-failure", "start": 0, "end": 60}, "faults[0].node: "),
        ({"kind": "node-failure", "start": 0, "end": 60, "node": 4}, "expected an integer from 0 to 3"),
        ({"kind": "kueue-down", "start": 0, "end": 60, "node": 1}, "expected node only on node-failure"),
    ],
)
def test_a_node_fault_names_one_gpu_worker_of_the_scenario(fault, problem):
    with pytest.raises(scenario.ScenarioError) as refused:
        scenario.parse({"workers": 4, "duration": 600, "faults": [fault]})
    (line,) = refused.value.problems
    assert problem in line and line.startswith("faults[0].node: ")


def test_a_node_beyond_the_stacks_workers_is_refused_with_the_stack():
    sc = scenario.parse({"duration": 600, "faults": [{"kind": "node-failure", "start": 0, "end": 60, "node": 9}]})
    (line,) = scenario.node_problems(sc, 4)
    assert line == 'faults[0].node: "9" is not allowed; expected an integer from 0 to 3 (the stack has 4 GPU workers)'


def test_nothing_binds_to_a_failed_idle_node():
    """Four 1-GPU AI jobs while worker 0, idle, is down: three run, the fourth waits for one of them."""
    jobs = [{"name": f"k{i}", "kind": "job", "submit": 100, "runtime": 600, "gpus": 1} for i in range(4)]
    fault = {"kind": "node-failure", "start": 50, "end": 1000, "node": 0}
    sc = scenario.parse({"workers": 4, "duration": 3000, "jobs": jobs, "faults": [fault]})
    run = sim.Run(program.setup(offline.stack_settings("dev", [])), sc)
    on_zero: list[int] = []
    run.run(lambda t, last: on_zero.extend(t for p in run.kube.live_pods() if p.gpu == 0 and t < 1000))
    *first, last = sorted(run.kube.jobs, key=lambda j: j.started or 0)
    assert on_zero == [] and last.started is not None and last.started > max(j.finished or 0 for j in first) - 600


def test_simulate_says_what_the_failure_did(watched):
    from cli import simulate

    text = simulate.summary(watched[1])
    assert "s0               slurm       completed" in text and "requeued 1x: its node failed" in text
    assert "requeued s0 at 600 s; evicted k0-0 at 650 s" in text and "node back GPU 2 at 1500 s" in text

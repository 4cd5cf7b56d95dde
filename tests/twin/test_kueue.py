"""Kueue in the twin: quota from the program's own objects, whole-gang admission, BestEffortFIFO,
waitForPodsReady eviction with backoff, and issue 11's scenarios (modelled)."""

import functools
from pathlib import Path

import pytest

from components import kueue as program_kueue
from components import slurmd_scaling as scaling
from components.names import AI_CLUSTER_QUEUE, HPC_CLUSTER_QUEUE, GpuShares
from stacks import offline, settings
from twin import kube, program, scenario, sim
from twin.kube import Kubernetes
from twin.kueue import Kueue, Quota, quota_for_local_queue

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


@functools.cache
def result(name: str, policy: str) -> dict:
    s = settings.load(offline.stack_config("dev", []), "dev", offline=True)
    return sim.Run(program.setup(s, policy), scenario.load(SCENARIOS / f"{name}.yaml")).run()


def kueue_for(gpus: int, ai: int, borrows: bool) -> Kueue:
    objects = program_kueue.objects(GpuShares(gpus, ai, borrows, False))
    return Kueue.from_program(objects, program_kueue.manager_config("0.19.2"))


@pytest.mark.parametrize(("ai", "borrows", "available"), [(0, True, 4), (1, False, 1), (1, True, 4), (3, False, 3)])
def test_quota_is_the_program_queues_nominal_plus_what_hpc_lends(ai, borrows, available):
    objects = program_kueue.objects(GpuShares(4, ai, borrows, False))
    assert quota_for_local_queue(objects).available == available


def test_a_gang_is_admitted_whole_or_not_and_a_smaller_one_passes_it():
    cluster, q = kube.Kubernetes(gpus=4, cold=False), kueue_for(4, 0, True)
    for name, replicas in (("big", 3), ("pair", 2), ("one", 1)):
        q.add(cluster.submit(name, "pytorchjob", replicas, 60, 0.0, suspended=True), replicas, 0.0)
    assert all(not j.pods for j in cluster.jobs), "suspended jobs have no pods"
    q.step(cluster, 0.0)
    pods = {j.name: len(j.pods) for j in cluster.jobs}
    assert pods == {"big": 3, "pair": 0, "one": 1}, "BestEffortFIFO passes over the pair that does not fit"
    assert q.pods_ready_timeout == 600  # the program's waitForPodsReady.timeout, 10m


def test_an_admitted_job_stuck_behind_slurmd_is_evicted_and_requeued_with_backoff():
    cluster, q = kube.Kubernetes(gpus=1, cold=False), kueue_for(1, 0, True)
    cluster.create_pod(kube.Pod("slurm-worker-slinky-0", kube.SLURMD, "slinky-0", "slurmd", 0.0))
    cluster.step(0.0)  # slurmd, outside Kueue, holds the only GPU
    job = cluster.submit("late", "job", 1, 60, 0.0, suspended=True)
    q.add(job, 1, 0.0)
    evicted_at = []
    for t in range(0, 2000):
        q.step(cluster, float(t))
        cluster.step(float(t))
        if not job.pods and q.workloads[0].evictions > len(evicted_at):
            evicted_at.append(t)
    # 10m timeout after each admission; readmitted after 60 s, then 120 s (the backoff doubles)
    assert evicted_at[:3] == [600, 600 + 60 + 600, 1260 + 120 + 600]


def test_gang_deadlock_remains_with_slurmd_outside_kueue():
    r = result("gang-deadlock", scaling.SAFE)
    jobs = {j["name"]: j for j in r["jobs"]}
    assert r["killed"] == [] and not sim.ok(r)
    # Kueue admitted the gang whole (its quota does not see slurmd) and its Master runs, so
    # PodsReady (JobRunning) holds and waitForPodsReady never evicts it.
    assert jobs["p"]["admitted"] == 120 and jobs["p"]["evictions"] == 0
    assert jobs["p"]["outcome"] == jobs["b"]["outcome"] == "unfinished"
    assert r["contention"]["gpu_s"]["kubernetes"] == 0


def test_heavy_mix_completes_with_nothing_killed_and_eviction_unblocks_a_gang():
    r = result("heavy-mix", scaling.SAFE)
    assert sim.ok(r) and r["killed"] == []
    assert sum(j.get("evictions", 0) for j in r["jobs"]) >= 1, "a gang stuck behind slurmd is evicted and retried"
    share = r["contention"]["share"]
    assert share["slurm"] + share["kubernetes"] == pytest.approx(1.0, abs=0.002)
    assert 0.2 < share["kubernetes"] < 0.5


def test_starvation_both_sides_progress_but_the_split_is_not_guaranteed():
    safe, seed = result("starvation", scaling.SAFE), result("starvation", scaling.SEED)
    assert sim.ok(safe) and sim.ok(seed)
    # Both sides get GPU time while both wait, but nothing reserves AI a share (aiGuaranteedGpus 0):
    # under the safe policy Slurm holds about four fifths.
    assert 0.1 < safe["contention"]["share"]["kubernetes"] < seed["contention"]["share"]["kubernetes"]


def test_the_kueue_switch_is_a_boolean_named_in_the_problem_line():
    assert scenario.parse({"duration": 10}).kueue is True
    with pytest.raises(scenario.ScenarioError) as error:
        scenario.parse({"duration": 10, "kueue": "on"})
    assert error.value.problems == ['kueue: "on" is not allowed; expected true or false']


def test_pending_gpus_counts_what_waits_in_each_cluster_queue():
    """B's scaler reads this as kueue_cluster_queue_resource_pending: only not-admitted work."""
    kueue = Kueue(Quota(nominal=2, borrowing_limit=None, lendable=0), pods_ready_timeout=600.0)
    kube = Kubernetes(gpus=2, cold=False)
    fits = kube.submit("fits", "job", 2, 100.0, 0.0, suspended=True)
    waits = kube.submit("waits", "pytorchjob", 3, 100.0, 0.0, suspended=True)
    kueue.add(fits, 2, 0.0)
    kueue.add(waits, 3, 1.0)
    assert kueue.pending_gpus(AI_CLUSTER_QUEUE) == 5
    kueue.step(kube, 2.0)
    assert kueue.pending_gpus(AI_CLUSTER_QUEUE) == 3
    assert kueue.pending_gpus(HPC_CLUSTER_QUEUE) == 0

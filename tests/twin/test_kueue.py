"""Kueue in the twin: the queues from the program's own objects, slurmd pods as 1-GPU workloads,
whole-gang admission, within-nominal before borrowing, waitForPodsReady, Kueue down, and issue
11's scenarios (modelled)."""

import functools
from pathlib import Path

import pytest
import yaml

from components import kueue as program_kueue
from components import slurmd_scaling as scaling
from core import settings
from core.names import (
    AI_CLUSTER_QUEUE,
    HPC_CLUSTER_QUEUE,
    GpuShares,
    slurmd_queue_labels,
)
from stacks import offline
from tests.twin import runs
from twin import kube, program, scenario, sim
from twin.kueue import Kueue

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
# Issue 11's "Done when": these complete with nothing killed under the default policy.
ISSUE_11 = ("gang-deadlock", "heavy-mix", "starvation", "busy-hour", "both-full", "kueue-down")
# Under contention each side's share of the GPU time, with the default even split.
SHARE_BOUND = (0.4, 0.6)


def dev(*overrides: str) -> settings.Settings:
    return offline.stack_settings("dev", list(overrides))


@functools.cache
def result(name: str, *overrides: str, kueue: bool = True, policy: str = scaling.DEFAULT_POLICY) -> dict:
    data = yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text())
    # the session's cache (tests/twin/runs.py): several modules run these scenarios on this setup
    return runs.result(program.setup(dev(*overrides), policy), scenario.parse({**data, "kueue": kueue}))


def kueue_for(gpus: int, ai: int, ai_borrows: bool = True, hpc_borrows: bool = False) -> Kueue:
    objects = program_kueue.objects(GpuShares(gpus, ai, ai_borrows, False, hpc_borrows))
    return Kueue.from_program(objects, program_kueue.manager_config("0.19.2"))


def slurmd_pod(cluster: kube.Kubernetes, q: Kueue, ordinal: int, now: float) -> kube.Pod:
    pod = cluster.create_pod(
        kube.Pod(f"slurm-worker-slinky-{ordinal}", kube.SLURMD, f"slinky-{ordinal}", "slurmd", now)
    )
    q.add_pod(pod, slurmd_queue_labels(), 1, now)
    return pod


@pytest.mark.parametrize(
    ("ai", "ai_borrows", "hpc_borrows", "ai_max", "hpc_max"),
    [
        (2, True, False, 4, 2),
        (1, False, False, 1, 3),
        (2, True, True, 4, 4),
        (0, True, False, 4, 4),
        (3, False, True, 3, 4),
    ],
)
def test_each_side_reaches_its_share_plus_what_the_other_lends(ai, ai_borrows, hpc_borrows, ai_max, hpc_max):
    q = kueue_for(4, ai, ai_borrows, hpc_borrows)
    assert (q.available(AI_CLUSTER_QUEUE), q.available(HPC_CLUSTER_QUEUE)) == (ai_max, hpc_max)
    shares = GpuShares(4, ai, ai_borrows, False, hpc_borrows)
    assert (shares.ai_max_gpus, shares.hpc_max_gpus) == (ai_max, hpc_max)  # plan prints the same caps


def test_a_gang_is_admitted_whole_or_not_and_later_jobs_wait_behind_the_head():
    cluster, q = kube.Kubernetes(gpus=4, cold=False), kueue_for(4, 2)
    for name, replicas in (("big", 3), ("pair", 2), ("one", 1)):
        q.add(cluster.submit(name, "pytorchjob", replicas, 60, 0.0, suspended=True), replicas, 0.0)
    assert all(not j.pods for j in cluster.jobs), "suspended jobs have no pods"
    q.step(cluster, 0.0)
    pods = {j.name: len(j.pods) for j in cluster.jobs}
    assert pods == {"big": 3, "pair": 0, "one": 0}, "StrictFIFO holds the free GPU for the pair at the head"
    assert q.pods_ready_timeout == 600  # the program's waitForPodsReady.timeout, 10m


def test_slurmd_pods_are_gated_until_admitted_and_capped_at_hpcs_share():
    cluster, q = kube.Kubernetes(gpus=4, cold=False), kueue_for(4, 2)
    pods = [slurmd_pod(cluster, q, i, 0.0) for i in range(3)]
    assert all(p.gated for p in pods)
    cluster.step(0.0)
    assert all(p.gpu is None for p in pods), "kube-scheduler leaves a gated pod alone"
    q.step(cluster, 1.0)
    cluster.step(1.0)
    assert [p.gated for p in pods] == [False, False, True]  # HPC's 2; AI's share is never lent
    assert [p.gpu is not None for p in pods] == [True, True, False]
    assert q.pending_gpus(HPC_CLUSTER_QUEUE) == 1


def test_a_borrowed_gpu_goes_back_to_the_side_whose_share_it_is():
    """AI borrowed HPC's idle share; once that job ends, the waiting slurmd pod (within HPC's
    nominal quota) is admitted before an older AI job that would borrow again."""
    cluster, q = kube.Kubernetes(gpus=4, cold=False), kueue_for(4, 2)
    big = cluster.submit("big", "job", 4, 100, 0.0, suspended=True)
    q.add(big, 4, 0.0)
    q.step(cluster, 0.0)
    assert len(big.pods) == 4  # all four: two of them borrowed from HPC
    late = cluster.submit("late", "job", 4, 100, 5.0, suspended=True)
    q.add(late, 4, 5.0)  # older than the pod, but it would borrow
    pods = [slurmd_pod(cluster, q, 0, 10.0)]
    t = 0.0
    while any(p.gated for p in pods):
        t += 1
        cluster.step(t)
        q.step(cluster, t)
    assert t > 100 and not late.pods, "HPC's own share first: the borrower waits"
    assert q.pending_gpus(AI_CLUSTER_QUEUE) == 4


def test_a_slurmd_pod_never_ready_is_deleted_and_a_ready_one_is_never_evicted():
    """waitForPodsReady.timeout evicts a workload not Ready in 10 min; for a slurmd pod that is
    one that never ran, so no Slurm job dies. recoveryTimeout 0s: a pod once Ready stays."""
    cluster, q = kube.Kubernetes(gpus=2, cold=False, container_start=900.0), kueue_for(2, 1)
    stuck = slurmd_pod(cluster, q, 0, 0.0)
    for t in range(0, 700):
        q.step(cluster, float(t))
        cluster.step(float(t))
    assert stuck.terminating_at == 600.0 and q.pod_evictions == 1
    cluster, q = kube.Kubernetes(gpus=2, cold=False), kueue_for(2, 1)
    fine = slurmd_pod(cluster, q, 0, 0.0)
    for t in range(0, 2000):
        if t == 1000:
            fine.running_at = None  # readiness flaps: no longer Running
        q.step(cluster, float(t))
        cluster.step(float(t))
    assert fine.terminating_at is None and q.pod_evictions == 0


def test_an_admitted_job_stuck_behind_a_pod_outside_kueue_is_evicted_and_requeued_with_backoff():
    cluster, q = kube.Kubernetes(gpus=1, cold=False), kueue_for(1, 1)
    cluster.create_pod(kube.Pod("unlabelled-0", kube.KUBERNETES, "unlabelled", "job", 0.0))
    cluster.step(0.0)  # a pod without the queue label holds the only GPU
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


def test_while_kueue_is_down_nothing_is_admitted_and_an_ended_pod_stays_counted():
    cluster, q = kube.Kubernetes(gpus=2, cold=False), kueue_for(2, 1)
    pod = slurmd_pod(cluster, q, 0, 0.0)
    q.step(cluster, 0.0)
    cluster.step(0.0)
    job = cluster.submit("ai", "job", 2, 60, 1.0, suspended=True)
    q.add(job, 2, 1.0)
    cluster.delete(pod, 10.0)
    for t in range(10, 60):
        cluster.step(float(t))
        q.step(cluster, float(t), up=False)
    assert pod.gone_at is not None and pod.gpu is not None  # its containers stopped: the GPU is idle
    assert q.usage(HPC_CLUSTER_QUEUE) == 1 and not job.pods, "the finalizer keeps its quota: no second owner"
    q.step(cluster, 60.0)
    assert q.usage(HPC_CLUSTER_QUEUE) == 0 and len(job.pods) == 2


def test_pending_gpus_counts_what_waits_in_each_cluster_queue():
    """B's scaler reads this as kueue_cluster_queue_resource_pending: only not-admitted work."""
    cluster, q = kube.Kubernetes(gpus=4, cold=False), kueue_for(4, 2, ai_borrows=False)
    for name, gpus, at in (("fits", 2, 0.0), ("waits", 3, 1.0)):
        q.add(cluster.submit(name, "job", gpus, 100.0, at, suspended=True), gpus, at)
    for i in range(3):
        slurmd_pod(cluster, q, i, 2.0)
    assert (q.pending_gpus(AI_CLUSTER_QUEUE), q.pending_gpus(HPC_CLUSTER_QUEUE)) == (5, 3)
    q.step(cluster, 3.0)
    assert (q.pending_gpus(AI_CLUSTER_QUEUE), q.pending_gpus(HPC_CLUSTER_QUEUE)) == (3, 1)


@pytest.mark.parametrize("name", ISSUE_11)
def test_issue_11_scenarios_complete_with_nothing_killed_and_one_owner_per_gpu(name):
    r = result(name)
    assert r["slurmd_in_kueue"] and r["killed"] == [] and r["unfinished"] == []
    assert all(j["outcome"] == "completed" for j in r["jobs"]), [j for j in r["jobs"] if j["outcome"] != "completed"]
    assert r["double_held"] == [], "no GPU had a slurmd pod and a Kubernetes pod at one tick"
    assert r["kueue_pod_evictions"] == 0 and sim.ok(r)


# A guaranteed share lost in a gap, at the start: AI's jobs, submitted with Slurm's, are admitted
# onto HPC's idle half at once, and slurmd's first pods come a scrape, a KEDA poll and an HPA sync
# later (45 s at the default phase set). Nothing is preempted, so HPC gets its half back when those
# jobs end, within its bound, but these contentions last only a few AI runs: under lend-and-reclaim
# Slurm gets 33 % in both-full and 17 % in heavy-mix on Slinky 1.0.5, the default (heavy-mix stays
# at 17 % on 1.0.0). Under fair-share, the default policy, the controller gives HPC, behind, the
# quota for what waits: both-full holds the band (56 % on either release, plans included). With
# the loops aligned on the submissions' tick, the pods came first and hid it. Strict: if the band
# holds, docs/handoff.md's figures are stale.
LOST_IN_A_GAP = pytest.mark.xfail(strict=True, reason="HPC's idle half is lent before slurmd's first pods exist")
# heavy-mix under fair-share overshoots the other way: HPC, behind at the start, gets its turn,
# its queue lends nothing meanwhile (components/fair_share.py lending_limit), and the contention (a
# few AI runs) ends before AI's turn evens it out: Slurm gets 61 % (17 % while HPC's queue still
# lent on its turn). Strict, as above.
TOO_SHORT_TO_EVEN_OUT = pytest.mark.xfail(strict=True, reason="HPC's turn outlasts a contention of a few AI runs")
# On 1.0.0 too since the twin's Slurm plans as sched/backfill does (twin/slurm.py): both-full's
# Slurm jobs alternate 1 and 2 nodes with no --time, so each 2-node job is planned at the 1-node
# job's 60 min MaxTime and the other node of HPC's half idles for it until that job ends (10 min):
# 23 min of a GPU held for plans, and Slurm gets 33 % (42 % with greedy starts). The real
# slurmctld 26.05.5 keeps an idle node so (tests/engines/test_slurm_states.py). Strict, as above.
HELD_FOR_A_PLAN = pytest.mark.xfail(strict=True, reason="HPC's idle node is held for a 2-node job's backfill plan")


@pytest.mark.parametrize(
    "name, overrides, policy",
    [
        ("starvation", (), scaling.DEFAULT_POLICY),
        pytest.param("starvation", (), scaling.LEND_RECLAIM, marks=pytest.mark.slow),
        ("both-full", (), scaling.DEFAULT_POLICY),
        ("both-full", ("slinkyVersion=1.0.0",), scaling.DEFAULT_POLICY),
        pytest.param("both-full", (), scaling.LEND_RECLAIM, marks=[LOST_IN_A_GAP, pytest.mark.slow]),
        pytest.param(
            "both-full", ("slinkyVersion=1.0.0",), scaling.LEND_RECLAIM, marks=[HELD_FOR_A_PLAN, pytest.mark.slow]
        ),
        pytest.param("heavy-mix", (), scaling.DEFAULT_POLICY, marks=TOO_SHORT_TO_EVEN_OUT),
        pytest.param("heavy-mix", (), scaling.LEND_RECLAIM, marks=[LOST_IN_A_GAP, pytest.mark.slow]),
    ],  # the default policy in the fast set; lend-and-reclaim with the slow sweeps, which run every policy
)
def test_neither_side_starves_under_contention(name, overrides, policy):
    share = result(name, *overrides, policy=policy)["contention"]["share"]
    low, high = SHARE_BOUND
    assert low <= share["slurm"] <= high and low <= share["kubernetes"] <= high, share


@pytest.mark.parametrize("name", ["both-full"])
def test_hpcs_half_lent_at_the_start_comes_back_when_the_borrowing_jobs_end_within_its_bound(name):
    r = result(name)
    first = min((j for j in r["jobs"] if j["kind"] == "slurm"), key=lambda j: j["started"])
    assert first["started"] >= min(j["finished"] for j in r["jobs"] if j["kind"] != "slurm"), "it waited for AI's"
    s = dev()
    bound = scaling.reclaim_bounds(
        s.slurm_metrics_interval_seconds, s.keda_polling_seconds, s.slurm_job_max_minutes, s.ai_job_max_minutes
    ).hpc_share_back_s
    assert first["started"] - first["submitted"] <= bound and sim.ok(r), first


def test_a_side_that_wants_less_than_its_share_gets_it_within_the_reclaim_bound():
    """busy-hour: AI asks for less than half the GPU time, so Slurm keeps more under contention
    (lending: more than with hpcBorrowsAiGpus false), and each AI job starts within the bound on AI's share
    coming back."""
    r = result("busy-hour")
    kept = result("busy-hour", "hpcBorrowsAiGpus=false")["contention"]["share"]["slurm"]
    assert r["contention"]["share"]["slurm"] > kept and sim.ok(r)  # 0.65 against 0.53 at phase set 0
    s = dev()
    bound = scaling.reclaim_bounds(
        s.slurm_metrics_interval_seconds, s.keda_polling_seconds, s.slurm_job_max_minutes, s.ai_job_max_minutes
    ).ai_share_back_s
    waits = [j["started"] - j["submitted"] for j in r["jobs"] if j["kind"] != "slurm"]
    assert waits and max(waits) <= bound, waits


def test_the_gang_deadlock_happens_without_kueue_and_not_with_it():
    without = result("gang-deadlock", kueue=False)
    assert without["unfinished"] == ["p", "b"] and not without["slurmd_in_kueue"]
    jobs = {j["name"]: j for j in result("gang-deadlock")["jobs"]}
    # the gang is admitted only once Kueue's quota (which counts the slurmd pods) has 4 GPUs free; first in
    # line (submitted before b), it has them reserved: slurmd drains and b waits behind it
    assert jobs["a"]["finished"] <= jobs["p"]["admitted"] < jobs["a"]["finished"] + 60 and jobs["p"]["evictions"] == 0
    assert jobs["b"]["started"] >= jobs["p"]["finished"]


def test_lending_without_reclaim_would_cost_ai_its_guarantee():
    """Why lending needs the reclaim rule: under `safe` a slurmd pod keeps a borrowed GPU as long as
    Slurm has work for it (nothing preempts it), so AI's share drops below its half; lend-and-reclaim
    drains it back."""
    without_reclaim = result("both-full", policy=scaling.SAFE)["contention"]["share"]["kubernetes"]
    assert without_reclaim < SHARE_BOUND[0] <= result("both-full")["contention"]["share"]["kubernetes"]
    # and a Slurm job wider than HPC's share runs only when HPC may borrow
    narrow = result("every-job-kind", "hpcBorrowsAiGpus=false")
    assert next(j for j in narrow["jobs"] if j["name"] == "b")["outcome"] == "refused"
    assert next(j for j in result("every-job-kind")["jobs"] if j["name"] == "b")["outcome"] == "completed"


def test_kueue_down_keeps_running_work_and_waits_for_new_pods():
    r = result("kueue-down")
    jobs = {j["name"]: j for j in r["jobs"]}
    assert jobs["a"]["started"] < 300 and jobs["a"]["finished"] == pytest.approx(jobs["a"]["started"] + 1500, abs=1)
    assert jobs["b"]["started"] >= 1200, "b's second slurmd pod is refused until Kueue is back"
    assert jobs["k"]["admitted"] >= 1200, "k's create is refused while Kueue is down, then submitted again"


def test_the_kueue_switch_is_a_boolean_named_in_the_problem_line():
    assert scenario.parse({"duration": 10}).kueue is True
    with pytest.raises(scenario.ScenarioError) as error:
        scenario.parse({"duration": 10, "kueue": "on"})
    assert error.value.problems == ['kueue: "on" is not allowed; expected true or false']
    parsed = scenario.parse({"duration": 10, "faults": [{"kind": "kueue-down", "start": 1, "end": 5}]})
    assert parsed.fault_active("kueue-down", 1.0) and not parsed.fault_active("kueue-down", 5.0)

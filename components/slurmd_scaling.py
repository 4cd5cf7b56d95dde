"""How many slurmd pods KEDA asks for: the rule as a pure function, and the trigger set that
implements it in PromQL. The hand-off twin (`twin/`) runs these very triggers under faults.

Rule (policy "safe", the base of the others): replicas = nodes busy now (ALLOCATED or MIXED) + what the
*runnable* pending work needs, at least the largest such job's node count and at least one
node per such job; capped at maxReplicaCount; 0 (after the cooldown) with nothing busy or
runnable. On top of that:

* Held jobs never count: `jobs_pending - jobs_hold` and `jobs_max_job_nodes_nohold`
  (SchedMD/slurm@slurm-25-11-0-1:src/slurmctld/statistics.c counts held jobs in jobs_pending).
* Work that stays pending next to enough idle nodes for STALL_SECONDS is not runnable
  (a dependency, a begin time, a throttled array: Slurm would have started it); that much
  pending work stops counting for STALL_MEMORY_SECONDS, so the idle nodes go back. An idle node
  is one Slurm may start a job on: IDLE minus DRAINED, never below 0. The NodeSet drains a node
  before every scale-in, and a drained node that runs nothing still reads IDLE; counting it would
  call work stalled that only waits for a node. A down node with the drain flag is DRAINED but not
  IDLE, so the difference can undercount idle nodes while one is going: work is then called
  runnable, never the other way round.
* Pending work in every partition the NodeSet serves counts (the default partition `all`
  and the NodeSet's own); busy nodes are read from the NodeSet's partition only (every node
  is in both).
* `max()` over each partition's series, never `sum()`: a target scraped twice is one.
* A job's node count is what the metric reads, and 25.11 has no pending-GPU metric: slurmctld's
  job_submit.lua (components/job_submit.lua, installed by components/slinky.py) gives a job sized
  only in GPUs one node per GPU at submit, or refuses it when that exceeds MaxNodes.
* No `or vector(0)` on Slurm metrics and `ignoreNullValues: "false"`: 25.11 emits every
  partition metric, zeros included (src/plugins/metrics/openmetrics/openmetrics.c), so an
  empty result means the scrape target is gone. That is a trigger error, and with no
  `fallback` KEDA leaves the scale alone (kedacore/keda@v2.20.2:pkg/scaling/executor/
  scale_scaledobjects.go) and the HPA does not scale down on an invalid metric
  (kubernetes/kubernetes@v1.34.0:pkg/controller/podautoscaler/horizontal.go
  computeReplicasForMetrics): a metrics outage freezes the scale (policies safe and demand-aware;
  lend-and-reclaim reads the loss instead, below).
* While slurmrestd has no available replica, a fourth trigger asks for every slurmd pod that
  exists: the operator then has no Slurm client, `IsNodeDrained` says true and victims are
  picked by ordinal, so a scale-in would delete busy pods
  (SlinkyProject/slurm-operator@v1.0.0:internal/controller/slurmclient/slurmclient_sync.go,
  internal/controller/nodeset/slurmcontrol/slurmcontrol.go, nodeset/utils/sort.go).

Policy "demand-aware" keeps every trigger of "safe" and adds who waits for a GPU:
replicas = the safe rule's demand, and, only while no Kubernetes GPU work waits, at least
min(nodes busy at some point in the last kedaCooldownSeconds, slurmd pods that exist). Warmth
lives in the query, so KEDA's cooldownPeriod and the HPA's scale-down window are 0: with AI
waiting, the last job's GPU goes back one scrape plus one poll after it ends; with nobody
waiting, slurmd stays for the cooldown as under "safe".

* Waiting AI work is invisible to kube-state-metrics while Kueue keeps it suspended (no pods):
  Kueue's `kueue_cluster_queue_resource_pending{cluster_queue="ai",resource="nvidia.com/gpu"}`
  (kubernetes-sigs/kueue@v0.19.2:pkg/metrics/metrics.go, reported by pkg/cache/queue/metrics.go
  only with the manager's `metrics.enableClusterQueueResources`) sees it. An admitted job whose
  pods still wait at kube-scheduler (for a GPU Kueue's quota does not count: an unlabelled GPU
  pod, or slurmd with the NodeSet left outside Kueue) is seen by
  kube-state-metrics' `kube_pod_status_unschedulable` (PodScheduled False; kubernetes/
  kube-state-metrics internal/store/pod.go) in the jobs' namespace. Both `or vector(0)`: a Kueue
  or kube-state-metrics outage reads as "nobody waits" (warmth as today), never as a freeze.
* Oscillation: warmth never adds a pod (the min() with the pods that exist) and stays off for
  AI_WAIT_MEMORY_SECONDS after anyone last waited, longer than one kube-state-metrics scrape
  plus a pod's termination. So Slurm does not take a GPU back the moment the AI job is admitted
  (pending drops to 0) and before its pods run. Only new Slurm work (pending) scales out.
  With slurmd pods under Kueue too, a pod created while AI holds the quota waits gated; the
  guard does not depend on that.
* The formula runs in KEDA 2.20.2 (`advanced.scalingModifiers`, expr-lang/expr v1.17.8, whose
  builtins include variadic `max`/`min` and `?:`; kedacore/keda@v2.20.2:pkg/scaling/modifiers/
  formula.go; 2.16.1 ran expr v1.16.9 the same way): trigger names are its variables, so they are
  identifiers, and its result must be a float64 (2.20 no longer converts an int). Any trigger error makes
  the composite metric an error for the HPA and the ScaledObject inactive-with-error for KEDA
  (pkg/scaling/scale_handler.go GetScaledObjectMetrics, getScaledObjectState): the freeze holds.

Policy "lend-and-reclaim" is demand-aware's wish capped at the GPUs AI does not claim
(`ai_claim`: what AI holds and what waits in Kueue, up to its share, or every GPU once an AI
job has waited RESERVE_AFTER_SECONDS although AI held less than its share). Above the cap the
NodeSet drains and releases pods as their Slurm jobs end: nothing is killed. A multi-node job's
nodes are asked for only when they all fit under the cap. The bounds are `reclaim_bounds`.

One input lost (`outage_bounds`, docs/handoff.md "One input lost"): Kueue's usage reads as AI's
guaranteed share, so slurmd stays within HPC's share and what was drained for AI stays drained.
slurmctld's metrics lost: the Slurm triggers read 0, `slurm_metrics` says they are gone, and the
formula asks for the pods that exist under the same cap, adding none. That is safe as scale-in is
drain-first: the NodeSet deletes a running pod only once its Slurm client reads the node drained
and idle, and with slurmctld unreachable every sync fails at its first step, RefreshNodeCache,
whose list fails, so nothing is drained or deleted (SlinkyProject/slurm-operator@v1.0.5:
internal/controller/nodeset/nodeset_sync.go sync, processCondemned; slurmcontrol/slurmcontrol.go
RefreshNodeCache, IsNodeDrained; SlinkyProject/slurm-client@v1.0.5:pkg/client/informer.go List).
Without a client the restapi-down hold keeps every pod; kube-state-metrics lost, that trigger
errs and the scale freezes. The runnable-jobs exporter lost (or slurmrestd, which it reads): the
runnable counts fall back to slurmctld's and the stall term, whose memory may hide work that
became runnable for up to STALL_MEMORY_SECONDS; the fair-share controller reads the same counts
and, not knowing the job first in line, makes no reservation for HPC's wide one meanwhile.

Policy "fair-share" (the default) is lend-and-reclaim whose cap follows AI's nominalQuota as
Kueue reports it (trigger `ai_quota`), which the fair-share controller moves toward the side
behind its share of the contended GPU time (components/fair_share.py; the program deploys it,
components/fair_share_controller.py); AI reserves every GPU for a job first in line only while
its quota is above its guaranteed share. "lend-and-reclaim", the default before it, stays
selectable in the twin for comparison.

Policies "previous" (busy + max(largest, pending) on `all`, `sum()` and `or vector(0)`) and
"reference-triggers" (the reference testbed's three triggers: jobs pending, nodes allocated, the
largest pending job) stay selectable for comparison in the twin, with
"safe" as the one before "demand-aware".

HPA arithmetic: each trigger (or the composite metric) is an External metric with metricType
AverageValue and threshold "1", for which the HPA wants ceil(value / 1) = value replicas; with
several triggers it takes the largest. KEDA is active while any trigger's value (the formula's)
exceeds activationThreshold 0; inactive for cooldownPeriod, it scales to idleReplicaCount 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from components.runnable_jobs import RUNNABLE_FIRST_JOB_NODES, RUNNABLE_JOBS, RUNNABLE_MAX_JOB_NODES
from core.names import (
    AI_CLUSTER_QUEUE,
    GPU_RESOURCE,
    HPC_CLUSTER_QUEUE,
    JOBS_NAMESPACE,
    SLURM_METRICS_INTERVAL_SECONDS,
    Names,
)

# Slurm 25.11 openmetrics (SchedMD/slurm@slurm-25-11-0-1 src/plugins/metrics/openmetrics/openmetrics.c),
# served by slurmctld at /metrics/partitions, label `partition`.
NODES_ALLOC = "slurm_partition_nodes_alloc"
NODES_MIXED = "slurm_partition_nodes_mixed"
NODES_IDLE = "slurm_partition_nodes_idle"
# IDLE counts a drained node that runs nothing; DRAINED counts it too, and a down node with the
# drain flag (src/slurmctld/statistics.c IS_NODE_DRAINED; seen on the real slurmctld, tests/engines).
NODES_DRAINED = "slurm_partition_nodes_drained"
PENDING_JOBS = "slurm_partition_jobs_pending"
HELD_JOBS = "slurm_partition_jobs_hold"
# MAX(max_nodes, min_nodes) over pending, not held, jobs (src/slurmctld/statistics.c).
LARGEST_PENDING_JOB_NODES = "slurm_partition_jobs_max_job_nodes_nohold"
BUSY_NODE_METRICS = (NODES_ALLOC, NODES_MIXED)
# kube-state-metrics (in kube-prometheus-stack): the restapi Deployment and the NodeSet's pods.
RESTAPI_AVAILABLE = "kube_deployment_status_replicas_available"
POD_INFO = "kube_pod_info"
POD_UNSCHEDULABLE = "kube_pod_status_unschedulable"
# Kueue 0.19.2 (pkg/metrics/metrics.go), labels cluster_queue, resource, replica_role; both reported
# only with the manager's metrics.enableClusterQueueResources (components/kueue.py sets it).
KUEUE_PENDING = "kueue_cluster_queue_resource_pending"
KUEUE_USAGE = "kueue_cluster_queue_resource_usage"  # what the queue's admitted workloads hold
KUEUE_NOMINAL = "kueue_cluster_queue_nominal_quota"  # the queue's nominalQuota (pkg/metrics/metrics.go)

LEND_RECLAIM, DEMAND_AWARE, SAFE, PREVIOUS, REFERENCE, FAIR_SHARE = (
    "lend-and-reclaim",
    "demand-aware",
    "safe",
    "previous",
    "reference-triggers",
    "fair-share",
)
POLICIES = (FAIR_SHARE, LEND_RECLAIM, DEMAND_AWARE, SAFE, PREVIOUS, REFERENCE)
DEFAULT_POLICY = FAIR_SHARE
# Policies that count held/stalled work, every partition, and refuse jobs that can never fit.
GUARDED_POLICIES = (LEND_RECLAIM, DEMAND_AWARE, SAFE, FAIR_SHARE)
# Policies whose triggers a KEDA scalingModifiers formula combines.
FORMULA_POLICIES = (LEND_RECLAIM, DEMAND_AWARE, FAIR_SHARE)
# Policies whose cap follows AI's nominalQuota as Kueue reports it, which the fair-share controller
# (components/fair_share.py) moves; lend-and-reclaim's cap uses the program's fixed split.
QUOTA_POLICIES = (FAIR_SHARE,)

# Slurm's main scheduler runs at least every sched_interval (60 s, SchedMD/slurm@slurm-25-11-0-1:
# doc/man/man5/slurm.conf.5) and on every submit: two cycles with idle nodes and no start is a stall.
STALL_SECONDS = 120
STALL_MEMORY_SECONDS = 1800  # how long work found stalled stays discounted
# Warmth stays off this long after AI work last waited: one 30 s kube-state-metrics scrape, a
# slurmd pod's termination and the next scrape, with margin (see "Oscillation" above).
AI_WAIT_MEMORY_SECONDS = 120
# An AI job first in line: it has waited this long although AI held less than its share, so what
# it waits for is more than AI's share can give (a gang, or the head of the StrictFIFO queue
# `ai`). Four Kueue scrapes: Kueue admits what fits within seconds of a GPU coming free.
RESERVE_AFTER_SECONDS = 120


# kube-controller-manager's --horizontal-pod-autoscaler-sync-period default (kubernetes/kubernetes@
# v1.34.0: pkg/controller/podautoscaler/config/v1alpha1/defaults.go) and a pod's default
# terminationGracePeriodSeconds (the slurm chart 1.0 sets none for slurmd): the most a slurmd pod's
# termination takes, all of it before 1.0.5, whose logfile sidecar ignored SIGTERM (twin/kube.py).
HPA_SYNC_SECONDS = 15
POD_TERMINATION_SECONDS = 30
# slurmctld ends a job past its limit in job_time_limit, run every PERIODIC_TIMEOUT (30 s), then
# waits KillWait (30 s, slurm.conf's default; the program sets none) before SIGKILL
# (SchedMD/slurm@slurm-25-11-6-1: src/slurmctld/slurmctld.h, job_mgr.c; doc/man/man5/slurm.conf.5).
SLURM_LIMIT_CHECK_SECONDS = 30
SLURM_KILL_WAIT_SECONDS = 30


@dataclass(frozen=True)
class ReclaimBounds:
    """The stated bounds of lend and reclaim, in seconds (docs/handoff.md; `plan` prints them)."""

    handoff_s: int  # a freed GPU reaches the waiting side: scrapes, a poll, an HPA sync, a termination
    ai_share_back_s: int  # AI waits for its share lent to Slurm: the drained node's job ends
    hpc_share_back_s: int  # HPC waits for its share lent to AI: the borrowing job ends
    ai_gang_start_s: int  # an AI job first in line (a gang wider than what is free) starts
    # Slurm work that becomes runnable (its --begin comes, a dependency is met, a hold is released)
    # gets a GPU free to Slurm: the runnable-jobs exporter counts it at its next scrape, a hand-off.
    runnable_start_s: int


def slurm_run_bound_s(slurm_job_max_minutes: int) -> int:
    """The longest a Slurm job runs: its MaxTime, then up to one limit check and KillWait."""
    return 60 * slurm_job_max_minutes + SLURM_LIMIT_CHECK_SECONDS + SLURM_KILL_WAIT_SECONDS


def reclaim_bounds(
    scrape_seconds: int, polling_seconds: int, slurm_job_max_minutes: int, ai_job_max_minutes: int
) -> ReclaimBounds:
    """Each wait is a run limit the engines enforce (Slurm's MaxTime, Kueue's max-exec-time) plus
    the hand-off's own latency: two scrapes (the end, then the metric that reflects it), one KEDA
    poll, one HPA sync and one pod termination. A Slurm job ends up to one limit check and KillWait
    after its MaxTime; Kueue deactivates a workload at its limit, and the termination above covers
    its pods' grace period. The gang first waits RESERVE_AFTER_SECONDS to be known as first in line,
    then for whichever ends last: AI's running jobs or the Slurm jobs on the nodes it needs."""
    handoff = 2 * scrape_seconds + polling_seconds + HPA_SYNC_SECONDS + POD_TERMINATION_SECONDS
    slurm = slurm_run_bound_s(slurm_job_max_minutes)
    ai = 60 * ai_job_max_minutes
    return ReclaimBounds(
        handoff_s=handoff,
        ai_share_back_s=slurm + handoff,
        hpc_share_back_s=ai + handoff,
        ai_gang_start_s=RESERVE_AFTER_SECONDS + max(slurm, ai) + handoff,
        runnable_start_s=handoff,
    )


def stack_reclaim_bounds(n: Names) -> ReclaimBounds:
    """`reclaim_bounds` for one stack: its scrape interval, KEDA poll and the two run limits."""
    return reclaim_bounds(n.metrics_interval_seconds, n.polling_seconds, n.slurm_job_max_minutes, n.ai_job_max_minutes)


def bounds_lines(b: ReclaimBounds, slurm_job_max_minutes: int, ai_job_max_minutes: int) -> list[str]:
    """The bounds in words, as `plan` prints them, then under one lost input (`outage_lines`)."""
    return [
        "lend and reclaim (the rule fair-share keeps; these bounds at the guaranteed split): either side uses "
        "the other's idle GPUs; nothing is killed",
        f"  AI gets its share back within {_minutes(b.ai_share_back_s)}: slurmd's borrowed nodes are drained and go "
        f"when their Slurm job ends (slurmJobMaxMinutes {slurm_job_max_minutes})",
        f"  HPC gets its share back within {_minutes(b.hpc_share_back_s)}: an AI job on it ends by its limit "
        f"(aiJobMaxMinutes {ai_job_max_minutes}), then Kueue admits the waiting slurmd pods first",
        f"  an AI job first in line (wider than what is free) starts within {_minutes(b.ai_gang_start_s)}",
        f"  a freed GPU reaches waiting work within {b.handoff_s} s (two scrapes, a poll, an HPA sync, a termination)",
        f"  Slurm work that becomes runnable (its --begin, a dependency met, a hold released) gets a GPU free to "
        f"Slurm within {_minutes(b.runnable_start_s)}: the runnable-jobs exporter counts it at its next scrape",
        *outage_lines(b),
    ]


AI_SHARE_BACK, AI_GANG_START, HPC_SHARE_BACK = "ai_share_back_s", "ai_gang_start_s", "hpc_share_back_s"
RUNNABLE_START = "runnable_start_s"
WAITS = (AI_SHARE_BACK, AI_GANG_START, HPC_SHARE_BACK, RUNNABLE_START)  # each row's, in the order stated


@dataclass(frozen=True)
class OutageBound:
    """The bounds of lend and reclaim while one input of the scaler is lost (docs/handoff.md, "One
    input lost"; `plan` prints them): each is its ReclaimBounds value, plus the outage's length for
    the waits in `plus_outage` (those the scaler cannot serve until the input is back)."""

    lost: str  # the input
    alert: str  # the alert that names it
    scaler: str  # what the scaler does meanwhile
    ai_share_back_s: int
    ai_gang_start_s: int
    hpc_share_back_s: int
    runnable_start_s: int
    plus_outage: tuple[str, ...]  # of WAITS

    def wait(self, which: str, outage_s: float) -> float:
        """The bound on wait `which` (a field name) for an outage of `outage_s` seconds."""
        return getattr(self, which) + (outage_s if which in self.plus_outage else 0)


def outage_bounds(b: ReclaimBounds) -> tuple[OutageBound, ...]:
    """One row per lost input, under lend-and-reclaim (and fair-share, whose controller then sets
    the guaranteed split, or reads the same fallback as the scaler where the runnable-jobs exporter
    is lost). A scale-in stays drain-first in every row: the operator deletes a slurmd pod only
    once its client reads the node drained and idle, or with no client at all, which the
    restapi-down hold prevents (SlinkyProject/slurm-operator@v1.0.5: internal/controller/nodeset/
    nodeset_sync.go processCondemned, slurmcontrol/slurmcontrol.go IsNodeDrained)."""
    base = (b.ai_share_back_s, b.ai_gang_start_s, b.hpc_share_back_s, b.runnable_start_s)
    # Without the exporter's series (it, its token or slurmrestd lost) `_runnable_jobs` and
    # `_widest` read slurmctld's pending minus held jobs, less the work `_stalled_pending` found
    # pending beside enough idle nodes for STALL_SECONDS. That count is remembered for
    # STALL_MEMORY_SECONDS, after the outage too, and hides as many pending jobs: work that became
    # runnable while its pod was scaled in, or HPC work waiting for its share lent to AI. Such work
    # is counted again at most STALL_MEMORY_SECONDS plus a scrape and a subquery step after it is
    # runnable (a later stall needs idle nodes that fit the widest pending job, where Slurm starts
    # it), so each of those waits grows by the memory at most; AI's claim and the cap read Kueue only.
    fallback = (
        b.ai_share_back_s,
        b.ai_gang_start_s,
        b.hpc_share_back_s + STALL_MEMORY_SECONDS,
        b.runnable_start_s + STALL_MEMORY_SECONDS,
    )
    return (
        OutageBound(
            "slurmctld's metrics (slurmctld up)",
            METRICS_MISSING_ALERT,
            "keeps the slurmd pods it has, none added, capped at what AI claims: AI's GPUs are drained as usual",
            *base,
            (HPC_SHARE_BACK, RUNNABLE_START),  # Slurm's new work gets no pod until its demand is seen again
        ),
        OutageBound(
            "slurmctld (down: no metrics, no drain)",
            METRICS_MISSING_ALERT,
            "as above, but every NodeSet sync fails at its first step: no pod goes until slurmctld is back",
            *base,
            WAITS,
        ),
        OutageBound(
            "Kueue's metrics",
            KUEUE_METRICS_MISSING_ALERT,
            "counts AI as claiming its guaranteed share: slurmd stays within HPC's share, drained nodes stay drained",
            *base,
            # a reservation needs Kueue's pending GPUs: it forms again after the outage; Slurm work
            # beyond HPC's share waits for AI's idle GPUs to be seen again
            (AI_GANG_START, RUNNABLE_START),
        ),
        OutageBound(
            "kube-state-metrics",
            KUBE_STATE_METRICS_MISSING_ALERT,
            "freezes the scale (it cannot see whether slurmrestd is up, so it scales nothing in)",
            *base,
            WAITS,
        ),
        OutageBound(
            "slurmrestd",
            RESTAPI_DOWN_ALERT,
            "keeps every slurmd pod (without a Slurm client the operator would delete busy ones); scale-out goes "
            "on, counting Slurm's work as without the runnable-jobs exporter (below), which reads slurmrestd",
            *fallback,
            (AI_SHARE_BACK, AI_GANG_START),
        ),
        OutageBound(
            "the runnable-jobs exporter",
            RUNNABLE_JOBS_MISSING_ALERT,
            f"counts slurmctld's pending minus held jobs, less those found pending beside idle nodes for "
            f"{STALL_SECONDS} s, which stay left out for {STALL_MEMORY_SECONDS // 60} min (after the outage too); "
            "the fair-share controller reads the same counts and makes no reservation for a wide Slurm job first in line",
            *fallback,
            (),  # the fallback serves every wait meanwhile; the memory, not the outage, is what it adds
        ),
    )


def outage_lines(b: ReclaimBounds) -> list[str]:
    """The bounds under one lost input, as `plan` prints them (D: the outage's length)."""

    def said(row: OutageBound, which: str) -> str:
        value = _minutes(getattr(row, which))
        return f"D + {value}" if which in row.plus_outage else value

    lines = ["  one input lost for D s (policies lend-and-reclaim, fair-share; the alert after 2 min names it):"]
    for row in outage_bounds(b):
        lines.append(
            f"    {row.lost} ({row.alert}): the scaler {row.scaler}; AI's share back within "
            f"{said(row, AI_SHARE_BACK)}, a first-in-line AI job within {said(row, AI_GANG_START)}, "
            f"HPC's share back within {said(row, HPC_SHARE_BACK)}, work that becomes runnable within "
            f"{said(row, RUNNABLE_START)}"
        )
    return lines


def _minutes(seconds: int) -> str:
    whole, rest = divmod(seconds, 60)
    return f"{seconds} s" if seconds < 600 else f"{whole} min {rest} s" if rest else f"{whole} min"


@dataclass(frozen=True)
class Target:
    """What the triggers look at: the Slurm partitions the NodeSet serves and its Kubernetes names."""

    partitions: tuple[str, ...]  # the default partition first, then the NodeSet's own
    nodeset_partition: str
    namespace: str
    nodeset: str  # NodeSet object name (kube_pod_info created_by_name)
    restapi_deployment: str
    ai_cluster_queue: str  # Kueue ClusterQueue of the Kubernetes GPU jobs
    ai_namespace: str  # where their pods run
    gpu_resource: str  # the resource name Kueue reports pending
    scrape_seconds: int = SLURM_METRICS_INTERVAL_SECONDS  # slurmctld's scrape interval: the subquery step
    gpus_total: int = 0  # the workers' GPUs (lend-and-reclaim)
    ai_share: int = 0  # AI's guaranteed GPUs, Kueue nominalQuota of the AI queue (lend-and-reclaim)


@dataclass(frozen=True)
class PartitionMetrics:
    """One partition's 25.11 metrics, for the rule as a table."""

    nodes_alloc: int = 0
    nodes_mixed: int = 0
    nodes_idle: int = 0
    jobs_pending: int = 0
    jobs_hold: int = 0
    largest_pending_job_nodes: int = 0  # _nohold
    nodes_drained: int = 0  # idle (or down) with the drain flag


def desired_replicas(
    m: PartitionMetrics, min_replicas: int, max_replicas: int, stalled_pending: int = 0, restapi_down_pods: int = 0
) -> int:
    """The slurmd replica count KEDA + HPA settle on under the safe policy (the rule above), for one
    partition; `stalled_pending` is the pending work found stalled in the last STALL_MEMORY_SECONDS."""
    busy = m.nodes_alloc + m.nodes_mixed
    runnable = max(0, m.jobs_pending - m.jobs_hold - stalled_pending)
    largest = m.largest_pending_job_nodes if runnable > 0 else 0
    wishes = [busy + runnable, busy + largest, restapi_down_pods]
    if max(wishes) <= 0:
        return 0  # inactive: idleReplicaCount once the cooldown has passed
    return max(min_replicas, min(max_replicas, max(math.ceil(w / 1) for w in wishes)))


def demand_aware_replicas(
    m: PartitionMetrics,
    min_replicas: int,
    max_replicas: int,
    *,
    ai_waiting: bool,
    recently_busy: int,
    pods: int,
    stalled_pending: int = 0,
    restapi_down_pods: int = 0,
) -> int:
    """The demand-aware policy: the safe rule, kept warm (never grown) by the nodes busy in the last
    cooldown unless Kubernetes GPU work waits (or waited in the last AI_WAIT_MEMORY_SECONDS)."""
    demand = desired_replicas(m, min_replicas, max_replicas, stalled_pending, restapi_down_pods)
    warm = 0 if ai_waiting else min(recently_busy, pods)
    if max(demand, warm) <= 0:
        return 0
    return max(min_replicas, min(max_replicas, max(demand, warm)))


# ------------------------------------------------------------------ PromQL


def _m(metric: str, partition: str) -> str:
    # max(): one value per partition even when the target is scraped twice (labels differ by instance).
    return f'max({metric}{{partition="{partition}"}})'


def _series(metric: str, partition: str) -> str:
    return f'{metric}{{partition="{partition}"}}'


def _busy(t: Target) -> str:
    # Summed per scrape target before max(): two targets read a node moving from MIXED to ALLOCATED
    # at different moments, and max() of each metric alone would count it twice.
    p = t.nodeset_partition
    return f"max({_series(NODES_ALLOC, p)} + {_series(NODES_MIXED, p)})"


def _pending(t: Target) -> str:
    return "(" + " + ".join(_runnable_jobs(p) for p in t.partitions) + ")"


def _runnable_jobs(partition: str) -> str:
    # The exporter's runnable count (components/runnable_jobs.py), else pending minus held: with
    # the exporter's series gone (it, or slurmrestd, is down) the rule is the stall-bounded one.
    fallback = f"{_m(PENDING_JOBS, partition)} - {_m(HELD_JOBS, partition)}"
    return f"({_m(RUNNABLE_JOBS, partition)} or ({fallback}))"


def _widest(partition: str) -> str:
    """The widest runnable job's nodes: the exporter's, else slurmctld's widest not-held job."""
    return f"({_m(RUNNABLE_MAX_JOB_NODES, partition)} or {_m(LARGEST_PENDING_JOB_NODES, partition)})"


def _first_in_line(partition: str) -> str:
    """The nodes of the runnable job first in line: the exporter's; 0 while it is lost, since
    slurmctld's metrics do not say which job is first (the fair-share controller then makes no
    reservation for HPC's wide job: components/fair_share.py)."""
    return f"({_m(RUNNABLE_FIRST_JOB_NODES, partition)} or vector(0))"


def _window(t: Target, seconds: int) -> str:
    """A subquery covering the last `seconds` with a sample at both ends. Prometheus 3 windows are
    left-open, (t - range, t] (Prometheus 3 migration guide): one step more keeps the sample at
    t - seconds, as Prometheus 2's closed windows did. Measured with Prometheus 3.5.3's promtool
    (tests/components/test_slurmd_scaling.py)."""
    return f"[{seconds + t.scrape_seconds}s:{t.scrape_seconds}s]"


def _usable_idle(t: Target) -> str:
    return f"clamp_min({_m(NODES_IDLE, t.nodeset_partition)} - {_m(NODES_DRAINED, t.nodeset_partition)}, 0)"


def _stalled_pending(t: Target) -> str:
    idle = _usable_idle(t)
    fits = " * ".join(f"({idle} - {_widest(p)} >= bool 0)" for p in t.partitions)
    stalled_now = f"({_pending(t)} * {fits} * ({idle} >= bool 1))"
    return f"max_over_time(min_over_time({stalled_now}{_window(t, STALL_SECONDS)}){_window(t, STALL_MEMORY_SECONDS)})"


def _runnable(t: Target) -> str:
    return f"clamp_min({_pending(t)} - {_stalled_pending(t)}, 0)"


def _pods(t: Target) -> str:
    # No pods is a real zero (or vector(0)).
    selector = f'{POD_INFO}{{namespace="{t.namespace}", created_by_kind="NodeSet", created_by_name="{t.nodeset}"}}'
    return f"(count({selector}) or vector(0))"


def _safe_queries(t: Target, sep: str = "-") -> list[tuple[str, str]]:
    def name(*words: str) -> str:
        return sep.join(w.replace("-", sep) for w in words)

    runnable = _runnable(t)
    queries = [(name("busy-plus-runnable-jobs"), f"{_busy(t)} + {runnable}")]
    queries += [
        (name("busy-plus-largest-job", p), f"{_busy(t)} + {_widest(p)} * ({runnable} > bool 0)") for p in t.partitions
    ]
    restapi = f'max({RESTAPI_AVAILABLE}{{namespace="{t.namespace}", deployment="{t.restapi_deployment}"}})'
    # A missing restapi series is an outage (an error, a freeze).
    queries.append((name("hold-while-restapi-down"), f"{_pods(t)} * ({restapi} < bool 1)"))
    return queries


# The formula policies' extra triggers, named for the formula.
RECENTLY_BUSY, SLURMD_PODS, AI_WAITING = "recently_busy", "slurmd_pods", "ai_waiting"
AI_HELD, AI_PENDING, AI_RESERVE, BUSY = "ai_held", "ai_pending", "ai_reserve", "busy_nodes"
AI_QUOTA, AI_RESERVE_AT_SHARE = "ai_quota", "ai_reserve_at_share"
SLURM_METRICS = "slurm_metrics"  # 1 while slurmctld's partition metrics are there, else 0 (lend-and-reclaim)


def _kueue(metric: str, t: Target, lost: int = 0) -> str:
    # No Kueue series (its metrics lost) reads as `lost`: 0 for what waits, AI's share for what it
    # holds (`_ai_held_when_kueue_lost`), so the cap leaves AI its share through the outage.
    return f'(max({metric}{{cluster_queue="{t.ai_cluster_queue}", resource="{t.gpu_resource}"}}) or vector({lost}))'


def _ai_held_when_kueue_lost(t: Target) -> int:
    """What AI counts as holding while Kueue's metrics are lost: its guaranteed share. Its claim is
    then that share (held and waiting, up to the share), so slurmd stays within HPC's share and the
    nodes drained for AI stay drained; reading 0 (before issue 28) let the cap rise to every GPU and
    un-drain them for new Slurm jobs."""
    return t.ai_share


def _slurm_present(t: Target) -> str:
    # count() of one partition's series: 0 (`or vector(0)`) once the target is gone or stale.
    return f'((count({PENDING_JOBS}{{partition="{t.partitions[0]}"}}) > bool 0) or vector(0))'


def _zero_when_slurm_lost(query: str) -> str:
    """A Slurm trigger of lend-and-reclaim: 0 instead of an error when slurmctld's metrics are lost,
    so the formula still runs and takes its outage branch (`_unless_slurm_lost`) on SLURM_METRICS."""
    return f"({query}) or vector(0)"


def _unless_slurm_lost(capped: str, lost_cap: str) -> str:
    """The formula's value: the capped wish while slurmctld's metrics are there; while they are
    lost, the slurmd pods that exist capped at what AI does not claim (`lost_cap`: lend-and-reclaim's
    cap, under fair-share too). Slurm's demand is unknown, so nothing is added, and what AI claims is
    drained as usual: drain-first scale-in deletes a pod only once the operator's client reads its
    node drained and idle (see the module docstring)."""
    return f"({SLURM_METRICS} > 0 ? {capped} : min({SLURMD_PODS}, {lost_cap}))"


def _ai_quota(t: Target) -> str:
    # No Kueue series is the program's split: the controller's quota then reads as the guaranteed one.
    return f'(max({KUEUE_NOMINAL}{{cluster_queue="{t.ai_cluster_queue}", resource="{t.gpu_resource}"}}) or vector({t.ai_share}))'


def _lend_and_reclaim_queries(t: Target, warm_seconds: int, follow_quota: bool = False) -> list[tuple[str, str]]:
    held, pending = _kueue(KUEUE_USAGE, t, _ai_held_when_kueue_lost(t)), _kueue(KUEUE_PENDING, t)
    share = _ai_quota(t) if follow_quota else str(t.ai_share)
    # fair-share: AI reserves every GPU for a job first in line only on its turn, while the
    # controller has raised its quota above its guaranteed share (AI behind on GPU time).
    turn = f" * ({share} > bool {t.ai_share})" if follow_quota else ""
    first_in_line = f"(({held} < bool {share}) * ({pending} > bool 0){turn})"
    # fair-share while slurmctld's metrics are lost: lend-and-reclaim's reservation (no turn, the
    # guaranteed share). The controller then sets the split; a job first in line keeps its bound.
    at_share = f"(({held} < bool {t.ai_share}) * ({pending} > bool 0))"
    slurm = [*_demand_aware_queries(t, warm_seconds), (BUSY, _busy(t))]
    return [
        *((name, _zero_when_slurm_lost(q) if "slurm_partition_" in q else q) for name, q in slurm),
        (SLURM_METRICS, _slurm_present(t)),
        (AI_HELD, held),
        (AI_PENDING, pending),
        (AI_RESERVE, f"min_over_time({first_in_line}{_window(t, RESERVE_AFTER_SECONDS)})"),
        *(
            [(AI_QUOTA, share), (AI_RESERVE_AT_SHARE, f"min_over_time({at_share}{_window(t, RESERVE_AFTER_SECONDS)})")]
            if follow_quota
            else []
        ),
    ]


def _demand_aware_queries(t: Target, warm_seconds: int) -> list[tuple[str, str]]:
    pending = f'max({KUEUE_PENDING}{{cluster_queue="{t.ai_cluster_queue}", resource="{t.gpu_resource}"}})'
    unschedulable = f'count({POD_UNSCHEDULABLE}{{namespace="{t.ai_namespace}"}})'
    waiting = f"(({pending} or vector(0)) + ({unschedulable} or vector(0)))"
    return [
        *_safe_queries(t, "_"),
        # Empty once the Slurm target has been gone for the window; the Slurm triggers above err at once.
        (RECENTLY_BUSY, f"max_over_time({_busy(t)}{_window(t, warm_seconds)})"),
        (SLURMD_PODS, _pods(t)),
        (AI_WAITING, f"max_over_time({waiting}{_window(t, AI_WAIT_MEMORY_SECONDS)})"),
    ]


def _warmth() -> str:
    return f"({AI_WAITING} > 0 ? 0.0 : min({RECENTLY_BUSY}, {SLURMD_PODS}))"


def formula(t: Target, policy: str = DEMAND_AWARE) -> str:
    """KEDA scalingModifiers formula (expr-lang) over a formula policy's triggers.

    demand-aware: the safe demand, and warmth (never more pods than exist) only while no AI work waits.
    lend-and-reclaim: the same, capped at the GPUs AI does not claim (see `lend_and_reclaim_replicas`),
    where a multi-node job's nodes are asked for only if all of them fit under the cap; while
    slurmctld's metrics are lost, the pods that exist under the same cap; the restapi-down hold is
    never capped (a scale-in then deletes busy pods)."""
    safe = [name for name, _ in _safe_queries(t, "_")]
    if policy == DEMAND_AWARE:
        return f"max({', '.join(safe)}, {_warmth()})"
    runnable, *largest, restapi_hold = safe
    at_share = _cap_expression(t, str(float(t.ai_share)), AI_RESERVE)
    cap = _cap_expression(t, AI_QUOTA, AI_RESERVE) if policy in QUOTA_POLICIES else at_share
    # while slurmctld's metrics are lost, fair-share's cap is lend-and-reclaim's
    lost_cap = _cap_expression(t, str(float(t.ai_share)), AI_RESERVE_AT_SHARE) if policy in QUOTA_POLICIES else at_share
    # A job fits if its nodes fit under the cap (the busy ones may be among them); one that does
    # not gets no pod at all: it counts as one runnable job, whose pod would idle.
    fits = [f"({term} - {BUSY} <= {cap})" for term in largest]
    gangs = [f"({fit} ? {term} : 0.0)" for fit, term in zip(fits, largest, strict=True)]
    too_wide = " + ".join(f"({fit} ? 0.0 : 1.0)" for fit in fits)
    wanted = f"max({runnable} - ({too_wide}), {', '.join(gangs)}, {_warmth()})"
    return f"max({_unless_slurm_lost(f'min({wanted}, {cap})', lost_cap)}, {restapi_hold})"


def _cap_expression(t: Target, ai_share: str, reserve: str) -> str:
    # Float literals: min() returns the argument it picks, so an int GPU count would make the whole
    # formula an int when AI claims every GPU, and KEDA 2.20 refuses a result that is not a float64
    # (kedacore/keda@v2.20.2:pkg/scaling/modifiers/formula.go; 2.16.1 converted it). `ai_share` is
    # a float literal or a trigger's name (fair-share's quota), whose value KEDA passes as a float64.
    total = float(t.gpus_total)
    held_and_waiting = f"({AI_HELD} + {AI_PENDING})"
    claim = f"({reserve} > 0 ? min({total}, {held_and_waiting}) : min({ai_share}, {held_and_waiting}))"
    return f"({total} - {claim})"


def ai_claim(ai_held: int, ai_pending: int, ai_share: int, gpus_total: int, reserved: bool) -> int:
    """The GPUs slurmd leaves to AI under lend-and-reclaim: what AI holds and waits for, up to its
    share; once an AI job is first in line (`reserved`), up to every GPU. Counting what AI holds
    above its share would stop slurmd asking for its own share while AI borrows it: its gated pods
    are what gets it back the moment the borrowing job ends (Kueue admits within-quota work first)."""
    return min(gpus_total if reserved else ai_share, ai_held + ai_pending)


def lend_and_reclaim_replicas(
    m: PartitionMetrics,
    min_replicas: int,
    max_replicas: int,
    *,
    ai_waiting: bool,
    recently_busy: int,
    pods: int,
    ai_claim_gpus: int,
    gpus_total: int,
    stalled_pending: int = 0,
    restapi_down_pods: int = 0,
    slurm_metrics: bool = True,
) -> int:
    """The lend-and-reclaim policy as a table: the demand-aware wish (a multi-node job's nodes only
    if they all fit), capped at the GPUs AI does not claim. Above the cap, the NodeSet drains the
    pods it condemns and deletes each once its Slurm job has ended: nothing is killed. Without
    slurmctld's metrics (`slurm_metrics` False, `m` unknown) the wish is the pods that exist."""
    cap = gpus_total - ai_claim_gpus
    if not slurm_metrics:
        value = max(min(pods, cap), restapi_down_pods)
        return 0 if value <= 0 else max(min_replicas, min(max_replicas, value))
    busy = m.nodes_alloc + m.nodes_mixed
    runnable = max(0, m.jobs_pending - m.jobs_hold - stalled_pending)
    largest = m.largest_pending_job_nodes if runnable > 0 else 0
    fits = largest <= cap
    gang = busy + largest if fits else 0
    warm = 0 if ai_waiting else min(recently_busy, pods)
    wanted = min(max(busy + runnable - (0 if fits else 1), gang, warm), cap)
    value = max(wanted, restapi_down_pods)
    if value <= 0:
        return 0
    return max(min_replicas, min(max_replicas, value))


def _previous_term(aggregate: str, metric: str, partition: str) -> str:
    return f'({aggregate}({metric}{{partition="{partition}"}}) or vector(0))'


def _previous_queries(t: Target) -> list[tuple[str, str]]:
    p = t.partitions[0]
    busy = " + ".join(_previous_term("sum", m, p) for m in BUSY_NODE_METRICS)
    return [
        ("busy-plus-largest-pending-job", f"{busy} + {_previous_term('max', LARGEST_PENDING_JOB_NODES, p)}"),
        ("busy-plus-pending-jobs", f"{busy} + {_previous_term('sum', PENDING_JOBS, p)}"),
    ]


def _reference_queries(t: Target) -> list[tuple[str, str]]:
    p = t.partitions[0]
    return [
        (m.removeprefix("slurm_partition_").replace("_", "-"), f'sum({m}{{partition="{p}"}})')
        for m in (PENDING_JOBS, NODES_ALLOC, LARGEST_PENDING_JOB_NODES)
    ]


def queries(t: Target, policy: str, warm_seconds: int) -> list[tuple[str, str]]:
    """(trigger name, PromQL) for a policy; `warm_seconds` is kedaCooldownSeconds (formula policies only)."""
    if policy in (LEND_RECLAIM, FAIR_SHARE):
        return _lend_and_reclaim_queries(t, warm_seconds, follow_quota=policy in QUOTA_POLICIES)
    if policy == DEMAND_AWARE:
        return _demand_aware_queries(t, warm_seconds)
    return {SAFE: _safe_queries, PREVIOUS: _previous_queries, REFERENCE: _reference_queries}[policy](t)


METRICS_MISSING_ALERT = "SlurmMetricsMissing"
METRICS_MISSING_FOR = "2m"  # a slurmctld restart's gap is not an outage


def metrics_alert_rules(t: Target) -> dict:
    """A Prometheus rule group: the alert that fires while slurmctld's partition metrics are missing.
    A slurmctld without MetricsType answers /metrics/partitions with 200 and an empty body, so its
    target is `up` while every Slurm trigger is empty and the scale is frozen (seen on the real
    slurmctld 26.05, tests/engines); a lost target looks the same to the triggers."""
    return {
        "name": "testbed-slurm-metrics",
        "rules": [
            {
                "alert": METRICS_MISSING_ALERT,
                "expr": f'absent({PENDING_JOBS}{{partition="{t.partitions[0]}"}})',
                "for": METRICS_MISSING_FOR,
                "labels": {"severity": "critical"},
                "annotations": {
                    "summary": "slurmctld's partition metrics are missing: slurmd adds no pod, AI's GPUs still come back",
                    "description": (
                        "No slurm_partition_* series: slurmctld is down or not scraped, or it runs without "
                        "MetricsType=metrics/openmetrics (any PrivateData hides them too). Until they are back "
                        "the scaler keeps the slurmd pods that exist, capped at what AI claims: new Slurm work "
                        "gets no pod, and the nodes AI claims are drained and go as their jobs end (with "
                        "slurmctld itself down the drain fails and no pod goes). Under the policies before "
                        "lend-and-reclaim the scale is frozen. Bounds: `plan`, docs/handoff.md 'One input lost'."
                    ),
                },
            }
        ],
    }


INPUT_LOST_FOR = "2m"  # as METRICS_MISSING_FOR: a restart's gap is not an outage
KUEUE_METRICS_MISSING_ALERT = "KueueMetricsMissing"
KUBE_STATE_METRICS_MISSING_ALERT = "KubeStateMetricsMissing"
RESTAPI_DOWN_ALERT = "SlurmrestdDown"
# The runnable-jobs exporter's (components/runnable_exporter.py alert_rules, in its own rule group)
RUNNABLE_JOBS_MISSING_ALERT = "SlurmRunnableJobsMissing"


def input_alert_rules(t: Target) -> dict:
    """A Prometheus rule group: one alert per lost input of the scaling rule and the fair-share
    controller besides slurmctld's (metrics_alert_rules), each naming the outage and what the
    scaler does meanwhile."""
    kueue = f'{{cluster_queue="{t.ai_cluster_queue}", resource="{t.gpu_resource}"}}'
    restapi = f'{RESTAPI_AVAILABLE}{{namespace="{t.namespace}", deployment="{t.restapi_deployment}"}}'

    def rule(alert: str, expr: str, summary: str, description: str) -> dict:
        return {
            "alert": alert,
            "expr": expr,
            "for": INPUT_LOST_FOR,
            "labels": {"severity": "critical"},
            "annotations": {"summary": summary, "description": description},
        }

    return {
        "name": "testbed-handoff-inputs",
        "rules": [
            rule(
                KUEUE_METRICS_MISSING_ALERT,
                f"absent({KUEUE_USAGE}{kueue})",
                "Kueue's ClusterQueue metrics are missing: the scaler counts AI as claiming its guaranteed share",
                "No kueue_cluster_queue_resource_usage for the AI queue: Kueue's metrics endpoint is not "
                "scraped, or metrics.enableClusterQueueResources is off. Until they are back slurmd is "
                "capped at HPC's share, whatever AI uses: nodes drained for AI stay drained, Slurm does "
                "not borrow AI's idle GPUs, and an AI job wider than its share gets no reservation (it "
                "forms again after the outage); the fair-share controller holds the guaranteed split. "
                "Bounds: `plan`, docs/handoff.md 'One input lost'.",
            ),
            rule(
                KUBE_STATE_METRICS_MISSING_ALERT,
                f"absent({restapi})",
                "kube-state-metrics is missing: slurmd's scale is frozen",
                "No kube_deployment_status_replicas_available for slurmrestd: kube-state-metrics is not "
                "scraped. The scaler cannot tell whether slurmrestd is up, without which a scale-in would "
                "delete busy slurmd pods, so its restapi-down trigger errs and KEDA leaves the NodeSet's "
                "size as it is until it is back: nothing is scaled in or out, and every wait for a lent "
                "GPU grows by the outage. Bounds: `plan`, docs/handoff.md 'One input lost'.",
            ),
            rule(
                RESTAPI_DOWN_ALERT,
                f"max({restapi}) < 1",
                "slurmrestd has no available replica: slurmd keeps every pod it has",
                "The NodeSet controller has no Slurm client without slurmrestd, so a scale-in would pick "
                "busy pods; the scaler asks for every slurmd pod that exists until it is back (scale-out "
                "goes on), and GPUs lent to Slurm come back only after: AI's waits grow by the outage. "
                "Bounds: `plan`, docs/handoff.md 'One input lost'.",
            ),
        ],
    }


def keda_triggers(server_address: str, t: Target, policy: str, warm_seconds: int) -> list[dict]:
    # ignoreNullValues defaults to true (kedacore/keda@v2.20.2:pkg/scalers/prometheus_scaler.go):
    # the older policies keep the default, the guarded ones turn an empty result into an error.
    extra = {"ignoreNullValues": "false"} if policy in GUARDED_POLICIES else {}
    return [
        {
            "type": "prometheus",
            "name": name,
            "metricType": "AverageValue",
            "metadata": {
                "serverAddress": server_address,
                "query": query,
                "threshold": "1",
                "activationThreshold": "0",
                **extra,
            },
        }
        for name, query in queries(t, policy, warm_seconds)
    ]


def fair_share_queries(t: Target) -> dict[str, str]:
    """What the fair-share controller reads (components/fair_share.py `reading`), as PromQL: HPC's
    busy nodes, runnable jobs, the widest pending job's nodes and the nodes of the one first in line
    per partition; AI's GPUs held and
    waiting in Kueue. None falls back to 0: an empty result is a lost input."""
    kueue = f'{{cluster_queue="{t.ai_cluster_queue}", resource="{t.gpu_resource}"}}'
    # Kueue's usage is admitted quota. Where AI's queue lends nothing (hpcBorrowsAiGpus false) it
    # admits up to its whole quota however many GPUs slurmd pods, over HPC's lowered quota, still
    # hold: a gang admitted on AI's turn then waits, some pods at kube-scheduler (PodScheduled
    # False), and read as used it ended AI's turn at once, the quota went back to the split and the
    # gang held half the GPUs idle for good (AI got 9 % in the gangs shape). AI's pods ask for one
    # GPU each (the run-limit policy refuses more: components/ai_run_limit.py), so each such pod is
    # one GPU waiting, not used. But kube-state-metrics counts every pod whose PodScheduled is
    # False (kubernetes/kube-state-metrics internal/store/pod.go createPodStatusUnschedulable
    # FamilyGenerator), whatever the reason: a bare Pod Kueue still gates (the API server sets
    # reason SchedulingGated at create: kubernetes/kubernetes pkg/registry/core/pod/strategy.go
    # applySchedulingGatedCondition), already in Kueue's pending GPUs and not in its usage, or any
    # pod an AI user makes that fits no node, GPU or not. Each counted so lowered AI's usage and
    # kept AI's turn from ever being served: one such pod left HPC's quota low for good. So at
    # most the GPUs Kueue admitted beyond the ones there are (both queues' usage less the GPUs),
    # which is where an admitted pod can wait for a GPU.
    hpc = f'{{cluster_queue="{HPC_CLUSTER_QUEUE}", resource="{t.gpu_resource}"}}'
    over = f"clamp_min(max({KUEUE_USAGE}{kueue}) + (max({KUEUE_USAGE}{hpc}) or vector(0)) - {t.gpus_total}, 0)"
    counted = f'(count({POD_UNSCHEDULABLE}{{namespace="{t.ai_namespace}"}}) or vector(0))'
    unscheduled = f"(({counted} < {over}) or {over})"  # the smaller of the two
    return {
        "hpc_used": _busy(t),
        "hpc_runnable": _runnable(t),
        **{f"hpc_widest_{p}": _widest(p) for p in t.partitions},
        **{f"hpc_first_{p}": _first_in_line(p) for p in t.partitions},
        "ai_used": f"clamp_min(max({KUEUE_USAGE}{kueue}) - {unscheduled}, 0)",
        "ai_waiting": f"max({KUEUE_PENDING}{kueue}) + {unscheduled}",
    }


def scaling_target(n: Names) -> Target:
    """What the triggers look at, for one stack: its Slurm names, scrape interval and GPU split."""
    names = n.slurm
    return Target(
        partitions=names.partitions,
        nodeset_partition=names.nodeset,  # the chart's nodesets.<key>.partition, named after the key
        namespace=names.namespace,
        nodeset=names.nodeset_resource,
        # The RestApi's Deployment and Service share one name, Key() = ServiceKey()
        # (SlinkyProject/slurm-operator@v1.0.0:api/v1beta1/restapi_keys.go).
        restapi_deployment=names.restapi_service,
        ai_cluster_queue=AI_CLUSTER_QUEUE,
        ai_namespace=JOBS_NAMESPACE,
        gpu_resource=GPU_RESOURCE,
        scrape_seconds=n.metrics_interval_seconds,
        gpus_total=n.shares.gpus_total,
        ai_share=n.shares.ai_guaranteed_gpus,
    )

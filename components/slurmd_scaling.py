"""How many slurmd pods KEDA asks for: the rule as a pure function, and the trigger set that
implements it in PromQL. The hand-off twin (`twin/`) runs these very triggers under faults.

Rule (policy "safe", the default): replicas = nodes busy now (ALLOCATED or MIXED) + what the
*runnable* pending work needs, at least the largest such job's node count and at least one
node per such job; capped at maxReplicaCount; 0 (after the cooldown) with nothing busy or
runnable. On top of that:

* Held jobs never count: `jobs_pending - jobs_hold` and `jobs_max_job_nodes_nohold`
  (SchedMD/slurm@slurm-25-11-0-1:src/slurmctld/statistics.c counts held jobs in jobs_pending).
* Work that stays pending next to enough idle nodes for STALL_SECONDS is not runnable
  (a dependency, a begin time, a throttled array: Slurm would have started it); that much
  pending work stops counting for STALL_MEMORY_SECONDS, so the idle nodes go back.
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
  `fallback` KEDA leaves the scale alone (kedacore/keda@v2.16.1:pkg/scaling/executor/
  scale_scaledobjects.go) and the HPA does not scale down on an invalid metric
  (kubernetes/kubernetes@v1.34.0:pkg/controller/podautoscaler/horizontal.go
  computeReplicasForMetrics): a metrics outage freezes the scale.
* While slurmrestd has no available replica, a fourth trigger asks for every slurmd pod that
  exists: the operator then has no Slurm client, `IsNodeDrained` says true and victims are
  picked by ordinal, so a scale-in would delete busy pods
  (SlinkyProject/slurm-operator@v1.0.0:internal/controller/slurmclient/slurmclient_sync.go,
  internal/controller/nodeset/slurmcontrol/slurmcontrol.go, nodeset/utils/sort.go).

Policies "previous" (busy + max(largest, pending) on `all`, `sum()` and `or vector(0)`) and
"seed" (the seed article's three triggers) stay selectable for comparison in the twin.

HPA arithmetic: each trigger is an External metric with metricType AverageValue and
threshold "1", for which the HPA wants ceil(value / 1) = value replicas; with several
triggers it takes the largest. KEDA is active while any trigger's value exceeds
activationThreshold 0; inactive for cooldownPeriod, it scales to idleReplicaCount 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Slurm 25.11 openmetrics (SchedMD/slurm@slurm-25-11-0-1 src/plugins/metrics/openmetrics/openmetrics.c),
# served by slurmctld at /metrics/partitions, label `partition`.
NODES_ALLOC = "slurm_partition_nodes_alloc"
NODES_MIXED = "slurm_partition_nodes_mixed"
NODES_IDLE = "slurm_partition_nodes_idle"
PENDING_JOBS = "slurm_partition_jobs_pending"
HELD_JOBS = "slurm_partition_jobs_hold"
# MAX(max_nodes, min_nodes) over pending, not held, jobs (src/slurmctld/statistics.c).
LARGEST_PENDING_JOB_NODES = "slurm_partition_jobs_max_job_nodes_nohold"
BUSY_NODE_METRICS = (NODES_ALLOC, NODES_MIXED)
# kube-state-metrics (in kube-prometheus-stack): the restapi Deployment and the NodeSet's pods.
RESTAPI_AVAILABLE = "kube_deployment_status_replicas_available"
POD_INFO = "kube_pod_info"

SAFE, PREVIOUS, SEED = "safe", "previous", "seed"
POLICIES = (SAFE, PREVIOUS, SEED)
DEFAULT_POLICY = SAFE

# Slurm's main scheduler runs at least every sched_interval (60 s, SchedMD/slurm@slurm-25-11-0-1:
# doc/man/man5/slurm.conf.5) and on every submit: two cycles with idle nodes and no start is a stall.
STALL_SECONDS = 120
STALL_MEMORY_SECONDS = 1800  # how long work found stalled stays discounted
SUBQUERY_STEP = "30s"  # the slurmctld scrape interval


@dataclass(frozen=True)
class Target:
    """What the triggers look at: the Slurm partitions the NodeSet serves and its Kubernetes names."""

    partitions: tuple[str, ...]  # the default partition first, then the NodeSet's own
    nodeset_partition: str
    namespace: str
    nodeset: str  # NodeSet object name (kube_pod_info created_by_name)
    restapi_deployment: str


@dataclass(frozen=True)
class PartitionMetrics:
    """One partition's 25.11 metrics, for the rule as a table."""

    nodes_alloc: int = 0
    nodes_mixed: int = 0
    nodes_idle: int = 0
    jobs_pending: int = 0
    jobs_hold: int = 0
    largest_pending_job_nodes: int = 0  # _nohold


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


# ------------------------------------------------------------------ PromQL


def _m(metric: str, partition: str) -> str:
    # max(): one value per partition even when the target is scraped twice (labels differ by instance).
    return f'max({metric}{{partition="{partition}"}})'


def _busy(t: Target) -> str:
    return f"({_m(NODES_ALLOC, t.nodeset_partition)} + {_m(NODES_MIXED, t.nodeset_partition)})"


def _pending(t: Target) -> str:
    return "(" + " + ".join(f"{_m(PENDING_JOBS, p)} - {_m(HELD_JOBS, p)}" for p in t.partitions) + ")"


def _stalled_pending(t: Target) -> str:
    idle = _m(NODES_IDLE, t.nodeset_partition)
    fits = " * ".join(f"({idle} - {_m(LARGEST_PENDING_JOB_NODES, p)} >= bool 0)" for p in t.partitions)
    stalled_now = f"({_pending(t)} * {fits} * ({idle} >= bool 1))"
    return (
        f"max_over_time(min_over_time({stalled_now}[{STALL_SECONDS}s:{SUBQUERY_STEP}])"
        f"[{STALL_MEMORY_SECONDS}s:{SUBQUERY_STEP}])"
    )


def _runnable(t: Target) -> str:
    return f"clamp_min({_pending(t)} - {_stalled_pending(t)}, 0)"


def _safe_queries(t: Target) -> list[tuple[str, str]]:
    runnable = _runnable(t)
    queries = [("busy-plus-runnable-jobs", f"{_busy(t)} + {runnable}")]
    queries += [
        (f"busy-plus-largest-job-{p}", f"{_busy(t)} + {_m(LARGEST_PENDING_JOB_NODES, p)} * ({runnable} > bool 0)")
        for p in t.partitions
    ]
    pods = f'count({POD_INFO}{{namespace="{t.namespace}", created_by_kind="NodeSet", created_by_name="{t.nodeset}"}})'
    restapi = f'max({RESTAPI_AVAILABLE}{{namespace="{t.namespace}", deployment="{t.restapi_deployment}"}})'
    # No pods is a real zero (or vector(0)); a missing restapi series is an outage (an error, a freeze).
    queries.append(("hold-while-restapi-down", f"({pods} or vector(0)) * ({restapi} < bool 1)"))
    return queries


def _previous_term(aggregate: str, metric: str, partition: str) -> str:
    return f'({aggregate}({metric}{{partition="{partition}"}}) or vector(0))'


def _previous_queries(t: Target) -> list[tuple[str, str]]:
    p = t.partitions[0]
    busy = " + ".join(_previous_term("sum", m, p) for m in BUSY_NODE_METRICS)
    return [
        ("busy-plus-largest-pending-job", f"{busy} + {_previous_term('max', LARGEST_PENDING_JOB_NODES, p)}"),
        ("busy-plus-pending-jobs", f"{busy} + {_previous_term('sum', PENDING_JOBS, p)}"),
    ]


def _seed_queries(t: Target) -> list[tuple[str, str]]:
    p = t.partitions[0]
    return [
        (m.removeprefix("slurm_partition_").replace("_", "-"), f'sum({m}{{partition="{p}"}})')
        for m in (PENDING_JOBS, NODES_ALLOC, LARGEST_PENDING_JOB_NODES)
    ]


def queries(t: Target, policy: str = DEFAULT_POLICY) -> list[tuple[str, str]]:
    """(trigger name, PromQL) for a policy."""
    return {SAFE: _safe_queries, PREVIOUS: _previous_queries, SEED: _seed_queries}[policy](t)


def keda_triggers(server_address: str, t: Target, policy: str = DEFAULT_POLICY) -> list[dict]:
    # ignoreNullValues defaults to true (kedacore/keda@v2.16.1:pkg/scalers/prometheus_scaler.go):
    # the older policies keep the default, the safe one turns an empty result into an error.
    extra = {"ignoreNullValues": "false"} if policy == SAFE else {}
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
        for name, query in queries(t, policy)
    ]

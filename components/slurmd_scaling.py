"""How many slurmd pods KEDA asks for: the rule as a pure function, and the trigger set that
implements it in PromQL.

Rule: replicas = nodes busy now (ALLOCATED or MIXED) + what the pending work needs, at
least the largest pending job's node count and at least one node per pending job; capped
at maxReplicaCount; 0 when Slurm has neither busy nodes nor pending jobs (after cooldown).

HPA arithmetic: each trigger is an External metric with metricType AverageValue and
threshold "1", for which the HPA wants ceil(value / 1) = value replicas (it does not
multiply by the current count, as metricType Value would). With several triggers the HPA
takes the largest wish, so two triggers, busy + largest pending job and busy + pending
jobs, give busy + max(largest job, pending jobs). KEDA is active while any trigger's value
exceeds activationThreshold 0; inactive for cooldownPeriod, it scales to idleReplicaCount 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Slurm 25.11 openmetrics (SchedMD/slurm@slurm-25-11-0-1 src/plugins/metrics/openmetrics/openmetrics.c),
# served by slurmctld at /metrics/partitions, label `partition`.
BUSY_NODE_METRICS = ("slurm_partition_nodes_alloc", "slurm_partition_nodes_mixed")
PENDING_JOBS = "slurm_partition_jobs_pending"
# Largest node count among pending, not held, jobs (src/slurmctld/statistics.c).
LARGEST_PENDING_JOB_NODES = "slurm_partition_jobs_max_job_nodes_nohold"


@dataclass(frozen=True)
class Demand:
    """One trigger: busy nodes plus one measure of pending demand, aggregated by `aggregate`."""

    name: str
    metric: str
    aggregate: str  # sum or max over the partition's series


TRIGGERS = (
    Demand("busy-plus-largest-pending-job", LARGEST_PENDING_JOB_NODES, "max"),
    Demand("busy-plus-pending-jobs", PENDING_JOBS, "sum"),
)


@dataclass(frozen=True)
class PartitionMetrics:
    nodes_alloc: int = 0
    nodes_mixed: int = 0
    jobs_pending: int = 0
    largest_pending_job_nodes: int = 0

    def value(self, metric: str) -> int:
        return {
            "slurm_partition_nodes_alloc": self.nodes_alloc,
            "slurm_partition_nodes_mixed": self.nodes_mixed,
            PENDING_JOBS: self.jobs_pending,
            LARGEST_PENDING_JOB_NODES: self.largest_pending_job_nodes,
        }[metric]


def desired_replicas(m: PartitionMetrics, min_replicas: int, max_replicas: int) -> int:
    """The slurmd replica count KEDA + HPA settle on for these metrics (the rule above)."""
    wishes = [trigger_value(m, t) for t in TRIGGERS]
    if max(wishes) <= 0:
        return 0  # inactive: idleReplicaCount once the cooldown has passed
    wanted = max(math.ceil(w / 1) for w in wishes)  # AverageValue, threshold 1
    return max(min_replicas, min(max_replicas, wanted))


def trigger_value(m: PartitionMetrics, t: Demand) -> int:
    return sum(m.value(metric) for metric in BUSY_NODE_METRICS) + m.value(t.metric)


def _term(aggregate: str, metric: str, partition: str) -> str:
    # `or vector(0)`: a metric with no series (no pending jobs yet) counts as 0 instead of
    # making the whole sum empty, which KEDA would read as 0 and scale away busy nodes.
    return f'({aggregate}({metric}{{partition="{partition}"}}) or vector(0))'


def promql(t: Demand, partition: str) -> str:
    """One scalar-valued query: busy nodes + this trigger's demand, for one partition."""
    return " + ".join(
        [*(_term("sum", metric, partition) for metric in BUSY_NODE_METRICS), _term(t.aggregate, t.metric, partition)]
    )


def keda_triggers(server_address: str, partition: str) -> list[dict]:
    return [
        {
            "type": "prometheus",
            "name": t.name,
            "metricType": "AverageValue",
            "metadata": {
                "serverAddress": server_address,
                "query": promql(t, partition),
                "threshold": "1",
                "activationThreshold": "0",
            },
        }
        for t in TRIGGERS
    ]

"""The slurmd scaling rule as a table, and the PromQL triggers evaluated against the same table."""

import re

import pytest

from components import slurmd_scaling as scaling
from components.slurmd_scaling import PartitionMetrics as M

WORKERS = 4

# (case, metrics, replicas wanted)
TABLE = [
    ("idle", M(), 0),
    ("one 1-node job pending", M(jobs_pending=1, largest_pending_job_nodes=1), 1),
    ("one 1-node job running, node MIXED (1 GPU of 4 CPUs)", M(nodes_mixed=1), 1),
    ("one 1-node job running, node ALLOCATED", M(nodes_alloc=1), 1),
    ("two parallel 2-node jobs, both pending", M(jobs_pending=2, largest_pending_job_nodes=2), 2),
    ("two parallel 2-node jobs, one started", M(nodes_alloc=2, jobs_pending=1, largest_pending_job_nodes=2), 4),
    ("two parallel 2-node jobs, both running", M(nodes_alloc=4), 4),
    ("running 2-node + pending 2-node", M(nodes_alloc=2, jobs_pending=1, largest_pending_job_nodes=2), 4),
    ("three 1-node jobs pending", M(jobs_pending=3, largest_pending_job_nodes=1), 3),
    ("more than the workers", M(nodes_alloc=3, jobs_pending=2, largest_pending_job_nodes=4), WORKERS),
    ("held job only (not counted by _nohold)", M(jobs_pending=1, largest_pending_job_nodes=0), 1),
]


@pytest.mark.parametrize("case, metrics, wanted", TABLE, ids=[t[0] for t in TABLE])
def test_rule_table(case, metrics, wanted):
    assert scaling.desired_replicas(metrics, min_replicas=1, max_replicas=WORKERS) == wanted


def test_active_scaling_never_goes_below_min_replicas():
    assert scaling.desired_replicas(M(nodes_mixed=1), min_replicas=2, max_replicas=WORKERS) == 2


# A tiny evaluator for exactly the query shape we emit: terms `(agg(metric{partition="p"}) or vector(0))`
# joined by " + ". It refuses anything else, so a changed query shape fails here loudly.
TERM = re.compile(r'\((sum|max)\((slurm_[a-z_]+)\{partition="([a-z0-9-]+)"\}\) or vector\(0\)\)')


def evaluate(query: str, metrics: M, partition: str) -> int:
    terms = query.split(" + ")
    total = 0
    for term in terms:
        m = TERM.fullmatch(term)
        assert m, f"unexpected query term {term!r}"
        _, metric, where = m.groups()
        assert where == partition
        total += metrics.value(metric)  # one series per partition: sum and max agree
    return total


def hpa_and_keda(triggers: list[dict], metrics: M, partition: str, min_r: int, max_r: int) -> int:
    """KEDA + HPA semantics for AverageValue triggers: active if any value > activationThreshold;
    then each trigger wants ceil(value / threshold) replicas and the HPA takes the largest."""
    values = [evaluate(t["metadata"]["query"], metrics, partition) for t in triggers]
    if not any(v > float(t["metadata"]["activationThreshold"]) for v, t in zip(values, triggers, strict=True)):
        return 0
    wishes = [-(-v // int(t["metadata"]["threshold"])) for v, t in zip(values, triggers, strict=True)]
    return max(min_r, min(max_r, max(wishes)))


@pytest.mark.parametrize("case, metrics, wanted", TABLE, ids=[t[0] for t in TABLE])
def test_keda_triggers_implement_the_rule(case, metrics, wanted):
    triggers = scaling.keda_triggers("http://prometheus:9090", "all")
    assert all(t["metricType"] == "AverageValue" for t in triggers)
    assert hpa_and_keda(triggers, metrics, "all", 1, WORKERS) == wanted


def test_triggers_cover_the_three_slurm_metrics_of_the_reference_plus_mixed_nodes():
    queries = " ".join(t["metadata"]["query"] for t in scaling.keda_triggers("http://p:9090", "all"))
    for metric in (
        "slurm_partition_jobs_pending",
        "slurm_partition_nodes_alloc",
        "slurm_partition_jobs_max_job_nodes_nohold",
        "slurm_partition_nodes_mixed",
    ):
        assert metric in queries


def test_trigger_metadata_values_are_strings_as_keda_requires():
    for trigger in scaling.keda_triggers("http://p:9090", "all"):
        assert all(isinstance(v, str) for v in trigger["metadata"].values())

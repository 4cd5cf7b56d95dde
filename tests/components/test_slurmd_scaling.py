"""The slurmd scaling rule as a table; the program's PromQL triggers evaluated over the same table by the
twin's evaluator and by a real Prometheus (`promtool test rules`), including no series, a vanished
target (staleness), a duplicated target and several partitions."""

import math
import os
import shutil
import subprocess

import pytest
import yaml

from components import keda
from components import slurmd_scaling as scaling
from components.names import slurm_names
from components.slurmd_scaling import PartitionMetrics as M
from twin.autoscale import Trigger
from twin.promql import TSDB, Evaluator, PromQLError

WORKERS = 4
NAMES = slurm_names("slinky")
TARGET = keda.scaling_target(NAMES)
ALL, OWN = TARGET.partitions
HISTORY = 16  # samples 30 s apart: 8 minutes, several stall windows
EVAL = HISTORY * 30


def _series(m: M) -> dict[str, float]:
    return {
        scaling.NODES_ALLOC: m.nodes_alloc,
        scaling.NODES_MIXED: m.nodes_mixed,
        scaling.NODES_IDLE: m.nodes_idle,
        scaling.PENDING_JOBS: m.jobs_pending,
        scaling.HELD_JOBS: m.jobs_hold,
        scaling.LARGEST_PENDING_JOB_NODES: m.largest_pending_job_nodes,
    }


def input_series(case: dict) -> list[tuple[dict, str]]:
    """(labels, promtool values notation): Slurm 25.11 emits every metric for every partition."""
    out = []
    nodes = case.get("nodes")  # node counts are the same in every partition (all nodes are in both)
    targets = ["slurm-controller:6817"] + (["slurm-controller-dup:6817"] if case.get("duplicate") else [])
    for instance in targets:
        for partition in TARGET.partitions:
            m = case.get(partition, M())
            if nodes is not None:
                m = M(
                    nodes.nodes_alloc,
                    nodes.nodes_mixed,
                    nodes.nodes_idle,
                    m.jobs_pending,
                    m.jobs_hold,
                    m.largest_pending_job_nodes,
                )
            for name, value in _series(m).items():
                labels = {"__name__": name, "partition": partition, "instance": instance, "job": "slurm"}
                notation = f"{value:g}x{HISTORY}"
                if case.get("vanished"):
                    notation = f"{value:g}x{HISTORY - 10} stale"
                if case.get("no_slurm"):
                    continue
                out.append((labels, notation))
    restapi = 0 if case.get("restapi_down") else 1
    out.append(
        (
            {
                "__name__": scaling.RESTAPI_AVAILABLE,
                "namespace": TARGET.namespace,
                "deployment": TARGET.restapi_deployment,
            },
            f"{restapi}x{HISTORY}",
        )
    )
    for i in range(case.get("pods", 0)):
        labels = {"__name__": scaling.POD_INFO, "namespace": TARGET.namespace, "pod": f"{TARGET.nodeset}-{i}"}
        out.append(({**labels, "created_by_kind": "NodeSet", "created_by_name": TARGET.nodeset}, f"1x{HISTORY}"))
    return out


def evaluator(case: dict) -> Evaluator:
    ev = Evaluator(tsdb(case))
    ev.final_before = EVAL + 1  # every sample is written: subquery steps may be memoised
    return ev


def tsdb(case: dict) -> TSDB:
    db = TSDB()
    for labels, notation in input_series(case):
        parts = notation.split()
        value, count = parts[0].split("x")
        for i in range(int(count) + 1):
            db.add(labels, i * 30.0, float(value))
        if len(parts) > 1:  # stale
            db.add(labels, (int(count) + 1) * 30.0, math.nan)
    return db


def wanted(triggers: list[dict], case: dict) -> int | None:
    """KEDA + HPA for AverageValue triggers; None where a trigger errs and the scale freezes."""
    ev = evaluator(case)
    values = []
    for t in map(Trigger.from_manifest, triggers):
        try:
            values.append((t, t.value(ev, EVAL)))
        except PromQLError:
            return None
    if not any(v > t.activation for t, v in values):
        return 0
    return max(1, min(WORKERS, max(math.ceil(v / t.threshold) for t, v in values)))


def triggers(policy: str = scaling.SAFE) -> list[dict]:
    return scaling.keda_triggers("http://prometheus:9090", TARGET, policy)


# (case, metrics (per partition, or `nodes` for both), replicas the safe policy wants)
TABLE = [
    ("idle", {}, 0),
    ("one 1-node job pending", {ALL: M(jobs_pending=1, largest_pending_job_nodes=1)}, 1),
    ("one job running, node MIXED (1 GPU of 4 CPUs)", {"nodes": M(nodes_mixed=1)}, 1),
    ("one job running, node ALLOCATED", {"nodes": M(nodes_alloc=1)}, 1),
    ("two 2-node jobs pending", {ALL: M(jobs_pending=2, largest_pending_job_nodes=2)}, 2),
    (
        "running 2-node + pending 2-node",
        {"nodes": M(nodes_alloc=2), ALL: M(jobs_pending=1, largest_pending_job_nodes=2)},
        4,
    ),
    ("three 1-node jobs pending", {ALL: M(jobs_pending=3, largest_pending_job_nodes=1)}, 3),
    (
        "more than the workers",
        {"nodes": M(nodes_alloc=3), ALL: M(jobs_pending=2, largest_pending_job_nodes=4)},
        WORKERS,
    ),
    ("held job only", {ALL: M(jobs_pending=1, jobs_hold=1)}, 0),
    ("pending in the NodeSet's own partition", {OWN: M(jobs_pending=1, largest_pending_job_nodes=1)}, 1),
    (
        "pending in both partitions",
        {ALL: M(jobs_pending=1, largest_pending_job_nodes=1), OWN: M(jobs_pending=2, largest_pending_job_nodes=1)},
        3,
    ),
    (
        "dependency job pending next to an idle node for 8 min",
        {"nodes": M(nodes_mixed=1, nodes_idle=1), ALL: M(jobs_pending=1, largest_pending_job_nodes=1)},
        1,
    ),
    (
        "4-node job waiting for 2 busy nodes keeps the 2 idle ones",
        {"nodes": M(nodes_mixed=2, nodes_idle=2), ALL: M(jobs_pending=1, largest_pending_job_nodes=4)},
        WORKERS,
    ),
]
EXTRA = [
    (
        "duplicate target",
        {"nodes": M(nodes_mixed=1), ALL: M(jobs_pending=1, largest_pending_job_nodes=1), "duplicate": True},
        2,
    ),
    ("restapi down: every pod stays", {"nodes": M(nodes_mixed=1), "restapi_down": True, "pods": 3}, 3),
    ("restapi up: pods do not count", {"nodes": M(nodes_mixed=1), "pods": 3}, 1),
    ("no Slurm series (target gone): freeze", {"no_slurm": True}, None),
    ("target vanished 5 min ago (staleness): freeze", {"nodes": M(nodes_mixed=2), "vanished": True}, None),
]


def _table_metrics(case: dict) -> M:
    """The pure rule reads one partition; fold the table's partitions into one."""
    nodes = case.get("nodes", M())
    parts = [case.get(p, M()) for p in TARGET.partitions]
    return M(
        nodes.nodes_alloc,
        nodes.nodes_mixed,
        nodes.nodes_idle,
        sum(p.jobs_pending for p in parts),
        sum(p.jobs_hold for p in parts),
        max(p.largest_pending_job_nodes for p in parts),
    )


@pytest.mark.parametrize("case, metrics, want", TABLE, ids=[t[0] for t in TABLE])
def test_rule_table(case, metrics, want):
    m = _table_metrics(metrics)
    stalled = m.jobs_pending - m.jobs_hold if m.nodes_idle >= max(1, m.largest_pending_job_nodes) else 0
    assert scaling.desired_replicas(m, 1, WORKERS, stalled_pending=stalled) == want


@pytest.mark.parametrize("case, metrics, want", TABLE + EXTRA, ids=[t[0] for t in TABLE + EXTRA])
def test_triggers_implement_the_rule(case, metrics, want):
    assert wanted(triggers(), metrics) == want


def test_previous_policy_fails_where_the_issue_says():
    prev = triggers(scaling.PREVIOUS)
    assert wanted(prev, {ALL: M(jobs_pending=1, jobs_hold=1)}) == 1, "a held job keeps a GPU"
    assert wanted(prev, {"no_slurm": True}) == 0, "a lost target reads as no demand"
    assert wanted(prev, {OWN: M(jobs_pending=1, largest_pending_job_nodes=1)}) == 0, "own partition never wakes it"
    dup = {"nodes": M(nodes_mixed=1), ALL: M(jobs_pending=1, largest_pending_job_nodes=1), "duplicate": True}
    assert wanted(prev, dup) == 4, "a duplicate target doubles sum()"
    assert wanted(prev, {"nodes": M(nodes_mixed=1), "restapi_down": True, "pods": 3}) == 1


def test_seed_triggers_are_the_three_metrics_of_the_seed_article():
    queries = [t["metadata"]["query"] for t in triggers(scaling.SEED)]
    assert [q.split("{")[0] for q in queries] == [
        "sum(slurm_partition_jobs_pending",
        "sum(slurm_partition_nodes_alloc",
        "sum(slurm_partition_jobs_max_job_nodes_nohold",
    ]


def test_safe_triggers_turn_an_empty_result_into_an_error():
    for t in triggers():
        assert t["metadata"]["ignoreNullValues"] == "false"
        assert t["metricType"] == "AverageValue"
        assert all(isinstance(v, str) for v in t["metadata"].values())
    slurm_queries = [t["metadata"]["query"] for t in triggers() if "slurm_" in t["metadata"]["query"]]
    assert slurm_queries and not any("vector(0)" in q for q in slurm_queries)


# ------------------------------------------------------------------ a real Prometheus


def _promtool() -> str | None:
    found = shutil.which("promtool")
    if found is None and os.environ.get("CI") == "true":
        pytest.fail("promtool is missing: .ci/run installs Debian's prometheus package, which ships it")
    return found


def _labels(pairs) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(pairs) if k != "__name__") + "}"


def _selector(labels: dict) -> str:
    return labels["__name__"] + _labels(labels.items())


def test_promtool_agrees_with_the_twin_evaluator(tmp_path):
    promtool = _promtool()
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus); CI=true makes this a failure")
    groups = []
    # Every case for the safe policy; the older policies share its operators, a few cases each.
    plan = [(scaling.SAFE, c) for c in TABLE + EXTRA] + [
        (policy, c) for policy in (scaling.PREVIOUS, scaling.SEED) for c in EXTRA[:1] + EXTRA[3:4] + TABLE[8:9]
    ]
    for policy, (case, metrics, _) in plan:
        ev = evaluator(metrics)
        tests = []
        for t in triggers(policy):
            result = ev.instant(t["metadata"]["query"], EVAL)
            samples = [{"labels": _labels(labels), "value": value} for labels, value in result.items()]
            tests.append({"expr": t["metadata"]["query"], "eval_time": f"{EVAL}s", "exp_samples": samples})
        series = [{"series": _selector(labels), "values": notation} for labels, notation in input_series(metrics)]
        groups.append(
            {"name": f"{policy}: {case}", "interval": "30s", "input_series": series, "promql_expr_test": tests}
        )
    (tmp_path / "rules.yaml").write_text("groups: []\n")
    test_file = tmp_path / "triggers_test.yaml"
    test_file.write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "30s", "tests": groups}))
    done = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

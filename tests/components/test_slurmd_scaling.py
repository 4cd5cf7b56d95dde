"""The slurmd scaling rule as a table; the program's PromQL triggers evaluated over the same table by the
twin's evaluator and by a real Prometheus (`promtool test rules`), including no series, a vanished
target (staleness), a duplicated target and several partitions."""

import math
import re
import subprocess

import pytest

from components import keda
from components import slurmd_scaling as scaling
from components.slurmd_scaling import PartitionMetrics as M
from core.names import GpuShares, Names, slurm_names
from tests.engines import harness
from twin.autoscale import Formula, Modifiers, Trigger
from twin.promql import TSDB, Evaluator, PromQLError

WORKERS = 4
AI_SHARE = 2  # the default split of 4 GPUs
STACK = Names(slurm_names("slinky"), WORKERS, WORKERS, 300, 30, GpuShares(WORKERS, AI_SHARE, True, False, True))
TARGET = scaling.scaling_target(STACK)
ALL, OWN = TARGET.partitions
HISTORY = 16  # samples 30 s apart: 8 minutes, several stall windows
EVAL = HISTORY * 30
COOLDOWN = 300  # kedaCooldownSeconds, the warmth window the demand-aware cases are written for


def _series(m: M) -> dict[str, float]:
    return {
        scaling.NODES_ALLOC: m.nodes_alloc,
        scaling.NODES_MIXED: m.nodes_mixed,
        scaling.NODES_IDLE: m.nodes_idle,
        scaling.PENDING_JOBS: m.jobs_pending,
        scaling.HELD_JOBS: m.jobs_hold,
        scaling.LARGEST_PENDING_JOB_NODES: m.largest_pending_job_nodes,
        scaling.NODES_DRAINED: m.nodes_drained,
    }


def input_series(case: dict) -> list[tuple[dict, str]]:
    """(labels, promtool values notation): Slurm 25.11 emits every metric for every partition."""
    out = []
    nodes = case.get("nodes")  # node counts are the same in every partition (all nodes are in both)
    targets = ["slurm-controller:6817"] + (["slurm-controller-dup:6817"] if case.get("duplicate") else [])
    for instance in targets:
        if instance != targets[0] and "dup_nodes" in case:  # the duplicate scraped at another moment
            nodes = case["dup_nodes"]
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
                    nodes.nodes_drained,
                )
            for name, value in _series(m).items():
                labels = {"__name__": name, "partition": partition, "instance": instance, "job": "slurm"}
                notation = f"{value:g}x{HISTORY}"
                if name == scaling.NODES_ALLOC and "was_busy" in case:  # busy until sample `until`, idle since
                    busy, until = case["was_busy"]
                    notation = f"{busy}x{until} 0x{HISTORY - until - 1}"
                if case.get("vanished"):
                    notation = f"{value:g}x{HISTORY - 10} stale"
                if case.get("no_slurm"):
                    continue
                out.append((labels, notation))
    # The runnable-jobs exporter (components/runnable_jobs.py): {partition: (jobs, widest)}
    for partition, (jobs, widest) in case.get("runnable", {}).items():
        for name, value in ((scaling.RUNNABLE_JOBS, jobs), (scaling.RUNNABLE_MAX_JOB_NODES, widest)):
            labels = {"__name__": name, "partition": partition, "instance": "runnable-jobs:8080", "job": "runnable"}
            gone = case.get("runnable_gone")  # its series went stale this many samples before the end
            out.append((labels, f"{value:g}x{HISTORY - gone} stale" if gone else f"{value:g}x{HISTORY}"))
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
    # Kueue's pending ("kueue") and admitted ("ai_held") GPUs of the AI ClusterQueue: a number, or promtool notation
    for key, metric in (("kueue", scaling.KUEUE_PENDING), ("ai_held", scaling.KUEUE_USAGE)):
        if key in case:
            value = case[key]
            labels = {"__name__": metric, "cluster_queue": TARGET.ai_cluster_queue}
            labels |= {"resource": TARGET.gpu_resource, "replica_role": "leader", "job": "kueue"}
            out.append((labels, value if isinstance(value, str) else f"{value:g}x{HISTORY}"))
    for i in range(case.get("unschedulable", 0)):
        labels = {"__name__": scaling.POD_UNSCHEDULABLE, "namespace": TARGET.ai_namespace, "pod": f"ddp-worker-{i}"}
        out.append((labels, f"1x{HISTORY}"))
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
        t = 0.0
        for part in notation.split():  # `VxN` is N + 1 samples of V (promtool's expanding notation)
            if part == "stale":
                db.add(labels, t, math.nan)
                continue
            value, count = part.split("x")
            for _ in range(int(count) + 1):
                db.add(labels, t, float(value))
                t += 30.0
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
    return scaling.keda_triggers("http://prometheus:9090", TARGET, policy, COOLDOWN)


def wanted_demand_aware(case: dict, policy: str = scaling.DEMAND_AWARE) -> int | None:
    """KEDA's formula over a formula policy's triggers, then the HPA on the composite metric."""
    ev = evaluator(case)
    trigs = list(map(Trigger.from_manifest, triggers(policy)))
    formula = scaling.formula(TARGET, policy)
    advanced = {"scalingModifiers": {"formula": formula, "target": "1", "activationTarget": "0"}}
    modifiers = Modifiers.from_advanced(advanced, [t.name for t in trigs])
    try:
        value = modifiers.value({t.name: t.value(ev, EVAL) for t in trigs})
    except PromQLError:
        return None
    return 0 if value <= modifiers.activation else max(1, min(WORKERS, math.ceil(value / modifiers.target)))


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
    (
        "duplicate targets scraped as a node went from MIXED to ALLOCATED: one busy node",
        {"nodes": M(nodes_mixed=1), "dup_nodes": M(nodes_alloc=1), "duplicate": True},
        1,
    ),
    ("restapi down: every pod stays", {"nodes": M(nodes_mixed=1), "restapi_down": True, "pods": 3}, 3),
    ("restapi up: pods do not count", {"nodes": M(nodes_mixed=1), "pods": 3}, 1),
    ("no Slurm series (target gone): freeze", {"no_slurm": True}, None),
    ("target vanished 5 min ago (staleness): freeze", {"nodes": M(nodes_mixed=2), "vanished": True}, None),
]


# The demand-aware policy: (case, series, replicas). Busy until sample 12 of 16 is busy 2 min ago
# (inside the 300 s cooldown); until sample 4, 6 min ago (outside it).
AI = [
    ("AI waits in Kueue, Slurm idle: back at once", {"was_busy": (2, 12), "pods": 2, "kueue": 1}, 0),
    ("AI pod unschedulable, Slurm idle: back at once", {"was_busy": (2, 12), "pods": 2, "unschedulable": 1}, 0),
    ("nobody waits: warm for the cooldown", {"was_busy": (2, 12), "pods": 2}, 2),
    ("nobody waits, cooldown over: 0", {"was_busy": (2, 4), "pods": 2}, 0),
    ("warmth never adds a pod", {"was_busy": (2, 12), "pods": 1}, 1),
    ("Kueue reports 0 pending: warm", {"was_busy": (2, 12), "pods": 2, "kueue": 0}, 2),
    ("Kueue series vanished (stale): as today, warm", {"was_busy": (2, 12), "pods": 2, "kueue": "1x5 stale"}, 2),
    (
        "AI admitted 60 s ago: no warmth yet (oscillation guard)",
        {"was_busy": (2, 12), "pods": 2, "kueue": "1x13 0x2"},
        0,
    ),
    ("AI admitted 3 min ago: warm again", {"was_busy": (2, 12), "pods": 2, "kueue": "1x9 0x6"}, 2),
    ("AI waits, Slurm busy: Slurm keeps its nodes", {"nodes": M(nodes_alloc=2), "pods": 2, "kueue": 3}, 2),
    (
        "AI waits, runnable Slurm job: still scales out",
        {ALL: M(jobs_pending=1, largest_pending_job_nodes=1), "kueue": 1},
        1,
    ),
    (
        "AI waits, restapi down: every pod stays",
        {"nodes": M(nodes_mixed=1), "restapi_down": True, "pods": 3, "kueue": 1},
        3,
    ),
    ("AI waits, Slurm series absent: freeze", {"no_slurm": True, "pods": 2, "kueue": 1}, None),
    ("AI waits, Slurm target vanished: freeze", {"nodes": M(nodes_mixed=2), "vanished": True, "kueue": 1}, None),
]


# Lend and reclaim (AI's share 2 of 4): (case, series, replicas). "kueue" is what AI waits for,
# "ai_held" what it holds; a constant series has waited the whole 8 minutes (first in line).
IDLE_AI = {"kueue": 0, "ai_held": 0}  # Kueue's series there: AI holds and waits for nothing
RECLAIM = [
    (
        "Slurm alone takes every GPU",
        {"nodes": M(nodes_alloc=3), ALL: M(jobs_pending=1, largest_pending_job_nodes=1), **IDLE_AI},
        4,
    ),
    (
        "a 4-node job on an idle testbed: all 4 at once",
        {ALL: M(jobs_pending=1, largest_pending_job_nodes=4), **IDLE_AI},
        4,
    ),
    ("AI waits for 1 GPU, Slurm on all 4: one drained", {"nodes": M(nodes_alloc=4), "kueue": 1, "ai_held": 0}, 3),
    (
        "AI holds its share and waits for more: Slurm keeps its own",
        {"nodes": M(nodes_alloc=2), "kueue": 2, "ai_held": 2},
        2,
    ),
    ("a 3-GPU gang first in line for 8 min: Slurm yields 3", {"nodes": M(nodes_alloc=4), "kueue": 3, "ai_held": 0}, 1),
    (
        "the same gang waiting 90 s: only AI's share back",
        {"nodes": M(nodes_alloc=4), "kueue": "0x12 3x3", "ai_held": 0},
        2,
    ),
    (
        "AI borrows HPC's share, a 1-node job waits: one pod, gated until AI's job ends",
        {ALL: M(jobs_pending=1, largest_pending_job_nodes=1), "ai_held": 3, "kueue": 0},
        1,
    ),
    (
        "a 4-node job while AI holds its share: no pod that would idle",
        {ALL: M(jobs_pending=1, largest_pending_job_nodes=4), "ai_held": 2, "kueue": 0},
        0,
    ),
    (
        "a 4-node job beside a 1-node job while AI holds its share: one pod",
        {ALL: M(jobs_pending=2, largest_pending_job_nodes=4), "ai_held": 2, "kueue": 0},
        1,
    ),
    (
        "restapi down with a gang first in line: every pod stays",
        {"nodes": M(nodes_mixed=1), "restapi_down": True, "pods": 3, "kueue": 4, "ai_held": 0},
        3,
    ),
]
# One input lost (issue 28, "Bounds that survive one fault"): the outage branch of the formula.
LOST = [
    (
        "Kueue's series absent during a reclaim: AI claims its share, the drained 2 stay drained",
        {"nodes": M(nodes_alloc=4), ALL: M(jobs_pending=2, largest_pending_job_nodes=1), "pods": 4},
        2,
    ),
    (
        "Kueue's series absent, Slurm wants 1 more: HPC's share only",
        {"nodes": M(nodes_alloc=2), ALL: M(jobs_pending=1, largest_pending_job_nodes=1)},
        2,
    ),
    (
        "Kueue's series vanished (stale) during a reclaim: AI's share still claimed",
        {"nodes": M(nodes_alloc=4), "pods": 4, "kueue": "1x5 stale", "ai_held": "0x5 stale"},
        2,
    ),
    (
        "AI waits for 1, Slurm series absent: the pods that exist, one drained",
        {"no_slurm": True, "pods": 4, **IDLE_AI, "kueue": 1},
        3,
    ),
    (
        "a gang first in line, Slurm series absent: every pod drained",
        {"no_slurm": True, "pods": 4, "kueue": 4, "ai_held": 0},
        0,
    ),
    (
        "AI waits for 2, Slurm target vanished (stale): HPC's share",
        {"nodes": M(nodes_mixed=4), "vanished": True, "pods": 4, "kueue": 2, "ai_held": 0},
        2,
    ),
    ("nobody waits, Slurm series absent: every pod stays, none added", {"no_slurm": True, "pods": 3, **IDLE_AI}, 3),
    (
        "AI waits, Slurm series absent, restapi down: every pod stays",
        {"no_slurm": True, "restapi_down": True, "pods": 4, "kueue": 2, "ai_held": 0},
        4,
    ),
]


# The exporter's runnable counts in front of slurmctld's (lend-and-reclaim, the default): (case, series, replicas).
NONE_RUNNABLE = {ALL: (0, 0), OWN: (0, 0)}
RUNNABLE = [
    (
        "3 pending, none runnable (begin, dependency, throttle): no pod",
        {ALL: M(jobs_pending=3, largest_pending_job_nodes=2), "runnable": NONE_RUNNABLE},
        0,
    ),
    (
        "3 pending, a 2-node one runnable: its 2 nodes",
        {ALL: M(jobs_pending=3, largest_pending_job_nodes=4), "runnable": {ALL: (1, 2), OWN: (0, 0)}},
        2,
    ),
    (
        "runnable in the NodeSet's partition counts too",
        {OWN: M(jobs_pending=1, largest_pending_job_nodes=1), "runnable": {ALL: (0, 0), OWN: (1, 1)}},
        1,
    ),
    (
        "exporter gone (stale): slurmctld's pending count, as before",
        {ALL: M(jobs_pending=3, largest_pending_job_nodes=2), "runnable": NONE_RUNNABLE, "runnable_gone": 4},
        3,
    ),
    (
        "exporter up, slurmctld's series absent: the pods that exist (the outage branch), none added",
        {"no_slurm": True, "runnable": {ALL: (2, 1), OWN: (0, 0)}, "pods": 1},
        1,
    ),
]
# Kueue's series there (AI holds and waits for nothing): the cap is every GPU, as Kueue's lost
# series would read as AI's share (docs/handoff.md "One input lost").
RUNNABLE = [(case, {"kueue": 0, "ai_held": 0} | metrics, want) for case, metrics, want in RUNNABLE]


@pytest.mark.parametrize("case, metrics, want", RUNNABLE, ids=[t[0] for t in RUNNABLE])
def test_the_exporter_s_runnable_work_goes_in_front_of_slurmctld_s_pending(case, metrics, want):
    assert wanted_demand_aware(metrics, scaling.LEND_RECLAIM) == want


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


@pytest.mark.parametrize("case, metrics, want", TABLE + EXTRA + AI, ids=[t[0] for t in TABLE + EXTRA + AI])
def test_demand_aware_triggers_and_formula(case, metrics, want):
    """Without anyone waiting, the safe rule's answer (TABLE, EXTRA); the AI cases above."""
    assert wanted_demand_aware(metrics) == want


@pytest.mark.parametrize("policy", [scaling.LEND_RECLAIM, scaling.FAIR_SHARE])
def test_the_capped_formula_stays_a_float_when_ai_claims_every_gpu(policy):
    """KEDA 2.20 refuses a formula result that is not a float64 (the twin's Formula too): with AI
    first in line for more than every GPU, the cap's min() picks the stack's GPU count, the cap is
    that count minus itself, and the result is the cap. Trigger values are floats; the literals
    must be too (mutation: an int GPU count gives an int 0 here)."""
    formula = scaling.formula(TARGET, policy)
    names = set(re.findall(r"[A-Za-z_]\w*", formula)) - {"max", "min", "float"}
    # slurmd warm (wanted 1), the restapi hold off, AI reserving and waiting for more than the stack has
    env = dict.fromkeys(names, 1.0) | {scaling.AI_RESERVE: 1.0, scaling.AI_PENDING: float(WORKERS + 1)}
    assert "hold_while_restapi_down" in names
    env |= {scaling.BUSY: 0.0, scaling.AI_WAITING: 0.0, "hold_while_restapi_down": 0.0}
    assert Formula(formula)(env) == 0.0


@pytest.mark.parametrize("case, metrics, want", RECLAIM + LOST, ids=[t[0] for t in RECLAIM + LOST])
def test_lend_and_reclaim_triggers_and_formula(case, metrics, want):
    assert wanted_demand_aware(metrics, scaling.LEND_RECLAIM) == want


# fair-share reserves for a gang only on AI's turn (a quota above its share, absent here) or, as
# lend-and-reclaim does, while slurmctld's metrics are lost: every LOST case gives the same answer.
FAIR_LOST = LOST


@pytest.mark.parametrize("case, metrics, want", FAIR_LOST, ids=[t[0] for t in FAIR_LOST])
def test_fair_share_survives_a_lost_input_as_lend_and_reclaim_does(case, metrics, want):
    """fair-share's cap follows Kueue's nominal quota, the guaranteed split when Kueue's series are lost."""
    assert wanted_demand_aware(metrics, scaling.FAIR_SHARE) == want


@pytest.mark.parametrize(
    "case, metrics, want", TABLE + EXTRA[:3] + AI[:9], ids=[t[0] for t in TABLE + EXTRA[:3] + AI[:9]]
)
def test_lend_and_reclaim_is_demand_aware_while_ai_holds_and_wants_nothing(case, metrics, want):
    """With Kueue's series reading 0 held and (unless the case says) 0 waiting, the cap is every GPU."""
    assert wanted_demand_aware(IDLE_AI | metrics, scaling.LEND_RECLAIM) == want


def test_a_lost_input_fails_the_formula_as_it_was_before_issue_28(monkeypatch):
    """The pre-change formula (git main before this change): Kueue's usage lost read as 0 and the
    Slurm triggers erred. Restored here, the lost-input cases give what the issue describes: the
    cap rises to every GPU during a reclaim, and a lost Slurm target freezes the scale."""
    monkeypatch.setattr(scaling, "_ai_held_when_kueue_lost", lambda t: 0)
    monkeypatch.setattr(scaling, "_zero_when_slurm_lost", lambda query: query)
    monkeypatch.setattr(scaling, "_unless_slurm_lost", lambda capped, lost_cap: capped)
    got = {case: wanted_demand_aware(metrics, scaling.LEND_RECLAIM) for case, metrics, _ in LOST}
    assert got == {
        LOST[0][0]: 4,  # un-drained: 4 pods for 4 busy nodes and 2 pending jobs
        LOST[1][0]: 3,
        LOST[2][0]: 4,
        LOST[3][0]: None,  # frozen
        LOST[4][0]: None,
        LOST[5][0]: None,
        LOST[6][0]: None,
        LOST[7][0]: None,
    }


@pytest.mark.parametrize("case, metrics, want", [r for r in RECLAIM + LOST if r[2] is not None], ids=lambda r: r)
def test_lend_and_reclaim_rule_table_agrees_with_the_triggers(case, metrics, want):
    """The pure rule over the same cases (one partition, nothing stalled, reservation as the series say)."""
    m = _table_metrics(metrics)
    if "nodes" in metrics:
        m = M(
            metrics["nodes"].nodes_alloc,
            metrics["nodes"].nodes_mixed,
            0,
            m.jobs_pending,
            0,
            m.largest_pending_job_nodes,
        )
    pending = metrics.get("kueue", 0)
    if isinstance(pending, str) and pending.endswith("stale"):
        pending = 0
    waiting_long = isinstance(pending, (int, float)) and pending > 0
    pending_now = pending if isinstance(pending, (int, float)) else float(pending.split()[-1].split("x")[0])
    held = metrics.get("ai_held", AI_SHARE)  # no Kueue series: AI holds its share
    if isinstance(held, str):  # stale: lost
        held, pending_now = AI_SHARE, 0
    claim = scaling.ai_claim(held, int(pending_now), AI_SHARE, WORKERS, waiting_long and held < AI_SHARE)
    restapi = metrics.get("pods", 0) if metrics.get("restapi_down") else 0
    pods = metrics.get("pods", 0)
    got = scaling.lend_and_reclaim_replicas(
        m,
        1,
        WORKERS,
        ai_waiting=pending_now > 0,
        recently_busy=0,
        pods=pods,
        ai_claim_gpus=claim,
        gpus_total=WORKERS,
        restapi_down_pods=restapi,
        slurm_metrics=not (metrics.get("no_slurm") or metrics.get("vanished")),
    )
    assert got == want


@pytest.mark.parametrize(
    "ai_waiting, recently_busy, pods, want",
    [(True, 2, 2, 0), (False, 2, 2, 2), (False, 2, 1, 1), (False, 0, 3, 0), (True, 0, 0, 0)],
)
def test_demand_aware_rule(ai_waiting, recently_busy, pods, want):
    idle = M()
    assert (
        scaling.demand_aware_replicas(idle, 1, WORKERS, ai_waiting=ai_waiting, recently_busy=recently_busy, pods=pods)
        == want
    )
    busy = M(nodes_alloc=1)
    assert scaling.demand_aware_replicas(
        busy, 1, WORKERS, ai_waiting=ai_waiting, recently_busy=recently_busy, pods=pods
    ) == max(1, want)


def test_the_rules_defaults_are_nothing_stalled_and_the_restapi_up():
    two_jobs = M(jobs_pending=2, largest_pending_job_nodes=1)
    assert scaling.desired_replicas(two_jobs, 1, WORKERS) == 2
    assert scaling.demand_aware_replicas(two_jobs, 1, WORKERS, ai_waiting=False, recently_busy=0, pods=0) == 2


def test_demand_aware_passes_the_caps_stalls_and_restapi_to_the_safe_rule():
    four_jobs = M(jobs_pending=4, largest_pending_job_nodes=1)
    assert scaling.demand_aware_replicas(four_jobs, 1, 2, ai_waiting=False, recently_busy=0, pods=0) == 2
    assert (
        scaling.demand_aware_replicas(
            four_jobs, 1, WORKERS, ai_waiting=False, recently_busy=0, pods=0, stalled_pending=4
        )
        == 0
    )
    assert (
        scaling.demand_aware_replicas(M(), 1, WORKERS, ai_waiting=False, recently_busy=0, pods=3, restapi_down_pods=3)
        == 3
    )


def test_previous_policy_scales_to_the_largest_pending_job_of_the_default_partition():
    assert wanted(triggers(scaling.PREVIOUS), {ALL: M(jobs_pending=1, largest_pending_job_nodes=3)}) == 3


def test_reference_triggers_read_the_default_partition_and_keep_kedas_null_default():
    reference = triggers(scaling.REFERENCE)
    assert all(f'partition="{ALL}"' in t["metadata"]["query"] for t in reference)
    for policy in (scaling.PREVIOUS, scaling.REFERENCE):
        assert all("ignoreNullValues" not in t["metadata"] for t in triggers(policy))
    assert wanted(reference, {"no_slurm": True}) == 0, "a lost target reads as no demand, as in the article"


def test_previous_policy_fails_where_the_issue_says():
    prev = triggers(scaling.PREVIOUS)
    assert wanted(prev, {ALL: M(jobs_pending=1, jobs_hold=1)}) == 1, "a held job keeps a GPU"
    assert wanted(prev, {"no_slurm": True}) == 0, "a lost target reads as no demand"
    assert wanted(prev, {OWN: M(jobs_pending=1, largest_pending_job_nodes=1)}) == 0, "own partition never wakes it"
    dup = {"nodes": M(nodes_mixed=1), ALL: M(jobs_pending=1, largest_pending_job_nodes=1), "duplicate": True}
    assert wanted(prev, dup) == 4, "a duplicate target doubles sum()"
    assert wanted(prev, {"nodes": M(nodes_mixed=1), "restapi_down": True, "pods": 3}) == 1


def test_reference_triggers_are_the_three_metrics_of_the_reference_testbed():
    queries = [t["metadata"]["query"] for t in triggers(scaling.REFERENCE)]
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


def _labels(pairs) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(pairs) if k != "__name__") + "}"


@pytest.mark.engine
def test_promtool_agrees_with_the_twin_evaluator(tmp_path):
    version = subprocess.run([harness.promtool(), "--version"], capture_output=True, text=True).stdout
    assert "version 3." in version
    groups = []
    # Every case for the safe policy; the older policies share its operators, a few cases each.
    plan = [(scaling.SAFE, c) for c in TABLE + EXTRA] + [
        (policy, c) for policy in (scaling.PREVIOUS, scaling.REFERENCE) for c in EXTRA[:1] + EXTRA[3:4] + TABLE[8:9]
    ]
    plan += [(scaling.DEMAND_AWARE, c) for c in AI + EXTRA]
    plan += [(scaling.LEND_RECLAIM, c) for c in RECLAIM + LOST + RUNNABLE] + [
        (scaling.FAIR_SHARE, c) for c in FAIR_LOST
    ]
    for policy, (case, metrics, _) in plan:
        ev = evaluator(metrics)
        tests = []
        for t in triggers(policy):
            result = ev.instant(t["metadata"]["query"], EVAL)
            samples = [{"labels": _labels(labels), "value": value} for labels, value in result.items()]
            tests.append({"expr": t["metadata"]["query"], "eval_time": f"{EVAL}s", "exp_samples": samples})
        series = [
            {"series": harness.series_selector(labels), "values": notation}
            for labels, notation in input_series(metrics)
        ]
        groups.append(
            {"name": f"{policy}: {case}", "interval": "30s", "input_series": series, "promql_expr_test": tests}
        )
    harness.promtool_test(tmp_path, groups)


@pytest.mark.parametrize("policy", scaling.POLICIES)
def test_only_the_formula_policies_move_the_cooldown_into_their_query(policy):
    """The older policies keep KEDA's cooldownPeriod (kedaCooldownSeconds) and no formula; the
    twin compares them with exactly these objects (twin/program.py)."""
    from core.names import Names
    from stacks import offline

    s = offline.stack_settings("dev", ["kedaCooldownSeconds=240"])
    n = Names.from_settings(s)
    spec = keda.scaled_object(n, 1, policy)["spec"]
    if policy in scaling.FORMULA_POLICIES:
        (recently_busy,) = [t for t in spec["triggers"] if t["name"] == scaling.RECENTLY_BUSY]
        assert spec["cooldownPeriod"] == 0 and "[270s:30s]" in recently_busy["metadata"]["query"], "240 s and one step"
        formula = scaling.formula(scaling.scaling_target(n), policy)
        assert spec["advanced"]["scalingModifiers"]["formula"] == formula
        capped = policy in (scaling.LEND_RECLAIM, scaling.FAIR_SHARE)
        assert (f"({float(n.gpus_total)} - " in formula) == capped, "the cap reads the stack's GPUs"
        assert ("ai_quota" in formula) == (policy == scaling.FAIR_SHARE), "fair-share's cap follows AI's quota"
    else:
        assert spec["cooldownPeriod"] == 240 and "advanced" not in spec


@pytest.mark.engine
@pytest.mark.parametrize("busy_until, warm", [(EVAL - COOLDOWN, 1), (EVAL - COOLDOWN - 30, 0)])
def test_warmth_covers_exactly_the_cooldown_on_prometheus_3(tmp_path, busy_until, warm):
    """A node busy until exactly kedaCooldownSeconds ago still counts (the window's left edge is in),
    one scrape earlier it does not: Prometheus 3's left-open subquery windows, one step longer. The
    twin's evaluator gives the same; a closed window (Prometheus 2) would count both."""
    (query,) = [t["metadata"]["query"] for t in triggers(scaling.DEMAND_AWARE) if t["name"] == scaling.RECENTLY_BUSY]
    samples = [1.0 if 30 * i <= busy_until else 0.0 for i in range(HISTORY + 1)]
    db = TSDB()
    for i, v in enumerate(samples):
        db.add({"__name__": scaling.NODES_MIXED, "partition": OWN}, 30 * i, v)
        db.add({"__name__": scaling.NODES_ALLOC, "partition": OWN}, 30 * i, 0.0)
    assert Evaluator(db).instant(query, EVAL) == {frozenset(): float(warm)}
    series = [
        {"series": f'{scaling.NODES_MIXED}{{partition="{OWN}"}}', "values": " ".join(f"{v:g}" for v in samples)},
        {"series": f'{scaling.NODES_ALLOC}{{partition="{OWN}"}}', "values": f"0x{HISTORY}"},
    ]
    test = {"expr": query, "eval_time": f"{EVAL}s", "exp_samples": [{"labels": "{}", "value": warm}]}
    harness.promtool_test(tmp_path, [{"interval": "30s", "input_series": series, "promql_expr_test": [test]}])

"""The twin's NodeSet controller against SlinkyProject/slurm-operator@v1.0.0 and what v1.0.5 changed
(twin/nodeset.py cites the lines): it syncs on events (and, from 1.0.5, 30 s after a sync that left a
scale-in victim draining), its scale-in sort reads the deadlines its previous sync wrote, and while
Kueue is down every sync stops at its first pod patch. Nothing is killed either way: a busy node it
condemns is drained, not deleted. Modelled figures, from the program's own objects."""

import ast
import functools
from pathlib import Path

import pytest

from components import slurmd_scaling as scaling
from stacks import offline
from twin import program, scenario, sim
from twin.kube import GRACE_PERIOD, KUBERNETES, SLURMD, TERMINATION, Kubernetes, Pod
from twin.nodeset import DRAIN_REQUEUE, INFORMER_PERIOD, NodeSetController
from twin.scenario import JobSpec
from twin.slurm import RUNNING, SlurmConfig, Slurmctld

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


@functools.cache
def setup(*overrides: str) -> sim.Setup:
    return program.setup(offline.stack_settings("dev", list(overrides)))


def _cluster(client: bool, job_at: int = 40, drain_requeue: bool = False) -> tuple[NodeSetController, Slurmctld]:
    """Two slurmd pods; job b starts at `job_at` on slinky-1; at 41 the NodeSet is scaled to 1. The
    client's informers list at 0, 30, 60, ..."""
    kube = Kubernetes(gpus=2, cold=False)
    slurm = Slurmctld(SlurmConfig("all", "slinky"))
    ns = NodeSetController("slurm-worker-slinky", "slinky", kube, slurm, replicas=2, drain_requeue=drain_requeue)
    for t in range(41):
        if t == job_at:
            (job,) = slurm.submit(JobSpec("b", "slurm", t, 1000, nodes=1), t)
            slurm.nodes["slinky-0"].drain = True  # so b lands on the highest ordinal
            slurm.step(t)
            slurm.nodes["slinky-0"].drain = False
            assert job.state == RUNNING and job.nodes == ("slinky-1",)
        ns.reconcile(t, client)
        kube.step(t)
    ns.replicas = 1
    return ns, slurm


def _active(ns: NodeSetController) -> list[str]:
    return [p.name.rsplit("-", 1)[1] for p in ns.pods() if p.terminating_at is None]


def test_scale_in_with_a_slurm_client_drains_then_deletes_the_idle_pod():
    """b started before the job list at 30 and the sync that list caused: its deadline is on its pod."""
    ns, slurm = _cluster(client=True, job_at=25)
    assert ns.reconcile(41, client=True) == []
    assert slurm.nodes["slinky-0"].drain and len(ns.pods()) == 2  # drained first
    assert ns.reconcile(42, client=True) == []
    assert _active(ns) == ["1"]


def test_scale_in_without_a_slurm_client_deletes_by_ordinal_and_kills():
    ns, _ = _cluster(client=False)
    assert ns.reconcile(41, client=False) == ["b"]
    assert _active(ns) == ["0"]


def _scale_in_after_b_started(drain_requeue: bool) -> tuple[Slurmctld, list[str], float]:
    """b started at 40, after the last job list (30): at 41 its pod carries no deadline, ties with
    the idle one, and goes first as the higher ordinal; it is drained, not deleted. Returns the pods
    left active when one of them is gone (and when), b's job never killed."""
    ns, slurm = _cluster(client=True, drain_requeue=drain_requeue)
    assert ns.reconcile(41, client=True) == []
    assert slurm.nodes["slinky-1"].drain and not slurm.nodes["slinky-0"].drain
    for t in range(42, 1100):
        slurm.step(t)
        assert ns.reconcile(t, client=True) == []
        ns.kube.step(t)
        if len(_active(ns)) == 1:
            return slurm, _active(ns), t
    raise AssertionError("no pod went")


def test_a_deadline_reaches_the_sort_one_sync_late_so_the_busy_node_is_drained_until_its_job_ends():
    """1.0.0: the list at 60 knows b, but no event follows it, so no sync writes that down before b
    ends (1040); the informer's next list (1050) is the event that deletes b's drained pod."""
    slurm, active, gone = _scale_in_after_b_started(drain_requeue=False)
    assert (active, gone) == (["0"], 1050) and not slurm.nodes["slinky-0"].drain


def test_from_1_0_5_the_drain_requeue_keeps_the_busy_node_and_deletes_the_idle_one():
    """1.0.5: the sync at 71 (41 + 30) writes b's deadline, the one at 101 sorts with it: the idle
    slinky-0 is condemned instead, drained and deleted, and slinky-1 is un-drained under b."""
    slurm, active, gone = _scale_in_after_b_started(drain_requeue=True)
    assert active == ["1"] and gone <= 41 + 2 * DRAIN_REQUEUE + 1, gone
    (b,) = [j for j in slurm.jobs if j.spec.name == "b"]
    assert not slurm.nodes["slinky-1"].drain and b.state == RUNNING


STALE = {
    "workers": 4,
    "duration": 3000,
    "images": "warm",
    "jobs": [
        # AI holds its two GPUs; k waits for one of HPC's, which slurmd holds for w and v
        {"name": "ai", "kind": "job", "submit": 0, "runtime": 2800, "gpus": 2},
        {"name": "k", "kind": "job", "submit": 100, "runtime": 100, "gpus": 1},
        {"name": "w", "kind": "slurm", "submit": 0, "runtime": 600, "nodes": 1},  # slinky-0
        # slinky-1, ends first; its deadline (start + time limit) is the earlier one
        {"name": "v", "kind": "slurm", "submit": 0, "runtime": 595, "nodes": 1, "time": 10},
        {"name": "x", "kind": "slurm", "submit": 605, "runtime": 1500, "nodes": 1},  # then slinky-1
    ],
}
# Scrape, poll and sync phases under which the HPA's scale-in follows w's end by 13 s, before the
# informers' next list at some of their phases (at phase set 0 it comes 27 s after, and at every
# phase a list has seen x and a sync has written its deadline by then).
STALE_PHASE_SET = 2


def _freed_by_informer_phase(*overrides: str) -> dict[int, float]:
    """When w's GPU reached k, by the informers' phase; nothing is killed at any."""
    freed = {}
    for phase in range(0, int(INFORMER_PERIOD), 5):
        run = sim.Run(setup(*overrides), scenario.parse(STALE), STALE_PHASE_SET)
        run.nodeset.informer_phase = float(phase)
        r = run.run()
        assert r["killed"] == [] and sim.ok(r), phase
        (w_end,) = [x for x in r["returns"] if x["slurm_job"] == "w"]
        freed[phase] = w_end["gpu_freed_s"]
    return freed


@pytest.mark.slow  # a sweep of the informers' phase: six runs
def test_a_stale_deadline_condemns_the_node_whose_job_just_started_and_the_idle_gpu_waits_for_it():
    """Slinky 1.0.0. w (52-652) ends while k waits: the default policy scales slurmd in. x started
    on slinky-1 at 650, where v had just ended. At some phases of the client's informers the
    scale-in sync reads v's old deadline on slinky-1 (its start, 55, plus its 10-minute limit) and
    w's on slinky-0 (52 plus MaxTime, 60 minutes), so it condemns slinky-1 and drains it under x;
    the list that knows x comes with no event after it, so slinky-0's idle GPU goes back only when
    x ends, about 1500 s later. Elsewhere it comes within a list and the pod's grace period."""
    freed = _freed_by_informer_phase("slinkyVersion=1.0.0")
    late = {phase for phase, s in freed.items() if s > 1400}
    assert late and late != freed.keys(), freed  # some phases only
    bound = INFORMER_PERIOD + setup("slinkyVersion=1.0.0").slurmd_termination
    assert max(s for phase, s in freed.items() if phase not in late) <= bound, freed


@pytest.mark.slow  # a sweep of the informers' phase: six runs (the requeue itself: the fast test above)
def test_from_1_0_5_the_drain_requeue_bounds_the_wait_for_a_stale_deadline():
    """Slinky 1.0.5: the sync 30 s after the one that drained slinky-1 under x has written x's
    deadline, the next sorts with it and condemns the idle slinky-0: at every phase its GPU comes
    back within a requeue and a list."""
    freed = _freed_by_informer_phase()
    assert max(freed.values()) <= DRAIN_REQUEUE + INFORMER_PERIOD, freed


def _tick_by_tick(run: sim.Run) -> list[tuple[float, int, frozenset, frozenset]]:
    """Per second: the replicas, the slurmd pods not being deleted, and the slurmd pods cordoned or
    drained in Slurm."""
    out = []
    for t in range(int(run.scenario.duration) + 1):
        run.tick(t)
        pods = [p for p in run.kube.live_pods() if p.holder == SLURMD]
        active = frozenset((p.name, p.created) for p in pods if p.terminating_at is None)
        drained = {n.name for n in run.slurm.nodes.values() if n.drain}
        out.append((float(t), run.nodeset.replicas, active, frozenset({p.name for p in pods if p.cordon} | drained)))
    return out


def test_while_kueue_is_down_the_nodeset_changes_no_pod_and_nothing_is_killed():
    """kueue-down.yaml, default stack: c's node is idle from 140 and the HPA asks for one pod fewer
    during the outage (300-1200), but every sync stops at its first deadline patch: no pod is
    created, cordoned, drained or deleted until Kueue is back."""
    run = sim.Run(setup(), scenario.load(SCENARIOS / "kueue-down.yaml"))
    outage = [tick for tick in _tick_by_tick(run) if 300 <= tick[0] < 1200]
    assert any(replicas < len(pods) for _, replicas, pods, _ in outage), "the HPA asked for a scale-in"
    assert len({pods for _, _, pods, _ in outage}) == 1, "no pod created or deleted"
    assert {held for *_, held in outage} == {frozenset()}, "none cordoned or drained"
    r = run.result()
    assert r["killed"] == [] and sim.ok(r)


def test_after_kueue_is_back_the_nodeset_waits_for_its_retry_or_the_next_event():
    """With slurmd allowed every GPU (policy demand-aware: no cap, so Kueue's metrics going with
    Kueue change nothing), b (2 nodes, from 600) needs a third pod, refused during the outage. When
    Kueue is back (1200) nothing enqueues the NodeSet: its retry has backed off (5 ms doubling per
    failed sync, at most 1000 s) and the next event is a's end (1500), seen by the informer. b runs
    then, on a's node; the third pod is never made. (Under lend-and-reclaim the cap, at HPC's share
    while Kueue's metrics are gone, leaves b without pods until they are back, and that change of
    the NodeSet is an event: b starts at once.)"""
    s = program.setup(offline.stack_settings("dev", ["hpcBorrowsAiGpus=true"]), scaling.DEMAND_AWARE)
    run = sim.Run(s, scenario.load(SCENARIOS / "kueue-down.yaml"))
    ticks = _tick_by_tick(run)
    short = [t for t, replicas, pods, _ in ticks if replicas > len(pods)]
    assert short and min(short) < 1200 and all(t in short for t in range(1200, 1500)), "unanswered after 1200"
    assert not any(c >= 300 for _, _, pods, _ in ticks for _, c in pods)
    r = run.result()
    assert {j["name"]: j["started"] for j in r["jobs"]}["b"] >= 1500 and r["killed"] == [] and sim.ok(r)


def test_the_slinky_release_sets_the_termination_and_the_drain_requeue():
    """1.0.5's logfile sidecar exits on SIGTERM and its drain requeue fires; 1.0.0's does neither."""
    for overrides, held, requeue in (((), TERMINATION, True), (("slinkyVersion=1.0.0",), GRACE_PERIOD, False)):
        s = setup(*overrides)
        assert (s.slurmd_termination, s.drain_requeue) == (held, requeue)
        kube = Kubernetes(gpus=1, cold=False, slurmd_termination=s.slurmd_termination)
        pod = kube.create_pod(Pod("slurm-worker-slinky-0", SLURMD, "slinky-0", "slurmd", 0.0))
        job_pod = kube.create_pod(Pod("job-0", KUBERNETES, "job", "job", 0.0))
        for t in range(200):
            if t == 100:
                kube.delete(pod, t)
            kube.step(t)
        assert pod.gone_at == job_pod.bound_at == 100 + held  # the job's pod waits for the GPU until then


def test_a_pod_gone_leaves_the_live_pods_and_the_nodesets_pods_at_once():
    """Both lists are cached between changes (Kubernetes.live_pods, NodeSetController.pods)."""
    ns, _ = _cluster(client=True)
    pod = ns.pods()[0]
    ns.kube.pod_gone(pod, 41.0)
    assert pod not in ns.kube.live_pods() and pod not in ns.pods()


def test_a_pod_is_marked_gone_by_kubernetes_pod_gone_alone():
    """Anything else setting gone_at would leave the pod in the cached live lists (read by the
    ledger, the samples and the NodeSet): the twin and its tests assign it nowhere else."""
    root = Path(__file__).resolve().parents[2]
    offenders = []
    for path in [*(root / "twin").glob("*.py"), *(root / "tests").rglob("*.py")]:
        tree = ast.parse(path.read_text())
        for function in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name != "pod_gone"]:
            for node in ast.walk(function):
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                for target in targets:
                    if isinstance(target, ast.Attribute) and target.attr == "gone_at":
                        offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert offenders == []

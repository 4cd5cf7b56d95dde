"""The twin's world: Slurm, Kubernetes, the NodeSet controller, KEDA + the HPA, Kueue and Prometheus
with its scrape targets, built from what the program renders (Setup), and one second of all of
them (World.advance). The clock that drives it and what is counted live in twin/sim.py,
twin/ledger.py and twin/report.py."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from components import fair_share, fair_share_controller, runnable_jobs
from components.ai_run_limit import Limits
from components.slurmd_scaling import KUEUE_NOMINAL, KUEUE_PENDING, KUEUE_USAGE
from core.names import (
    AI_CLUSTER_QUEUE,
    GPU_RESOURCE,
    GPUS_PER_WORKER,
    HPC_CLUSTER_QUEUE,
    JOBS_NAMESPACE,
    QUEUE_NAME_LABEL,
)
from twin import kube as k8s
from twin.autoscale import HPA_SYNC, TOLERANCE, Hpa, Keda
from twin.kueue import Kueue
from twin.nodeset import NodeSetController
from twin.prometheus import SCRAPE_INTERVAL, Prometheus, Target
from twin.promql import Evaluator, PromQLError, scalar_result
from twin.scenario import JobSpec, Scenario
from twin.slurm import BF_INTERVAL, SLURMD_TIMEOUT, SlurmConfig, Slurmctld, SlurmJob

DEFAULT_PHASE_SET = 0  # the phases of `simulate` and the README's tables; --phases N sweeps sets 0..N-1
# Fault node-failure, on Kubernetes' side: kube-controller-manager marks a node that stopped posting
# its status NotReady (Unknown) after --node-monitor-grace-period, 50 s since v1.29 (the program
# sets none; kubernetes/kubernetes#121793), and taints it unreachable:NoExecute; every pod carries
# the toleration the DefaultTolerationSeconds admission plugin adds, 300 s
# (plugin/pkg/admission/defaulttolerationseconds/admission.go, default-unreachable-toleration-
# seconds), so the taint-eviction controller deletes them 300 s later. Deleted, they stay
# Terminating, bound to the node's GPU, until its kubelet is back to stop them (PodGC removes them
# sooner only from a node tainted out-of-service, which nothing here sets).
NODE_NOT_READY_S = 50.0
UNREACHABLE_TOLERATION_S = 300.0


@dataclass(frozen=True)
class Setup:
    """What the twin takes from the program: its ScaledObject, Slurm config and names."""

    scaled_object: dict
    slurm: SlurmConfig
    namespace: str
    nodeset: str  # NodeSet object name, also the slurmd pod name prefix
    host_prefix: str  # Slurm node names <host_prefix>-<ordinal>
    restapi_deployment: str
    workers: int
    kueue_objects: tuple[dict, ...] = ()
    kueue_config: dict = field(default_factory=dict)
    images: dict[str, str] = field(default_factory=lambda: {role: role for role in k8s.IMAGE_PULL})
    prepulled: tuple[str, ...] = ()  # on every GPU worker before the stack is ready
    init_tries: int = k8s.INIT_TRIES_DEFAULT
    # The NodeSet's pod labels (components/slinky.py): with the queue label, each slurmd pod is a
    # 1-GPU Kueue workload; without it, slurmd is outside Kueue.
    slurmd_labels: dict = field(default_factory=dict)
    scrape_interval: int = SCRAPE_INTERVAL  # slurmMetricsIntervalSeconds (the ServiceMonitor's interval)
    # What the program's run-limit policies allow a queued job (components/ai_run_limit.py); None: no policy
    run_limit: Limits | None = None
    gpu_replicas: int = 1  # the device plugin's devices per GPU (twin/program.py gpu_replicas)
    hpa_tolerance: float = TOLERANCE  # kube-controller-manager's, as the kubeadm config sets it
    # The fair-share controller (components/fair_share.py), under the policies that run it: its
    # PromQL (slurmd_scaling.fair_share_queries) and each side's guaranteed GPUs; None: not run.
    fair_share_queries: tuple[tuple[str, str], ...] | None = None
    guaranteed: tuple[tuple[str, int], ...] = ()
    lends: tuple[tuple[str, bool], ...] = ()  # whether each side's queue lends (fair_share_controller.lends)
    turn_limit_s: float | None = None  # the controller's (fair_share_controller.no_starvation_bounds)
    # What the Slinky release changes (twin/program.py slinky_behaviour): how long a deleted slurmd
    # pod holds its GPU, and whether a draining scale-in victim requeues its NodeSet
    slurmd_termination: float = k8s.TERMINATION
    drain_requeue: bool = True
    # The runnable-jobs exporter (components/runnable_jobs.py) under the guarded policies, whose
    # triggers read it: the partitions it reports; empty: not run.
    runnable_partitions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Phases:
    """Where each periodic loop fires within its period, in seconds from the run's start. On a
    cluster they are independent: each scrape target at its own offset (prometheus/prometheus
    scrape/target.go Target.offset: a hash of the target), the KEDA poll from when its scale loop
    started (kedacore/keda@v2.20.2:pkg/scaling/scale_handler.go startScaleLoop: a check, then one
    every pollingInterval) and the HPA sync from when the HPA was first queued (kubernetes/
    kubernetes@v1.34.0:pkg/controller/podautoscaler/horizontal.go: each HPA is requeued one
    resync period after it was processed). A phase set (a number) draws them: random.Random(it),
    so a run stays reproducible."""

    scrape: tuple[int, ...]  # per scrape target, in Run's target order
    poll: int
    sync: int
    # slurmctld's sched/backfill cycle, every bf_interval from when its thread started
    # (SchedMD/slurm@slurm-25-11-6-1: src/plugins/sched/backfill/backfill.c backfill_agent)
    backfill: int = 0

    @classmethod
    def drawn(cls, phase_set: int, targets: int, scrape_interval: int, polling: int, later_targets: int = 0) -> Phases:
        """`later_targets` (the exporter's) are drawn after the others, so adding one leaves the
        phases of every run without it as they were."""
        rng = random.Random(phase_set)
        scrape = tuple(rng.randrange(scrape_interval) for _ in range(targets))
        poll, sync = rng.randrange(polling), rng.randrange(HPA_SYNC)
        backfill = rng.randrange(int(BF_INTERVAL))  # drawn after those: their phases stay
        later = tuple(rng.randrange(scrape_interval) for _ in range(later_targets))
        return cls(scrape + later, poll, sync, backfill)


def gpu_uuid(i: int) -> str:
    return f"GPU-{i:08x}-0000-4000-8000-twin{i:08x}"


@dataclass
class World:
    setup: Setup
    scenario: Scenario
    phase_set: int = DEFAULT_PHASE_SET  # draws the Phases
    slurm: Slurmctld = field(init=False)
    kube: k8s.Kubernetes = field(init=False)

    def __post_init__(self) -> None:
        s = self.setup
        self.slurm = Slurmctld(s.slurm)  # its backfill phase is drawn with the others below
        self.kube = k8s.Kubernetes(
            gpus=self.scenario.workers or s.workers,
            cold=self.scenario.images == "cold",
            images=dict(s.images),
            prepulled=frozenset(s.prepulled),
            init_tries=s.init_tries,
            gpu_replicas=s.gpu_replicas,
            slurmd_termination=s.slurmd_termination,
        )
        self.nodeset = NodeSetController(s.nodeset, s.host_prefix, self.kube, self.slurm, drain_requeue=s.drain_requeue)
        self.keda = Keda.from_scaled_object(s.scaled_object)
        self.hpa = Hpa(self.keda, s.hpa_tolerance)
        self.kueue = (
            Kueue.from_program(list(s.kueue_objects), s.kueue_config)
            if self.scenario.kueue and s.kueue_objects
            else None
        )
        self.slurmd_queued = self.kueue is not None and QUEUE_NAME_LABEL in s.slurmd_labels
        self._pods_seen_by_kueue = 0  # kube.pods is append-only: the pods before this index are seen
        self._refused: list[JobSpec] = []  # jobs refused at submit (Kueue down, slurmctld down), submitted again
        self.denied: dict[str, str] = {}  # Kubernetes jobs the run-limit policies refused, with why
        self.prom = Prometheus(interval=s.scrape_interval)
        self.prom.targets = [
            Target("slurm-controller", "slurm-controller:6817", self._slurm_metrics),
            Target("slurm-controller", "slurm-controller-dup:6817", self._slurm_metrics),
            Target("kube-state-metrics", "kube-state-metrics:8080", self._kube_state),
            Target("kueue", "kueue-controller-manager-metrics-service:8443", self._kueue_metrics),
        ]
        # The exporter runs as is on the twin's clock, reading the twin's job list when scraped (from
        # slurmrestd, so nothing while restapi is down).
        self.exporter = runnable_jobs.Exporter(s.runnable_partitions, self._job_list, clock=lambda: self.now)
        if s.runnable_partitions:
            self.prom.targets.append(Target("runnable-jobs", "runnable-jobs:8080", self._runnable_metrics))
        later = 1 if s.runnable_partitions else 0
        self.phases = Phases.drawn(
            self.phase_set, len(self.prom.targets) - later, s.scrape_interval, int(self.keda.polling), later
        )
        for target, offset in zip(self.prom.targets, self.phases.scrape, strict=True):
            target.offset = offset
        # Where in its interval some target is due (`prom.due`), fixed with the offsets
        self._scrape_phases = frozenset(t.offset % self.prom.interval for t in self.prom.targets)
        self.slurm.backfill_phase = float(self.phases.backfill)
        self.ev = Evaluator(self.prom.db)
        self.fair = (
            fair_share.FairShare(
                self.kube.gpus,
                dict(s.guaranteed),
                dict(s.lends),
                hpc_max=s.scaled_object["spec"]["maxReplicaCount"],  # as the controller's config
                turn_limit_s=s.turn_limit_s,
            )
            if s.fair_share_queries is not None and self.kueue is not None
            else None
        )
        self.quota_changes: list[tuple[float, dict[str, int], str]] = []  # the controller's patches
        self.killed: list[str] = []
        # Fault node-failure: what it did, by time (the Slurm jobs its DOWN node requeued, the pods
        # evicted), and each fault's progress (its index -> the steps taken).
        self.failure_events: list[tuple[float, str, str]] = []
        self._failure_steps: dict[int, set[str]] = {}
        self.kube_jobs: dict[str, k8s.KubeJob] = {}
        self.slurm_jobs: dict[str, list[SlurmJob]] = {}  # by scenario name: one record, or one per array task
        # The node failures: most scenarios have none, and no second looks for them then
        self._node_faults = [
            (i, f) for i, f in enumerate(self.scenario.faults) if f.kind == "node-failure" and f.node is not None
        ]
        self._events = sorted(self.scenario.jobs, key=lambda j: j.submit)
        self._releases = sorted((j.release, j.name) for j in self.scenario.jobs if j.release is not None)
        self.now = 0.0
        # The stack was up before the run: each target's last scrape before 0 saw the idle cluster.
        for target in self.prom.targets:
            self.prom.scrape(float(target.offset - self.prom.interval), [target], self._target_down)

    # ------------------------------------------------------------ scrape targets

    def _slurm_metrics(self, now: float) -> list[tuple[dict, float]]:
        return [
            ({"__name__": name, "partition": p}, value)
            for p, metrics in self.slurm.partition_metrics(now).items()
            for name, value in metrics.items()
        ]

    def _kube_state(self, now: float) -> list[tuple[dict, float]]:
        s = self.setup
        restapi = 0.0 if self.scenario.fault_active("restapi-down", now) else 1.0
        out = [
            (
                {"__name__": "kube_deployment_status_replicas_available", "namespace": s.namespace}
                | {"deployment": s.restapi_deployment},
                restapi,
            )
        ]
        for pod in self.kube.live_pods():
            if pod.holder == k8s.SLURMD:
                labels = {"__name__": "kube_pod_info", "namespace": s.namespace, "pod": pod.name}
                out.append(({**labels, "created_by_kind": "NodeSet", "created_by_name": s.nodeset}, 1.0))
            elif pod.gpu is None and pod.terminating_at is None:
                # PodScheduled False: kube-scheduler found no free GPU (kube-state-metrics pod.go)
                labels = {"__name__": "kube_pod_status_unschedulable", "namespace": JOBS_NAMESPACE}
                out.append(({**labels, "pod": pod.name}, 1.0))
        return out

    def _kueue_metrics(self, now: float) -> list[tuple[dict, float]]:
        if self.kueue is None:
            return []
        out = []
        for cq in (AI_CLUSTER_QUEUE, HPC_CLUSTER_QUEUE):
            labels = {"cluster_queue": cq, "resource": GPU_RESOURCE}
            out.append(({"__name__": KUEUE_PENDING} | labels, float(self.kueue.pending_gpus(cq))))
            out.append(({"__name__": KUEUE_USAGE} | labels, float(self.kueue.usage(cq))))
            out.append(({"__name__": KUEUE_NOMINAL} | labels, float(self.kueue.queues[cq].nominal)))
        return out

    def _job_list(self) -> list[dict]:
        if self.scenario.fault_active("restapi-down", self.now):
            raise OSError("slurmrestd has no available replica")
        if self.scenario.fault_active("slurmctld-down", self.now):
            raise OSError("slurmrestd cannot reach slurmctld")
        return self.slurm.job_list(self.now)

    def _runnable_metrics(self, now: float) -> list[tuple[dict, float]]:
        out = []
        for line in self.exporter.metrics().splitlines():
            if not line.startswith("#"):
                series, value = line.rsplit(" ", 1)
                parsed = re.fullmatch(r'(\w+)\{partition="([^"]*)"\}', series)
                if parsed is None:  # the exporter serves only per-partition series
                    raise ValueError(f"runnable-jobs exporter: unexpected series {series!r}")
                name, partition = parsed.groups()
                out.append(({"__name__": name, "partition": partition}, float(value)))
        return out

    def _target_down(self, target: Target, now: float) -> bool:
        if target.job == "runnable-jobs":
            return self.scenario.fault_active("runnable-exporter-down", now)
        if target.job == "kueue":  # its metrics endpoint is down too while Kueue is
            return self.scenario.fault_active("kueue-metrics-outage", now) or self._kueue_down(now)
        if target.job == "kube-state-metrics":
            return self.scenario.fault_active("kube-state-metrics-outage", now)
        if target.job != "slurm-controller":
            return False
        if self.scenario.fault_active("metrics-outage", now) or self.scenario.fault_active("slurmctld-down", now):
            return True
        return target.instance.startswith("slurm-controller-dup") and not self.scenario.fault_active(
            "duplicate-scrape", now
        )

    # ------------------------------------------------------------ submissions and one second

    def submit(self, spec: JobSpec, now: float) -> None:
        if spec.kind == "slurm" and not self.slurm.up:
            self._refused.append(spec)  # sbatch cannot reach slurmctld; the user submits it again
        elif spec.kind == "slurm":
            self.slurm_jobs[spec.name] = self.slurm.submit(spec, now)
        elif self.kueue is not None and self._kueue_down(now):
            self._refused.append(spec)  # the job webhook fails closed; the user submits it again
        else:
            queued = self.kueue is not None
            limit = self._declared_limit(spec)
            if queued and (reason := self._denial(spec, limit)):
                self.denied[spec.name] = reason  # for good: the same job is refused again
                return
            job = self.kube.submit(
                spec.name, spec.kind, spec.gpus_wanted, spec.runtime, now, suspended=queued, image=spec.image
            )
            self.kube_jobs[spec.name] = job
            if self.kueue is not None:
                self.kueue.add(job, spec.gpus_wanted, now, limit=limit)

    def _declared_limit(self, spec: JobSpec) -> float | None:
        """The job's kueue.x-k8s.io/max-exec-time-seconds: its own, or the most the policies allow."""
        rl = self.setup.run_limit
        return spec.limit if spec.limit is not None else rl.max_seconds if rl is not None else None

    def _denial(self, spec: JobSpec, limit: float | None) -> str | None:
        """Why the run-limit policies refuse the job at submit, if they do. The twin's pods ask for
        one GPU each, so only the label and the total can be wrong."""
        rl = self.setup.run_limit
        if rl is None:
            return None
        if limit is not None and limit > rl.max_seconds:
            return f"run limit {limit:g} s is above the stack's {rl.max_seconds} s (aiJobMaxMinutes {rl.max_minutes})"
        if spec.gpus_wanted > rl.gpus:
            return f"asks for {spec.gpus_wanted} GPUs; the workers have {rl.gpus} (workerCount)"
        return None

    def advance(self, tick: int) -> float:
        """One second of submissions, Slurm, the scrape, KEDA and the HPA, the NodeSet, Kubernetes."""
        now = self.now = float(tick)
        faults = self.scenario.faults  # most scenarios have none: no fault is looked up
        self.slurm.up = not (faults and self.scenario.fault_active("slurmctld-down", now))
        if self._refused:
            retry, self._refused = self._refused, []
            for spec in retry:
                self.submit(spec, now)
        while self._events and self._events[0].submit <= now:
            self.submit(self._events.pop(0), now)
        while self._releases and self._releases[0][0] <= now:
            self.slurm.release(self._releases.pop(0)[1])
        if self._node_faults:
            self._node_failures(now)
        self.slurm.step(now)
        if tick % self.prom.interval in self._scrape_phases:  # most seconds no target is due
            self.prom.scrape(now, self.prom.due(tick), self._target_down)
        # Every sample before the next second's scrape is written: results at any time before it are
        # final, those at `now` too (a KEDA poll or HPA sync on a subquery step memoises its windows).
        self.ev.final_before = now + 1
        if (tick - self.phases.poll) % int(self.keda.polling) == 0:
            self.nodeset.replicas = self.keda.poll(self.ev, now, self.nodeset.replicas)
        if (tick - self.phases.sync) % HPA_SYNC == 0:
            self.nodeset.replicas = self.hpa.sync(self.ev, now, self.nodeset.replicas)
        down = bool(faults) and self._kueue_down(now)
        if self.fair is not None and tick % fair_share.PERIOD_S == 0:
            self._fair_share(now, kueue_up=not down)
        client = not (faults and self.scenario.fault_active("restapi-down", now))
        self.killed += self.nodeset.reconcile(now, client, refused=self.slurmd_queued and down)
        if self.kueue is not None:
            if self.slurmd_queued and len(self.kube.pods) > self._pods_seen_by_kueue:
                self._queue_new_slurmd_pods(self.kueue, now)
            self.kueue.step(self.kube, now, up=not down)
        self.kube.step(now)
        self.slurm.step(now)
        return now

    def fair_share_reading(self, t: float) -> fair_share.Reading:
        """What the fair-share controller reads at t: its queries on the twin's Prometheus, a query
        that errs read as lost (components/fair_share.py reading)."""
        assert self.setup.fair_share_queries is not None
        values: dict[str, float | None] = {}
        for name, query in self.setup.fair_share_queries:
            try:
                values[name] = scalar_result(self.ev.instant(query, t))
            except PromQLError:
                values[name] = None
        return fair_share.reading(values)

    def _fair_share(self, now: float, kueue_up: bool) -> None:
        """The controller's period: it reads Prometheus, decides, and patches the ClusterQueues
        (refused by Kueue's webhook while Kueue is down: the quotas stay as they were)."""
        assert self.fair is not None and self.kueue is not None
        quotas = self.fair.step(now, self.fair_share_reading(now))
        if not kueue_up:
            return
        moved = False  # a nominalQuota changed (a lendingLimit alone follows the turn)
        for side, name in fair_share_controller.sides().items():  # as the controller's config
            queue, nominal = self.kueue.queues[name], quotas.nominal[side]
            lending = queue.lending_limit
            if lending is not None:
                lending = fair_share.lending_limit(side, self.fair.lends[side], nominal, quotas.turn)
            moved |= queue.nominal != nominal
            self.kueue.set_nominal(name, nominal, lending)  # a no-op where both are as wanted
        if moved:
            self.quota_changes.append((now, dict(quotas.nominal), quotas.reason))

    def _node_failures(self, now: float) -> None:
        """Fault node-failure on GPU worker `node`, from `start` to `end`: the node stops (its pods'
        work stands still, nothing binds there), Slurm sets its node DOWN after SLURMD_TIMEOUT and
        requeues the job on it, Kubernetes evicts its pods NODE_NOT_READY_S +
        UNREACHABLE_TOLERATION_S after the start, and they go, freeing the GPU, only once the node
        is back at `end`. A Kubernetes job's controller replaces its evicted pod elsewhere; Kueue
        keeps the workload's quota meanwhile (the job stays admitted, and a stopped slurmd pod is
        counted until it is gone: twin/kueue.py)."""
        for i, fault in self._node_faults:
            if fault.node is None or fault.node >= self.kube.gpus:
                continue
            done = self._failure_steps.setdefault(i, set())
            gpu = fault.node
            on_it = [p for p in self.kube.live_pods() if p.gpu == gpu]
            slurm_nodes = {p.owner for p in on_it if p.holder == k8s.SLURMD}
            if now >= fault.end:
                if "start" in done and "end" not in done:
                    done.add("end")
                    self.kube.failed.discard(gpu)
                    self.slurm.unreachable -= slurm_nodes
                    self.failure_events.append((now, "node back", f"GPU {gpu}"))
                continue
            if now < fault.start:
                continue
            if "start" not in done:
                done.add("start")
                self.kube.failed.add(gpu)
                self.slurm.unreachable |= slurm_nodes
                self.failure_events.append((now, "node failed", f"GPU {gpu}"))
            if "down" not in done and now >= fault.start + SLURMD_TIMEOUT:
                done.add("down")
                for node in sorted(slurm_nodes):
                    self.slurm.unreachable.discard(node)
                    for job in self.slurm.set_down(node, now, failed=True):
                        self.failure_events.append((now, "requeued", job.spec.name))
            if "evict" not in done and now >= fault.start + NODE_NOT_READY_S + UNREACHABLE_TOLERATION_S:
                done.add("evict")
                for pod in on_it:
                    self._evict_from_failed_node(pod, now)

    def _evict_from_failed_node(self, pod: k8s.Pod, now: float) -> None:
        self.kube.delete(pod, now)
        self.failure_events.append((now, "evicted", pod.name))
        job = next((j for j in self.kube.open_jobs if pod in j.pods), None)
        if job is None:
            return  # a slurmd pod: the NodeSet replaces it once it is gone
        self.kube.replace_pod(job, pod, now)
        if self.kueue is not None:
            for w in self.kueue.open_workloads:
                if w.job is job:
                    w.stopping = (*w.stopping, pod)  # the Job ends only once this pod is gone

    def _kueue_down(self, now: float) -> bool:
        return self.scenario.fault_active("kueue-down", now)

    def _queue_new_slurmd_pods(self, kueue: Kueue, now: float) -> None:
        """Kueue's pod webhook gates each new labelled slurmd pod and makes it a workload."""
        new, self._pods_seen_by_kueue = self.kube.pods[self._pods_seen_by_kueue :], len(self.kube.pods)
        for pod in new:
            if pod.holder == k8s.SLURMD:
                kueue.add_pod(pod, self.setup.slurmd_labels, GPUS_PER_WORKER, now)

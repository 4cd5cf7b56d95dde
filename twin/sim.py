"""The hand-off twin: one-second ticks of Slurm, Prometheus, KEDA + HPA, the NodeSet controller and
Kubernetes, driven by the program's own ScaledObject and slurm chart values."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from components.ai_run_limit import Limits
from components.slurmd_scaling import KUEUE_PENDING, KUEUE_USAGE
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
from twin.promql import Evaluator
from twin.scenario import JobSpec, Scenario
from twin.slurm import (
    COMPLETED,
    NEVER_SATISFIED,
    REFUSED,
    RUNNING,
    TIMEOUT,
    SlurmConfig,
    Slurmctld,
    SlurmJob,
)

SAMPLE_INTERVAL = 15.0
DEFAULT_PHASE_SET = 0  # the phases of `simulate` and the README's tables; --phases N sweeps sets 0..N-1


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
    # What the Slinky release changes (twin/program.py slinky_behaviour): how long a deleted slurmd
    # pod holds its GPU, and whether a draining scale-in victim requeues its NodeSet
    slurmd_termination: float = k8s.TERMINATION
    drain_requeue: bool = True


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

    @classmethod
    def drawn(cls, phase_set: int, targets: int, scrape_interval: int, polling: int) -> Phases:
        rng = random.Random(phase_set)
        scrape = tuple(rng.randrange(scrape_interval) for _ in range(targets))
        return cls(scrape, rng.randrange(polling), rng.randrange(HPA_SYNC))


def gpu_uuid(i: int) -> str:
    return f"GPU-{i:08x}-0000-4000-8000-twin{i:08x}"


@dataclass
class Run:
    setup: Setup
    scenario: Scenario
    phase_set: int = DEFAULT_PHASE_SET  # draws the Phases
    slurm: Slurmctld = field(init=False)
    kube: k8s.Kubernetes = field(init=False)
    samples: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        s = self.setup
        self.slurm = Slurmctld(s.slurm)
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
        self._refused: list[JobSpec] = []  # Kubernetes jobs whose create was refused (Kueue down)
        self.denied: dict[str, str] = {}  # Kubernetes jobs the run-limit policies refused, with why
        self.prom = Prometheus(interval=s.scrape_interval)
        self.prom.targets = [
            Target("slurm-controller", "slurm-controller:6817", self._slurm_metrics),
            Target("slurm-controller", "slurm-controller-dup:6817", self._slurm_metrics),
            Target("kube-state-metrics", "kube-state-metrics:8080", self._kube_state),
            Target("kueue", "kueue-controller-manager-metrics-service:8443", self._kueue_metrics),
        ]
        self.phases = Phases.drawn(self.phase_set, len(self.prom.targets), s.scrape_interval, int(self.keda.polling))
        for target, offset in zip(self.prom.targets, self.phases.scrape, strict=True):
            target.offset = offset
        self.ev = Evaluator(self.prom.db)
        self.killed: list[str] = []
        self.kube_jobs: dict[str, k8s.KubeJob] = {}
        self.slurm_jobs: dict[str, list[SlurmJob]] = {}  # by scenario name: one record, or one per array task
        self.idle_gpu_s = 0.0  # GPU-seconds held by slurmd pods whose Slurm node runs no job
        self.held_now = 0
        # GPU-seconds each side holds while both have work waiting or running (contention)
        self.contended = {"slurm": 0.0, "kubernetes": 0.0, "seconds": 0.0}
        self.zero_spans: list[list[float]] = []  # [start, end] of times slurmd held no GPU
        self.held: list[int] = []  # GPUs slurmd held, per second
        self.gpu_holder: dict[int, str] = {}
        self.owner_changes = 0  # a GPU going from slurmd to a Kubernetes job or back
        self.waiting_at_end: list[tuple[SlurmJob, list[k8s.KubeJob]]] = []  # Slurm job ends while AI waits
        # Each side's guaranteed GPUs (its ClusterQueue's nominalQuota), and the stretches it waited
        # below them while the other side held more than its own: a lent share not yet back.
        self.shares = (
            {
                side: self.kueue.queues[cq].nominal
                for side, cq in (("slurm", HPC_CLUSTER_QUEUE), ("kubernetes", AI_CLUSTER_QUEUE))
            }
            if self.kueue is not None
            else None
        )
        self.reclaim_waits: dict[str, list[float]] = {"slurm": [], "kubernetes": []}
        self._lent_since: dict[str, float | None] = {"slurm": None, "kubernetes": None}
        self._noted: set[int] = set()  # the Slurm jobs in waiting_at_end
        # Each job's last sample row and what it was built from: a sample builds only the rows of
        # jobs that changed since (a pending array task stays pending for hours).
        self._rows: dict[int, tuple[object, dict]] = {}
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
        return out

    def _target_down(self, target: Target, now: float) -> bool:
        if target.job == "kueue":  # its metrics endpoint is down too while Kueue is
            return self.scenario.fault_active("kueue-metrics-outage", now) or self._kueue_down(now)
        if target.job != "slurm-controller":
            return False
        if self.scenario.fault_active("metrics-outage", now):
            return True
        return target.instance.startswith("slurm-controller-dup") and not self.scenario.fault_active(
            "duplicate-scrape", now
        )

    # ------------------------------------------------------------ the loop

    def run(self) -> dict:
        for tick in range(int(self.scenario.duration) + 1):
            self.tick(tick)
        return self.result()

    def submit(self, spec: JobSpec, now: float) -> None:
        if spec.kind == "slurm":
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

    def tick(self, tick: int) -> None:
        """One second: submissions, Slurm, the scrape, KEDA and the HPA, the NodeSet, Kubernetes."""
        now = self.now = float(tick)
        retry, self._refused = self._refused, []
        for spec in retry:
            self.submit(spec, now)
        while self._events and self._events[0].submit <= now:
            self.submit(self._events.pop(0), now)
        while self._releases and self._releases[0][0] <= now:
            self.slurm.release(self._releases.pop(0)[1])
        self.slurm.step(now)
        self.prom.scrape(now, self.prom.due(tick), self._target_down)
        self.ev.final_before = now
        if (tick - self.phases.poll) % int(self.keda.polling) == 0:
            self.nodeset.replicas = self.keda.poll(self.ev, now, self.nodeset.replicas)
        if (tick - self.phases.sync) % HPA_SYNC == 0:
            self.nodeset.replicas = self.hpa.sync(self.ev, now, self.nodeset.replicas)
        client = not self.scenario.fault_active("restapi-down", now)
        down = self._kueue_down(now)
        self.killed += self.nodeset.reconcile(now, client, refused=self.slurmd_queued and down)
        if self.kueue is not None:
            if self.slurmd_queued:
                self._queue_new_slurmd_pods(now)
            self.kueue.step(self.kube, now, up=not down)
        self.kube.step(now)
        self.slurm.step(now)
        self._note_ends(now)
        self._account(now)
        if tick % int(SAMPLE_INTERVAL) == 0:
            self.samples.append(self._sample(now))

    def _note_ends(self, now: float) -> None:
        """Each Slurm job that ends while a Kubernetes job waits (queued in Kueue or Pending)."""
        if not self.slurm.completed_now:
            return
        waiting = [j for j in self.kube.open_jobs if j.started is None and j.finished is None]
        if waiting:
            ended = [j for j in self.slurm.completed_now if id(j) not in self._noted]
            self._noted.update(id(j) for j in ended)
            self.waiting_at_end += [(j, waiting) for j in ended]

    def _kueue_down(self, now: float) -> bool:
        return self.scenario.fault_active("kueue-down", now)

    def _queue_new_slurmd_pods(self, now: float) -> None:
        """Kueue's pod webhook gates each new labelled slurmd pod and makes it a workload."""
        new, self._pods_seen_by_kueue = self.kube.pods[self._pods_seen_by_kueue :], len(self.kube.pods)
        for pod in new:
            if pod.holder == k8s.SLURMD:
                self.kueue.add_pod(pod, self.setup.slurmd_labels, GPUS_PER_WORKER, now)

    def _account(self, now: float) -> None:
        busy = self.slurm.busy_nodes()
        held = idle = used = 0  # GPUs slurmd pods hold; of them, on nodes running nothing / a job
        ai_held = 0  # GPUs Kubernetes jobs' pods hold
        for p in self.kube.live_pods():
            if p.gpu is None:
                continue
            if p.running(now):
                if self.gpu_holder.get(p.gpu, p.holder) != p.holder:
                    self.owner_changes += 1
                self.gpu_holder[p.gpu] = p.holder
            if p.holder != k8s.SLURMD:
                ai_held += 1
            else:
                held += 1
                if p.owner in busy:
                    used += 1
                else:
                    idle += 1
        self.idle_gpu_s += idle
        self.held_now = held
        self.held.append(self.held_now)
        slurm_waits = any(j.finished is None for j in self.slurm.open_jobs)
        kube_open = [j for j in self.kube.open_jobs if j.finished is None]
        if slurm_waits and kube_open:
            self.contended["seconds"] += 1
            self.contended["slurm"] += used
            self.contended["kubernetes"] += sum(len(j.pods) for j in kube_open if j.started is not None)
        if self.held_now == 0:
            if self.zero_spans and self.zero_spans[-1][1] == now - 1:
                self.zero_spans[-1][1] = now
            else:
                self.zero_spans.append([now, now])
        if self.shares is not None:
            self._reclaim_wait("slurm", held, ai_held, self.shares, now)
            self._reclaim_wait("kubernetes", ai_held, held, self.shares, now)

    def _reclaim_wait(self, side: str, mine: int, theirs: int, shares: dict[str, int], now: float) -> None:
        """A side waits for its lent share while it has work waiting, holds less than its share
        and the other side more than its own."""
        other = "kubernetes" if side == "slurm" else "slurm"
        lent = mine < shares[side] and theirs > shares[other] and self._waits(side, now)
        since = self._lent_since[side]
        if lent and since is None:
            self._lent_since[side] = now
        elif not lent and since is not None:
            self.reclaim_waits[side].append(now - since)
            self._lent_since[side] = None

    def _waits(self, side: str, now: float) -> bool:
        """Work of the side that could start now: an eligible Slurm job, a workload Kueue has not admitted."""
        if side == "slurm":
            return any(self.slurm.eligible(j, now) for j in self.slurm.open_jobs)
        return self.kueue is not None and self.kueue.pending_gpus(AI_CLUSTER_QUEUE) > 0

    # ------------------------------------------------------------ results

    def _sample(self, now: float) -> dict:
        return {
            "t": now,
            "nodeset_replicas": self.nodeset.replicas,
            "slurmd_ready": sum(1 for p in self.nodeset.pods() if p.owner in self.slurm.nodes),
            "slurm_jobs": self._slurm_rows(),
            "kube_jobs": self._kube_rows(now),
            "gpu_pods": [
                {
                    "namespace": self.setup.namespace if p.holder == k8s.SLURMD else "default",
                    "name": p.name,
                    "uid": f"{p.name}@{p.created:g}",
                    "node": f"gpu-worker-{p.gpu}" if p.gpu is not None else "",
                    "phase": "Running" if p.running(now) else "Pending",
                    "holder": p.holder,
                    "owner": p.owner,
                    "container": "slurmd" if p.holder == k8s.SLURMD else "pytorch",
                    "uuids": [gpu_uuid(p.gpu)] if p.gpu is not None and p.running(now) else [],
                }
                for p in self.kube.live_pods()
            ],
        }

    def _slurm_rows(self) -> list[dict]:
        """Each Slurm job's sample row, the same object while its state and nodes are the same."""
        out, rows = [], self._rows
        for j in self.slurm.jobs:
            last = rows.get(id(j))
            if last is None or last[0] != (j.state, j.nodes):
                last = rows[id(j)] = ((j.state, j.nodes), _slurm_row(j))
            out.append(last[1])
        return out

    def _kube_rows(self, now: float) -> list[dict]:
        """Each Kubernetes job's sample row, the same object while its phase is the same."""
        out, rows = [], self._rows
        for j in self.kube.jobs:
            phase, last = _kube_phase(j, now), rows.get(id(j))
            if last is None or last[0] != phase:
                last = rows[id(j)] = (phase, {"kind": j.kind, "name": j.name, "phase": phase})
            out.append(last[1])
        return out

    def result(self) -> dict:
        jobs = []
        for spec in self.scenario.jobs:
            if spec.kind == "slurm":
                tasks = self.slurm_jobs.get(spec.name, [])
                states = {t.state for t in tasks}
                outcome = "unfinished"
                if tasks and states == {COMPLETED}:
                    outcome = "completed"
                if REFUSED in states:
                    outcome = "refused"
                if tasks and states <= {COMPLETED, TIMEOUT} and TIMEOUT in states:
                    outcome = "timed_out"  # its own time limit (--time or MaxTime), not the hand-off
                if tasks and all(t.reason == NEVER_SATISFIED for t in tasks):
                    outcome = "cancelled"  # by slurmctld: what it depends on did not complete
                if any(t.restarts for t in tasks):  # requeued: the work it had done was lost
                    outcome = "killed"
                starts = [t.started for t in tasks if t.started is not None]
                ends = [t.finished for t in tasks]
                row = {
                    "started": min(starts) if starts else None,
                    "finished": max(ends) if tasks and None not in ends else None,
                }
                if outcome == "refused":
                    row["reason"] = tasks[0].reason
                if outcome == "cancelled":
                    row["reason"] = f"{spec.after} did not complete: {NEVER_SATISFIED}, cancelled (kill_invalid_depend)"
                if outcome == "timed_out":
                    limit = next(t.time_limit for t in tasks if t.state == TIMEOUT)
                    row["reason"] = f"slurmctld ended it at its time limit, {limit / 60:g} min (TIMEOUT)"
            else:
                kj = self.kube_jobs.get(spec.name)
                outcome = "unfinished" if not kj or kj.finished is None else "failed" if kj.failed else "completed"
                row = {"started": kj.started if kj else None, "finished": kj.finished if kj else None}
                if spec.name in self.denied:
                    outcome, row["reason"] = "refused", self.denied[spec.name]
                if self.kueue is not None and kj is not None:
                    w = next(w for w in self.kueue.workloads if w.job is kj)
                    row |= {"admitted": w.first_admitted, "evictions": w.evictions}
                    if w.deactivated_at is not None:  # stopped at its own limit, not by the hand-off
                        outcome = "timed_out"
                        row["reason"] = f"Kueue stopped it after {w.limit:g} s admitted (its run limit)"
            jobs.append({"name": spec.name, "kind": spec.kind, "outcome": outcome, "submitted": spec.submit, **row})
        slurm_done = [j.finished for j in self.slurm.jobs if j.state in (COMPLETED, TIMEOUT)]
        gpu_return = None
        if slurm_done:
            last = max(slurm_done)
            back = next((max(start, last) for start, end in self.zero_spans if end >= last), None)
            if back is not None:
                gpu_return = max(0.0, back - last)
        waits = [j.started - self._eligible_since(j) for j in self.slurm.jobs if j.started is not None]
        return {
            "jobs": jobs,
            "killed": sorted(set(self.killed)),
            "double_held": sorted(gpu_uuid(g) for g in self.kube.double_held),
            "unfinished": [j["name"] for j in jobs if j["outcome"] == "unfinished"],
            "timed_out": [j["name"] for j in jobs if j["outcome"] == "timed_out"],  # Slurm's and Kueue's
            "end": {
                "slurmd_replicas": self.nodeset.replicas,
                "gpus_held_by_slurmd": self.held_now,
            },
            "latency": {"scale_up_s": max(waits) if waits else None, "gpu_return_s": gpu_return},
            "returns": self._returns(),
            "slurmd_starts": self.nodeset.starts,
            "gpu_owner_changes": self.owner_changes,
            "slurmd_idle_gpu_s": self.idle_gpu_s,
            "trigger_errors": self.keda.errors,
            "kueue": self.kueue is not None,
            "slurmd_in_kueue": self.slurmd_queued,
            "kueue_pod_evictions": self.kueue.pod_evictions if self.kueue is not None else 0,
            "contention": self._contention(),
            # seconds each side waited for its lent share, per wait; one still open at the end counts
            # until then
            "reclaim_waits": {
                side: waits + ([self.now - since] if (since := self._lent_since[side]) is not None else [])
                for side, waits in self.reclaim_waits.items()
            },
        }

    def _returns(self) -> list[dict]:
        """For each Slurm job that ended while a Kubernetes job waited: `last` (no other Slurm job
        ran) or `partial` (others kept running), the seconds until slurmd held one GPU fewer
        (`gpu_freed_s`) and until a waiting Kubernetes job ran (`kube_running_s`). Ends after
        which Slurm still had work pending (not held), or started another job before a GPU was freed,
        are left out: the rule keeps GPUs for that work."""
        out = []
        for job, waiting in self.waiting_at_end:
            end = job.finished
            if any(self._pending_at(o, end) for o in self.slurm.jobs if o is not job):
                continue
            others = [o for o in self.slurm.jobs if o is not job and o.started is not None]
            running = any(o.started <= end and (o.finished is None or o.finished > end) for o in others)
            before = self.held[int(end) - 1] if end >= 1 else 0
            freed = next((t - end for t in range(int(end), len(self.held)) if self.held[t] < before), None)
            if any(end <= o.started <= end + (freed if freed is not None else float("inf")) for o in others):
                continue
            starts = [j.started for j in waiting if j.started is not None and j.started >= end]
            out.append(
                {
                    "slurm_job": job.spec.name,
                    "ended": end,
                    "kind": "partial" if running else "last",
                    "gpu_freed_s": freed,
                    "kube_running_s": min(starts) - end if starts else None,
                }
            )
        return out

    @staticmethod
    def _pending_at(j: SlurmJob, t: float) -> bool:
        if j.state == REFUSED or j.spec.submit > t or (j.started is not None and j.started <= t):
            return False
        return not (j.spec.hold and (j.spec.release is None or j.spec.release > t))

    def _contention(self) -> dict:
        """Each side's share of the GPU time used while both had work waiting or running: a slurmd
        pod counts while its Slurm node runs a job, a Kubernetes job's pods while the job runs
        (a gang holding GPUs while it waits for its last pod counts for neither)."""
        c = self.contended
        used = c["slurm"] + c["kubernetes"]
        share = {side: round(c[side] / used, 3) if used else None for side in ("slurm", "kubernetes")}
        return {"seconds": c["seconds"], "gpu_s": {s: c[s] for s in ("slurm", "kubernetes")}, "share": share}

    def _eligible_since(self, j: SlurmJob) -> float:
        since = j.spec.submit
        if j.spec.begin is not None:
            since = max(since, j.spec.begin)
        if j.spec.release is not None:
            since = max(since, j.spec.release)
        if j.spec.after is not None:
            ends = [p.finished for p in self.slurm_jobs.get(j.spec.after, [])]
            if ends and None not in ends:
                since = max(since, *ends)
        if j.spec.throttle is not None:
            # a throttled task is eligible once an earlier task of its array has ended
            ends = sorted(t.finished for t in self.slurm_jobs[j.spec.name] if t.finished is not None)
            earlier = [e for e in ends if e <= (j.started or 0)]
            if earlier:
                since = max(since, earlier[-1])
        return since


def _slurm_row(j: SlurmJob) -> dict:
    return {
        "job_id": str(j.job_id),
        "name": j.spec.name,
        "state": "CANCELLED" if j.state == REFUSED else j.state,
        "nodes": list(j.nodes) if j.state == RUNNING else [],
    }


def _kube_phase(j: k8s.KubeJob, now: float) -> str:
    if j.finished is not None:
        return "succeeded"
    return "running" if j.started is not None else "pending"


def ok(result: dict) -> bool:
    """Exit 0: nothing killed or double-held, and every job that was not refused completed."""
    return (
        not result["killed"]
        and not result["double_held"]
        and all(j["outcome"] in ("completed", "refused") for j in result["jobs"])
    )


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q % of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _spread(values: list[float | None]) -> dict | None:
    """p50, p95 and max of the values known, and how many runs had none (never happened)."""
    known = [v for v in values if v is not None]
    if not known:
        return None
    return {
        "p50": percentile(known, 50),
        "p95": percentile(known, 95),
        "max": max(known),
        "none": len(values) - len(known),
    }


def sweep(setup: Setup, scenario: Scenario, phase_sets: Iterable[int]) -> dict:
    """The scenario once per phase set, each with its own Phases: the latencies of `Run.result` as
    p50/p95 over the phases, each side's waits for its lent share over every wait of every set,
    and the phase sets under which a job was killed, a GPU double-held, or the run was otherwise
    not ok."""
    return summary({n: Run(setup, scenario, n).run() for n in phase_sets})


def summary(results: dict[int, dict]) -> dict:
    """`sweep`'s report from the results of its runs, by phase set."""
    returns = [r for result in results.values() for r in result["returns"]]
    return {
        "phase_sets": list(results),
        "latency": {
            name: _spread([r["latency"][name] for r in results.values()]) for name in ("scale_up_s", "gpu_return_s")
        },
        "returns": {
            kind: {
                name: _spread([r[name] for r in returns if r["kind"] == kind])
                for name in ("gpu_freed_s", "kube_running_s")
            }
            for kind in ("last", "partial")
        },
        "reclaim_waits": {
            side: _spread([w for r in results.values() for w in r["reclaim_waits"][side]])
            for side in ("slurm", "kubernetes")
        },
        "killed": {n: r["killed"] for n, r in results.items() if r["killed"]},
        "double_held": {n: r["double_held"] for n, r in results.items() if r["double_held"]},
        "not_ok": [n for n, r in results.items() if not ok(r)],
    }

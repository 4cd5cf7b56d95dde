"""Kueue 0.19.2 admission as the program configures it: queued Kubernetes GPU jobs and every slurmd
pod are workloads of the ClusterQueues of one cohort, admitted whole or not at all.

The queues are read from the program's own rendered objects (`components.kueue.objects`), the
slurmd pods' queue and priority from the NodeSet's pod labels (`components.slinky.slurm_values`),
and waitForPodsReady from the manager configuration (`components.kueue.manager_config`).

Followed (kubernetes-sigs/kueue@v0.19.2; FACTS section 14):
* pkg/controller/jobframework/reconciler.go: a job with the queue-name label is created
  suspended (no pods) and becomes a Workload; admission unsuspends it, eviction suspends it again
  (its pods are deleted).
* pkg/controller/jobs/pod/pod_webhook.go, pod_controller.go: a labelled pod of an unknown owner
  (the NodeSet) is its own workload; it is created with the `kueue.x-k8s.io/admission`
  scheduling gate (kube-scheduler leaves it alone) and a finalizer; admission removes the gate;
  the finalizer goes once Kueue has seen the pod end, so its quota stays counted until then;
  eviction (Stop) deletes the pod.
* pkg/scheduler/scheduler.go (classicalIterator): the heads of the ClusterQueues are tried in
  this order: within nominal quota before borrowing, then higher priority, then older; each is
  admitted only if its whole request fits. pkg/cache/queue/cluster_queue.go: within a queue, by
  priority then age; BestEffortFIFO sets a head that does not fit aside and tries the next,
  StrictFIFO does not.
* pkg/cache/scheduler/resource_node.go (available, localQuota, addUsage): a queue's own
  `nominalQuota - lendingLimit` is its alone; the rest of every queue's nominalQuota is the
  cohort's, and usage above a queue's local part is drawn from the cohort; borrowingLimit caps it.
* pkg/controller/core/workload_controller.go (waitForPodsReady): an admitted workload whose
  PodsReady condition is not true `timeout` after admission is evicted and requeued after
  backoffBaseSeconds 60 doubling per eviction, capped at backoffMaxSeconds 3600
  (apis/config/v1beta2/configuration_types.go, requeuingStrategy; recoveryTimeout "0s" turns the
  check off once ready). PodsReady for a PyTorchJob is JobRunning, which the Training Operator
  sets once the Master runs (pkg/controller/jobs/kubeflow/kubeflowjob); for a batch Job or a pod,
  all its pods ready.
* pkg/controller/core/workload_controller.go (reconcileMaxExecutionTime), pkg/workload/
  admissionchecks.go: a workload whose job declares kueue.x-k8s.io/max-exec-time-seconds is
  deactivated once admitted that long, its admitted time summed over earlier admissions
  (AccumulatedPastExecutionTimeSeconds); deactivated, it is evicted, its job suspended (pods
  deleted) and never requeued.

While Kueue is down (fault `kueue-down`) nothing is admitted, evicted or released: running pods
keep running, gated pods stay gated, and an ended slurmd pod stays counted (its finalizer). The
webhooks refusing creation while it is down is `Kueue.up`'s caller's business (twin/world.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from core.names import (
    AI_LOCAL_QUEUE,
    AI_PRIORITY_CLASSES,
    GPU_RESOURCE,
    PRIORITY_CLASS_LABEL,
    QUEUE_NAME_LABEL,
)
from twin.kube import KubeJob, Kubernetes, Pod

# requeuingStrategy backoffBaseSeconds and backoffMaxSeconds defaults (apis/config/v1beta2/configuration_types.go)
BACKOFF_BASE, BACKOFF_MAX = 60.0, 3600.0


def _seconds(duration: str) -> float:
    """A Go duration as the manager config writes it: `10m`, `0s`, `90s`, `1h`."""
    units = {"s": 1, "m": 60, "h": 3600}
    return float(duration[:-1]) * units[duration[-1]]


@dataclass(frozen=True)
class ClusterQueue:
    name: str
    cohort: str | None
    nominal: int
    lending_limit: int | None  # None: all of nominal may be lent
    borrowing_limit: int | None  # None: no cap
    strict_fifo: bool

    @property
    def local(self) -> int:
        """What only this queue may use (resource_node.go localQuota)."""
        return max(0, self.nominal - self.lending_limit) if self.lending_limit is not None else 0


def _gpu_resource(cq: dict) -> dict:
    return next(
        r
        for g in cq["spec"]["resourceGroups"]
        for f in g["flavors"]
        for r in f["resources"]
        if r["name"] == GPU_RESOURCE
    )


def cluster_queues(objects: list[dict]) -> dict[str, ClusterQueue]:
    out = {}
    for o in objects:
        if o["kind"] != "ClusterQueue":
            continue
        gpu = _gpu_resource(o)
        out[o["metadata"]["name"]] = ClusterQueue(
            o["metadata"]["name"],
            o["spec"].get("cohortName"),
            int(gpu["nominalQuota"]),
            gpu.get("lendingLimit"),
            gpu.get("borrowingLimit"),
            o["spec"].get("queueingStrategy", "BestEffortFIFO") == "StrictFIFO",
        )
    return out


@dataclass
class Workload:
    gpus: int
    created: float
    cluster_queue: str
    priority: int = 0
    job: KubeJob | None = None  # a queued Kubernetes job, or
    pod: Pod | None = None  # a slurmd pod (the `pod` integration)
    admitted_at: float | None = None
    first_admitted: float | None = None
    ready: bool = False
    evictions: int = 0
    requeue_at: float = 0.0
    done: bool = False  # finished, or its pod gone and seen by Kueue: the quota is free again
    limit: float | None = None  # the job's declared longest run once admitted, in seconds
    past: float = 0.0  # seconds admitted before the current admission (evicted, then admitted again)
    deactivated_at: float | None = None  # when Kueue stopped it at its limit
    # An evicted or deactivated job's pods: its quota stays reserved until they are gone. Kueue
    # clears the admission only once the stopped job is no longer active
    # (kubernetes-sigs/kueue@v0.19.2: pkg/controller/jobframework/reconciler.go, "handle eviction":
    # UnsetQuotaReservation under !job.IsActive()).
    stopping: tuple[Pod, ...] = ()

    def releasing(self) -> bool:
        return bool(self.stopping) and any(p.gone_at is None for p in self.stopping)

    def ended(self) -> bool:
        """The work itself is over (Kueue may not have seen it yet)."""
        if self.job is not None:
            return self.job.finished is not None
        return self.pod is not None and self.pod.gone_at is not None


@dataclass
class Kueue:
    queues: dict[str, ClusterQueue]
    local_queues: dict[str, str]  # LocalQueue name -> ClusterQueue
    priorities: dict[str, int]  # WorkloadPriorityClass -> value
    pods_ready_timeout: float
    workloads: list[Workload] = field(default_factory=list)
    # The workloads not done, in creation order: a done one never counts again (no quota, not
    # pending, never a head), and every tick would otherwise walk every workload ever made.
    open_workloads: list[Workload] = field(default_factory=list)
    pod_evictions: int = 0  # slurmd pods waitForPodsReady deleted (never Ready: no Slurm job ran)
    # What the last scheduling run that admitted nothing saw (see _admission_state).
    _idle_state: tuple | None = None

    @classmethod
    def from_program(cls, objects: list[dict], manager_config: dict) -> Kueue:
        return cls(
            cluster_queues(objects),
            {o["metadata"]["name"]: o["spec"]["clusterQueue"] for o in objects if o["kind"] == "LocalQueue"},
            {o["metadata"]["name"]: int(o["value"]) for o in objects if o["kind"] == "WorkloadPriorityClass"},
            _seconds(manager_config["waitForPodsReady"]["timeout"]),
        )

    def add(
        self, job: KubeJob, gpus: int, now: float, local_queue: str = AI_LOCAL_QUEUE, limit: float | None = None
    ) -> Workload:
        """A queued Kubernetes job (the example jobs' priority class, the lowest AI one)."""
        priority = self.priorities[AI_PRIORITY_CLASSES[0]]
        w = Workload(gpus, now, self.local_queues[local_queue], priority, job=job, limit=limit)
        self.workloads.append(w)
        self.open_workloads.append(w)
        return w

    def add_pod(self, pod: Pod, labels: dict[str, str], gpus: int, now: float) -> Workload:
        """A labelled pod: gated until admitted (pod_webhook.go)."""
        pod.gated = True
        cq = self.local_queues[labels[QUEUE_NAME_LABEL]]
        w = Workload(gpus, now, cq, self.priorities.get(labels.get(PRIORITY_CLASS_LABEL, ""), 0), pod=pod)
        self.workloads.append(w)
        self.open_workloads.append(w)
        return w

    def usage(self, cluster_queue: str, reserved: dict[str, int] | None = None) -> int:
        """GPUs the queue's admitted workloads hold, as Kueue counts them (until it sees them end),
        plus what this scheduling cycle holds back for it."""
        held = sum(
            w.gpus
            for w in self.open_workloads
            if w.cluster_queue == cluster_queue and (w.admitted_at is not None or w.releasing())
        )
        return held + (reserved or {}).get(cluster_queue, 0)

    def available(self, cluster_queue: str, reserved: dict[str, int] | None = None) -> int:
        """resource_node.go `available` for one flat cohort."""
        cq = self.queues[cluster_queue]
        own = max(0, cq.local - self.usage(cq.name, reserved))
        if cq.cohort is None:
            return own
        members = [q for q in self.queues.values() if q.cohort == cq.cohort]
        subtree = sum(q.nominal - q.local for q in members)
        used = sum(max(0, self.usage(q.name, reserved) - q.local) for q in members)
        parent = subtree - used
        if cq.borrowing_limit is not None:
            stored = cq.nominal - cq.local
            used_in_parent = max(0, self.usage(cq.name, reserved) - cq.local)
            parent = min(stored - used_in_parent + cq.borrowing_limit, parent)
        return own + max(0, parent)

    def borrows(self, w: Workload) -> bool:
        return self.usage(w.cluster_queue) + w.gpus > self.queues[w.cluster_queue].nominal

    def set_nominal(self, cluster_queue: str, nominal: int, lending: int | None) -> None:
        """A patch of the queue's nominalQuota and lendingLimit (the fair-share controller's:
        fair_share.lending_limit; None: the queue has none)."""
        cq = self.queues[cluster_queue]
        if (cq.nominal, cq.lending_limit) == (nominal, lending):
            return
        self.queues[cluster_queue] = replace(cq, nominal=nominal, lending_limit=lending)
        self._idle_state = None  # the quotas changed: the next cycle decides again

    def pending_gpus(self, cluster_queue: str) -> int:
        """What `kueue_cluster_queue_resource_pending{cluster_queue, resource="nvidia.com/gpu"}` reads:
        the GPUs requested by the queue's workloads not admitted, waiting or backing off
        (pkg/cache/queue/cluster_queue.go pendingResources: heap, inadmissible and in flight)."""
        return sum(
            w.gpus
            for w in self.open_workloads
            if w.cluster_queue == cluster_queue and w.admitted_at is None and not w.ended()
        )

    def step(self, kube: Kubernetes, now: float, up: bool = True) -> None:
        if not up:
            return  # no admission, no eviction, no finalizer removed
        closed = False
        for w in self.open_workloads:
            ended = w.ended()
            if ended and not w.releasing():
                w.done = closed = True  # the job finished or the pod is gone: its quota is free (finalizer removed)
                w.admitted_at = None
                continue
            if ended or w.admitted_at is None or (w.pod is not None and w.pod.terminating_at is not None):
                continue  # waiting, or a pod being deleted: nothing more to decide
            if w.job is not None and w.limit is not None and now >= w.admitted_at + w.limit - w.past:
                self._deactivate(w, w.job, kube, now)
                continue
            if not w.ready and _pods_ready(w, now):
                w.ready = True  # recoveryTimeout 0s: never evicted once ready
            if not w.ready and now >= w.admitted_at + self.pods_ready_timeout:
                self._evict(w, kube, now)
        if closed:
            self.open_workloads = [w for w in self.open_workloads if not w.done]
        state = self._admission_state(now)
        if state != self._idle_state:  # the same state admits nothing again: skip the cycles
            self._idle_state = state if not self._admit(kube, now) else None

    def _admission_state(self, now: float) -> tuple:
        """Everything `_admit` decides on that can change: which workloads are open, and whether each
        is admitted, over, and past its requeue time. The rest (GPUs, queue, priority, age) is fixed."""
        return tuple(
            [(id(w), w.admitted_at is None, w.ended(), w.releasing(), now >= w.requeue_at) for w in self.open_workloads]
        )

    def _evict(self, w: Workload, kube: Kubernetes, now: float) -> None:
        w.evictions += 1
        if w.pod is not None:
            # a plain pod is stopped by deleting it (pod_controller.go Stop); the NodeSet makes a
            # new one, a new workload. Its quota is held until Kueue sees it gone.
            kube.delete(w.pod, now)
            self.pod_evictions += 1
            return
        assert w.job is not None and w.admitted_at is not None  # not a pod, so a job; evicted once admitted
        w.stopping = tuple(w.job.pods)
        kube.suspend(w.job, now)
        w.past += now - w.admitted_at
        w.admitted_at = None
        w.requeue_at = now + min(BACKOFF_MAX, BACKOFF_BASE * 2 ** (w.evictions - 1))

    def _deactivate(self, w: Workload, job: KubeJob, kube: Kubernetes, now: float) -> None:
        """At its limit: the job's pods are deleted and it never runs again; it is over, so
        nothing counts it as waiting. Unlike `_evict` it keeps its pods' record and start."""
        w.stopping = tuple(job.pods)
        for pod in job.pods:
            kube.delete(pod, now)
        job.finished, job.failed = now, True
        w.deactivated_at = now
        w.admitted_at = None

    def _admit(self, kube: Kubernetes, now: float) -> bool:
        """Scheduling cycles until one admits nothing. Each cycle takes every queue's head, in
        classicalIterator order (within nominal quota first, then priority, then age), and admits
        each that fits. A head within its queue's nominal quota that does not fit needs preemption
        and finds no candidate (every policy is Never): the cycle then holds back its queue's
        unused nominal quota for it, so no borrower behind it takes that (scheduler.go
        reserveCapacityForUnreclaimablePreempt, quotaResourcesToReserve). StrictFIFO puts a head
        that did not fit straight back at the head, so it does that every cycle; BestEffortFIFO
        sets it aside and the next workload is the head (cluster_queue.go RequeueIfNotPresent)."""
        passed: set[int] = set()  # BestEffortFIFO heads set aside this tick
        admitted = False
        while True:
            heads = [h for h in (self._head(cq, now, passed) for cq in self.queues) if h is not None]
            heads.sort(key=lambda w: (self.borrows(w), -w.priority, w.created))
            reserved: dict[str, int] = {}
            progress = False
            for w in heads:
                cq = self.queues[w.cluster_queue]
                if w.gpus <= self.available(cq.name, reserved):
                    self._admit_one(w, kube, now)
                    progress = admitted = True
                    continue
                used = self.usage(cq.name)
                if used + w.gpus <= cq.nominal:
                    reserved[cq.name] = reserved.get(cq.name, 0) + min(w.gpus, cq.nominal - used)
                if not cq.strict_fifo:
                    passed.add(id(w))
                    progress = True
            if not progress:
                return admitted

    def _admit_one(self, w: Workload, kube: Kubernetes, now: float) -> None:
        w.admitted_at = now
        w.first_admitted = now if w.first_admitted is None else w.first_admitted
        if w.pod is not None:
            w.pod.gated = False
        elif w.job is not None:
            kube.unsuspend(w.job, now)

    def _head(self, cluster_queue: str, now: float, passed: set[int]) -> Workload | None:
        """The queue's next workload: by priority, then age (cluster_queue.go heap order)."""
        waiting = [
            w
            for w in self.open_workloads
            if w.cluster_queue == cluster_queue
            and w.admitted_at is None
            and not w.ended()
            and not w.releasing()  # its quota is still reserved until its old pods are gone
            and now >= w.requeue_at
            and id(w) not in passed
        ]
        return min(waiting, key=lambda w: (-w.priority, w.created), default=None)


def _pods_ready(w: Workload, now: float) -> bool:
    if w.pod is not None:
        return w.pod.running(now)
    job = w.job
    assert job is not None  # not a pod, so a job
    if job.kind == "PyTorchJob":
        return any(p.running(now) for p in job.pods if p.wait_for is None)  # JobRunning: the Master runs
    return all(p.running(now) for p in job.pods)

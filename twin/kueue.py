"""Kueue 0.19.2 admission as the program configures it: queued Kubernetes GPU jobs are suspended
until their whole GPU request fits the AI ClusterQueue's quota, then admitted whole.

The quotas are read from the program's own rendered ClusterQueue and LocalQueue objects
(`components.kueue.objects`) and the manager configuration (`components.kueue.manager_config`).

Followed (kubernetes-sigs/kueue@v0.19.2; FACTS section 14):
* pkg/controller/jobframework/reconciler.go: a job with the queue-name label is created
  suspended (no pods) and becomes a Workload; admission unsuspends it, eviction suspends it again
  (its pods are deleted).
* pkg/scheduler/scheduler.go with pkg/cache/queue/cluster_queue.go: heads are taken in priority
  then creation order; under BestEffortFIFO a workload that does not fit is set aside and the
  next one is tried; a workload is admitted only if its whole request fits the flavor's quota.
* pkg/cache (resource node): a ClusterQueue may use its nominalQuota plus what the others in its
  cohort lend (each lends up to its lendingLimit, default its nominalQuota, minus its own usage),
  capped by its own borrowingLimit (none = no cap).
* pkg/controller/core/workload_controller.go (waitForPodsReady): an admitted workload whose
  PodsReady condition is not true `timeout` after admission is evicted and requeued after
  backoffBaseSeconds 60 doubling per eviction, capped at backoffMaxSeconds 3600
  (apis/config/v1beta2/configuration_types.go, requeuingStrategy). PodsReady for a PyTorchJob is JobRunning, which the
  Training Operator sets once the Master runs (pkg/controller/jobs/kubeflow/kubeflowjob); for a
  batch Job it is all its pods ready (pkg/controller/jobs/job/job_controller.go).

slurmd is outside Kueue (README, "Kueue"): Kueue's quota counts only its own workloads, so an
admitted gang can still find GPUs held by slurmd pods. The twin does not hide that: the admitted
job's pods go to kube-scheduler like any other and wait there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from components.names import AI_CLUSTER_QUEUE, AI_LOCAL_QUEUE, GPU_RESOURCE
from twin.kube import KubeJob, Kubernetes

# requeuingStrategy backoffBaseSeconds and backoffMaxSeconds defaults (apis/config/v1beta2/configuration_types.go)
BACKOFF_BASE, BACKOFF_MAX = 60.0, 3600.0


def _seconds(duration: str) -> float:
    """A Go duration as the manager config writes it: `10m`, `0s`, `90s`, `1h`."""
    units = {"s": 1, "m": 60, "h": 3600}
    return float(duration[:-1]) * units[duration[-1]]


@dataclass(frozen=True)
class Quota:
    nominal: int
    borrowing_limit: int | None
    lendable: int  # what the other queues of the cohort lend (they admit nothing of their own)

    @property
    def available(self) -> int:
        borrow = self.lendable if self.borrowing_limit is None else min(self.lendable, self.borrowing_limit)
        return self.nominal + borrow


def _gpu_resource(cq: dict) -> dict:
    return next(
        r
        for g in cq["spec"]["resourceGroups"]
        for f in g["flavors"]
        for r in f["resources"]
        if r["name"] == GPU_RESOURCE
    )


def quota_for_local_queue(objects: list[dict], local_queue: str = AI_LOCAL_QUEUE) -> Quota:
    """The GPUs Kueue may admit through `local_queue`, from the program's objects."""
    lq = next(o for o in objects if o["kind"] == "LocalQueue" and o["metadata"]["name"] == local_queue)
    queues = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterQueue"}
    cq = queues[lq["spec"]["clusterQueue"]]
    own = _gpu_resource(cq)
    lendable = sum(
        _gpu_resource(o).get("lendingLimit", _gpu_resource(o)["nominalQuota"])
        for name, o in queues.items()
        if name != cq["metadata"]["name"] and o["spec"].get("cohortName") == cq["spec"].get("cohortName")
    )
    return Quota(int(own["nominalQuota"]), own.get("borrowingLimit"), int(lendable))


@dataclass
class Workload:
    job: KubeJob
    gpus: int
    created: float
    admitted_at: float | None = None
    first_admitted: float | None = None
    ready: bool = False
    evictions: int = 0
    requeue_at: float = 0.0
    cluster_queue: str = AI_CLUSTER_QUEUE


@dataclass
class Kueue:
    quota: Quota
    pods_ready_timeout: float
    workloads: list[Workload] = field(default_factory=list)

    @classmethod
    def from_program(cls, objects: list[dict], manager_config: dict) -> Kueue:
        return cls(
            quota_for_local_queue(objects), _seconds(manager_config["waitForPodsReady"]["timeout"]), workloads=[]
        )

    def add(self, job: KubeJob, gpus: int, now: float) -> None:
        self.workloads.append(Workload(job, gpus, now))

    @property
    def used(self) -> int:
        return sum(w.gpus for w in self.workloads if w.admitted_at is not None and w.job.finished is None)

    def pending_gpus(self, cluster_queue: str) -> int:
        """What `kueue_cluster_queue_resource_pending{cluster_queue, resource="nvidia.com/gpu"}` reads:
        the GPUs requested by the queue's workloads not admitted, waiting or backing off
        (pkg/cache/queue/cluster_queue.go pendingResources: heap, inadmissible and in flight)."""
        return sum(
            w.gpus
            for w in self.workloads
            if w.cluster_queue == cluster_queue and w.admitted_at is None and w.job.finished is None
        )

    def step(self, kube: Kubernetes, now: float) -> None:
        for w in self.workloads:
            if w.admitted_at is None or w.job.finished is not None:
                continue
            if not w.ready and _pods_ready(w.job, now):
                w.ready = True  # recoveryTimeout 0s: never evicted once ready
            if not w.ready and now >= w.admitted_at + self.pods_ready_timeout:
                kube.suspend(w.job, now)
                w.evictions += 1
                w.admitted_at = None
                w.requeue_at = now + min(BACKOFF_MAX, BACKOFF_BASE * 2 ** (w.evictions - 1))
        free = self.quota.available - self.used
        # BestEffortFIFO: by creation time (one priority class in these scenarios); a workload that
        # does not fit is passed over and the next is tried.
        for w in sorted(self.workloads, key=lambda w: w.created):
            if w.admitted_at is not None or w.job.finished is not None or now < w.requeue_at:
                continue
            if w.gpus <= free:
                free -= w.gpus
                w.admitted_at = now
                w.first_admitted = now if w.first_admitted is None else w.first_admitted
                kube.unsuspend(w.job, now)


def _pods_ready(job: KubeJob, now: float) -> bool:
    if job.kind == "PyTorchJob":
        return any(p.running(now) for p in job.pods if p.wait_for is None)  # JobRunning: the Master runs
    return all(p.running(now) for p in job.pods)

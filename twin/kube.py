"""Kubernetes: kube-scheduler with the NVIDIA device plugin, the kubelet's pod start, the Training
Operator's PyTorchJob pods and batch Jobs.

Followed:
* kubernetes/kubernetes@v1.34.0:pkg/scheduler (one queue ordered by priority then creation time;
  a pod binds to a node that has the extended resource free) and the device plugin API
  (NVIDIA/k8s-device-plugin@v0.17.0: each `nvidia.com/gpu: 1` gets one whole GPU, never shared).
* The kubelet pulls an image once per node (IfNotPresent): `images: cold` pays the pull on each
  node's first pod of that image; the pull times below are assumptions, labelled as such.
* kubeflow/training-operator@v1.8.1:pkg/controller.v1/pytorch/initcontainer.go and
  pkg/config/config.go: every Worker has an init container resolving `<job>-master-0`, up to
  100 tries 2 s apart; the master Service resolves only once the Master runs. On failure the
  kubelet restarts the init container (restartPolicy OnFailure) with back-off 10 s doubling to
  300 s (pkg/kubelet/kubelet.go backOff). The job runs once every replica runs and is done when
  the Master succeeds (pkg/controller.v1/pytorch/pytorchjob_controller.go).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Assumptions of the twin (seconds), not upstream facts.
CONTAINER_START = 5.0
IMAGE_PULL = {"slurmd": 90.0, "pytorch": 240.0, "job": 60.0}
INIT_TRIES, INIT_INTERVAL = 100, 2.0
BACKOFF_START, BACKOFF_MAX = 10.0, 300.0
TERMINATION = 5.0  # slurmd preStop + container stop

SLURMD, KUBERNETES = "slurmd", "kubernetes"


@dataclass
class Pod:
    name: str
    holder: str  # SLURMD or KUBERNETES
    owner: str  # Slurm node name for slurmd, the job's name otherwise
    image: str
    created: float
    gpu: int | None = None
    bound_at: float | None = None
    running_at: float | None = None
    terminating_at: float | None = None
    gone_at: float | None = None
    wait_for: str | None = None  # a Worker waits for this pod (the Master) to run
    init_started: float | None = None
    init_restarts: int = 0

    def running(self, now: float) -> bool:
        return self.running_at is not None and self.running_at <= now and self.gone_at is None

    @property
    def live(self) -> bool:
        return self.gone_at is None


@dataclass
class KubeJob:
    name: str
    kind: str  # PyTorchJob or Job
    runtime: float
    submitted: float
    replicas: int = 1
    pods: list[Pod] = field(default_factory=list)
    started: float | None = None
    finished: float | None = None


@dataclass
class Kubernetes:
    gpus: int
    cold: bool
    pods: list[Pod] = field(default_factory=list)
    jobs: list[KubeJob] = field(default_factory=list)
    pulled: set[tuple[int, str]] = field(default_factory=set)
    double_held: set[int] = field(default_factory=set)
    container_start: float = CONTAINER_START
    # A broken device plugin that hands slurmd pods GPUs already held (the validation checks' fault).
    double_books_slurmd: bool = False

    def create_pod(self, pod: Pod) -> Pod:
        self.pods.append(pod)
        return pod

    def submit(
        self, name: str, kind: str, replicas: int, runtime: float, now: float, suspended: bool = False
    ) -> KubeJob:
        """A job; a suspended one (queued in Kueue) has no pods until it is unsuspended."""
        job = KubeJob(name, "PyTorchJob" if kind == "pytorchjob" else "Job", runtime, now, replicas=replicas)
        self.jobs.append(job)
        if not suspended:
            self.unsuspend(job, now)
        return job

    def unsuspend(self, job: KubeJob, now: float) -> None:
        """The operator creates the job's pods (Training Operator: runPolicy.suspend false)."""
        name, replicas = job.name, job.replicas
        job.pods = []
        if job.kind == "PyTorchJob":
            master = Pod(f"{name}-master-0", KUBERNETES, name, "pytorch", now)
            job.pods.append(master)
            for i in range(replicas - 1):
                worker = Pod(f"{name}-worker-{i}", KUBERNETES, name, "pytorch", now, wait_for=master.name)
                job.pods.append(worker)
        else:
            job.pods += [Pod(f"{name}-{i}", KUBERNETES, name, "job", now) for i in range(replicas)]
        for pod in job.pods:
            self.create_pod(pod)

    def suspend(self, job: KubeJob, now: float) -> None:
        """Kueue's eviction suspends the job: its pods are deleted and it starts over when admitted."""
        for pod in job.pods:
            self.delete(pod, now)
        job.pods = []
        job.started = None

    def delete_job(self, name: str, now: float) -> None:
        """Deleting the job object: its pods go with it (ownerReferences)."""
        for job in self.jobs:
            if job.name == name:
                self.jobs.remove(job)
                for pod in job.pods:
                    self.delete(pod, now)
                return

    def delete(self, pod: Pod, now: float) -> None:
        if pod.terminating_at is None and pod.gone_at is None:
            pod.terminating_at = now

    def step(self, now: float) -> None:
        for pod in self.pods:
            # an unbound pod goes at once; a bound one after its termination
            gone = pod.terminating_at is not None and (pod.gpu is None or now >= pod.terminating_at + TERMINATION)
            if gone and pod.gone_at is None:
                pod.gone_at = now
        held = {p.gpu for p in self.pods if p.live and p.gpu is not None}
        free = [g for g in range(self.gpus) if g not in held]
        for pod in sorted(
            (p for p in self.pods if p.gpu is None and p.live and p.terminating_at is None), key=lambda p: p.created
        ):
            if self.double_books_slurmd and pod.holder == SLURMD:
                pod.gpu = 0
            elif not free:
                continue
            else:
                pod.gpu = free.pop(0)
            pod.bound_at = now
            pull = IMAGE_PULL[pod.image] if self.cold and (pod.gpu, pod.image) not in self.pulled else 0.0
            self.pulled.add((pod.gpu, pod.image))
            pod.init_started = now + pull
            if pod.wait_for is None:
                pod.running_at = now + pull + self.container_start
        bound = [p.gpu for p in self.pods if p.gpu is not None and p.gone_at is None]
        self.double_held |= {g for g in bound if bound.count(g) > 1}
        self._init_containers(now)
        self._jobs(now)

    def _init_containers(self, now: float) -> None:
        by_name = {p.name: p for p in self.pods if p.live}
        for pod in self.pods:
            if pod.wait_for is None or pod.running_at is not None or pod.init_started is None or not pod.live:
                continue
            if pod.init_started > now:
                continue
            master = by_name.get(pod.wait_for)
            if master is not None and master.running(now):
                pod.running_at = now + self.container_start
            elif now >= pod.init_started + INIT_TRIES * INIT_INTERVAL:
                # the init container gives up; the kubelet restarts it after its back-off
                pod.init_started = now + min(BACKOFF_MAX, BACKOFF_START * 2**pod.init_restarts)
                pod.init_restarts += 1

    def _jobs(self, now: float) -> None:
        for job in self.jobs:
            if job.finished is not None:
                continue
            if job.started is None and job.pods and all(p.running(now) for p in job.pods):
                job.started = now
            if job.started is not None and now >= job.started + job.runtime:
                job.finished = now
                for pod in job.pods:
                    pod.gone_at = now  # Succeeded: the GPU goes back

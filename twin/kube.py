"""Kubernetes: kube-scheduler with the NVIDIA device plugin, the kubelet's pod start, the Training
Operator's PyTorchJob pods and batch Jobs.

Followed:
* kubernetes/kubernetes@v1.34.0:pkg/scheduler (one queue ordered by priority then creation time;
  a pod binds to a node that has the extended resource free: plugins/noderesources/fit.go) and
  the device plugin API. What keeps a GPU to one pod is the device plugin and kubelet's device
  manager, so the twin binds by what they do. The plugin advertises each GPU as `gpu_replicas`
  devices: 1, or the replicas of its time-slicing or MPS sharing config
  (NVIDIA/k8s-device-plugin@v0.17.0: internal/rm/device_map.go:284-330; twin/program.py reads
  the program's values, which set none). The device manager hands each device to one container
  (pkg/kubelet/cm/devicemanager/manager.go, devicesToAllocate), so with 1 no GPU has two pods
  and with more it can. kube-scheduler's default scores count cpu and memory only
  (pkg/scheduler/apis/config/v1/defaults.go defaultResourceSpec) and it breaks ties at random
  (pkg/scheduler/schedule_one.go selectHost): the twin takes the lowest-numbered node with a
  free device, which packs shared GPUs first, a placement the scheduler can make.
* A pod with a scheduling gate (Kueue's `kueue.x-k8s.io/admission`) is not tried by kube-scheduler
  until the gate is removed (kubernetes/kubernetes@v1.34.0: pkg/scheduler/framework/plugins/
  schedulinggates); it holds no GPU meanwhile.
* The kubelet pulls an image once per node (IfNotPresent: the slurm chart's `imagePullPolicy`,
  SlinkyProject/slurm-operator@v1.0.0:helm/slurm/values.yaml; the Kubernetes default for a tagged
  image; the init container's in initcontainer.go), each when its container starts, init
  containers first (pkg/kubelet/kuberuntime/kuberuntime_container.go startContainer).
  `images: warm` is every image on every node; `images: cold` is only the images the program
  pre-pulls on every GPU worker (`components.images.worker_images`), so a pod pays the pull of
  each other image on its node's first pod of it. The image references come from the program
  (twin/program.py); the pull times below are assumptions, labelled as such.
* kubeflow/training-operator@v1.8.1:pkg/controller.v1/pytorch/initcontainer.go and
  pkg/config/config.go: every Worker has an init container (image `alpine:3.10`) resolving
  `<job>-master-0` up to `--pytorch-init-container-max-tries` times (default 100), 2 s apart; the
  program's overlay sets the flag (components/training_operator.py, read in twin/program.py). The
  master Service resolves only once the Master runs. When the tries run out the init container
  exits 1; the example job's Workers have restartPolicy Never (jobs/kubernetes/pytorchjob-ddp.yaml),
  so the Worker fails and with it the job (pkg/controller.v1/pytorch/pytorchjob_controller.go
  UpdateJobStatus: a failed replica with restartPolicy Never sets JobFailed). The twin then frees
  the job's GPUs; on a cluster its Master, kept by `cleanPodPolicy: None`, holds its GPU until its
  rendezvous times out. The job runs once every replica runs and is done when the Master succeeds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from components.slurmd_scaling import POD_TERMINATION_SECONDS

# Assumptions of the twin (seconds), not upstream facts.
CONTAINER_START = 5.0
# One node's pull of each image a pod runs, by its role: the slurmd pod's `logfile` sidecar and
# slurmd, the Worker's init container, and the several-GB image the example PyTorchJob and Job run.
IMAGE_PULL = {"logfile": 5.0, "slurmd": 90.0, "init": 5.0, "pytorch": 240.0, "job": 240.0}
TERMINATION = 5.0  # a pod's container stop: a Kubernetes job's, and slurmd's preStop + stop
# Upstream: a slurmd pod of Slinky 1.0.0-1.0.4 ends only at its grace period, the Kubernetes default
# (k8s.io/api@v0.34.1 core/v1 DefaultTerminationGracePeriodSeconds; neither the chart nor the program
# sets one): its logfile sidecar runs as PID 1 with no SIGTERM handler and is killed at the end
# (SlinkyProject/slurm-operator@v1.0.0:internal/builder/scripts/logfile.sh). From 1.0.5 it exits
# on SIGTERM (@v1.0.5: the same file, `trap "exit 0" TERM`), so the pod ends in TERMINATION.
# twin/program.py slinky_behaviour picks one by the program's slinkyVersion.
GRACE_PERIOD = float(POD_TERMINATION_SECONDS)
# Upstream: the init container's default tries and its sleep (config.go, initcontainer.go).
INIT_TRIES_DEFAULT, INIT_INTERVAL = 100, 2.0

SLURMD, KUBERNETES = "slurmd", "kubernetes"


@dataclass
class Pod:
    name: str
    holder: str  # SLURMD or KUBERNETES
    owner: str  # Slurm node name for slurmd, the job's name otherwise
    image: str  # its main container's role in IMAGE_PULL: slurmd, pytorch or job
    created: float
    gpu: int | None = None
    bound_at: float | None = None
    running_at: float | None = None
    terminating_at: float | None = None
    gone_at: float | None = None
    wait_for: str | None = None  # a Worker waits for this pod (the Master) to run
    init_started: float | None = None
    main_pull: float = 0.0  # a Worker's pull of its main image, after its init container
    own_image: str | None = None  # a scenario's own image for the main container, instead of the role's
    gated: bool = False  # Kueue's admission scheduling gate: kube-scheduler does not try it
    # A slurmd pod's annotations, as the NodeSet controller writes them (twin/nodeset.py):
    # nodeset.slinky.slurm.net/pod-deadline (a time; None = absent) and .../pod-cordon.
    deadline: float | None = None
    cordon: bool = False

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
    finished: float | None = None  # succeeded or failed: its GPUs are back, Kueue's quota too
    failed: bool = False
    image: str | None = None  # the scenario's own image, or None for the example job's


@dataclass
class Kubernetes:
    gpus: int
    cold: bool
    # The reference each role in IMAGE_PULL runs (the program's, twin/program.py) and the
    # references on every node at start under `images: cold` (the program's pre-pull list).
    images: dict[str, str] = field(default_factory=lambda: {role: role for role in IMAGE_PULL})
    prepulled: frozenset[str] = frozenset()
    init_tries: int = INIT_TRIES_DEFAULT
    pods: list[Pod] = field(default_factory=list)
    jobs: list[KubeJob] = field(default_factory=list)
    pulled: set[tuple[int | None, str]] = field(default_factory=set)
    double_held: set[int] = field(default_factory=set)
    container_start: float = CONTAINER_START
    gpu_replicas: int = 1  # the `nvidia.com/gpu` devices the device plugin advertises per GPU
    slurmd_termination: float = TERMINATION  # GRACE_PERIOD before Slinky 1.0.5
    # The pods not yet gone, in creation order; `pods` keeps every pod ever made, which a long
    # scenario would otherwise walk several times a tick. Likewise the jobs not finished (pruned
    # each step, so one that finished in the latest step may still be there).
    _live: list[Pod] = field(default_factory=list)
    _went: bool = False  # a pod in _live went (`pod_gone`) since it was last pruned
    # Bumped whenever the live pods change (one made, or the gone ones pruned): a caller that
    # filters them keeps its filtered list while this stays (twin/nodeset.py pods).
    live_version: int = 0
    open_jobs: list[KubeJob] = field(default_factory=list)
    # GPUs whose node is NotReady (fault node-failure; one GPU per node): nothing binds there, and a
    # pod on it neither runs its work nor goes, even deleted, until its kubelet is back to stop it.
    failed: set[int] = field(default_factory=set)

    def create_pod(self, pod: Pod) -> Pod:
        self.pods.append(pod)
        self._live.append(pod)
        self.live_version += 1
        return pod

    def live_pods(self) -> list[Pod]:
        """Every pod not gone, in creation order (as `[p for p in pods if p.live]`). Pruned only
        after a pod went: asked several times a second, while pods go a few times an hour."""
        if self._went:
            self._live = [p for p in self._live if p.gone_at is None]
            self._went = False
            self.live_version += 1
        return self._live

    def pod_gone(self, pod: Pod, now: float) -> None:
        """The pod is gone at `now` (every gone_at is set here, so live_pods knows to prune)."""
        pod.gone_at = now
        self._went = True

    def submit(
        self,
        name: str,
        kind: str,
        replicas: int,
        runtime: float,
        now: float,
        suspended: bool = False,
        image: str | None = None,
    ) -> KubeJob:
        """A job; a suspended one (queued in Kueue) has no pods until it is unsuspended."""
        kind = "PyTorchJob" if kind == "pytorchjob" else "Job"
        job = KubeJob(name, kind, runtime, now, replicas=replicas, image=image)
        self.jobs.append(job)
        self.open_jobs.append(job)
        if not suspended:
            self.unsuspend(job, now)
        return job

    def unsuspend(self, job: KubeJob, now: float) -> None:
        """The operator creates the job's pods (Training Operator: runPolicy.suspend false)."""
        name, replicas = job.name, job.replicas
        job.pods = []
        if job.kind == "PyTorchJob":
            master = Pod(f"{name}-master-0", KUBERNETES, name, "pytorch", now, own_image=job.image)
            job.pods.append(master)
            for i in range(replicas - 1):
                worker = Pod(
                    f"{name}-worker-{i}", KUBERNETES, name, "pytorch", now, wait_for=master.name, own_image=job.image
                )
                job.pods.append(worker)
        else:
            job.pods += [Pod(f"{name}-{i}", KUBERNETES, name, "job", now, own_image=job.image) for i in range(replicas)]
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
                self.open_jobs = [j for j in self.open_jobs if j is not job]
                for pod in job.pods:
                    self.delete(pod, now)
                return

    def delete(self, pod: Pod, now: float) -> None:
        if pod.terminating_at is None and pod.gone_at is None:
            pod.terminating_at = now

    def step(self, now: float) -> None:
        pods = self.live_pods()
        # One walk: a terminating pod goes (an unbound one at once, a bound one after its
        # termination), then each live pod either waits to bind or counts its GPU as bound.
        unbound, bound = [], []
        for pod in pods:
            if pod.terminating_at is not None and pod.gone_at is None and pod.gpu not in self.failed:
                took = self.slurmd_termination if pod.holder == SLURMD else TERMINATION
                if pod.gpu is None or now >= pod.terminating_at + took:
                    self.pod_gone(pod, now)
            if pod.gone_at is None:
                if pod.gpu is not None:
                    bound.append(pod.gpu)
                elif pod.terminating_at is None and not pod.gated:
                    unbound.append(pod)
        unbound.sort(key=lambda p: p.created)
        if unbound:  # most seconds nothing waits to bind: the free devices are not needed
            held = Counter(bound)
            # the free devices, one entry per device, lowest-numbered node first
            free = [g for g in range(self.gpus) if g not in self.failed for _ in range(self.gpu_replicas - held[g])]
        for pod in unbound:
            if not free:
                continue
            pod.gpu = free.pop(0)
            bound.append(pod.gpu)
            pod.bound_at = now
            before, main = self._pulls(pod)
            if pod.wait_for is None:
                pod.running_at = now + before + main + self.container_start
            else:
                # its main image is pulled once the init container has found the Master
                pod.init_started, pod.main_pull = now + before, main
        if len(bound) != len(set(bound)):
            self.double_held |= {g for g in bound if bound.count(g) > 1}
        self._init_containers(now)
        self._jobs(now)

    def replace_pod(self, job: KubeJob, pod: Pod, now: float) -> Pod:
        """The job's controller replaces a pod deleted under it (the batch Job's default
        podReplacementPolicy TerminatingOrFailed, kubernetes/kubernetes@v1.34.0 pkg/controller/job;
        the Training Operator recreates a missing replica's pod): a new pod, unbound, and the job's
        work starts over once every pod runs again."""
        new = Pod(f"{pod.name}-r{len(self.pods)}", pod.holder, pod.owner, pod.image, now, own_image=pod.own_image)
        job.pods = [new if p is pod else p for p in job.pods]
        for other in job.pods:
            if other.wait_for == pod.name:
                other.wait_for = new.name
        job.started = None
        return self.create_pod(new)

    def _pulls(self, pod: Pod) -> tuple[float, float]:
        """Seconds of pulls on the pod's node before its init container runs and before its main
        container starts; a node pulls each reference once (one GPU per node: gpu = node)."""

        def pull(role: str, reference: str) -> float:
            have = not self.cold or reference in self.prepulled or (pod.gpu, reference) in self.pulled
            self.pulled.add((pod.gpu, reference))
            return 0.0 if have else IMAGE_PULL[role]

        main = pod.own_image or self.images[pod.image]
        if pod.holder == SLURMD:  # the logfile sidecar is an init container (restartPolicy Always)
            return pull("logfile", self.images["logfile"]), pull(pod.image, main)
        if pod.wait_for is not None:
            return pull("init", self.images["init"]), pull(pod.image, main)
        return 0.0, pull(pod.image, main)

    def _init_containers(self, now: float) -> None:
        pods = self.live_pods()
        by_name: dict[str, Pod] | None = None  # made once a Worker's init container runs
        for pod in pods:
            if pod.wait_for is None or pod.running_at is not None or pod.init_started is None or not pod.live:
                continue
            if pod.init_started > now:
                continue
            if by_name is None:
                by_name = {p.name: p for p in pods}
            master = by_name.get(pod.wait_for)
            if master is not None and master.running(now):
                pod.running_at = now + pod.main_pull + self.container_start
            elif now >= pod.init_started + self.init_tries * INIT_INTERVAL:
                self._fail(pod.owner, now)  # out of tries: the Worker (restartPolicy Never) and its job fail

    def _fail(self, name: str, now: float) -> None:
        for job in self.open_jobs:
            if job.name == name and job.finished is None:
                job.finished, job.failed = now, True
                for pod in job.pods:
                    self.pod_gone(pod, now)

    def _jobs(self, now: float) -> None:
        self.open_jobs = [j for j in self.open_jobs if j.finished is None]
        for job in self.open_jobs:
            if job.started is None and job.pods and all(p.running(now) for p in job.pods):
                job.started = now
            if (
                job.started is not None
                and now >= job.started + job.runtime
                and not any(p.gpu in self.failed for p in job.pods)  # its node is down: its work stands still
            ):
                job.finished = now
                for pod in job.pods:
                    self.pod_gone(pod, now)  # Succeeded: the GPU goes back

"""What the runner saw, sample by sample, and the facts derived from it.

Everything here is plain data and pure functions, so the checks, the report and the
plot work the same on a live recording and on a constructed timeline in a test.
Times are seconds since the run started, on the runner's clock: the cluster's own
timestamps would mix clocks of several machines.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Normalised job phases: every source (Slurm, PyTorchJob, batch Job) maps onto these.
PENDING, RUNNING, SUCCEEDED, FAILED = "pending", "running", "succeeded", "failed"
FINISHED = (SUCCEEDED, FAILED)

# Who holds a GPU: a slurmd pod (the GPU belongs to Slurm while the pod lives,
# whether or not a Slurm job runs on it) or a Kubernetes job's pod.
SLURMD, KUBERNETES = "slurmd", "kubernetes"


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    name: str
    state: str  # Slurm's own word, e.g. PENDING, RUNNING, COMPLETED
    nodes: tuple[str, ...] = ()  # Slurm node names (slurmd pod hostnames)

    @property
    def phase(self) -> str:
        return slurm_phase(self.state)


@dataclass(frozen=True)
class KubeJob:
    kind: str  # PyTorchJob or Job
    name: str
    phase: str


@dataclass(frozen=True)
class GpuPod:
    """A pod that asked the device plugin for GPUs, as seen in one sample."""

    namespace: str
    name: str
    uid: str  # a slurmd pod comes back under the same name, maybe on another GPU
    node: str
    phase: str  # the pod's phase: Pending, Running, Succeeded, Failed
    holder: str  # SLURMD or KUBERNETES
    owner: str  # Slurm node name for slurmd pods, job name for Kubernetes pods
    container: str = ""  # the container that asked for the GPU
    uuids: tuple[str, ...] = ()  # read from inside the pod; empty until read
    # Bound to its node (PodScheduled): the device plugin allocates at admission, so from here
    # on the GPU is the pod's even while images pull and init containers run ("reserved").
    scheduled: bool = False
    gpus: int = 1  # nvidia.com/gpu it holds: max(largest init container, sum of containers)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def reserved(self) -> bool:
        """Holds its GPUs but does not run yet: scheduled, not Running, not finished."""
        return self.phase == "Pending" and (self.scheduled or bool(self.node))


@dataclass(frozen=True)
class GpuProcess:
    """A process the GPU driver reported on a GPU, and the pod whose cgroup it lives in."""

    uuid: str
    pid: int
    node: str
    pod_uid: str  # "" for a process outside any pod


@dataclass(frozen=True)
class Sample:
    t: float  # when the sample started
    nodeset_replicas: int  # NodeSet .spec.replicas: what KEDA asked for
    slurmd_ready: int  # NodeSet .status.readyReplicas
    slurm_jobs: tuple[SlurmJob, ...] = ()
    kube_jobs: tuple[KubeJob, ...] = ()
    gpu_pods: tuple[GpuPod, ...] = ()
    # When the sample's last read returned: anything it shows happened at most then, so an
    # event first seen here happened in (previous sample's t, this t_end].
    t_end: float | None = None
    processes: tuple[GpuProcess, ...] = ()  # what the GPUs ran, from the probe on each node
    probed: bool = False  # the probe answered on every GPU node this sample

    def slurmd_pods(self) -> tuple[GpuPod, ...]:
        return tuple(p for p in self.gpu_pods if p.holder == SLURMD)

    @property
    def end(self) -> float:
        return self.t if self.t_end is None else self.t_end


@dataclass(frozen=True)
class DcgmHolding:
    """dcgm-exporter's word for who held a GPU (its pod label, from kubelet's allocations)."""

    uuid: str
    pod: str  # namespace/name
    start: float
    end: float


@dataclass(frozen=True)
class RunError:
    t: float
    during: str  # what the runner was doing: sample, submit, cleanup, ...
    message: str


@dataclass(frozen=True)
class Submission:
    name: str  # unique in the run: the Slurm job name or the Kubernetes object name
    kind: str  # slurm, PyTorchJob or Job
    t: float
    gpus: int
    ref: str = ""  # the Slurm job id; the object name for Kubernetes


@dataclass
class Timeline:
    scenario: str
    gpus_total: int
    interval: float
    started_at: str  # wall-clock ISO time of t = 0, for the reader only
    samples: list[Sample] = field(default_factory=list)
    submissions: list[Submission] = field(default_factory=list)
    outcome: str = "completed"  # completed, timeout, interrupted, error or not-idle
    ended: str = ""  # how it ended, in words, for the summary
    errors: list[RunError] = field(default_factory=list)  # every failed read or write, retried or not
    waited_for_idle: float = 0.0  # seconds before t = 0 spent waiting for the cluster to be idle
    dcgm: list[DcgmHolding] = field(default_factory=list)  # read from Prometheus after the run
    outputs: dict[str, str] = field(default_factory=dict)  # job name -> its output, for jobs that report results

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Timeline:
        samples = [
            Sample(
                t=s["t"],
                nodeset_replicas=s["nodeset_replicas"],
                slurmd_ready=s["slurmd_ready"],
                slurm_jobs=tuple(SlurmJob(**{**j, "nodes": tuple(j["nodes"])}) for j in s["slurm_jobs"]),
                kube_jobs=tuple(KubeJob(**j) for j in s["kube_jobs"]),
                gpu_pods=tuple(GpuPod(**{**p, "uuids": tuple(p["uuids"])}) for p in s["gpu_pods"]),
                t_end=s.get("t_end"),
                processes=tuple(GpuProcess(**g) for g in s.get("processes", ())),
                probed=s.get("probed", False),
            )
            for s in data["samples"]
        ]
        return cls(
            scenario=data["scenario"],
            gpus_total=data["gpus_total"],
            interval=data["interval"],
            started_at=data["started_at"],
            samples=samples,
            submissions=[Submission(**s) for s in data["submissions"]],
            outcome=data.get("outcome", "completed"),
            ended=data.get("ended", ""),
            errors=[RunError(**e) for e in data.get("errors", ())],
            waited_for_idle=data.get("waited_for_idle", 0.0),
            dcgm=[DcgmHolding(**d) for d in data.get("dcgm", ())],
            outputs=dict(data.get("outputs", {})),
        )

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> Timeline:
        return cls.from_dict(json.loads(path.read_text()))


# ------------------------------------------------------------------ state mapping

_SLURM_RUNNING = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESIZING"}
_SLURM_PENDING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}


def slurm_phase(state: str) -> str:
    """Map a Slurm job state (squeue %T) onto a phase; anything that ended badly is failed."""
    word = state.split()[0].rstrip("+").upper() if state else ""
    if word == "COMPLETED":
        return SUCCEEDED
    if word in _SLURM_RUNNING:
        return RUNNING
    if word in _SLURM_PENDING:
        return PENDING
    return FAILED


def pytorchjob_phase(conditions: list[dict]) -> str:
    """The Training Operator appends conditions; the latest true one is the job's state."""
    true_types = [c.get("type") for c in conditions if str(c.get("status")) == "True"]
    for wanted, phase in (("Failed", FAILED), ("Succeeded", SUCCEEDED), ("Running", RUNNING), ("Restarting", RUNNING)):
        if wanted in true_types:
            return phase
    return PENDING


def batch_job_phase(status: dict) -> str:
    """batch/v1 Job: `active` counts pods that are still Pending too, so use `ready`."""
    conditions = {c.get("type") for c in status.get("conditions") or [] if str(c.get("status")) == "True"}
    if "Complete" in conditions or "SuccessCriteriaMet" in conditions:
        return SUCCEEDED
    if "Failed" in conditions or "FailureTarget" in conditions:
        return FAILED
    if (status.get("ready") or 0) > 0:
        return RUNNING
    return PENDING


# ------------------------------------------------------------------ derived facts


@dataclass(frozen=True)
class JobLife:
    """One submitted job over the run; None where the run never saw that moment."""

    name: str
    kind: str
    submitted: float
    started: float | None
    finished: float | None
    final_phase: str | None

    @property
    def wait(self) -> float | None:
        return None if self.started is None else self.started - self.submitted

    @property
    def run(self) -> float | None:
        if self.started is None or self.finished is None:
            return None
        return self.finished - self.started


def observed_phases(sample: Sample) -> dict[str, str]:
    """Job name -> phase in this sample, Slurm and Kubernetes alike."""
    phases = {j.name: j.phase for j in sample.slurm_jobs}
    phases.update({j.name: j.phase for j in sample.kube_jobs})
    return phases


def job_lives(timeline: Timeline) -> list[JobLife]:
    lives = []
    for sub in timeline.submissions:
        started = finished = final = None
        for sample in timeline.samples:
            phase = observed_phases(sample).get(sub.name)
            if phase is None or sample.t < sub.t:
                continue
            final = phase
            if phase == RUNNING and started is None:
                started = sample.t
            if phase in FINISHED and finished is None:
                finished = sample.t
                # A job that ran between two samples was never seen running; its
                # start is bounded by the finish, which keeps run time >= 0.
                started = started if started is not None else sample.t
        lives.append(JobLife(sub.name, sub.kind, sub.t, started, finished, final))
    return lives


@dataclass(frozen=True)
class Holding:
    """One pod holding one GPU, from the first to the last sample that showed it: from
    PodScheduled (the device plugin allocates at admission), through image pulls and init
    containers (reserved), while it runs."""

    uuid: str
    pod: str  # namespace/name
    pod_uid: str
    node: str
    holder: str
    owner: str
    start: float
    end: float
    running_from: float | None = None  # None: reserved all along, it never ran


def pod_gpus(timeline: Timeline) -> dict[str, tuple[str, ...]]:
    """Pod UID -> its GPUs: as read inside it once it ran; for a pod that never ran, the only
    GPU its node ever showed (one GPU per worker), else unknown."""
    found: dict[str, tuple[str, ...]] = {}
    for sample in timeline.samples:
        for pod in sample.gpu_pods:
            if pod.uuids:
                found.setdefault(pod.uid, pod.uuids)
    by_node: dict[str, set[str]] = {}
    for uuid, node in node_of_uuid(timeline).items():
        by_node.setdefault(node, set()).add(uuid)
    for sample in timeline.samples:
        for pod in sample.gpu_pods:
            node_gpus = by_node.get(pod.node, set())
            if pod.uid not in found and pod.reserved and pod.gpus == 1 and len(node_gpus) == 1:
                found[pod.uid] = tuple(node_gpus)
    return found


def held_gpus(pod: GpuPod, gpus: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """What a pod holds in one sample: its GPUs while it runs or is reserved."""
    if pod.phase == "Running":
        return pod.uuids or gpus.get(pod.uid, ())
    return gpus.get(pod.uid, ()) if pod.reserved else ()


def holdings(timeline: Timeline) -> list[Holding]:
    """Group the samples into (GPU, pod) holdings; pods whose GPU is unknown do not count."""
    gpus = pod_gpus(timeline)
    spans: dict[tuple[str, str], list] = {}
    for sample in timeline.samples:
        for pod in sample.gpu_pods:
            for uuid in held_gpus(pod, gpus):
                span = spans.setdefault((uuid, pod.uid), [pod, sample.t, sample.t, None])
                span[2] = sample.t
                if pod.phase == "Running" and span[3] is None:
                    span[3] = sample.t
    return sorted(
        (
            Holding(uuid, pod.key, pod.uid, pod.node, pod.holder, pod.owner, start, end, running)
            for (uuid, _), (pod, start, end, running) in spans.items()
        ),
        key=lambda h: (h.uuid, h.start, h.pod),
    )


def slurm_job_on_node(sample: Sample, slurm_node: str) -> str | None:
    """The Slurm job running on a Slurm node in this sample, if any."""
    for job in sample.slurm_jobs:
        if job.phase == RUNNING and slurm_node in job.nodes:
            return job.name
    return None


def gpu_owner(sample: Sample, uuid: str, gpus: dict[str, tuple[str, ...]] | None = None) -> tuple[str, str] | None:
    """(category, label) of whoever holds a GPU in a sample: slurm-job, slurmd-idle, kubernetes,
    or reserved (a scheduled pod not running yet; `gpus` from pod_gpus says which GPU it has)."""
    for pod in sample.gpu_pods:
        if pod.phase == "Running" and uuid in pod.uuids:
            if pod.holder == KUBERNETES:
                return "kubernetes", pod.owner
            job = slurm_job_on_node(sample, pod.owner)
            return ("slurm-job", job) if job else ("slurmd-idle", pod.name)
    for pod in sample.gpu_pods:
        if pod.reserved and uuid in (gpus or {}).get(pod.uid, ()):
            return "reserved", pod.name
    return None


def slurm_holds_every_gpu(sample: Sample, gpus_total: int) -> bool:
    """Every GPU is held by a slurmd pod whose Slurm node runs a job in this sample."""
    held = {
        uuid
        for pod in sample.slurmd_pods()
        if pod.phase == "Running" and slurm_job_on_node(sample, pod.owner)
        for uuid in pod.uuids
    }
    return len(held) >= gpus_total


def node_of_uuid(timeline: Timeline) -> dict[str, str]:
    """GPU UUID -> the Kubernetes node it lives on, as the pods that held it reported."""
    found: dict[str, str] = {}
    for sample in timeline.samples:
        for pod in sample.gpu_pods:
            for uuid in pod.uuids:
                found.setdefault(uuid, pod.node)
    return found


def gpu_uuids(timeline: Timeline) -> list[str]:
    """Every GPU UUID seen, ordered by node: one lane per GPU in the picture."""
    nodes = node_of_uuid(timeline)
    return sorted(nodes, key=lambda u: (nodes[u], u))

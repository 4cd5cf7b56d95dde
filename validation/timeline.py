"""What the runner saw, sample by sample, and the facts derived from it.

Everything here is plain data and pure functions, so the checks, the report and the
plot work the same on a live recording and on a constructed timeline in a test.
Times are seconds since the run started, on the runner's clock: the cluster's own
timestamps would mix clocks of several machines.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from datetime import datetime
from pathlib import Path

from core.settings import escaped

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
    # each sample's phases once, not once per submission: the runner asks after every sample
    observed = [(sample, observed_phases(sample)) for sample in timeline.samples]
    for sub in timeline.submissions:
        started = finished = final = None
        for sample, phases in observed:
            phase = phases.get(sub.name)
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


# ------------------------------------------------------------------ a saved timeline's schema

MAX_TIMELINE_BYTES = 64 * 1024 * 1024  # a week of 1 s samples of a large run is ~50 MiB
MAX_SHOWN_PROBLEMS = 20  # then one line counts the rest


def _type_problem(value: object, hint: str) -> str | None:
    """Why `value` (from JSON) is not of the field type `hint` (its annotation's text), or None."""
    if hint.endswith(" | None"):
        return None if value is None else _type_problem(value, hint[: -len(" | None")])
    if hint == "str":
        return None if isinstance(value, str) else "expected text"
    if hint == "bool":
        return None if isinstance(value, bool) else "expected true or false"
    if hint == "int":
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        return None if ok else "expected a whole number, 0 or more"
    if hint == "float":
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
        return None if ok else "expected a number of seconds, 0 or more (no NaN, no infinity)"
    if hint == "tuple[str, ...]":
        return None if isinstance(value, list) and all(isinstance(v, str) for v in value) else "expected a list of text"
    if hint == "dict[str, str]":
        ok = isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
        return None if ok else "expected an object of text"
    return None


def _nested() -> dict[str, type]:
    """Fields that hold lists of records: their annotation's text -> the record's class."""
    return {f"tuple[{c.__name__}, ...]": c for c in (SlurmJob, KubeJob, GpuPod, GpuProcess)} | {
        f"list[{c.__name__}]": c for c in (Sample, Submission, RunError, DcgmHolding)
    }


def _record_problems(item: object, cls: type, where: str) -> list[str]:
    """Each field of one record (a sample, a pod, ...) against its dataclass: present, of its type."""
    if not isinstance(item, dict):
        return [f"{where}: expected an object"]
    known = {f.name: f for f in fields(cls)}
    problems = [f"{where}.{escaped(str(k), 40)}: not a field of {cls.__name__}" for k in item if k not in known]
    for name, f in known.items():
        if name not in item:
            if f.default is MISSING and f.default_factory is MISSING:
                problems.append(f"{where}.{name}: missing")
            continue
        if str(f.type) in _nested():
            value = item[name]
            if not isinstance(value, list):
                problems.append(f"{where}.{name}: expected a list")
                continue
            for i, sub in enumerate(value):
                problems += _record_problems(sub, _nested()[str(f.type)], f"{where}.{name}[{i}]")
        elif problem := _type_problem(item[name], str(f.type)):
            problems.append(f"{where}.{name}: {_shown(item[name])}: {problem}")
    return problems


def _shown(value: object) -> str:
    if isinstance(value, str):
        return f'"{escaped(value, 40)}"'
    return escaped(repr(value) if isinstance(value, float) else json.dumps(value), 40)


def schema_problems(data: object) -> list[str]:
    """What makes `data` (a parsed timeline.json) not a timeline, before any check reads it: every
    field of its type (no NaN or infinite time, no text for a number), samples in time order, each
    sample's end after its start, counts of GPUs within its own gpus_total, a positive interval,
    started_at an ISO time."""
    if not isinstance(data, dict):
        return ["expected a JSON object"]
    problems = _record_problems(data, Timeline, "timeline")
    if problems:
        return problems
    total = data["gpus_total"]
    if total < 1:
        problems.append(f"gpus_total: {total}: expected 1 or more")
    if data["interval"] <= 0:
        problems.append(f"interval: {_shown(data['interval'])}: expected seconds between samples above 0")
    try:
        datetime.fromisoformat(data["started_at"])
    except ValueError:
        problems.append(
            f"started_at: {_shown(data['started_at'])}: expected an ISO time, e.g. 2026-01-01T10:00:00+00:00"
        )
    previous = -math.inf
    for i, s in enumerate(data["samples"]):
        if s["t"] < previous:
            problems.append(
                f"samples[{i}].t: {s['t']:g} comes before the previous sample's {previous:g}: expected time order"
            )
        previous = s["t"]
        if s.get("t_end") is not None and s["t_end"] < s["t"]:
            problems.append(f"samples[{i}].t_end: {s['t_end']:g} is before its t {s['t']:g}")
        for key in ("nodeset_replicas", "slurmd_ready"):
            if s[key] > total:
                problems.append(f"samples[{i}].{key}: {s[key]}: expected at most gpus_total ({total})")
        problems += [
            f"samples[{i}].gpu_pods[{j}].gpus: {p.get('gpus', 1)}: expected 1 to gpus_total ({total})"
            for j, p in enumerate(s.get("gpu_pods", []))
            if not 1 <= p.get("gpus", 1) <= total
        ]
    problems += [
        f"submissions[{i}].gpus: {sub['gpus']}: expected at most gpus_total ({total})"
        for i, sub in enumerate(data["submissions"])
        if sub["gpus"] > total
    ]
    problems += [
        f"dcgm[{i}]: ends at {d['end']:g}, before its start {d['start']:g}"
        for i, d in enumerate(data.get("dcgm", []))
        if d["end"] < d["start"]
    ]
    return problems


def read_timeline(path: Path) -> Timeline:
    """A saved timeline.json, read with a size limit and checked against its schema before anything
    reads it; TimelineError with every problem (at most MAX_SHOWN_PROBLEMS and a count)."""
    try:
        if not path.is_file():
            raise TimelineError(["is not a file"])
        with path.open("rb") as f:
            raw = f.read(MAX_TIMELINE_BYTES + 1)
    except OSError as error:
        raise TimelineError([f"cannot be read ({error.strerror or type(error).__name__})"]) from None
    if len(raw) > MAX_TIMELINE_BYTES:
        raise TimelineError([f"is larger than {MAX_TIMELINE_BYTES // 2**20} MiB, the limit for a timeline"])
    try:
        data = json.loads(raw.decode("utf-8"))  # NaN and Infinity parse: the schema refuses them
    except (ValueError, RecursionError) as error:  # RecursionError: brackets nested past the decoder
        raise TimelineError([f"is not a timeline.json ({type(error).__name__}: {escaped(str(error), 160)})"]) from None
    problems = schema_problems(data)
    if problems:
        if len(problems) > MAX_SHOWN_PROBLEMS:
            problems = [*problems[:MAX_SHOWN_PROBLEMS], f"and {len(problems) - MAX_SHOWN_PROBLEMS} more problems"]
        raise TimelineError(problems)
    return Timeline.from_dict(data)


class TimelineError(Exception):
    """A saved timeline that is not one: one line per problem, each naming the field."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems

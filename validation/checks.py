"""The checks: pure functions from a timeline to pass/fail with a reason.

Each one states a property of the whole run, so a test can build a timeline that breaks
exactly that property and see the check fail.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations

from validation.scenarios import AT_START, SLURM, Planned, Scenario
from validation.timeline import (
    FINISHED,
    KUBERNETES,
    PENDING,
    SLURMD,
    SUCCEEDED,
    Holding,
    Sample,
    Submission,
    Timeline,
    held_gpus,
    holdings,
    job_lives,
    observed_phases,
    pod_gpus,
    slurm_holds_every_gpu,
)


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class Expectations:
    """What a scenario promises beyond 'every job succeeded and no GPU was shared'."""

    slurm: bool  # Slurm jobs ran, so slurmd must scale up and later return the GPUs
    queueing: bool  # more GPU demand than GPUs: some work must wait, then run
    handoff: bool  # a GPU must go from slurmd to a Kubernetes job
    leak_jobs: tuple[str, ...] = ()  # jobs that must fail to reach a GPU they did not request
    # (name, kind) of the jobs whose output must report a bus bandwidth above 0 and no wrong values
    collectives: tuple[tuple[str, str], ...] = ()


def expectations(scenario: Scenario, planned: list[Planned], gpus_total: int) -> Expectations:
    at_once = sum(p.gpus for p in planned if p.after == AT_START)
    return Expectations(
        slurm=any(p.kind == SLURM for p in planned),
        queueing=at_once > gpus_total,
        handoff=scenario.handoff,
        leak_jobs=tuple(p.name for p in planned if scenario.leak_probe and p.kind != SLURM and p.gpus == 0),
        collectives=tuple((p.name, p.kind) for p in planned if p.collective),
    )


# ------------------------------------------------------------------ latencies


@dataclass(frozen=True)
class Latency:
    """Between two events, each first seen in some sample. An event first seen in sample i
    happened after sample i-1 started and before sample i's last read returned, so the latency
    lies in [low, high]; `value` is the difference of the two samples' start times."""

    value: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.value:.0f} s (between {self.low:.0f} and {self.high:.0f} s)"


def latency(timeline: Timeline, i: int, j: int) -> Latency:
    samples = timeline.samples
    a, b = samples[i], samples[j]
    before_a = samples[i - 1].t if i > 0 else a.t
    before_b = samples[j - 1].t if j > i else b.t
    return Latency(b.t - a.t, max(0.0, before_b - a.end), b.end - before_a)


def first_index(timeline: Timeline, test, start: int = 0) -> int | None:
    return next((i for i in range(start, len(timeline.samples)) if test(timeline.samples[i])), None)


def first_slurm_pending(timeline: Timeline) -> float | None:
    i = first_index(timeline, lambda s: any(j.phase == PENDING for j in s.slurm_jobs))
    return None if i is None else timeline.samples[i].t


def scale_up_bounds(timeline: Timeline) -> Latency | None:
    """First Slurm job pending -> first sample with a Ready slurmd pod."""
    i = first_index(timeline, lambda s: any(j.phase == PENDING for j in s.slurm_jobs))
    j = None if i is None else first_index(timeline, lambda s: s.slurmd_ready > 0, i)
    return None if i is None or j is None else latency(timeline, i, j)


def scale_up_latency(timeline: Timeline) -> float | None:
    bounds = scale_up_bounds(timeline)
    return None if bounds is None else bounds.value


def slurmd_gone(sample: Sample) -> bool:
    return sample.nodeset_replicas == 0 and not sample.slurmd_pods()


def finished_for_good(timeline: Timeline, sub: Submission) -> float | None:
    """The first sample of the job's last finished stretch; None if the last phase seen is not
    finished. Slurm requeues a job after a node failure or preemption (NODE_FAIL, PREEMPTED, then
    PENDING again), so the first finished sample alone may not be the end."""
    done = None
    for sample in timeline.samples:
        phase = observed_phases(sample).get(sub.name)
        if phase is None or sample.t < sub.t:
            continue
        if phase not in FINISHED:
            done = None
        elif done is None:
            done = sample.t
    return done


def last_slurm_done(timeline: Timeline) -> float | None:
    """When the last submitted Slurm job finished for good; None if one never did."""
    done = [finished_for_good(timeline, sub) for sub in timeline.submissions if sub.kind == SLURM]
    if not done or None in done:
        return None
    return max(t for t in done if t is not None)


def gpu_return_bounds(timeline: Timeline) -> Latency | None:
    """Last Slurm job done -> first sample with no slurmd replica and no slurmd pod."""
    done = last_slurm_done(timeline)
    i = None if done is None else first_index(timeline, lambda s: s.t >= done)
    j = None if i is None else first_index(timeline, slurmd_gone, i)
    return None if i is None or j is None else latency(timeline, i, j)


def gpu_return_latency(timeline: Timeline) -> float | None:
    bounds = gpu_return_bounds(timeline)
    return None if bounds is None else bounds.value


# ------------------------------------------------------------------ checks


def check_outcome(timeline: Timeline) -> Check:
    detail = f"outcome: {timeline.outcome}" + (f" ({timeline.ended})" if timeline.ended else "")
    return Check("run completed", timeline.outcome == "completed", detail)


def check_jobs_succeeded(timeline: Timeline) -> Check:
    problems = []
    for life in job_lives(timeline):
        if life.started is None:
            problems.append(f"{life.name} never ran (last seen {life.final_phase or 'never'})")
        elif life.final_phase not in FINISHED:
            problems.append(f"{life.name} never finished (last seen {life.final_phase})")
        elif life.final_phase != SUCCEEDED:
            problems.append(f"{life.name} {life.final_phase}")
    if not timeline.submissions:
        problems.append("nothing was submitted")
    detail = "; ".join(problems) or f"{len(timeline.submissions)} of {len(timeline.submissions)} succeeded"
    return Check("every job succeeded", not problems, detail)


def check_uuids_read(timeline: Timeline) -> Check:
    """Exclusivity is only proven for pods whose GPU we saw from inside."""
    read = {p.uid for s in timeline.samples for p in s.gpu_pods if p.uuids}
    unread = sorted({p.key for s in timeline.samples for p in s.gpu_pods if p.phase == "Running" and p.uid not in read})
    detail = "unread: " + ", ".join(unread) if unread else "every running GPU pod reported its GPU"
    return Check("GPU UUIDs read", not unread, detail)


def overlaps(a: Holding, b: Holding) -> bool:
    return a.start <= b.end and b.start <= a.end


def check_gpu_exclusive(timeline: Timeline) -> Check:
    held = holdings(timeline)
    clashes = [
        f"{a.uuid}: {a.pod} [{a.start:.0f}-{a.end:.0f}s] and {b.pod} [{b.start:.0f}-{b.end:.0f}s]"
        for a, b in combinations(held, 2)
        if a.uuid == b.uuid and a.pod_uid != b.pod_uid and overlaps(a, b)
    ]
    gpus = len({h.uuid for h in held})
    detail = "; ".join(clashes) or f"{len(held)} holdings of {gpus} GPUs, none overlapping"
    return Check("no GPU held twice", bool(held) and not clashes, detail if held else "no GPU holding was seen")


def allocations(timeline: Timeline) -> dict[str, set[str]]:
    """Pod UID -> the GPUs it was allocated, as read inside it (the device plugin's mounts)."""
    found: dict[str, set[str]] = {}
    for sample in timeline.samples:
        for pod in sample.gpu_pods:
            found.setdefault(pod.uid, set()).update(pod.uuids)
    return found


@dataclass(frozen=True)
class ProcessSpan:
    """One pod's processes on one GPU, from the first to the last sample that showed them."""

    uuid: str
    pod_uid: str
    node: str
    start: float
    end: float


def process_spans(timeline: Timeline) -> list[ProcessSpan]:
    spans: dict[tuple[str, str], list] = {}
    for sample in timeline.samples:
        for proc in sample.processes:
            span = spans.setdefault((proc.uuid, proc.pod_uid), [proc.node, sample.t, sample.end])
            span[2] = sample.end
    return sorted(
        (ProcessSpan(uuid, uid, node, start, end) for (uuid, uid), (node, start, end) in spans.items()),
        key=lambda p: (p.uuid, p.start),
    )


def check_processes(timeline: Timeline) -> Check:
    """From the processes on the GPUs, not the allocations: every process runs in a pod that was
    allocated that GPU, and no two pods' processes share a GPU at overlapping times."""
    name = "GPU processes only in their GPU's pod"
    probed = sum(s.probed for s in timeline.samples)
    if not probed:
        return Check(name, False, "the process probe never answered on every GPU node")
    allocated = allocations(timeline)
    pods = {p.uid: p.key for s in timeline.samples for p in s.gpu_pods}
    problems: dict[tuple[str, str], str] = {}
    for sample in timeline.samples:
        for proc in sample.processes:
            where = f"{proc.uuid} at {sample.t:.0f} s"
            if not proc.pod_uid:
                problem = f"{where}: pid {proc.pid} on {proc.node} runs in no pod"
            elif proc.pod_uid not in pods:
                problem = f"{where}: pod {proc.pod_uid} asked for no GPU (pid {proc.pid} on {proc.node})"
            elif not allocated.get(proc.pod_uid):
                problem = f"{where}: {pods[proc.pod_uid]}'s allocation was never read"
            elif proc.uuid not in allocated[proc.pod_uid]:
                problem = f"{where}: {pods[proc.pod_uid]} was allocated {', '.join(sorted(allocated[proc.pod_uid]))}"
            else:
                continue
            problems.setdefault((proc.uuid, proc.pod_uid), problem)
    spans = process_spans(timeline)
    for a, b in combinations(spans, 2):
        if a.uuid == b.uuid and a.pod_uid != b.pod_uid and a.start <= b.end and b.start <= a.end:
            who = [pods.get(x.pod_uid) or x.pod_uid or "no pod" for x in (a, b)]
            problems.setdefault(
                (a.uuid, a.pod_uid + b.pod_uid),
                f"{a.uuid}: {who[0]} [{a.start:.0f}-{a.end:.0f} s] and {who[1]} [{b.start:.0f}-{b.end:.0f} s]",
            )
    seen = sum(len(s.processes) for s in timeline.samples)
    detail = "; ".join(problems.values()) or (
        f"{seen} process sightings on {len({p.uuid for p in spans})} GPUs, each in its GPU's pod "
        f"(probe answered in {probed} of {len(timeline.samples)} samples)"
    )
    return Check(name, not problems, detail)


def check_dcgm(timeline: Timeline) -> Check:
    """dcgm-exporter's pod label per GPU (kubelet's allocations, scraped without gaps) as a second
    record: one pod per GPU at a time, and the GPU each pod read inside itself."""
    name = "dcgm-exporter agrees"
    if not timeline.dcgm:
        return Check(name, False, "no dcgm-exporter record for the run")
    read: dict[str, set[str]] = {p.key: set() for s in timeline.samples for p in s.gpu_pods}
    for sample in timeline.samples:
        for pod in sample.gpu_pods:
            read[pod.key].update(pod.uuids)
    problems = [
        f"{a.uuid}: {a.pod} [{a.start:.0f}-{a.end:.0f} s] and {b.pod} [{b.start:.0f}-{b.end:.0f} s]"
        for a, b in combinations(timeline.dcgm, 2)
        if a.uuid == b.uuid and a.pod != b.pod and a.start <= b.end and b.start <= a.end
    ]
    problems += [
        f"dcgm-exporter says {h.pod} held {h.uuid}; inside, it read {', '.join(sorted(read[h.pod])) or 'nothing'}"
        for h in timeline.dcgm
        if h.pod in read and read[h.pod] and h.uuid not in read[h.pod]
    ]
    detail = "; ".join(problems) or f"{len(timeline.dcgm)} holdings of {len({h.uuid for h in timeline.dcgm})} GPUs"
    return Check(name, not problems, detail)


def check_scale_up(timeline: Timeline) -> Check:
    bounds = scale_up_bounds(timeline)
    if bounds is None:
        return Check("slurmd scaled up", False, "no Slurm job pended, or slurmd never became Ready after it")
    return Check("slurmd scaled up", True, f"first pending -> slurmd Ready in {bounds}")


def check_gpu_return(timeline: Timeline) -> Check:
    if last_slurm_done(timeline) is None:
        return Check("GPUs returned by slurmd", False, "a Slurm job never finished")
    bounds = gpu_return_bounds(timeline)
    if bounds is None:
        return Check("GPUs returned by slurmd", False, "slurmd never scaled to 0 after the last Slurm job")
    return Check("GPUs returned by slurmd", True, f"last Slurm job done -> slurmd gone in {bounds}")


def gpus_held(sample: Sample, gpus: dict[str, tuple[str, ...]]) -> int:
    """GPUs held in a sample, reserved ones included."""
    return len({u for p in sample.gpu_pods for u in held_gpus(p, gpus)})


def check_queued_work(timeline: Timeline) -> Check:
    """Some job pended while every GPU was held, and every job that waited then ran."""
    lives = {life.name: life for life in job_lives(timeline)}
    waited: set[str] = set()
    gpus = pod_gpus(timeline)
    for sample in timeline.samples:
        if gpus_held(sample, gpus) < timeline.gpus_total:
            continue
        for life in lives.values():
            started = life.started if life.started is not None else float("inf")
            if life.submitted <= sample.t < started:
                waited.add(life.name)
    never = sorted(n for n in waited if lives[n].started is None)
    if not waited:
        return Check("queued work waited, then ran", False, "no job ever waited while all GPUs were held")
    if never:
        return Check("queued work waited, then ran", False, "waited and never ran: " + ", ".join(never))
    return Check(
        "queued work waited, then ran",
        True,
        ", ".join(f"{n} waited {lives[n].wait:.0f} s" for n in sorted(waited)),
    )


def check_handoff(timeline: Timeline) -> Check:
    """A GPU went from a slurmd pod to a Kubernetes job's pod, one after the other."""
    held = holdings(timeline)
    handed = sorted(
        {
            a.uuid
            for a in held
            for b in held
            if a.uuid == b.uuid and a.holder == SLURMD and b.holder == KUBERNETES and b.start > a.end
        }
    )
    if not handed:
        return Check("GPU handed from Slurm to Kubernetes", False, "no GPU went from slurmd to a Kubernetes job")
    return Check("GPU handed from Slurm to Kubernetes", True, f"{len(handed)} GPU(s): " + ", ".join(handed))


def check_leak_probe(timeline: Timeline, leak_jobs: tuple[str, ...]) -> Check:
    """The leak probe exits 0 only if it reached no GPU; it counts only if it ran while Slurm
    held every GPU (the GPU it would have taken from slurmd)."""
    name = "no GPU without a request"
    lives = {life.name: life for life in job_lives(timeline)}
    problems = []
    for job in leak_jobs:
        life = lives.get(job)
        if life is None or life.started is None:
            problems.append(f"{job} never ran")
            continue
        if life.final_phase != SUCCEEDED:
            problems.append(f"{job} {life.final_phase or 'never finished'}: it reached a GPU (see its log)")
        end = life.finished if life.finished is not None else float("inf")
        if not any(
            slurm_holds_every_gpu(s, timeline.gpus_total) for s in timeline.samples if life.submitted <= s.t <= end
        ):
            problems.append(f"{job} ran while Slurm did not hold every GPU")
    detail = "; ".join(problems) or f"{', '.join(leak_jobs)} found no GPU while Slurm held all {timeline.gpus_total}"
    return Check(name, not problems, detail)


# nccl-tests' summary lines (NVIDIA/nccl-tests@v2.17.7:src/util.cu writeResultFooter), which the
# PyTorchJob prints too: "# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 1.234".
_WRONG_VALUES = re.compile(r"^# Out of bounds values\s*:\s*(\d+)", re.M)
_AVG_BUSBW = re.compile(r"^# Avg bus bandwidth\s*:\s*([0-9.eE+-]+|nan|inf)", re.M)


def collective_result(output: str) -> tuple[int | None, float | None]:
    """(wrong values, average bus bandwidth in GB/s) from an all-reduce's output; None where absent."""
    wrong, busbw = _WRONG_VALUES.findall(output), _AVG_BUSBW.findall(output)
    return (int(wrong[-1]) if wrong else None), (float(busbw[-1]) if busbw else None)


def check_collectives(timeline: Timeline, jobs: tuple[tuple[str, str], ...]) -> Check:
    problems, results = [], []
    for name, kind in jobs:
        output = timeline.outputs.get(name)
        path = "Slurm" if kind == SLURM else "Kubernetes"
        if output is None:
            problems.append(f"{name} ({path}): no output read")
            continue
        wrong, busbw = collective_result(output)
        if wrong is None or busbw is None:
            problems.append(f"{name} ({path}): no nccl-tests summary in its output (did it run to the end?)")
        elif wrong:
            problems.append(f"{name} ({path}): {wrong} wrong values")
        elif not busbw > 0:
            problems.append(f"{name} ({path}): bus bandwidth {busbw:g} GB/s")
        else:
            results.append(f"{name} ({path}) {busbw:g} GB/s")
    detail = "; ".join(problems) or "average bus bandwidth " + ", ".join(results) + " (functional, not a benchmark)"
    return Check("NCCL all-reduce across nodes", not problems, detail)


# ------------------------------------------------------------------ the table
# One row per check: what the plan promises (`describe_checks`), when it applies and how it runs
# (`evaluate`); both read this table, so what is promised is what is checked.


@dataclass(frozen=True)
class CheckSpec:
    promise: str
    applies: Callable[[Expectations], bool]
    run: Callable[[Timeline, Expectations], Check]


def _always(exp: Expectations) -> bool:
    return True


CHECKS: tuple[CheckSpec, ...] = (
    CheckSpec("run ends before the timeout and was not interrupted", _always, lambda t, e: check_outcome(t)),
    CheckSpec("every submitted job finished successfully", _always, lambda t, e: check_jobs_succeeded(t)),
    CheckSpec(
        "every pod that held a GPU had its GPU UUID read from inside it", _always, lambda t, e: check_uuids_read(t)
    ),
    CheckSpec("no GPU UUID held by two pods at overlapping times", _always, lambda t, e: check_gpu_exclusive(t)),
    CheckSpec(
        "every process on a GPU runs in a pod allocated that GPU, one pod per GPU at a time (the probe)",
        _always,
        lambda t, e: check_processes(t),
    ),
    CheckSpec(
        "dcgm-exporter's pod per GPU: one at a time, and the GPU the pod read (a second record)",
        _always,
        lambda t, e: check_dcgm(t),
    ),
    CheckSpec(
        "slurmd scaled up after work pended (scale-up latency: first pending -> slurmd Ready)",
        lambda e: e.slurm,
        lambda t, e: check_scale_up(t),
    ),
    CheckSpec(
        "slurmd scaled to 0 after the last Slurm job (GPU return latency: last Slurm job done -> slurmd gone)",
        lambda e: e.slurm,
        lambda t, e: check_gpu_return(t),
    ),
    CheckSpec(
        "work beyond the GPUs waited while every GPU was held, then ran",
        lambda e: e.queueing,
        lambda t, e: check_queued_work(t),
    ),
    CheckSpec(
        "a GPU held by slurmd was later held by a Kubernetes job", lambda e: e.handoff, lambda t, e: check_handoff(t)
    ),
    CheckSpec(
        "while Slurm held every GPU, a pod without a GPU request could not reach one",
        lambda e: bool(e.leak_jobs),
        lambda t, e: check_leak_probe(t, e.leak_jobs),
    ),
    CheckSpec(
        "each all-reduce reported 0 wrong values and an average bus bandwidth above 0 (a functional check: "
        "g4dn.xlarge has one GPU and no EFA, NCCL runs over TCP on the pod network)",
        lambda e: bool(e.collectives),
        lambda t, e: check_collectives(t, e.collectives),
    ),
)


def describe_checks(exp: Expectations) -> list[str]:
    """What `evaluate` will check for these expectations, one line each, in its order."""
    return [c.promise for c in CHECKS if c.applies(exp)]


def evaluate(timeline: Timeline, exp: Expectations) -> list[Check]:
    return [c.run(timeline, exp) for c in CHECKS if c.applies(exp)]

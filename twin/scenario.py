"""The scenario file (YAML) of `python -m cli simulate`, validated with one line per problem."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core import user_files
from core.settings import escaped, secret_kind, show

KINDS = ("slurm", "pytorchjob", "job")
FAULTS = (
    "restapi-down",
    "metrics-outage",
    "duplicate-scrape",
    "kueue-metrics-outage",
    "kube-state-metrics-outage",
    "kueue-down",
    "slurmctld-down",
    "node-failure",
    "runnable-exporter-down",
)
NODE_FAULTS = ("node-failure",)  # the faults that name a GPU worker (`node`: its index)
IMAGES = ("warm", "cold")
# Size bounds (docs/input-limits.md): the twin steps every second, about 0.2 s of CPU per simulated
# hour plus up to 0.005 s per queued task (job, array task, replica) and hour: these keep a run
# under a minute (41 s measured at the bounds: two 1,000-task arrays queued for 2 hours).
MAX_DURATION = 24 * 3600
MAX_JOBS = 500
MAX_WORKERS = 64
MAX_FAULTS = 100  # each is checked every simulated second
MAX_TASKS = 2000  # jobs, each Slurm array task and each PyTorchJob replica counted
MAX_TASK_HOURS = 10000  # each task's hours from its submit to the run's end, summed: the most it can be open
NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-")
IMAGE_REFERENCE = re.compile(r"[a-z0-9][A-Za-z0-9._/:@-]{0,254}")  # loosely, a registry/name:tag


class ScenarioError(Exception):
    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class JobSpec:
    name: str
    kind: str
    submit: float
    runtime: float
    nodes: int | None = None  # Slurm -N; None = not given (min 1, max 0 in Slurm)
    max_nodes: int | None = None  # the top of a range, -N <nodes>-<max_nodes>; None = no range
    gpus: int | None = None  # Slurm --gpus, or a batch Job's GPU request
    hold: bool = False  # sbatch --hold
    release: float | None = None  # scontrol release at this time
    after: str | None = None  # --dependency=afterok:<job>
    begin: float | None = None  # --begin, seconds from the start
    partition: str | None = None  # -p; None = the default partition
    replicas: int = 1  # PyTorchJob: Master + Workers, one GPU each
    array: int | None = None  # sbatch --array=0-<array-1>
    throttle: int | None = None  # ...%<throttle>: at most this many tasks run at once
    image: str | None = None  # a Kubernetes job's own image; None = the example job's (pre-pulled)
    # A Kubernetes job's kueue.x-k8s.io/max-exec-time-seconds; None = the most the stack allows
    # (aiJobMaxMinutes), which is what a job that runs as long as it may declares.
    limit: int | None = None
    time: int | None = None  # Slurm --time in minutes; None = not given (the partition's MaxTime)

    @property
    def gpus_wanted(self) -> int:
        if self.kind == "pytorchjob":
            return self.replicas
        if self.kind == "job":
            return self.gpus or 1
        # one GPU per slurmd node: a job needs max(nodes, gpus) nodes
        return max(self.nodes or 1, self.gpus or 0)


@dataclass(frozen=True)
class Fault:
    kind: str
    start: float
    end: float
    node: int | None = None  # node-failure: the GPU worker that goes NotReady (0 .. workers - 1)


@dataclass(frozen=True)
class Scenario:
    duration: float
    images: str = "warm"
    workers: int | None = None
    kueue: bool = True  # as the program deploys it; false: Kubernetes jobs go straight to kube-scheduler
    jobs: tuple[JobSpec, ...] = ()
    faults: tuple[Fault, ...] = field(default_factory=tuple)

    def fault_active(self, kind: str, t: float) -> bool:
        """A fault of `kind` is on at `t` (a window is [start, end))."""
        windows = self._fault_windows.get(kind)
        return windows is not None and any(start <= t < end for start, end in windows)

    @functools.cached_property
    def _fault_windows(self) -> dict[str, tuple[tuple[float, float], ...]]:
        # by kind, made once: the twin asks several times a second, while most scenarios have no fault
        windows: dict[str, tuple[tuple[float, float], ...]] = {}
        for f in self.faults:
            windows[f.kind] = (*windows.get(f.kind, ()), (f.start, f.end))
        return windows


def _show(value: Any) -> str:
    """Escaped, cut, and hidden if it looks like a secret, as every problem line shows a value."""
    return show(value)


def _label(name: Any) -> str:
    """A job's name where a problem line says which job: escaped, cut, hidden if it looks secret."""
    if not isinstance(name, str):
        return "?"
    kind = secret_kind(name)
    return f"(name hidden: {kind})" if kind else escaped(name, 40)


def _extra(data: dict, known: set[str]) -> list:
    """The keys of `data` not in `known`, sorted whatever their types (parse may be handed any dict)."""
    return sorted(set(data) - known, key=lambda k: (str(type(k)), str(k)))


class _Checker:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def bad(self, where: str, value: Any, allowed: str) -> None:
        self.problems.append(f"{where}: {_show(value)} is not allowed; expected {allowed}")

    def number(self, where: str, value: Any, lo: float, hi: float) -> float | None:
        return float(value) if self._in_range(where, value, lo, hi, integer=False) else None

    def integer(self, where: str, value: Any, lo: float, hi: float) -> int | None:
        return int(value) if self._in_range(where, value, lo, hi, integer=True) else None

    def _in_range(self, where: str, value: Any, lo: float, hi: float, integer: bool) -> bool:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and lo <= value <= hi
        if ok and integer and value != int(value):
            ok = False
        if not ok:
            kind = "an integer" if integer else "a number"
            self.bad(where, value, f"{kind} from {lo:g} to {hi:g}")
        return ok


_JOB_KEYS = {
    "name",
    "kind",
    "submit",
    "runtime",
    "nodes",
    "max_nodes",
    "gpus",
    "hold",
    "release",
    "after",
    "begin",
    "partition",
    "replicas",
    "array",
    "throttle",
    "image",
    "limit",
    "time",
}
# A week: aiJobMaxMinutes' top (core/settings.py). A limit above the stack's own is refused at
# submit, in the run; one above every stack's is a mistake in the file.
MAX_LIMIT = 7 * 24 * 3600
# The same for a Slurm job's --time, in minutes as sbatch takes it: slurmJobMaxMinutes' top.
MAX_TIME_MINUTES = 7 * 24 * 60


def parse(data: Any, partitions: tuple[str, ...] = ("all", "slinky")) -> Scenario:
    c = _Checker()
    if not isinstance(data, dict):
        raise ScenarioError([f"scenario: {_show(data)} is not allowed; expected a mapping"])
    for key in _extra(data, {"workers", "duration", "images", "kueue", "jobs", "faults"}):
        c.bad(f"scenario.{_label(key)}", data[key], "one of workers, duration, images, kueue, jobs, faults")
    duration = c.number("duration", data.get("duration"), 1, MAX_DURATION)
    workers = None if "workers" not in data else c.integer("workers", data["workers"], 1, MAX_WORKERS)
    images = data.get("images", "warm")
    if images not in IMAGES:
        c.bad("images", images, " or ".join(IMAGES))
    use_kueue = data.get("kueue", True)
    if not isinstance(use_kueue, bool):
        c.bad("kueue", use_kueue, "true or false")
    jobs: list[JobSpec] = []
    raw_jobs = data.get("jobs", [])
    if not isinstance(raw_jobs, list):
        c.bad("jobs", raw_jobs, "a list")
        raw_jobs = []
    if len(raw_jobs) > MAX_JOBS:
        raise ScenarioError(
            [f"jobs: {len(raw_jobs)} jobs are too many; expected at most {MAX_JOBS} (docs/input-limits.md)"]
        )
    names: set[str] = set()
    for i, raw in enumerate(raw_jobs):
        where = f"jobs[{i}]"
        if not isinstance(raw, dict):
            c.bad(where, raw, "a mapping")
            continue
        where = f"jobs[{i}] ({_label(raw.get('name'))})"
        for key in _extra(raw, _JOB_KEYS):
            c.bad(f"{where}.{_label(key)}", raw[key], "a known job field: " + ", ".join(sorted(_JOB_KEYS)))
        name = raw.get("name")
        if not isinstance(name, str) or not name or not set(name) <= NAME_CHARS or len(name) > 40:
            c.bad(f"{where}.name", name, "lower-case letters, digits and '-', at most 40")
        elif name in names:
            c.bad(f"{where}.name", name, "a name used once")
        else:
            names.add(name)
        kind = raw.get("kind")
        if kind not in KINDS:
            c.bad(f"{where}.kind", kind, " | ".join(KINDS))
        submit = c.number(f"{where}.submit", raw.get("submit"), 0, MAX_DURATION)
        runtime = c.number(f"{where}.runtime", raw.get("runtime"), 1, MAX_DURATION)
        nodes = None if "nodes" not in raw else c.integer(f"{where}.nodes", raw["nodes"], 1, 1024)
        max_nodes = None
        if "max_nodes" in raw:
            max_nodes = c.integer(f"{where}.max_nodes", raw["max_nodes"], nodes or 1, 1024)
            if nodes is None:
                c.bad(f"{where}.max_nodes", raw["max_nodes"], "max_nodes only with nodes (-N nodes-max_nodes)")
        gpus = None if "gpus" not in raw else c.integer(f"{where}.gpus", raw["gpus"], 1, 1024)
        replicas = c.integer(f"{where}.replicas", raw.get("replicas", 1), 1, 1024)
        array = None if "array" not in raw else c.integer(f"{where}.array", raw["array"], 1, 1000)
        time = None if "time" not in raw else c.integer(f"{where}.time", raw["time"], 1, MAX_TIME_MINUTES)
        throttle = None
        if "throttle" in raw:
            throttle = c.integer(f"{where}.throttle", raw["throttle"], 1, array or 1000)
            if array is None:
                c.bad(f"{where}.throttle", raw["throttle"], "throttle only with array")
        hold = raw.get("hold", False)
        if not isinstance(hold, bool):
            c.bad(f"{where}.hold", hold, "true or false")
        release = None if "release" not in raw else c.number(f"{where}.release", raw["release"], 0, MAX_DURATION)
        begin = None if "begin" not in raw else c.number(f"{where}.begin", raw["begin"], 0, MAX_DURATION)
        after = raw.get("after")
        if after is not None and not isinstance(after, str):
            c.bad(f"{where}.after", after, "the name of another slurm job")
            after = None
        partition = raw.get("partition")
        image = raw.get("image")
        if image is not None and (not isinstance(image, str) or not IMAGE_REFERENCE.fullmatch(image)):
            c.bad(f"{where}.image", image, "an image reference such as registry.example/team/train:1.0")
        if kind == "slurm" and "image" in raw:
            c.bad(f"{where}.image", image, "no image on a slurm job (pytorchjob and job only)")
        limit = None if "limit" not in raw else c.integer(f"{where}.limit", raw["limit"], 1, MAX_LIMIT)
        if kind == "slurm" and "limit" in raw:
            c.bad(f"{where}.limit", raw["limit"], "no limit on a slurm job (pytorchjob and job only)")
        if kind != "slurm":
            for key in (
                "nodes",
                "max_nodes",
                "hold",
                "release",
                "after",
                "begin",
                "partition",
                "array",
                "throttle",
                "time",
            ):
                if key in raw:
                    c.bad(f"{where}.{key}", raw[key], f"no {key} on a {kind} (Slurm jobs only)")
            if kind == "job" and "replicas" in raw:
                c.bad(f"{where}.replicas", raw["replicas"], "no replicas on a job (pytorchjob only)")
        elif "replicas" in raw:
            c.bad(f"{where}.replicas", raw["replicas"], "no replicas on a slurm job (pytorchjob only)")
        if partition is not None and (not isinstance(partition, str) or partition not in partitions):
            c.bad(f"{where}.partition", partition, " or ".join(partitions))
        if release is not None and hold is not True:
            c.bad(f"{where}.release", release, "release only with hold: true")
        jobs.append(
            JobSpec(
                name=str(name),
                kind=str(kind),
                submit=submit or 0.0,
                runtime=runtime or 1.0,
                nodes=nodes,
                max_nodes=max_nodes,
                gpus=gpus,
                hold=hold is True,
                release=release,
                after=after,
                begin=begin,
                partition=partition,
                replicas=replicas or 1,
                array=array,
                throttle=throttle,
                image=image if isinstance(image, str) else None,
                limit=int(limit) if limit is not None else None,
                time=time,
            )
        )
    slurm_names = {j.name for j in jobs if j.kind == "slurm"}
    for i, job in enumerate(jobs):
        if job.after is not None and (job.after not in slurm_names or job.after == job.name):
            c.bad(f"jobs[{i}] ({_label(job.name)}).after", job.after, "the name of another slurm job")
    c.problems += _cycles(jobs)
    faults: list[Fault] = []
    raw_faults = data.get("faults", [])
    if not isinstance(raw_faults, list):
        c.bad("faults", raw_faults, "a list")
        raw_faults = []
    elif len(raw_faults) > MAX_FAULTS:
        c.problems.append(
            f"faults: {len(raw_faults)} faults are too many; expected at most {MAX_FAULTS} (docs/input-limits.md)"
        )
        raw_faults = []
    for i, raw in enumerate(raw_faults):
        where = f"faults[{i}]"
        if not isinstance(raw, dict):
            c.bad(where, raw, "a mapping")
            continue
        for key in _extra(raw, {"kind", "start", "end", "node"}):
            c.bad(f"{where}.{_label(key)}", raw[key], "kind, start, end, node")
        kind = raw.get("kind")
        if kind not in FAULTS:
            c.bad(f"{where}.kind", kind, " | ".join(FAULTS))
        node = None
        if kind in NODE_FAULTS:
            top = (workers if isinstance(workers, int) else MAX_WORKERS) - 1
            if "node" not in raw:
                c.bad(f"{where}.node", None, f"the index of the GPU worker that fails, an integer from 0 to {top}")
            else:
                node = c.integer(f"{where}.node", raw["node"], 0, top)
        elif "node" in raw:
            c.bad(f"{where}.node", raw["node"], f"node only on {' or '.join(NODE_FAULTS)}")
        start = c.number(f"{where}.start", raw.get("start"), 0, MAX_DURATION)
        end = c.number(f"{where}.end", raw.get("end"), 0, MAX_DURATION)
        if start is not None and end is not None and end <= start:
            c.bad(f"{where}.end", raw.get("end"), f"a time after start ({start:g})")
        faults.append(Fault(str(kind), start or 0.0, end or 0.0, node))
    if duration is not None:
        c.problems += _outside(duration, jobs, faults)
        c.problems += _too_big(duration, jobs)
    if c.problems or duration is None:  # a missing duration is one of the problems
        raise ScenarioError(c.problems)
    return Scenario(
        duration=duration,
        images=images,
        workers=workers,
        kueue=use_kueue is True,
        jobs=tuple(jobs),
        faults=tuple(faults),
    )


def node_problems(sc: Scenario, workers: int) -> list[str]:
    """A node fault naming a GPU worker the stack does not have (its workers known only with the
    stack, when the file does not set `workers`)."""
    return [
        f"faults[{i}].node: {_show(f.node)} is not allowed; expected an integer from 0 to {workers - 1} "
        f"(the stack has {workers} GPU workers)"
        for i, f in enumerate(sc.faults)
        if f.node is not None and f.node >= workers
    ]


def _cycles(jobs: list[JobSpec]) -> list[str]:
    """Each dependency cycle (a after b after a), once, named at its first job: Slurm would hold
    every job of it forever (DependencyNeverSatisfied), which is a mistake in the file, not an outcome."""
    after = {j.name: j.after for j in jobs if j.kind == "slurm" and j.after not in (None, j.name)}
    index = {j.name: i for i, j in enumerate(jobs)}
    problems, seen = [], set()
    for start in after:
        path, name = [start], after[start]
        while name in after and name not in path and name not in seen:
            path.append(name)
            name = after[name]
        seen.update(path)
        if name in path:
            cycle = path[path.index(name) :]
            chain = " -> ".join(_label(n) for n in [*cycle, name])
            first = cycle[0]
            problems.append(
                f"jobs[{index[first]}] ({_label(first)}).after: {_show(after[first])} is not allowed; expected "
                f"dependencies without a cycle ({chain} would wait forever)"
            )
    return problems


def _outside(duration: float, jobs: list[JobSpec], faults: list[Fault]) -> list[str]:
    """Times that fall outside the run: an event at or after the end would never happen."""
    problems = []
    for i, job in enumerate(jobs):
        for key, t in (("submit", job.submit), ("begin", job.begin), ("release", job.release)):
            if t is not None and t >= duration:
                problems.append(
                    f"jobs[{i}] ({_label(job.name)}).{key}: {_show(t)} is not allowed; expected a time before the "
                    f"end of the run (duration {duration:g})"
                )
    for i, fault in enumerate(faults):  # a fault may outlast the run: still on at the end
        if fault.start >= duration:
            problems.append(
                f"faults[{i}].start: {_show(fault.start)} is not allowed; expected a time before the end of the run "
                f"(duration {duration:g})"
            )
    return problems


def _too_big(duration: float, jobs: list[JobSpec]) -> list[str]:
    tasks = sum(j.array or j.replicas for j in jobs)  # replicas is 1 but on a PyTorchJob
    if tasks > MAX_TASKS:
        return [
            f"jobs: {tasks} tasks (jobs, array tasks, replicas) are too many; expected at most {MAX_TASKS} "
            "(docs/input-limits.md)"
        ]
    # The twin's work is the open tasks it walks each second: a task is open from its submit at
    # most to the run's end, so work submitted through the day weighs what it can cost, not
    # tasks x duration (a 300-job day, about 430 tasks submitted evenly, is about 5,000 task-hours).
    hours = sum((j.array or j.replicas) * (duration - j.submit) for j in jobs) / 3600
    if hours > MAX_TASK_HOURS:
        return [
            f"duration: {_show(duration)} with {tasks} tasks (jobs, array tasks, replicas) is {hours:,.0f} "
            "task-hours to "
            f"simulate (each task from its submit to the end); expected at most {MAX_TASK_HOURS:,} "
            "(a shorter duration, later submits or fewer tasks; docs/input-limits.md)"
        ]
    return []


def load(path: Path, partitions: tuple[str, ...] = ("all", "slinky")) -> Scenario:
    try:
        data = user_files.read_yaml(path, "a scenario file", typed=True)
    except user_files.UserFileError as error:
        raise ScenarioError([f"--scenario: {show(str(path))} {error.problem}"]) from None
    return parse(data, partitions)

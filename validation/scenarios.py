"""The reference experiments, and the exact submissions each one makes.

A scenario names job files under `jobs/`; planning turns them into what the runner
submits (the sbatch script, the Kubernetes objects) with names unique to the run, so two
copies of one job can run side by side and every row in squeue or the API is ours.
"""

from __future__ import annotations

import functools
import json
import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core import host_layout, trusted_yaml
from core.names import GPU_RESOURCE, JOBS_NAMESPACE, MAX_EXEC_TIME_LABEL, Names, SlurmNames

JOBS_DIR = Path(__file__).resolve().parent.parent / "jobs"

# When a workload is submitted.
AT_START = "start"
# Once every Slurm job is done and KEDA has scaled slurmd to 0: the GPUs are back.
AFTER_SCALE_DOWN = "after-slurmd-scaled-to-0"
# Once Slurm jobs run on every GPU (each slurmd pod holding its GPU runs one).
WHILE_SLURM_HOLDS_ALL = "while-slurm-holds-every-gpu"
# Once every build Job of the run (jobs/build/) succeeded: what it built is on the share.
AFTER_BUILD = "after-the-build-succeeded"
BUILD_DIR = "build/"
# The NFS server a build Job mounts the share from; planning fills in the control node's address.
SHARE_SERVER_PLACEHOLDER = "CONTROL_PLANE_IP"
# Where a Slurm job's output is read from: the example scripts write --output=<share>/%x-%j.out
SLURM_OUTPUT_DIR = host_layout.SHARE_SLURM_DIR

SLURM = "slurm"


@dataclass(frozen=True)
class Workload:
    source: str  # path under jobs/
    after: str = AT_START
    workers: int | None = None  # PyTorchJob Worker replicas, if not the file's
    every_gpu: bool = False  # sbatch: one node per GPU of the stack, whatever the file says
    collective: bool = False  # its output ends with nccl-tests' summary: bus bandwidth and wrong values


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    workloads: tuple[Workload, ...]
    handoff: bool = False  # must show a GPU going from Slurm to Kubernetes
    leak_probe: bool = False  # a pod without a GPU request must fail to reach one


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "hpc-parallel",
            "two MPI jobs at once (2 nodes x 2 tasks, 1 GPU per node each)",
            (Workload("slurm/mpi-gpu.sbatch"), Workload("slurm/mpi-gpu.sbatch")),
        ),
        Scenario(
            "mixed",
            "an MPI job and a PyTorchJob at once",
            (Workload("slurm/mpi-gpu.sbatch"), Workload("kubernetes/pytorchjob-ddp.yaml")),
        ),
        Scenario(
            "heavy-mixed",
            "2 MPI jobs + 2 PyTorchJobs + 1 inference Job: more GPU demand than GPUs",
            (
                Workload("slurm/mpi-gpu.sbatch"),
                Workload("slurm/mpi-gpu.sbatch"),
                Workload("kubernetes/pytorchjob-ddp.yaml"),
                Workload("kubernetes/pytorchjob-ddp.yaml"),
                Workload("kubernetes/inference-job.yaml"),
            ),
        ),
        Scenario(
            "handoff",
            "idle -> sbatch -> slurmd scales up -> job ends -> cooldown -> slurmd to 0 -> a PyTorchJob on every GPU",
            (
                Workload("slurm/gpu-smoke.sbatch"),
                # Master + 3 Workers take all 4 GPUs, so the GPU Slurm had must change hands.
                Workload("kubernetes/pytorchjob-ddp.yaml", after=AFTER_SCALE_DOWN, workers=3),
            ),
            handoff=True,
        ),
        Scenario(
            "leak-probe",
            "Slurm holds every GPU; a CUDA pod with NVIDIA_VISIBLE_DEVICES=all and no GPU request tries to use one",
            (
                Workload("slurm/hold-gpus.sbatch", every_gpu=True),
                Workload("kubernetes/leak-probe.yaml", after=WHILE_SLURM_HOLDS_ALL),
            ),
            leak_probe=True,
        ),
        Scenario(
            "nccl",
            "an NCCL all-reduce across two nodes on each path: nccl-tests' all_reduce_perf through sbatch, "
            "torch.distributed in a PyTorchJob (bus bandwidth: a functional check on g4dn, not a performance figure)",
            (
                Workload("build/nccl-tests.yaml"),
                Workload("slurm/nccl-allreduce.sbatch", after=AFTER_BUILD, collective=True),
                Workload("kubernetes/pytorchjob-nccl-allreduce.yaml", collective=True),
            ),
        ),
    )
}


@dataclass(frozen=True)
class PlannedSlurm:
    """One sbatch submission, ready to send."""

    name: str
    source: str
    gpus: int
    after: str
    script: str  # the sbatch script, sent on sbatch's stdin
    collective: bool = False

    @property
    def kind(self) -> str:
        return SLURM


@dataclass(frozen=True)
class PlannedKube:
    """One Kubernetes object (PyTorchJob or Job), ready to create."""

    name: str
    kind: str  # PyTorchJob or Job
    source: str
    gpus: int
    after: str
    obj: dict
    collective: bool = False

    @property
    def namespace(self) -> str:
        return self.obj.get("metadata", {}).get("namespace", JOBS_NAMESPACE)


Planned = PlannedSlurm | PlannedKube


# ------------------------------------------------------------------ GPU demand

_SBATCH = re.compile(r"^#SBATCH\s+(.*)$", re.MULTILINE)


def sbatch_options(script: str) -> dict[str, str]:
    """The #SBATCH options of a script as {long option: value}."""
    short = {"-N": "--nodes", "-n": "--ntasks", "-J": "--job-name", "-G": "--gpus"}
    options: dict[str, str] = {}
    for line in _SBATCH.findall(script):
        words = shlex.split(line, comments=True)
        for i, word in enumerate(words):
            if word.startswith("--"):
                key, _, value = word.partition("=")
                options[key] = value
            elif word in short and i + 1 < len(words):
                options[short[word]] = words[i + 1]
    return options


def slurm_gpus(script: str) -> int:
    """GPUs a batch script asks for: nodes x GPUs per node from --gres=gpu[:type]:N."""
    options = sbatch_options(script)
    nodes = int(options.get("--nodes", "1").split("-")[0])
    per_node = 0
    for gres in options.get("--gres", "").split(","):
        parts = gres.split(":")
        if parts[0] == "gpu":
            per_node += int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
    return nodes * per_node


def pod_gpus(pod_spec: dict) -> int:
    return sum(
        int(c.get("resources", {}).get("limits", {}).get(GPU_RESOURCE, 0)) for c in pod_spec.get("containers", [])
    )


def kube_gpus(obj: dict) -> int:
    """GPUs a PyTorchJob or Job holds while all its pods run."""
    spec = obj["spec"]
    if obj["kind"] == "PyTorchJob":
        return sum(
            int(r.get("replicas", 1)) * pod_gpus(r["template"]["spec"]) for r in spec["pytorchReplicaSpecs"].values()
        )
    return int(spec.get("parallelism", 1)) * pod_gpus(spec["template"]["spec"])


# ------------------------------------------------------------------ planning


def time_minutes(text: str) -> float | None:
    """An sbatch --time in minutes, seconds rounded up as slurmctld rounds them: "minutes",
    "minutes:seconds", "hours:minutes:seconds", "days-hours", "days-hours:minutes",
    "days-hours:minutes:seconds" (SchedMD/slurm@slurm-25-11-6-1: doc/man/man1/sbatch.1, --time;
    src/common/parse_time.c time_str2mins). infinity for INFINITE or UNLIMITED; None if unreadable."""
    value = text.strip()
    if value.upper() in ("INFINITE", "UNLIMITED"):
        return math.inf
    days, dash, rest = value.partition("-")
    if not dash:
        days, rest = "0", value
    parts = rest.split(":")
    if not days.isdigit() or not all(p.isdigit() for p in parts) or len(parts) > 3:
        return None
    numbers = [int(p) for p in parts]
    if dash:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = [*numbers, 0, 0][:3]
    elif len(numbers) == 3:  # hours:minutes:seconds
        hours, minutes, seconds = numbers
    else:  # minutes[:seconds]
        hours, (minutes, seconds) = 0, [*numbers, 0][:2]
    return int(days) * 1440 + hours * 60 + minutes + math.ceil(seconds / 60)


def limit_problems(scenario: Scenario, planned: list[Planned], names: Names) -> list[str]:
    """The submissions the stack's run limits would refuse, one line each: a Slurm --time over
    slurmJobMaxMinutes (components/job_submit.lua refuses it at submit), an AI job whose
    max-exec-time label is over aiJobMaxMinutes or that asks for more GPUs than AI may hold
    (components/ai_run_limit.py's admission policies refuse it)."""
    problems = []
    for p in planned:
        where = f"--scenario {scenario.name}: jobs/{p.source}"
        if isinstance(p, PlannedSlurm):
            given = sbatch_options(p.script).get("--time")
            minutes = time_minutes(given) if given is not None else None
            if minutes is not None and minutes > names.slurm_job_max_minutes:
                problems.append(
                    f"{where} asks --time={given} ({minutes:g} min), over slurmJobMaxMinutes "
                    f"{names.slurm_job_max_minutes}: job_submit.lua would refuse it at submit; "
                    f"raise slurmJobMaxMinutes to {minutes:g} or more"
                )
            continue
        declared = p.obj.get("metadata", {}).get("labels", {}).get(MAX_EXEC_TIME_LABEL)
        limit = 60 * names.ai_job_max_minutes
        if declared is not None and str(declared).isdigit() and int(declared) > limit:
            problems.append(
                f"{where} declares {MAX_EXEC_TIME_LABEL} {declared}, over aiJobMaxMinutes "
                f"{names.ai_job_max_minutes} ({limit} s): the admission policy would refuse it; "
                f"raise aiJobMaxMinutes to {math.ceil(int(declared) / 60)} or more"
            )
        if p.gpus > names.shares.ai_max_gpus:
            problems.append(
                f"{where} asks for {p.gpus} GPUs, more than AI may hold ({names.shares.ai_max_gpus}): the "
                "admission policy would refuse it; raise workerCount, or aiGuaranteedGpus if aiBorrowsHpcGpus is false"
            )
    return list(dict.fromkeys(problems))  # a job file the scenario submits twice, once


def load_objects(path: Path) -> list[dict]:
    # YAML anchors (the PyTorchJob shares one pod template) load as one shared object,
    # and deepcopy keeps the sharing; a JSON round trip gives each replica its own copy
    # (and each caller its own objects).
    return [json.loads(json.dumps(d)) for d in _documents(path.read_text())]


@functools.cache
def _documents(text: str) -> tuple[Any, ...]:
    # parsed once per text: a run of every scenario reads the same few job files many times
    return tuple(d for d in trusted_yaml.load_all(text) if d)


def unique_name(source: str, run_id: str, index: int) -> str:
    """DNS-1035 and Slurm-safe: the file's stem, the run, the position in the scenario."""
    stem = Path(source).name.split(".")[0]
    return f"{stem}-{run_id}-{index}"


def with_share_server(obj: dict, server: str | None) -> dict:
    """A build Job with the NFS server of its share filled in (the placeholder left without one)."""
    for volume in obj["spec"]["template"]["spec"].get("volumes", []):
        if volume.get("nfs", {}).get("server") == SHARE_SERVER_PLACEHOLDER and server:
            volume["nfs"]["server"] = server
    return obj


def plan(
    scenario: Scenario,
    run_id: str,
    jobs_dir: Path = JOBS_DIR,
    gpus_total: int | None = None,
    share_server: str | None = None,
) -> list[Planned]:
    """`share_server`: the control node's private IP, which serves the shared directory."""
    planned: list[Planned] = []
    for index, workload in enumerate(scenario.workloads, start=1):
        path = jobs_dir / workload.source
        name = unique_name(workload.source, run_id, index)
        if path.suffix == ".sbatch":
            script = path.read_text()
            if workload.every_gpu and gpus_total is not None:
                # As `sbatch -N <GPUs>` would: the directive is the script's, so rewrite it.
                script = re.sub(r"^#SBATCH --nodes=\S+$", f"#SBATCH --nodes={gpus_total}", script, flags=re.M)
            planned.append(
                PlannedSlurm(name, workload.source, slurm_gpus(script), workload.after, script, workload.collective)
            )
            continue
        (obj,) = load_objects(path)
        obj["metadata"]["name"] = name
        if workload.workers is not None:
            obj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = workload.workers
        if workload.source.startswith(BUILD_DIR):
            obj = with_share_server(obj, share_server)
        planned.append(
            PlannedKube(name, obj["kind"], workload.source, kube_gpus(obj), workload.after, obj, workload.collective)
        )
    return planned


def sbatch_command(job_name: str) -> list[str]:
    """What runs inside slurmctld; the script arrives on stdin, as when a user types it.

    --job-name on the command line overrides the script's own, which makes the job findable.
    """
    return ["sbatch", "--parsable", f"--job-name={job_name}"]


def describe(scenario: Scenario, planned: list[Planned], names: SlurmNames, gpus_total: int) -> list[str]:
    """What a run would submit, in the words of the commands a user would type."""
    at_start = sum(p.gpus for p in planned if p.after == AT_START)
    later = sum(p.gpus for p in planned) - at_start
    demand = f"GPU demand {at_start} at start" + (f", {later} later" if later else "")
    lines = [f"scenario {scenario.name}: {scenario.description}", f"{demand}; the testbed has {gpus_total} GPUs"]
    for p in planned:
        when = {
            AT_START: "at start",
            AFTER_SCALE_DOWN: "once slurmd is scaled to 0",
            AFTER_BUILD: "once the build succeeded",
        }.get(p.after, "once Slurm holds every GPU")
        if isinstance(p, PlannedSlurm):
            command = " ".join([names.exec_prefix(), *sbatch_command(p.name), "<", f"jobs/{p.source}"])
        else:
            command = f"create {p.kind} {p.namespace}/{p.name} from jobs/{p.source} (kubectl apply -f)"
        lines.append(f"  {when}: {command}  [{p.gpus} GPU]")
        if p.collective:
            path = (
                "Slurm: nccl-tests all_reduce_perf" if isinstance(p, PlannedSlurm) else "Kubernetes: torch.distributed"
            )
            lines.append(
                f"    {path}, {p.gpus} ranks with one GPU each (one GPU per worker: a rank per node); "
                f"bus bandwidth read from {output_source(p)}"
            )
    return lines


def output_source(p: Planned) -> str:
    """Where a job's output is read after it ended."""
    if isinstance(p, PlannedSlurm):
        return f"{SLURM_OUTPUT_DIR}/{p.name}-<job id>.out (its --output on the share)"
    return f"the log of pod {p.namespace}/{p.name}-master-0"

"""The job-shape table on the real slurmctld (booted from the program's files, components/job_submit.lua
inside it, slurmd as dynamic nodes with the GPU a g4dn's driver reports): every shape a user types is
either accepted and runs, or refused at submit with the testbed's line; every update either applies
or is refused, the job left as it was. The script's node shape is this host's (harness ADAPTATIONS),
so the CPU and memory rows are written against it. Rows the twin's Slurm can express are compared
with twin/slurm.py too."""

from __future__ import annotations

import re
from dataclasses import dataclass

from stacks import offline
from tests.engines import harness
from tests.engines.conftest import engine_marks
from twin import program
from twin.scenario import JobSpec
from twin.slurm import REFUSED, Slurmctld

pytestmark = engine_marks(__name__)
NODES = ("slinky-0", "slinky-1")
RUNS = "runs"


@dataclass(frozen=True)
class Shape:
    label: str
    args: tuple[str, ...]
    want: str  # RUNS, or a piece of the testbed's refusal line
    twin: JobSpec | None = None  # the same request as the twin's scenario knows it


def _config():
    return program.setup(offline.stack_settings("dev", [])).slurm


def shapes(cpus: int, memory_mb: int, max_nodes: int, max_minutes: int) -> list[Shape]:
    """The issue's shapes, the CPU and memory ones written against the node here (`cpus`, `memory_mb`)."""
    over_nodes = f"MaxNodes={max_nodes}"
    on_one_node = "on one node, but each node (slurmd pod on a g4dn.xlarge) has"
    return [
        Shape("sbatch", (), RUNS, JobSpec("a", "slurm", 0.0, 1.0)),
        Shape("--gpus=1", ("--gpus=1",), RUNS, JobSpec("a", "slurm", 0.0, 1.0, gpus=1)),
        Shape("--gpus=tesla:1 (the node's type)", ("--gpus=tesla:1",), RUNS),
        Shape("--gres=gpu:1", ("--gres=gpu:1",), RUNS),
        Shape("--gpus=2 (sized to 2 nodes)", ("--gpus=2",), RUNS, JobSpec("a", "slurm", 0.0, 1.0, gpus=2)),
        Shape("-N 2", ("-N", "2"), RUNS, JobSpec("a", "slurm", 0.0, 1.0, nodes=2)),
        Shape(
            f"-N 1-{max_nodes} (range within MaxNodes)",
            ("-N", f"1-{max_nodes}"),
            RUNS,
            JobSpec("a", "slurm", 0.0, 1.0, nodes=1, max_nodes=max_nodes),
        ),
        Shape(f"-c {cpus} (the node's CPUs)", ("-c", str(cpus)), RUNS),
        Shape(f"-n {2 * cpus} (sized to 2 nodes)", ("-n", str(2 * cpus)), RUNS),
        Shape(f"--mem={memory_mb}M (the node's memory)", (f"--mem={memory_mb}M",), RUNS),
        Shape("--array=0-3%2", ("--array=0-3%2",), RUNS),
        Shape(f"--time={max_minutes}", (f"--time={max_minutes}",), RUNS, JobSpec("a", "slurm", 0.0, 1.0, time=60)),
        Shape(
            "-N 1-8",
            ("-N", "1-8"),
            f"-N 1-8 need 8 nodes (one GPU per slurmd pod); partition all has {over_nodes}",
            JobSpec("a", "slurm", 0.0, 1.0, nodes=1, max_nodes=8),
        ),
        Shape("-N 8", ("-N", "8"), over_nodes, JobSpec("a", "slurm", 0.0, 1.0, nodes=8)),
        Shape("--gpus=8", ("--gpus=8",), over_nodes, JobSpec("a", "slurm", 0.0, 1.0, gpus=8)),
        Shape(f"-c {2 * cpus}", ("-c", str(2 * cpus)), f"the job asks {2 * cpus} CPUs {on_one_node} {cpus}"),
        Shape(f"-n {cpus + 1} -N 1", ("-n", str(cpus + 1), "-N", "1"), f"asks {cpus + 1} CPUs {on_one_node}"),
        Shape(f"--ntasks-per-node={cpus + 1}", (f"--ntasks-per-node={cpus + 1}",), f"asks {cpus + 1} CPUs"),
        Shape(f"--mem={memory_mb + 1}M", (f"--mem={memory_mb + 1}M",), f"--mem asks {memory_mb + 1} MB {on_one_node}"),
        Shape("--mem=64G", ("--mem=64G",), "--mem asks 65536 MB" if memory_mb < 65536 else RUNS),
        # The issue's own rows, refused on a g4dn.xlarge (4 CPUs): refused here unless this host has 8.
        Shape("-c 8", ("-c", "8"), f"the job asks 8 CPUs {on_one_node}" if cpus < 8 else RUNS),
        Shape("-n 8 -N 1", ("-n", "8", "-N", "1"), f"asks 8 CPUs {on_one_node}" if cpus < 8 else RUNS),
        Shape(
            "--mem-per-gpu=40G --gpus=1",
            ("--mem-per-gpu=40G", "--gpus=1"),
            "--mem-per-gpu asks 40960 MB" if memory_mb < 40960 else RUNS,
        ),
        Shape(
            f"--mem-per-gpu={memory_mb + 1}M --gpus=1",
            (f"--mem-per-gpu={memory_mb + 1}M", "--gpus=1"),
            f"--mem-per-gpu asks {memory_mb + 1} MB",
        ),
        Shape("--gpus=a100:1", ("--gpus=a100:1",), "GPU type a100: no node has it"),
        Shape("--gres=gpu:nosuchtype:1", ("--gres=gpu:nosuchtype:1",), "GPU type nosuchtype: no node has it"),
        Shape("--gres=gpu:2", ("--gres=gpu:2",), "2 GPUs per node asked"),
        Shape(
            f"--time={max_minutes + 60}",
            (f"--time={max_minutes + 60}",),
            f"over MaxTime={max_minutes}",
            JobSpec("a", "slurm", 0.0, 1.0, time=max_minutes + 60),
        ),
    ]


UPDATES = [
    # (label, scontrol update arguments, RUNS: applied, else a piece of the refusal; the field shown after)
    ("NumNodes=8", ("NumNodes=8",), "NumNodes=8 need 8 nodes", ("NumNodes", "1-1")),
    ("NumNodes=1-8", ("NumNodes=1-8",), "MaxNodes=4", ("NumNodes", "1-1")),
    ("TimeLimit=120", ("TimeLimit=120",), "a time limit of 120 minutes is over MaxTime=60", ("TimeLimit", "01:00:00")),
    ("TresPerJob=gres/gpu:8", ("TresPerJob=gres/gpu:8",), "8 GPUs need 8 nodes", ("TresPerJob", None)),
    ("TresPerJob=gres/gpu:a100:1", ("TresPerJob=gres/gpu:a100:1",), "GPU type a100", ("TresPerJob", None)),
    ("MinMemoryNode=65536000", ("MinMemoryNode=65536000",), "--mem asks 65536000 MB", ("MinMemoryNode", "0")),
    ("TimeLimit=30 (applied)", ("TimeLimit=30",), RUNS, ("TimeLimit", "00:30:00")),
    ("NumNodes=2 (applied)", ("NumNodes=2",), RUNS, ("NumNodes", "2-2")),
]


def _show(slurm: harness.Engines, job: str) -> dict[str, str]:
    out = slurm.client("scontrol", "show", "job", "-o", job).stdout
    return dict(re.findall(r"\b(JobState|Reason|TimeLimit|NumNodes|TresPerJob|MinMemoryNode)=(\S+)", out))


def _twin_answer(spec: JobSpec) -> tuple[bool, str]:
    """(refused, the refusal's text) from the twin's Slurm."""
    ctld = Slurmctld(_config())
    (job, *_) = ctld.submit(spec, 0.0)
    return job.state == REFUSED, job.reason


def test_every_shape_is_accepted_and_runs_or_is_refused_at_submit(slurm):
    config = _config()
    cpus, memory_mb = slurm.shape
    for node in NODES:
        slurm.start_node(node)
    accepted: dict[str, str] = {}
    for shape in shapes(cpus, memory_mb, config.max_nodes, config.max_minutes):
        done = slurm.client("sbatch", "--parsable", *shape.args, "--wrap", "true")
        if shape.want == RUNS:
            assert done.returncode == 0, (shape.label, done.stderr)
            accepted[shape.label] = done.stdout.strip().split(";")[0]
        else:
            assert done.returncode != 0, (shape.label, "accepted")
            assert "sbatch: error: testbed: " in done.stderr and shape.want in done.stderr, (shape.label, done.stderr)
        if shape.twin is not None:
            refused, reason = _twin_answer(shape.twin)
            assert refused == (shape.want != RUNS), shape.label
            # The client prints the plugin's line, then the error of its return code; so does the twin.
            assert all(part.removeprefix("sbatch: error: ") in done.stderr for part in reason.split("; ") if part)

    def ran(job: str) -> bool:
        return slurm.client("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == ""

    # Every accepted job runs and leaves the queue (`true`); one that can never start would pend.
    try:
        slurm.wait_for(lambda: all(ran(j) for j in accepted.values()), 120, "every accepted job to run")
    except TimeoutError:
        left = {label: _show(slurm, job) for label, job in accepted.items() if not ran(job)}
        raise AssertionError(f"accepted and never ran: {left}") from None
    for label, job in accepted.items():
        state = _show(slurm, job).get("JobState")
        assert state in (None, "COMPLETED"), (label, state)


def test_every_update_is_applied_or_refused_leaving_the_job_as_it_was(slurm):
    for node in NODES:
        slurm.start_node(node)
    job = slurm.sbatch("-H", "-N", "1", command="true")  # held: it stays pending while it is updated
    for label, args, want, (field, before) in UPDATES:
        done = slurm.client("scontrol", "update", f"JobId={job}", *args)
        shown = _show(slurm, job)
        if want == RUNS:
            assert done.returncode == 0, (label, done.stderr)
            assert shown.get(field) == before, (label, shown)
        else:
            assert done.returncode != 0 and "testbed: " in done.stderr and want in done.stderr, (label, done.stderr)
            assert shown.get(field) == before, (label, "the refused update was applied", shown)
    assert slurm.client("scontrol", "release", job).returncode == 0
    slurm.wait_for(lambda: _show(slurm, job).get("JobState") == "COMPLETED", 60, "the updated job to run")


def test_at_zero_nodes_the_misleading_answers_come_with_a_clear_line(slurm):
    """No slurmd pod runs: Slurm's own answers mislead, the testbed's line says what happened."""
    for option in ("--exclude=slinky-0", "--nodelist=slinky-0"):
        done = slurm.client("sbatch", option, "--wrap", "true")
        assert done.returncode != 0 and "Invalid node name specified" in done.stderr, done.stderr
        assert "testbed: --nodelist/--exclude name slurmd pods" in done.stderr, done.stderr
    job = slurm.sbatch("-H")
    done = slurm.client("scontrol", "release", job)
    # Slurm tries to start the job after the update and finds no node: an error and exit 1 ...
    assert done.returncode != 0 and "Requested partition configuration not available now" in done.stderr
    assert "testbed: released;" in done.stderr, done.stderr
    # ... although the release was applied.
    assert _show(slurm, job).get("Reason") != "JobHeldUser", _show(slurm, job)


def test_gres_type_matching_under_autodetect_takes_the_node_type_as_a_substring_of_the_device_name(slurm):
    """The conformance row for GRES types. The driver names a g4dn's GPU `Tesla T4`; gpu/nvidia makes
    it the type `tesla_t4` (gpu_nvidia.c _set_basic_info, gpu_common_underscorify_tolower); slurmd then
    gives each detected device the type of the first configured record whose type is a substring of
    its own (case-insensitive) and keeps the configured one (gres_gpu.c _normalize_sys_gres_types,
    _find_type_in_gres_list: xstrcasestr; the same at slurm-25-11-6-1 and slurm-26-05-0-1). So the
    node's `gpu:tesla:1` matches a T4 and `--gpus=tesla:1` runs; a type that is not a substring
    (`a10g`) leaves the node with 0 usable GPUs of its type, and slurmctld marks it INVAL."""
    slurm.start_node("slinky-0")
    shown = slurm.client("scontrol", "show", "node", "slinky-0").stdout
    assert re.search(r"\bGres=gpu:tesla:1\b", shown) and "INVALID_REG" not in shown, shown
    log = (slurm.work / "nodes" / "slinky-0" / "log" / "slurmd.log").read_text()
    assert "Adding fake system GPU data" in log and "Could not find an unused configuration record" not in log
    job = slurm.sbatch("--gpus=tesla:1", command="true")
    slurm.wait_for(lambda: _show(slurm, job).get("JobState") == "COMPLETED", 60, "the tesla job to run")

    slurm.slurmd_conf = slurm.slurmd_conf.replace("gpu:tesla:1", "gpu:a10g:1")
    slurm.start_node("slinky-1")  # it registers (node_states lists it), invalid
    shown = slurm.client("scontrol", "show", "node", "slinky-1").stdout
    assert "INVALID_REG" in shown and "gres/gpu count reported lower than configured (0 < 1)" in shown, shown

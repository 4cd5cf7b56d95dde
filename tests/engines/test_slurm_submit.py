"""Submissions on the real slurmctld booted from the program's slurm.conf, as users make them while
KEDA keeps slurmd at 0 (no node registered), with one node, and under the value that broke it; each
answer compared with the twin's Slurm (twin/slurm.py) on the same request."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest

from components import slinky
from stacks import offline
from tests.engines import harness
from tests.engines.conftest import engine_marks, worker_index
from twin import program
from twin.scenario import JobSpec
from twin.slurm import NEVER_SATISFIED, REFUSED, SlurmConfig, Slurmctld
from validation.scenarios import sbatch_options, time_minutes

pytestmark = engine_marks(__name__)
JOBS = Path(__file__).resolve().parents[2] / "jobs" / "slurm"


@dataclass(frozen=True)
class Request:
    """One sbatch: its arguments, and the same request as the twin's scenario knows it."""

    label: str
    args: tuple[str, ...]
    nodes: int | None = None
    gpus: int | None = None  # --gpus, or --gpus-per-task times -n
    partition: str | None = None
    stdin: str | None = None  # a batch script, as `sbatch < file`
    time: int | None = None  # --time in minutes


def _script_request(path: Path) -> Request:
    """A shipped job script submitted as the README does (`sbatch < file`): its -N and --time for
    the twin, read as `validate` reads them."""
    text = path.read_text()
    options = sbatch_options(text)
    minutes = time_minutes(options["--time"]) if "--time" in options else None
    return Request(
        f"jobs/slurm/{path.name}",
        (),
        nodes=int(options["--nodes"]) if "--nodes" in options else None,
        stdin=text,
        time=int(minutes) if minutes is not None else None,
    )


REQUESTS = [
    Request("sbatch --wrap", ()),
    Request("--gpus=1", ("--gpus=1",), gpus=1),
    Request("-p slinky -N 1", ("-p", "slinky", "-N", "1"), nodes=1, partition="slinky"),
    Request("--gpus=2 (sized to 2 nodes)", ("--gpus=2",), gpus=2),
    Request("-n 2 --gpus-per-task=1", ("-n", "2", "--gpus-per-task=1"), gpus=2),
    Request("--gpus=3 (over MaxNodes)", ("--gpus=3",), gpus=3),
    Request("-N 3 (over MaxNodes)", ("-N", "3"), nodes=3),
    Request("-N 1 --gpus=2 (never fits)", ("-N", "1", "--gpus=2"), nodes=1, gpus=2),
    Request("--time=60 (at MaxTime)", ("--time=60",), time=60),
    Request("--time=1:01:00 (over MaxTime)", ("--time=1:01:00",), time=61),
    Request(
        "--time=61 --gpus=2 (over MaxTime, refused before it is sized)", ("--time=61", "--gpus=2"), gpus=2, time=61
    ),
    *[_script_request(p) for p in sorted(JOBS.glob("*.sbatch"))],
]


def submit(slurm: harness.Engines, r: Request):
    """`sbatch ARGS --wrap ...`, or `sbatch ARGS < script` for a job script."""
    if r.stdin is None:
        return slurm.client("sbatch", *r.args, "--wrap", "sleep 600")
    return slurm.client("sbatch", *r.args, stdin=r.stdin)


def twin_answer(config: SlurmConfig, r: Request, nodes_registered: int) -> tuple[bool, str]:
    """(accepted, the refusal's text) from the twin's Slurm in the same state."""
    ctld = Slurmctld(config)
    for i in range(nodes_registered):
        ctld.register(f"slinky-{i}", 0.0)
    spec = JobSpec(r.label, "slurm", 0.0, 600.0, nodes=r.nodes, gpus=r.gpus, partition=r.partition, time=r.time)
    (job, *_) = ctld.submit(spec, 0.0)
    return job.state != REFUSED, job.reason


def _dev():
    return offline.stack_settings("dev", [])


def _assert_same(real, accepted: bool, reason: str, label: str) -> None:
    assert (real.returncode == 0) == accepted, f"{label}: real said {real.stderr.strip()!r}, twin {reason!r}"
    if not accepted:
        # The client prints the plugin's message (if any), then the error of the return code.
        for part in reason.split("; "):
            assert part.removeprefix("sbatch: error: ") in real.stderr, (label, real.stderr, reason)


def test_every_request_is_answered_with_slurmd_at_zero_as_the_twin_answers(slurm):
    config = program.setup(_dev()).slurm
    assert not config.enforce_part_limits and config.job_submit_lua
    accepted = 0
    for r in REQUESTS:
        real = submit(slurm, r)
        ok, reason = twin_answer(config, r, 0)
        _assert_same(real, ok, reason, r.label)
        accepted += ok
    # The basic path: a plain sbatch and the README's first job are accepted and pend until slurmd comes.
    assert accepted >= 6
    pending = slurm.client("squeue", "-h", "-o", "%T %r").stdout.split("\n")
    assert all(line.startswith("PENDING") for line in pending if line)


def test_a_node_registering_runs_what_waited(slurm):
    assert submit(slurm, REQUESTS[0]).returncode == 0
    slurm.start_node("slinky-0")
    slurm.wait_for(lambda: "RUNNING" in slurm.client("squeue", "-h", "-o", "%T").stdout, 30, "the job to start")
    assert slurm.node_states() == {"slinky-0": "mixed"}


@pytest.mark.parametrize("value", ["ALL", "ANY"])
def test_any_other_enforce_part_limits_refuses_against_the_nodes_registered_now(
    engine_root, tmp_path, deployed_slurm_values, value
):
    """The regression the program's EnforcePartLimits=NO prevents, shown on the real engine and
    expressed by the twin: with no node every job is refused, with one a 2-node job is."""
    from core.names import slurm_names

    conf = deployed_slurm_values["controller"]["extraConfMap"]
    assert conf["EnforcePartLimits"] == slinky.ENFORCE_PART_LIMITS == "NO"
    values = {
        **deployed_slurm_values,
        "controller": {**deployed_slurm_values["controller"], "extraConfMap": {**conf, "EnforcePartLimits": value}},
    }
    config = dataclasses.replace(program.setup(_dev()).slurm, enforce_part_limits=True)
    assert config.job_submit_lua
    plain, two = REQUESTS[0], Request("-N 2", ("-N", "2"), nodes=2)
    with harness.engines(tmp_path, values, slurm_names("slinky"), worker_index()) as slurm:
        real = submit(slurm, plain)
        assert "More processors requested than permitted" in real.stderr
        _assert_same(real, *twin_answer(config, plain, 0), plain.label)
        slurm.start_node("slinky-0")
        real = submit(slurm, two)
        assert "Node count specification invalid" in real.stderr
        _assert_same(real, *twin_answer(config, two, 1), two.label)
        _assert_same(submit(slurm, plain), *twin_answer(config, plain, 1), plain.label)


@pytest.mark.parametrize("kill_invalid_depend", [True, False])
def test_a_dependency_that_can_never_be_satisfied_is_cancelled_as_the_twin_cancels_it(
    engine_root, tmp_path, deployed_slurm_values, kill_invalid_depend
):
    """afterok on a job that was cancelled: the program's DependencyParameters=kill_invalid_depend
    has slurmctld cancel the dependent job; without it the job pends for good
    (DependencyNeverSatisfied), work slurmd would keep starting for. The twin's Slurm agrees."""
    from core.names import slurm_names

    conf = deployed_slurm_values["controller"]["extraConfMap"]
    assert conf["DependencyParameters"] == slinky.DEPENDENCY_PARAMETERS
    if not kill_invalid_depend:
        conf = {k: v for k, v in conf.items() if k != "DependencyParameters"}
    values = {**deployed_slurm_values, "controller": {**deployed_slurm_values["controller"], "extraConfMap": conf}}
    config = program.setup(_dev()).slurm
    assert config.kill_invalid_depend
    config = dataclasses.replace(config, kill_invalid_depend=kill_invalid_depend)
    want = ("CANCELLED" if kill_invalid_depend else "PENDING", NEVER_SATISFIED)
    with harness.engines(tmp_path, values, slurm_names("slinky"), worker_index()) as slurm:
        slurm.start_node("slinky-0")
        first = slurm.sbatch()
        then = slurm.sbatch(f"--dependency=afterok:{first}", command="sleep 1")

        def state(job: str) -> tuple[str, str]:
            shown = slurm.show_job(job)
            return shown.get("JobState", ""), shown.get("Reason", "")

        slurm.wait_for(lambda: state(first)[0] == "RUNNING", 30, "the first job to start")
        assert slurm.client("scancel", first).returncode == 0
        slurm.wait_for(lambda: state(then) == want, 30, f"the dependent job {want}")

    twin = Slurmctld(config)
    twin.register("slinky-0", 0.0)
    (t_first,) = twin.submit(JobSpec("first", "slurm", 0.0, 600.0), 0.0)
    (t_then,) = twin.submit(JobSpec("then", "slurm", 0.0, 1.0, after="first"), 0.0)
    twin.step(0.0)
    twin.cancel(t_first, 5.0)
    twin.step(5.0)
    for now in range(5, 200):
        twin.step(float(now))
    assert t_then.state == want[0] and t_then.reason == (NEVER_SATISFIED if kill_invalid_depend else "")

"""slurmJobMaxMinutes on the real slurmctld (booted from the program's slurm.conf, MaxTime on both
partitions): the time limit a job runs under, the end of a job that outlasts it, and the twin's
Slurm on the same jobs. The refusal of a longer --time is a row of test_slurm_submit.py's table."""

from __future__ import annotations

import dataclasses

from components import slurmd_scaling as scaling
from core.names import slurm_names
from stacks import offline
from tests.conftest import by_type, run_program
from tests.engines import harness
from tests.engines.conftest import engine_marks, worker_index
from tests.tokens import RELEASE
from twin import program
from twin.scenario import JobSpec
from twin.slurm import COMPLETED, PENDING, TIMEOUT, Slurmctld
from validation.scenarios import time_minutes

pytestmark = engine_marks(__name__)
NODE = "slinky-0"


def _values(**config) -> dict:
    """The slurm release's values as the program registers them with these settings."""
    (release,) = [r for r in by_type(run_program(**config), RELEASE) if r.inputs["name"] == "slurm"]
    return release.inputs["values"]


def _twin(*config: str, lua: bool = True) -> Slurmctld:
    """The twin's Slurm for the settings (with or without job_submit.lua), NODE registered."""
    s = offline.stack_settings("dev", list(config))
    twin = Slurmctld(dataclasses.replace(program.setup(s).slurm, job_submit_lua=lua))
    twin.register(NODE, 0.0)
    return twin


def _seconds(duration: str) -> int:
    """Slurm's [D-]HH:MM:SS, as scontrol prints a TimeLimit or RunTime, in seconds."""
    days, _, hms = duration.rpartition("-")
    h, m, s = (int(x) for x in hms.split(":"))
    return ((int(days or 0) * 24 + h) * 60 + m) * 60 + s


def _minutes(limit: str) -> float:
    return _seconds(limit) / 60


def test_a_job_without_time_runs_under_maxtime_and_one_at_the_limit_is_accepted(slurm):
    """No DefaultTime: a job without --time gets MaxTime (60, slurmJobMaxMinutes' default) when it
    starts (SchedMD/slurm@slurm-25-11-6-1:src/slurmctld/node_scheduler.c select_nodes)."""
    plain, at_limit = slurm.sbatch(), slurm.sbatch("--time=60")
    slurm.start_node(NODE)
    twin = _twin()
    jobs = [twin.submit(JobSpec(name, "slurm", 0.0, 600.0, time=t), 0.0)[0] for name, t in (("p", None), ("a", 60))]
    twin.step(0.0)
    slurm.wait_for(lambda: slurm.show_job(plain).get("JobState") == "RUNNING", 60, "the plain job to start")
    assert _minutes(slurm.show_job(plain)["TimeLimit"]) == 60 == jobs[0].time_limit / 60
    # One node: the job at the limit waits behind it, accepted, with its own limit.
    assert slurm.show_job(at_limit)["JobState"] == "PENDING" and jobs[1].state == PENDING
    assert _minutes(slurm.show_job(at_limit)["TimeLimit"]) == 60 == jobs[1].time_limit / 60


def test_a_job_past_its_time_limit_is_ended_by_slurm_as_the_twin_ends_it(engine_root, tmp_path):
    """slurmJobMaxMinutes=1 and `sleep 120` without --time: slurmctld's job_time_limit, run every
    PERIODIC_TIMEOUT (30 s), ends it once its end time has passed (OverTimeLimit 0) as TIMEOUT and
    signals it (KillWait 30 s before SIGKILL; sleep ends on SIGTERM); its node runs nothing after
    (src/slurmctld/job_mgr.c job_time_limit, _job_timed_out; slurmctld.h PERIODIC_TIMEOUT). The twin
    ends it at its first limit check plus KillWait, the worst case: never before the real end."""
    values = _values(slurmJobMaxMinutes=1)
    with harness.engines(tmp_path, values, slurm_names("slinky"), worker_index()) as slurm:
        slurm.start_node(NODE)
        job = slurm.sbatch(command="sleep 120")
        slurm.wait_for(lambda: slurm.show_job(job).get("JobState") == "RUNNING", 60, "the job to start")
        assert _minutes(slurm.show_job(job)["TimeLimit"]) == 1
        # The limit, one check period, and slack for a loaded machine; well short of the job's 120 s.
        slurm.wait_for(lambda: slurm.show_job(job).get("JobState") == "TIMEOUT", 60 + 30 + 20, "the job to time out")
        ended = slurm.show_job(job)
        # RunTime: start to end as slurmctld recorded them (88 s in one run: the check came 28 s late).
        run = _seconds(ended["RunTime"])
        assert ended["Reason"] == "TimeLimit" and 60 <= run <= 60 + scaling.SLURM_LIMIT_CHECK_SECONDS + 5, ended
        # the bound `plan` states for AI's lent GPUs covers the real end before the hand-off's own latency
        bounds = scaling.reclaim_bounds(30, 30, slurm_job_max_minutes=1, ai_job_max_minutes=1)
        assert run <= bounds.ai_share_back_s - bounds.handoff_s
        slurm.wait_for(lambda: slurm.node_states() == {NODE: "idle"}, 40, "the node to be idle again")

    twin = _twin("slurmJobMaxMinutes=1")
    (t,) = twin.submit(JobSpec("t", "slurm", 0.0, 120.0), 0.0)
    for now in range(130):
        twin.step(float(now))
    # The real end lies between the limit and the twin's worst case (5 s: the engine check's slack).
    worst = 60 + scaling.SLURM_LIMIT_CHECK_SECONDS + scaling.SLURM_KILL_WAIT_SECONDS
    assert t.state == TIMEOUT and 60 <= _seconds(ended["RunTime"]) <= t.finished - t.started + 5 <= worst + 5


def test_without_the_submit_check_a_longer_time_pends_for_good(engine_root, tmp_path, deployed_slurm_values):
    """What job_submit.lua's refusal prevents: with no JobSubmitPlugins, EnforcePartLimits=NO accepts
    --time=61 and slurmctld never starts it, even on an idle node (job_limits_check: PartitionTimeLimit);
    the twin's Slurm without the plugin keeps it pending too."""
    conf = {k: v for k, v in deployed_slurm_values["controller"]["extraConfMap"].items() if k != "JobSubmitPlugins"}
    values = {**deployed_slurm_values, "controller": {**deployed_slurm_values["controller"], "extraConfMap": conf}}
    with harness.engines(tmp_path, values, slurm_names("slinky"), worker_index()) as slurm:
        slurm.start_node(NODE)
        over = slurm.sbatch("--time=61")
        slurm.wait_for(
            lambda: slurm.show_job(over).get("Reason") == "PartitionTimeLimit", 60, "the reason PartitionTimeLimit"
        )
        assert slurm.show_job(over)["JobState"] == "PENDING" and slurm.node_states() == {NODE: "idle"}
        fits = slurm.sbatch("--time=60")
        slurm.wait_for(lambda: slurm.show_job(fits).get("JobState") == "RUNNING", 60, "the job within MaxTime to run")
        assert slurm.show_job(over)["JobState"] == "PENDING"

    twin = _twin(lua=False)
    (t_over,) = twin.submit(JobSpec("over", "slurm", 0.0, 60.0, time=61), 0.0)
    (t_fits,) = twin.submit(JobSpec("fits", "slurm", 0.0, 60.0, time=60), 0.0)
    for now in range(200):
        twin.step(float(now))
    assert t_over.state == PENDING and t_fits.state == COMPLETED


def test_validate_reads_a_time_as_slurmctld_does(slurm):
    """`validate` refuses a scenario whose --time is over slurmJobMaxMinutes before submitting it
    (validation/scenarios.py time_minutes): each form sbatch takes, as slurmctld records it, and
    one second over the limit refused by job_submit.lua as 61 minutes (seconds round up)."""
    forms = ["45", "1:30", "0:59:01", "00:15:00", "0-0:30", "0-0:30:01", "0-1"]
    for given in forms:
        job = slurm.sbatch("--hold", f"--time={given}")
        assert _minutes(slurm.show_job(job)["TimeLimit"]) == time_minutes(given), given
    over = slurm.client("sbatch", "--hold", "--time=1:00:01", "--wrap", "sleep 1")
    assert over.returncode != 0 and "a time limit of 61 minutes" in over.stderr
    assert time_minutes("1:00:01") == 61

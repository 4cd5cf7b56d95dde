"""The runnable-jobs function (components/runnable_jobs.py) on the job list of a real slurmrestd
26.05.5 in front of the real slurmctld booted from the program's slurm.conf: it counts what Slurm
starts once nodes exist, and leaves out work waiting for its --begin, a dependency, a hold or its
array's throttle, including the moment each of those ends.

slurmrestd runs as slurm-operator's restapi runs it (`-s openapi/slurmctld`; SlinkyProject/
slurm-operator@v1.0.5: internal/builder/restapi_app.go), but in inetd mode (an HTTP request on its
stdin) with rest_auth/local, as `nobody`: Debian's Slurm has no auth/jwt for slurmctld to check a
token with (tests/engines/harness.py ADAPTATIONS), and rest_auth/local takes the user from the
pipe's owner (src/slurmrestd/plugins/auth/local/local.c at slurm-25-11-6-1). Authentication picks
the user only; the request, the handler (jobs.c op_handler_jobs) and the data parser (v0.0.44)
that make the job list are the same under rest_auth/jwt, so the fields read here are the ones the
exporter reads on the cluster with its token.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from components import runnable_jobs
from core.names import DEFAULT_PARTITION
from stacks import offline
from tests.engines import harness
from tests.engines.conftest import engine_marks
from twin import program
from twin.scenario import JobSpec
from twin.slurm import Slurmctld

pytestmark = engine_marks(__name__)
NOBODY = "65534"  # Debian's nobody: neither root, SlurmUser nor Slurm's own nobody (99), which slurmrestd refuses


def slurmrestd(slurm: harness.Engines, method: str, path: str) -> tuple[int, dict]:
    """One request to slurmrestd in inetd mode, as a non-privileged user: (HTTP status, JSON body)."""
    if not (slurm.root / "usr" / "sbin" / "slurmrestd").exists():
        pytest.skip(f"no slurmrestd in {slurm.root}: rebuild it with `sudo {harness.BUILD}`")
    request = f"{method} {path} HTTP/1.1\\r\\nHost: slurmrestd\\r\\nConnection: close\\r\\n\\r\\n"
    command = f'printf "{request}" | slurmrestd -a rest_auth/local -s openapi/slurmctld'
    done = slurm.client("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sh", "-c", command)
    head, _, body = done.stdout.partition("\n\n")  # text mode: the CRLFs read as LF
    status = re.match(r"HTTP/1\.1 (\d+)", head)
    assert status, done.stdout[-2000:] + done.stderr[-2000:]
    parsed, _ = json.JSONDecoder().raw_decode(body)
    return int(status[1]), parsed


def job_list(slurm: harness.Engines) -> list[dict]:
    status, body = slurmrestd(slurm, "GET", runnable_jobs.JOBS_PATH)
    assert status == 200 and not body["errors"], body["errors"]
    return body["jobs"]


def by_id(jobs: list[dict]) -> dict[str, dict]:
    return {str(j["job_id"]): j for j in jobs}


def counted(slurm: harness.Engines, partitions: tuple[str, ...]) -> dict[str, runnable_jobs.Runnable]:
    return runnable_jobs.runnable_pending(job_list(slurm), partitions, time.time())


def twin_counts(partitions: tuple[str, ...], nodes: int) -> dict[str, runnable_jobs.Runnable]:
    """The same six jobs in the twin's Slurm (twin/slurm.py job_list) with `nodes` registered."""
    ctld = Slurmctld(program.setup(offline.stack_settings("dev", [])).slurm)
    for spec in (
        JobSpec("one", "slurm", 0.0, 600.0, nodes=1),
        JobSpec("two", "slurm", 0.0, 600.0, nodes=2),
        JobSpec("array", "slurm", 0.0, 600.0, array=3, throttle=1),
        JobSpec("begin", "slurm", 0.0, 600.0, begin=150.0),
        JobSpec("held", "slurm", 0.0, 600.0, hold=True),
        JobSpec("after", "slurm", 0.0, 600.0, after="held"),
    ):
        ctld.submit(spec, 0.0)
    for i in range(nodes):
        ctld.register(f"slinky-{i}", 0.0)
    ctld.step(1.0)
    return runnable_jobs.runnable_pending(ctld.job_list(1.0), partitions, 1.0)


def test_counts_what_slurm_starts_and_nothing_that_waits(slurm):
    names = slurm.names
    partitions = (DEFAULT_PARTITION, names.nodeset)
    one = slurm.sbatch("-N", "1")
    two = slurm.sbatch("-N", "2")
    array = slurm.sbatch("--array=0-2%1")
    begin = slurm.sbatch("--begin=now+150")
    held = slurm.sbatch("--hold")
    after = slurm.sbatch(f"--dependency=afterany:{held}")

    # No node registered (KEDA keeps slurmd at 0): Slurm's reasons, and what the function makes of them.
    jobs = by_id(job_list(slurm))
    reasons = {i: jobs[i]["state_reason"] for i in (one, two, array, begin, held, after)}
    # Work a node would start pends as PartitionConfig while none exists (a whitelist of
    # Resources/Priority would never scale out from 0), and so does work waiting for its begin or
    # a dependency until slurmctld's first scheduling pass: the reason alone cannot tell them apart.
    assert {reasons[i] for i in (one, two, array)} == {"PartitionConfig"}, reasons
    assert reasons[held] == "JobHeldUser"
    assert reasons[begin] in ("PartitionConfig", "BeginTime") and reasons[after] in ("PartitionConfig", "Dependency")
    assert jobs[array]["array_task_string"] == "0-2%1"
    now = time.time()
    assert {i for i in reasons if not runnable_jobs.is_runnable(jobs[i], now)} == {begin, held, after}
    # Every user's jobs (these are root's) are listed to nobody: slurm.conf sets no PrivateData.
    assert {j["user_name"] for j in jobs.values()} == {"root"}
    assert counted(slurm, partitions) == twin_counts(partitions, 0)
    assert counted(slurm, partitions)[DEFAULT_PARTITION] == runnable_jobs.Runnable(
        jobs=3, max_job_nodes=2, first_job_nodes=1
    )

    # Four nodes, what the count asks for (one + two + the array's one task the throttle lets run):
    # Slurm starts exactly those, and what waits stays out of the count.
    for i in range(4):
        slurm.start_node(f"{names.nodeset}-{i}")

    def state(job_id: str) -> str:
        return slurm.show_job(job_id)["JobState"]

    slurm.wait_for(
        lambda: all(state(j) == "RUNNING" for j in (one, two, f"{array}_0")), 120, "the runnable jobs to start"
    )
    jobs = by_id(job_list(slurm))
    assert jobs[array]["state_reason"] == runnable_jobs.WAITING_FOR_THROTTLE
    assert runnable_jobs.array_task_count(jobs[array]["array_task_string"]) == 2
    begin_at = jobs[begin]["start_time"]["number"]
    if time.time() < begin_at:  # a loaded machine may have taken the whole delay to start the nodes
        assert counted(slurm, partitions) == twin_counts(partitions, 4)
        assert counted(slurm, partitions)[DEFAULT_PARTITION] == runnable_jobs.Runnable()

    # A hold released is runnable at once (scontrol release clears the reason), and its dependent's
    # dependency is met when it ends (here cancelled: afterany): runnable when Slurm says so.
    slurm.client("scontrol", "release", held)
    assert runnable_jobs.is_runnable(by_id(job_list(slurm))[held], time.time())
    slurm.client("scancel", held)
    slurm.wait_for(
        lambda: by_id(job_list(slurm))[after]["state_reason"] != "Dependency",
        120,
        "slurmctld to see the dependency met",
    )
    assert runnable_jobs.is_runnable(by_id(job_list(slurm))[after], time.time())

    # --begin: counted from its begin time on, before slurmctld's next pass clears BeginTime, and
    # Slurm then agrees.
    slurm.wait_for(lambda: time.time() > begin_at + 1, 200, "the begin time")
    assert runnable_jobs.is_runnable(by_id(job_list(slurm))[begin], time.time())
    slurm.wait_for(
        lambda: by_id(job_list(slurm))[begin]["state_reason"] != runnable_jobs.WAITING_FOR_BEGIN,
        120,
        "slurmctld to clear BeginTime",
    )
    assert counted(slurm, partitions)[DEFAULT_PARTITION] == runnable_jobs.Runnable(
        jobs=2, max_job_nodes=1, first_job_nodes=1
    )

    # Two nodes freed: Slurm starts the two jobs counted, and nothing else.
    slurm.client("scancel", two)
    slurm.wait_for(lambda: state(begin) == state(after) == "RUNNING", 120, "the newly runnable jobs to start")
    assert counted(slurm, partitions)[DEFAULT_PARTITION] == runnable_jobs.Runnable()


def test_the_job_first_in_line_is_the_one_slurm_starts_first(slurm):
    """The exporter's job first in line (runnable_jobs.queue_order: priority, then submission, then
    job id, as job_scheduler.c sort_job_queue2) on the real list, and the main scheduler agrees: the
    first node that joins runs that job, not an earlier or narrower one."""
    names = slurm.names
    partitions = (DEFAULT_PARTITION,)
    wide = slurm.sbatch("-N", "3")
    narrow = slurm.sbatch("-N", "1")
    later = slurm.sbatch("-N", "1")
    jobs = by_id(job_list(slurm))
    assert {jobs[i]["priority"]["set"] for i in (wide, narrow, later)} == {True}, jobs[wide]["priority"]
    assert jobs[wide]["submit_time"]["number"] <= jobs[narrow]["submit_time"]["number"]
    assert counted(slurm, partitions)[DEFAULT_PARTITION] == runnable_jobs.Runnable(3, 3, 3)
    # An operator puts the later 1-node job first: its priority above the others'
    top = max(jobs[i]["priority"]["number"] for i in (wide, narrow)) + 1000
    slurm.client("scontrol", "update", f"JobId={later}", f"Priority={top}")
    assert by_id(job_list(slurm))[later]["priority"]["number"] == top
    assert counted(slurm, partitions)[DEFAULT_PARTITION] == runnable_jobs.Runnable(3, 3, 1)
    slurm.start_node(f"{names.nodeset}-0")
    slurm.wait_for(lambda: slurm.show_job(later)["JobState"] == "RUNNING", 120, "the job first in line to start")
    assert slurm.show_job(narrow)["JobState"] == "PENDING"
    # Now the wide one is first again (earliest submitted of equal priority), wider than the nodes there are
    assert counted(slurm, partitions)[DEFAULT_PARTITION] == runnable_jobs.Runnable(2, 3, 3)


def test_the_token_s_user_reads_but_cannot_cancel_another_s_job(slurm):
    """The exporter's user is not an operator: slurmrestd refuses it a change to someone else's job.
    (Seen here: after refusing the kill, slurmctld 26.05.5 stopped answering job queries for the
    rest of the test, "Socket timed out on send/recv": the exporter never sends one.)"""
    job = slurm.sbatch("-N", "1")
    status, body = slurmrestd(slurm, "DELETE", f"/slurm/v0.0.44/job/{job}")
    assert status == 403 and body["errors"][0]["error"] == "Operation not permitted", body


def test_the_token_user_may_not_submit(slurm):
    """The program's job_submit.lua refuses nobody, the exporter's token user, inside the real slurmctld."""
    done = slurm.client(
        "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sbatch", "--wrap", "sleep 1"
    )
    assert done.returncode != 0 and "user nobody only reads the job list" in done.stderr, done.stderr
    assert "Access/permission denied" in done.stderr, done.stderr

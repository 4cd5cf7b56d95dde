"""Which pending Slurm work is runnable, read from Slurm itself: a pure function over slurmrestd's
job list, the Prometheus metrics it becomes, and the small exporter that serves them. The KEDA
rule (components/slurmd_scaling.py) counts these in front of slurmctld's own pending counts, so
work waiting for its `--begin`, a dependency, a hold or its array's throttle never brings up a
slurmd pod, and work that becomes runnable gets one within the hand-off bound.

Why slurmrestd: slurmctld's openmetrics (SchedMD/slurm@slurm-25-11-6-1: src/plugins/metrics/
openmetrics/openmetrics.c) count pending jobs and held jobs per partition and nothing per pending
reason; the job list has each job's reason. The endpoint is GET /slurm/v0.0.44/jobs/
(src/slurmrestd/plugins/openapi/slurmctld/api.c, jobs.c op_handler_jobs: slurm_load_jobs with
SHOW_ALL|SHOW_DETAIL), the data parser slurm-operator 1.0.x's own client uses
(SlinkyProject/slurm-operator@v1.0.5: internal/controller/nodeset/slurmcontrol/slurmcontrol.go imports
slurm-client api/v0044) and that 25.11 and 26.05 both serve. Fields (src/plugins/data_parser/
v0.0.44/parsers.c PARSER_ARRAY(JOB_INFO) at slurm-25-11-6-1):

* `job_state`: a list of flags, the base state first ("PENDING", "RUNNING", ...).
* `state_reason`: the reason string (job_state_reason_string).
* `start_time`: {set, infinite, number}; for a pending job not yet planned, its begin time while
  that is in the future, else 0 (src/slurmctld/job_mgr.c pack_job); `eligible_time`: its begin.
* `dependency`: each entry with its state, "afterok:12(unfulfilled)".
* `node_count` (num_nodes, the minimum) and `max_nodes`: {set, infinite, number}.
* `partition`: the job's partition, a comma-separated list for a multi-partition job.
* `array_job_id`, `array_task_id`, `array_max_tasks` (the `%N` throttle, 0 for none),
  `array_task_string` (the pending tasks of the array's one pending record, "1-7%2").
* `hold`: priority 0.

What the real slurmctld 26.05.5 says (tests/engines/test_runnable_jobs.py): with no node
registered, work that would run on a node pends with reason PartitionConfig, and a job wider than
the nodes registered with PartitionNodeLimit; only once nodes exist do Resources and Priority
appear. So runnable is everything pending *except* the reasons a node cannot help, and an unknown
reason counts as runnable (the rule's stall term still bounds it).
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# The job list the exporter reads, and the header slurmrestd's rest_auth/jwt reads the token from
# (src/slurmrestd/plugins/auth/jwt/jwt.c at slurm-25-11-6-1: X-SLURM-USER-TOKEN).
JOBS_PATH = "/slurm/v0.0.44/jobs/"
TOKEN_HEADER = "X-SLURM-USER-TOKEN"

# The exporter's metrics, one series per partition the NodeSet serves (zeros included, as
# slurmctld's openmetrics emit theirs): what the rule reads in front of slurm_partition_jobs_pending
# minus _hold and slurm_partition_jobs_max_job_nodes_nohold.
RUNNABLE_JOBS = "testbed_slurm_runnable_jobs"
RUNNABLE_MAX_JOB_NODES = "testbed_slurm_runnable_max_job_nodes"
# The nodes of the runnable job first in line, the one slurmctld's schedulers try first: the
# fair-share controller reserves for it (components/fair_share.py), never for a wide job further back.
RUNNABLE_FIRST_JOB_NODES = "testbed_slurm_runnable_first_job_nodes"

# Reasons that say no node would start the job now (src/common/slurm_protocol_defs.c
# job_state_reason_string at slurm-25-11-6-1; job_mgr.c job_independent sets the first five).
WAITING_FOR_BEGIN = "BeginTime"  # WAIT_TIME; also a requeued job's requeue delay
WAITING_FOR_THROTTLE = "JobArrayTaskLimit"  # WAIT_ARRAY_TASK_LIMIT
WAITING_FOR_DEPENDENCY = "Dependency"  # WAIT_DEPENDENCY
NOT_RUNNABLE_REASONS = frozenset(
    {
        WAITING_FOR_BEGIN,
        WAITING_FOR_THROTTLE,
        WAITING_FOR_DEPENDENCY,
        "DependencyNeverSatisfied",  # FAIL_DEPEND: for good, unless kill_invalid_depend cancels it
        "JobHeldUser",  # WAIT_HELD_USER
        "JobHeldAdmin",  # WAIT_HELD
        "BadConstraints",  # FAIL_BAD_CONSTRAINTS
        "PartitionTimeLimit",  # --time over MaxTime: pends for good under EnforcePartLimits=NO
        "PartitionDown",
        "PartitionInactive",
        "InvalidAccount",
        "InvalidQOS",
        "Reservation",  # WAIT_RESERVATION: its reservation has not begun
        "MaxRequeueLimit",
    }
)
# Accounting and QOS limits (AssocGrp*, AssocMax*, QOSGrp*, QOSMax*, ...): a node does not lift them.
NOT_RUNNABLE_PREFIXES = ("Assoc", "QOS")


@dataclass(frozen=True)
class Runnable:
    """One partition's runnable pending work: jobs (each array task one, as statistics.c counts
    jobs_pending), the widest such job's nodes, MAX(max_nodes, node_count), and the nodes of the
    one first in line (`queue_order`)."""

    jobs: int = 0
    max_job_nodes: int = 0
    first_job_nodes: int = 0


def _number(value: object) -> int | None:
    """A v0.0.44 {set, infinite, number} (or a bare number): the number, None when unset or infinite."""
    if isinstance(value, dict):  # JSON objects: dict, not the slower Mapping ABC check
        if not value.get("set") or value.get("infinite"):
            return None
        value = value.get("number")
    return int(value) if isinstance(value, int | float) else None


def _base_state(job: Mapping) -> str:
    state = job.get("job_state") or []
    return (state[0] if isinstance(state, list) and state else str(state)).upper()


def array_task_count(task_string: str) -> int:
    """The tasks in an array record's `array_task_string` ("0-7%2", "1,3,5-9:2"), throttle aside."""
    count = 0
    for part in task_string.split("%", 1)[0].split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part.strip())
        if match:
            first, last, step = int(match[1]), int(match[2] or match[1]), int(match[3] or 1)
            count += len(range(first, last + 1, step))
    return count


def is_runnable(job: Mapping, now: float) -> bool:
    """Whether a node would start this pending job now (its array's throttle aside). Read from the
    job's fields first, its reason second: slurmctld sets the reason at submit from the partition
    alone (PartitionConfig with no node, whatever the job waits for) and refines it only at its
    next scheduling pass (job_mgr.c job_independent), up to sched_interval later, while the fields
    are right from the submit on (seen on the real slurmctld 26.05.5):
    * `hold` (priority 0): held;
    * `eligible_time` or, under BeginTime, `start_time` after now: its --begin (or a requeue's
      delay) has not come; once it has, BeginTime is stale;
    * `dependency` naming an entry "(unfulfilled)" or "(failed)": waits for it, or for good; once
      none does, Dependency is stale."""
    if job.get("hold") is True:
        return False
    reason = str(job.get("state_reason") or "None")
    begins = [_number(job.get("eligible_time")) or 0]
    if reason == WAITING_FOR_BEGIN:
        begins.append(_number(job.get("start_time")) or 0)
    if max(begins) > now:
        return False
    dependency = str(job.get("dependency") or "")
    if "(unfulfilled)" in dependency or "(failed)" in dependency:
        return False
    if reason in (WAITING_FOR_BEGIN, WAITING_FOR_DEPENDENCY, WAITING_FOR_THROTTLE):
        return True  # the fields above say it no longer waits; the throttle is counted below
    return reason not in NOT_RUNNABLE_REASONS and not reason.startswith(NOT_RUNNABLE_PREFIXES)


def queue_order(job: Mapping) -> tuple[int, int, int]:
    """A pending job's place in slurmctld's queue, first first: higher priority, then earlier
    submission, then lower job id (src/slurmctld/job_scheduler.c sort_job_queue2 at
    slurm-25-11-6-1 and slurm-26-05-0-1; a partition's PriorityTier comes before, and the program
    has one tier). An array's pending record sorts by its array job's id, as its tasks do."""
    job_id = _number(job.get("array_job_id")) or _number(job.get("job_id")) or 0
    return (-(_number(job.get("priority")) or 0), _number(job.get("submit_time")) or 0, job_id)


def runnable_pending(jobs: Iterable[Mapping], partitions: Iterable[str], now: float) -> dict[str, Runnable]:
    """Runnable pending work per partition in `partitions` (each listed, zeros included) from
    slurmrestd's `jobs`, at `now` (UNIX seconds). A multi-partition job counts in the first of its
    partitions listed here. An array's pending record counts its pending tasks, at most as many as
    its throttle lets start beside its running tasks (job_mgr.c job_array_start_test)."""
    jobs = list(jobs)
    wanted = list(partitions)
    running_tasks: dict[int, int] = {}
    for job in jobs:
        array_id = _number(job.get("array_job_id")) or 0
        if array_id and _base_state(job) in ("RUNNING", "SUSPENDED"):
            running_tasks[array_id] = running_tasks.get(array_id, 0) + 1
    count = dict.fromkeys(wanted, 0)
    widest = dict.fromkeys(wanted, 0)
    first: dict[str, tuple[tuple[int, int, int], int]] = {}
    for job in jobs:
        if _base_state(job) != "PENDING" or not is_runnable(job, now):
            continue
        partition = next((p for p in str(job.get("partition") or "").split(",") if p in count), None)
        if partition is None:
            continue
        tasks = 1
        array_id = _number(job.get("array_job_id")) or 0
        task_string = str(job.get("array_task_string") or "")
        if array_id and task_string:
            tasks = array_task_count(task_string)
            throttle = _number(job.get("array_max_tasks")) or 0
            if throttle:
                tasks = min(tasks, max(0, throttle - running_tasks.get(array_id, 0)))
        if tasks <= 0:
            continue
        nodes = max(_number(job.get("node_count")) or 1, _number(job.get("max_nodes")) or 0)
        count[partition] += tasks
        widest[partition] = max(widest[partition], nodes)
        place = queue_order(job)
        if partition not in first or place < first[partition][0]:
            first[partition] = (place, nodes)
    return {p: Runnable(count[p], widest[p], first[p][1] if p in first else 0) for p in wanted}


def exposition(runnable: Mapping[str, Runnable]) -> str:
    """The metrics in Prometheus' text format (what the exporter's /metrics serves)."""
    lines = []
    for name, help_text, field in (
        (RUNNABLE_JOBS, "Pending Slurm jobs (array tasks) a node would start now, by partition", "jobs"),
        (RUNNABLE_MAX_JOB_NODES, "Nodes of the widest such job, by partition", "max_job_nodes"),
        (RUNNABLE_FIRST_JOB_NODES, "Nodes of the such job first in line, by partition", "first_job_nodes"),
    ):
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        lines += [f'{name}{{partition="{p}"}} {getattr(r, field)}' for p, r in runnable.items()]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the exporter


def read_jobs(url: str, token_file: str, timeout: float = 10) -> list[dict]:
    """slurmrestd's job list, authenticated with the JWT in `token_file` (a non-privileged user's:
    it can read every job while slurm.conf sets no PrivateData, and change none but its own). The
    file is read on every request: the Token's Secret is rotated before the JWT expires and the
    kubelet updates the mounted file in place."""
    with open(token_file) as f:
        token = f.read().strip()
    request = urllib.request.Request(url.rstrip("/") + JOBS_PATH, headers={TOKEN_HEADER: token})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = json.loads(response.read())
    if body.get("errors"):
        raise RuntimeError(f"slurmrestd answered with errors: {body['errors']!r:.200}")
    return list(body.get("jobs") or [])


@dataclass
class Exporter:
    """Reads the job list when scraped, as Prometheus exporters collect: a scrape sees the list as
    it is then, and one whose read fails gets no series at all, so Prometheus marks the last ones
    stale at once and the rule falls back to slurmctld's counts (components/slurmd_scaling.py): a
    lost input, never a zero."""

    partitions: tuple[str, ...]
    read: Callable[[], list[dict]]
    clock: Callable[[], float] = time.time

    def metrics(self) -> str:
        now = self.clock()
        try:
            jobs = self.read()
        except (OSError, ValueError, RuntimeError):
            return ""
        return exposition(runnable_pending(jobs, self.partitions, now))

    def serve(self, port: int) -> None:  # pragma: no cover - the process's main loop
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server calls it by this name
                body = exporter.metrics().encode() if self.path == "/metrics" else b""
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

        ThreadingHTTPServer(("", port), Handler).serve_forever()


# The process's settings, from its environment (the Deployment sets them).
ENV_URL, ENV_TOKEN_FILE, ENV_PARTITIONS, ENV_PORT = (
    "SLURMRESTD_URL",
    "SLURM_JWT_FILE",
    "SLURM_PARTITIONS",
    "METRICS_PORT",
)


def exporter_from_env(env: Mapping[str, str]) -> tuple[Exporter, int]:
    """The exporter and its port from the environment; ValueError naming each missing setting."""
    missing = [key for key in (ENV_URL, ENV_TOKEN_FILE, ENV_PARTITIONS) if not env.get(key)]
    if missing:
        raise ValueError(f"runnable-jobs exporter: set {', '.join(missing)}")
    url, token_file = env[ENV_URL], env[ENV_TOKEN_FILE]
    partitions = tuple(p for p in env[ENV_PARTITIONS].split(",") if p)
    return Exporter(partitions, lambda: read_jobs(url, token_file)), int(env.get(ENV_PORT) or 8080)


if __name__ == "__main__":  # pragma: no cover - the exporter's process
    import os
    import sys

    try:
        exporter, port = exporter_from_env(os.environ)
    except ValueError as bad:
        print(bad, file=sys.stderr)
        sys.exit(2)
    exporter.serve(port)

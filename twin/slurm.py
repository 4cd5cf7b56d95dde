"""slurmctld: the job queue, the nodes slurmd pods register, scheduling, and the 25.11 partition metrics.

Followed: SchedMD/slurm@slurm-25-11-0-1
* src/slurmctld/statistics.c: per-partition counts by the job's own partition; jobs_pending counts
  held jobs (WAIT_HELD, WAIT_HELD_USER) and every pending array task; jobs_hold counts the held
  ones; jobs_max_job_nodes_nohold = MAX over pending, not held, jobs of MAX(max_nodes, min_nodes);
  nodes count as MIXED / ALLOCATED / IDLE, the drain flag on top.
* src/plugins/metrics/openmetrics/openmetrics.c: every partition metric for every partition, zeros
  included.
* src/slurmctld/job_mgr.c: an array's pending tasks stay one record counted task_cnt times in
  jobs_pending; a task that starts is split off as its own job; `%N` lets N tasks run at once
  (the rest pend with reason JobArrayTaskLimit).
* src/slurmctld/job_mgr.c: a job without -N has min_nodes 1, max_nodes 0; `--gpus=N` alone does not
  raise min_nodes (the select plugin spreads the GPUs over nodes when it allocates).
* src/slurmctld/job_mgr.c _part_access_check and _valid_job_part: under EnforcePartLimits ALL or ANY a
  job is compared with the nodes registered *now*: with none, "More processors requested than
  permitted"; with fewer than its -N, "Node count specification invalid" (seen on the real
  slurmctld 26.05.5, tests/engines). The program sets NO; the twin keeps the other value expressible.
* src/slurmctld/job_mgr.c validate_job_create_req: the job_submit plugins run first, on what the client
  sent; the program's components/job_submit.lua (`time_refusal`, `job_submit` below) refuses a --time
  over MaxTime and sizes a GPU-only job. Its other refusals (node ranges, CPUs, memory and GPU types
  beyond the worker type, the same on updates) concern what a scenario cannot ask: a JobSpec has no
  range, CPUs, memory or GPU type and no update; tests/engines/test_job_shapes.py compares the rows
  it can express (-N, --gpus, --time) with the real slurmctld.
* Time limits (at slurm-25-11-6-1): a job without --time gets the partition's MaxTime when it starts,
  DefaultTime being unset (src/slurmctld/node_scheduler.c select_nodes); job_mgr.c job_time_limit ends
  a running job whose end time has passed (OverTimeLimit 0) as TIMEOUT. It runs every PERIODIC_TIMEOUT
  (30 s, slurmctld.h), so the real job ends up to 30 s after its limit, plus KillWait (30 s) if it
  ignores SIGTERM: the twin ends it at the first check at or after its limit (checks every 30 s
  from the run's start), then holds its nodes KillWait longer, the worst case. A --time over MaxTime pends forever under
  EnforcePartLimits=NO (job_limits_check: PartitionTimeLimit), which job_submit.lua prevents.
Scheduling (one GPU per node, `gpu:tesla:1`), as slurm.conf sets it: the program sets no
SchedulerType, SchedulerParameters or PriorityWeight*, so the defaults rule (SchedMD/slurm@
slurm-25-11-6-1: src/common/read_config.h DEFAULT_SCHEDTYPE "sched/backfill", DEFAULT_PRIORITY_TYPE
"priority/multifactor" with every PriorityWeight* 0 in src/common/read_config.c): every job has
the same priority, so the queue is submission order (src/slurmctld/job_scheduler.c sort_job_queue2:
submit_time, which a requeue keeps, job_mgr.c). Two schedulers share it:
* The main scheduler (job_scheduler.c _schedule), on every event (the twin: every tick), walks it
  in order and starts each job that fits the idle nodes. The first that does not fit because nodes
  are busy (ESLURM_NODES_BUSY: the usable nodes, up and not drained, could hold it) stops it for
  the partition and its nodes (PART_FLAG_SCHED_FAILED): both partitions hold every node, so no
  later job starts in that pass. A job wider than the registered nodes (ESLURM_REQUESTED_NODE_
  CONFIG_UNAVAILABLE) or than the usable ones with the rest not busy (ESLURM_NODE_NOT_AVAIL:
  a 1-GPU job leaves its node MIXED, shareable, so node_scheduler.c _pick_best_nodes counts no busy
  node) does not stop it (node_scheduler.c _pick_best_nodes).
* sched/backfill (src/plugins/sched/backfill/backfill.c, the same at slurm-26-05-0-1 but for locks
  and logging) runs every bf_interval (30 s) and tests the queue in the same order, at most
  bf_max_job_test (500) jobs: a job that fits now on nodes no earlier plan needs during its time
  limit starts; one that does not gets a planned start, the earliest time its -N nodes are free
  by the running jobs' time limits (start + --time, else MaxTime; not their real end, which no one
  knows) and by the plans already made, and those nodes are planned for it from then to its own
  limit, times rounded to bf_resolution (60 s: _set_slot_time). Every tested job plans, not only
  the head (conservative backfill, _add_reservation), unless the start is past bf_window (1 day),
  its -N exceeds the usable nodes (it is skipped: no node that may join is held), or an array
  already has bf_max_job_array_resv (20) tasks planned. So a lower job starts early only if it
  ends, by its own limit, before the planned start of every job ahead whose nodes it would take
  (or takes nodes outside them). Nothing here is set in slurm.conf: the defaults above apply.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from components.slurmd_scaling import SLURM_KILL_WAIT_SECONDS, SLURM_LIMIT_CHECK_SECONDS
from core.names import GPUS_PER_WORKER as GPUS_PER_NODE  # job_submit.lua's GPUS_PER_NODE (a test keeps them in step)
from twin.scenario import JobSpec

PENDING, RUNNING, COMPLETED, REFUSED = "PENDING", "RUNNING", "COMPLETED", "REFUSED"
CANCELLED, TIMEOUT = "CANCELLED", "TIMEOUT"
NEVER_SATISFIED = "DependencyNeverSatisfied"
# sched/backfill's SchedulerParameters, none of which the program sets (components/slurm_config.py),
# at their defaults (SchedMD/slurm@slurm-25-11-6-1: src/plugins/sched/backfill/backfill.c
# BACKFILL_INTERVAL, BACKFILL_WINDOW, BACKFILL_RESOLUTION, DEF_BF_MAX_JOB_TEST, BF_MAX_JOB_ARRAY_RESV).
BF_INTERVAL = 30.0
BF_WINDOW = 24 * 3600.0
BF_RESOLUTION = 60
BF_MAX_JOB_TEST = 500
BF_MAX_JOB_ARRAY_RESV = 20
# slurmctld sets a node that stopped answering DOWN once its last answer is SlurmdTimeout old, at a
# ping round (every SlurmdTimeout / 3): 300 s, the default, the program setting none
# (SchedMD/slurm@slurm-25-11-6-1: src/common/read_config.h DEFAULT_SLURMD_TIMEOUT, src/slurmctld/
# ping_nodes.c ping_nodes "Not responding", controller.c ping_interval). Its batch jobs are requeued
# (JobRequeue defaults to 1: src/common/read_config.c), as `set_down` does. The last answer came up
# to one round before the failure, so DOWN falls between 200 and 400 s after it; the twin takes 300.
SLURMD_TIMEOUT = 300.0
# A job with no limit (MaxTime UNLIMITED) plans a year (backfill.c YEAR_MINUTES, YEAR_SECONDS).
YEAR = 365 * 24 * 3600.0
# A batch job whose node goes down is requeued, eligible again after the requeue delay: the
# SchedulerParameters requeue_delay, else the credential lifetime, 120 s, plus 1
# (SchedMD/slurm@slurm-25-11-6-1:src/slurmctld/job_mgr.c _requeue_delay; the real slurmctld 26.05.5
# requeued a job whose node the preStop set down and deleted, Restarts=1, EligibleTime 121 s later).
REQUEUE_DELAY = 121
RETURN_TO_SERVICE_ALL = 2  # ReturnToService=2: a DOWN node that answers is back (slurm.h RETURN_TO_SERVICE_ALL)


@dataclass
class SlurmJob:
    spec: JobSpec
    job_id: int
    partition: str
    state: str = PENDING
    nodes: tuple[str, ...] = ()
    started: float | None = None
    finished: float | None = None
    held: bool = False
    reason: str = ""
    sized: int | None = None  # min_nodes = max_nodes as job_submit.lua set them
    restarts: int = 0  # times its node went down under it: its work was lost each time
    failovers: int = 0  # of those, times its node had failed (fault node-failure), not been scaled in
    eligible_at: float = 0.0  # a requeued job waits for the requeue delay
    seq: int = 0  # its place among every job record submitted
    time_limit: float | None = None  # seconds: its --time, else the partition's MaxTime; None: UNLIMITED
    first_in_line: float | None = None  # when it first was the eligible job first in queue order

    @property
    def begin(self) -> float:
        """When it may start at the earliest: its --begin, or a requeued job's requeue delay."""
        return max(self.spec.begin or 0.0, self.eligible_at)

    @property
    def min_nodes(self) -> int:
        return self.sized or self.spec.nodes or 1

    @property
    def max_nodes(self) -> int:
        return self.sized or self.spec.max_nodes or self.spec.nodes or 0  # no -N: max_nodes 0

    @property
    def nodes_needed(self) -> int:
        return self.spec.gpus_wanted

    @property
    def times_out(self) -> bool:
        """Its work outlasts its time limit: slurmctld ends it at the limit (a job that finishes
        exactly at its limit completes)."""
        return self.time_limit is not None and self.spec.runtime > self.time_limit

    @property
    def ends_at(self) -> float:
        """When it ends once started: its work done, or slurmctld's first limit check at or after
        its limit plus KillWait when its work outlasts the limit."""
        assert self.started is not None
        limit = self.time_limit
        if limit is None or self.spec.runtime <= limit:
            return self.started + self.spec.runtime
        check = SLURM_LIMIT_CHECK_SECONDS
        return math.ceil((self.started + limit) / check) * check + SLURM_KILL_WAIT_SECONDS


@dataclass
class SlurmNode:
    name: str
    registered: float
    drain: bool = False
    down: bool = False


@dataclass
class SlurmConfig:
    default_partition: str
    nodeset_partition: str
    max_nodes: int | None = None  # partition MaxNodes (both partitions), None = UNLIMITED
    enforce_part_limits: bool = False  # EnforcePartLimits ALL or ANY (not NO)
    job_submit_lua: bool = False  # JobSubmitPlugins=lua with components/job_submit.lua
    max_minutes: int | None = None  # partition MaxTime (both partitions), None = UNLIMITED
    kill_invalid_depend: bool = False  # DependencyParameters=kill_invalid_depend
    return_to_service: int = 0  # ReturnToService (Slurm's default 0, src/common/read_config.h)


LIMIT_SETTINGS = "settings workerCount, aiGuaranteedGpus, hpcBorrowsAiGpus, kedaMaxReplicas"
TIME_SETTING = "setting slurmJobMaxMinutes"
# The client's line for each return code of the script (src/common/slurm_errno.c).
NODE_COUNT_INVALID = "Node count specification invalid"
TIME_LIMIT_INVALID = "Requested time limit is invalid (missing or exceeds some limit)"


def time_refusal(time: int | None, partition: str, max_minutes: int | None) -> str:
    """components/job_submit.lua's first check, for the scenario's --time (minutes, None: not given)
    and -p (one partition, MaxTime `max_minutes`, None for UNLIMITED): the message it refuses with
    (return code ESLURM_INVALID_TIME_LIMIT), or ""."""
    if time is None or max_minutes is None or time <= max_minutes:
        return ""
    return (
        f"testbed: a time limit of {time} minutes is over MaxTime={max_minutes} of partition {partition}, the "
        f"longest a Slurm job may run on this testbed ({TIME_SETTING}); ask --time={max_minutes} or less"
    )


def job_submit(
    nodes: int | None, gpus: int | None, partition: str, max_nodes: int | None, most: int | None = None
) -> tuple[int | None, str]:
    """components/job_submit.lua slurm_job_submit for the scenario's -N (`nodes`, and `most` for the top
    of a range -N nodes-most), --gpus (or --gpus-per-task times the tasks) and -p (one partition,
    MaxNodes `max_nodes`, None for UNLIMITED): (the node count it sets, or None; the message it refuses
    with, or ""). A test runs the Lua file itself on the same cases, and the real-Slurm tests run it
    inside slurmctld."""

    def over(need: int, what: str) -> str:
        if max_nodes is not None and need > max_nodes:
            return (
                f"testbed: {what} need {need} nodes (one GPU per slurmd pod); partition {partition} has "
                f"MaxNodes={max_nodes}, the most slurmd pods this testbed runs ({LIMIT_SETTINGS})"
            )
        return ""

    gpus = gpus or None
    need = -(-gpus // GPUS_PER_NODE) if gpus else 0
    if nodes is not None:
        top = max(nodes, most or nodes)
        refusal = over(top, f"-N {nodes}" if top == nodes else f"-N {nodes}-{top}")
        if not refusal and gpus and top * GPUS_PER_NODE < gpus:
            refusal = (
                f"testbed: {gpus} GPUs on at most {top} node(s) can never run: each node (slurmd pod) has "
                f"{GPUS_PER_NODE} GPU; drop -N or ask -N {need}"
            )
        return None, refusal
    if not gpus:
        return None, ""
    refusal = over(need, f"{gpus} GPUs")
    return (None, refusal) if refusal else (need, "")


@dataclass(frozen=True)
class Plan:
    """A backfill plan: nodes held for a pending job from `start` to `end` (bf_resolution steps)."""

    job: SlurmJob
    nodes: frozenset[str]
    start: float
    end: float


@dataclass
class Slurmctld:
    config: SlurmConfig
    # Where sched/backfill's 30 s cycle falls (its thread started with slurmctld, before the run)
    backfill_phase: float = 0.0
    jobs: list[SlurmJob] = field(default_factory=list)
    nodes: dict[str, SlurmNode] = field(default_factory=dict)
    # The jobs still PENDING or RUNNING, in submission order (pruned each step), and every job by
    # name: each tick would otherwise walk every job ever submitted, several times.
    open_jobs: list[SlurmJob] = field(default_factory=list)
    running: list[SlurmJob] = field(default_factory=list)  # in the order they started
    _closed: bool = False  # a job left open_jobs' states since the last prune
    by_name: dict[str, list[SlurmJob]] = field(default_factory=dict)
    completed_now: list[SlurmJob] = field(default_factory=list)  # ended (or timed out) at the latest time
    plans: list[Plan] = field(default_factory=list)  # the last backfill cycle's plans
    # Nodes whose slurmd stopped answering (fault node-failure) and not yet set DOWN: no job is
    # started there (the first ping that fails marks it NOT_RESPONDING, off avail_node_bitmap;
    # a ping round is SlurmdTimeout / 3), and a job on it cannot end until the node goes DOWN.
    unreachable: set[str] = field(default_factory=set)
    _stepped_at: float | None = None
    _backfilled_at: float | None = None
    # False while slurmctld is down (fault slurmctld-down): it starts nothing and no slurmd
    # registers; a job that ends meanwhile is counted as ended (slurmd reports it once it is back).
    up: bool = True
    # Bumped by every change of a job or node that can start a job or move the first in line. A
    # main scheduling pass over the same queue and nodes starts nothing and marks no one, at the
    # same time (twin/world.py steps slurmctld twice a second) or later, until a pending job's
    # begin time comes (time enters a pass only there: `_held_back`): `step` skips it.
    _changes: int = 0
    _scheduled: tuple = ()  # (_changes, unreachable) after the last main scheduling pass
    _wake: float = math.inf  # the earliest begin time still ahead of a pending job at that pass
    # Bumped by every change of `running` (a job added or removed; a running job's nodes and end
    # are fixed while it runs): busy_nodes and earliest_end are kept for it.
    _running_version: int = 0
    _busy: tuple[int, frozenset[str]] = (-1, frozenset())
    _earliest_end: tuple[int, float] = (-1, math.inf)

    @property
    def partitions(self) -> tuple[str, str]:
        return (self.config.default_partition, self.config.nodeset_partition)

    def submit(self, spec: JobSpec, now: float) -> list[SlurmJob]:
        """One job, or one record per array task (the metrics count each pending task)."""
        partition = spec.partition or self.config.default_partition
        job_id = 100 + len(self.jobs)
        limit, minutes = self.config.max_nodes, self.config.max_minutes
        lua = self.config.job_submit_lua
        over_time = time_refusal(spec.time, partition, minutes) if lua else ""
        sized, refusal = (
            job_submit(spec.nodes, spec.gpus, partition, limit, spec.max_nodes) if lua and not over_time else (None, "")
        )
        # The limit it runs under: its --time, else MaxTime (given when it starts; the same here).
        run_minutes = spec.time if spec.time is not None else minutes
        jobs = [
            SlurmJob(
                spec,
                job_id,
                partition,
                held=spec.hold,
                sized=sized,
                seq=len(self.jobs) + i,
                time_limit=None if run_minutes is None else run_minutes * 60.0,
            )
            for i in range(spec.array or 1)
        ]
        failed = "sbatch: error: Batch job submission failed: "
        registered = len(self.nodes)  # every node is in both partitions
        # The client prints the plugin's message, then the error of its return code.
        if over_time:
            reason = f"sbatch: error: {over_time}; {failed}{TIME_LIMIT_INVALID}"
        elif refusal:
            reason = f"sbatch: error: {refusal}; {failed}{NODE_COUNT_INVALID}"
        elif self.config.enforce_part_limits and registered == 0:
            reason = f"{failed}More processors requested than permitted"
        elif self.config.enforce_part_limits and jobs[0].min_nodes > min(registered, limit or registered):
            reason = f"{failed}{NODE_COUNT_INVALID}"
        else:
            reason = ""
        if reason:
            for job in jobs:
                job.state, job.finished, job.reason = REFUSED, now, reason
        self.jobs += jobs
        self.open_jobs += [j for j in jobs if j.state == PENDING]
        self.by_name.setdefault(spec.name, []).extend(jobs)
        self._changes += 1
        return jobs

    def cancel(self, job: SlurmJob, now: float) -> None:
        """scancel: a pending or running job ends CANCELLED and frees its nodes."""
        if job.state in (PENDING, RUNNING):
            if job.state == RUNNING:
                self.running.remove(job)
                self._running_version += 1
            job.state, job.finished = CANCELLED, now
            self._closed = True  # step counts it as a change when it prunes the closed jobs

    def release(self, name: str) -> None:  # scontrol release
        for job in self.by_name.get(name, []):
            job.held = False
        self._changes += 1

    # ------------------------------------------------------------ nodes (slurmd registers / goes)

    def register(self, name: str, now: float) -> None:
        """slurmd registers; a DOWN node that registers again returns to service (ReturnToService=2,
        components/slurm_config.py; SchedMD/slurm@slurm-25-11-6-1 doc/man/man5/slurm.conf.5)."""
        if self.up:
            node = self.nodes.get(name)  # slurmd registers every second: a node only once
            if node is None:
                node = self.nodes[name] = SlurmNode(name, now)
                self._changes += 1
            elif node.down:
                node.down = False
                self._changes += 1

    def node_gone(self, name: str, now: float) -> list[SlurmJob]:
        """slurmd's preStop sets the node down, then deletes it (SlinkyProject/slurm-operator@v1.0.0:
        internal/builder/worker_app.go)."""
        killed = self.set_down(name, now)
        self.nodes.pop(name, None)
        self._changes += 1
        return killed

    def set_down(self, name: str, now: float, failed: bool = False) -> list[SlurmJob]:
        """`scontrol update state=down` (or a failed node): its batch jobs are killed and requeued,
        eligible again after REQUEUE_DELAY (src/slurmctld/job_mgr.c; seen on the real slurmctld).

        The kill goes to the DOWN node too (SchedMD/slurm@slurm-26-05-0-1 and @slurm-25-11-6-1:
        src/slurmctld/node_scheduler.c deallocate_nodes, "Issue the KILL RPC, but don't verify
        response"); its slurmd's answer marks the node responding (agent.c DSH_DONE, node_did_resp
        from the 2 s node-update thread), and under ReturnToService=2 a responding DOWN node is back
        in service whatever the reason (node_mgr.c _node_did_resp). So on the real slurmctld 26.05.5 a
        node set down under a running job is back within about 2 s and runs the next job at the next
        scheduling pass, 3 to 28 s after the down (tests/engines/test_slurm_states.py). The twin's
        slurmd always answers until node_gone, and it returns the node at once. A node set down with
        no job gets no kill, so it stays down here; the real one returns at its next ping
        (ping_nodes.c), which no scenario waits for. A failed node (`failed`) has no slurmd to
        answer the kill, so it stays down whatever ReturnToService says."""
        node = self.nodes.get(name)
        if node is not None:
            node.down = True
        self._changes += 1
        killed = [j for j in self.running if name in j.nodes]
        self.running = [j for j in self.running if name not in j.nodes]
        self._running_version += 1
        for job in killed:
            job.state, job.nodes, job.started = PENDING, (), None
            job.restarts += 1
            job.failovers += failed
            job.eligible_at = now + REQUEUE_DELAY
        if node is not None and killed and not failed and self.config.return_to_service == RETURN_TO_SERVICE_ALL:
            node.down = False
        return killed

    def set_drain(self, name: str, drain: bool) -> None:
        if name in self.nodes and self.nodes[name].drain != drain:
            self.nodes[name].drain = drain
            self._changes += 1

    def busy_nodes(self) -> frozenset[str]:
        """The nodes running jobs hold (kept while `running` is unchanged: asked several times a second)."""
        if self._busy[0] != self._running_version:
            self._busy = (self._running_version, frozenset(n for j in self.running for n in j.nodes))
        return self._busy[1]

    def earliest_end(self) -> float:
        """The earliest `ends_at` of the running jobs (kept while `running` is unchanged): before
        it no job can end, so `step` need not look."""
        if self._earliest_end[0] != self._running_version:
            self._earliest_end = (
                self._running_version,
                min((j.ends_at for j in self.running if j.started is not None), default=math.inf),
            )
        return self._earliest_end[1]

    def is_drained(self, name: str) -> bool:
        """IsNodeDrained: drain flag set and no job on it (not ALLOCATED/MIXED/COMPLETING)."""
        node = self.nodes.get(name)
        return node is None or (node.drain and name not in self.busy_nodes())

    def deadlines(self) -> dict[str, float]:
        """By node, the latest start + time limit of the jobs running on it, as GetNodeDeadlines folds
        the RUNNING jobs of a job list: the limit, not the end no one knows in advance; an UNLIMITED
        job's deadline is infinite (SlinkyProject/slurm-operator@v1.0.0: internal/controller/nodeset/
        slurmcontrol/slurmcontrol.go GetNodeDeadlines, infiniteDuration)."""
        out: dict[str, float] = {}
        for job in self.running:
            assert job.started is not None  # a running job has started
            limit = math.inf if job.time_limit is None else job.time_limit
            for node in job.nodes:
                out[node] = max(out.get(node, 0.0), job.started + limit)
        return out

    # ------------------------------------------------------------ scheduling

    def eligible(self, job: SlurmJob, now: float) -> bool:
        """Pending, and held back by nothing but the nodes (`_held_back`)."""
        return job.state == PENDING and self._held_back(job, now) is None

    def _held_back(self, job: SlurmJob, now: float) -> tuple[str, float] | None:
        """What holds a pending job back whatever the nodes, as its state_reason and the start_time
        the job list shows (its begin while that is in the future, else 0), in job_mgr.c
        job_independent's order at slurm-25-11-6-1: held, dependency, the array's throttle, begin
        time; then the partition's MaxTime. None: it starts where the nodes allow."""
        if job.held:
            return "JobHeldUser", 0.0
        if job.spec.after is not None:
            parents = self.by_name.get(job.spec.after, [])
            if any(p.state in (TIMEOUT, CANCELLED) for p in parents):
                return NEVER_SATISFIED, 0.0
            if not parents or any(p.state != COMPLETED for p in parents):
                return "Dependency", 0.0
        if job.spec.throttle is not None and self._running_tasks(job) >= job.spec.throttle:
            return "JobArrayTaskLimit", 0.0
        if now < job.begin:
            return "BeginTime", job.begin
        minutes = self.config.max_minutes
        if job.spec.time is not None and minutes is not None and job.spec.time > minutes:
            return "PartitionTimeLimit", 0.0  # for good: job_submit.lua refuses it first
        return None

    def step(self, now: float) -> None:
        if now != self._stepped_at:
            self.completed_now, self._stepped_at = [], now
        ended = (
            [
                j
                for j in self.running
                if j.started is not None and now >= j.ends_at and not self.unreachable.intersection(j.nodes)
            ]
            if now >= self.earliest_end()
            else []
        )
        for job in ended:
            job.state, job.finished = TIMEOUT if job.times_out else COMPLETED, now
        if ended:
            self.completed_now += sorted(ended, key=lambda j: j.seq)  # submission order
            self.running = [j for j in self.running if j.state == RUNNING]
            self._running_version += 1
            self._closed = True
        if self._closed:
            if self.config.kill_invalid_depend:
                self._cancel_never_satisfied(now)
            self.open_jobs = [j for j in self.open_jobs if j.state in (PENDING, RUNNING)]
            self._closed = False
            self._changes += 1
        if not self.up:
            return
        state = (self._changes, frozenset(self.unreachable) if self.unreachable else _NONE)
        if state != self._scheduled or now >= self._wake:
            self._schedule(now)
            self._note_first_in_line(now)
            self._scheduled = (self._changes, state[1])
            self._wake = min(
                (j.begin for j in self.open_jobs if j.state == PENDING and j.begin > now), default=math.inf
            )
        if self._backfilled_at is None:
            self._backfilled_at = self.backfill_phase - BF_INTERVAL
        if now >= self._backfilled_at + BF_INTERVAL:
            self._backfilled_at = now
            self._backfill(now)

    def _usable(self) -> list[str]:
        """The nodes a job may be given: up, answering and not drained (avail_node_bitmap), by ordinal."""
        return sorted(
            (n.name for n in self.nodes.values() if not n.drain and not n.down and n.name not in self.unreachable),
            key=_ordinal,
        )

    def _start(self, job: SlurmJob, nodes: list[str], now: float) -> None:
        job.nodes, job.state, job.started = tuple(nodes), RUNNING, now
        self.running.append(job)
        self._running_version += 1
        self._changes += 1

    def _schedule(self, now: float) -> None:
        """The main scheduler: in queue order, until a job waits for busy nodes (module docstring)."""
        if not self.open_jobs:
            return  # nothing to start
        busy = self.busy_nodes()
        if all(n.drain or n.down or n.name in busy or n.name in self.unreachable for n in self.nodes.values()):
            return  # every job needs at least one node
        usable = self._usable()
        idle = [n for n in usable if n not in busy]
        for job in self.open_jobs:
            if not self.eligible(job, now):
                continue
            need = job.nodes_needed
            if len(idle) >= need:
                self._start(job, idle[:need], now)
                idle = idle[need:]
                if not idle:
                    return
            elif need <= len(usable):
                return  # ESLURM_NODES_BUSY: the partition takes no later job this pass

    def _note_first_in_line(self, now: float) -> None:
        """Marks the job first in line (the first eligible pending one in queue order, as the
        runnable-jobs exporter names it: components/runnable_jobs.py queue_order) when it first is:
        a wait from there to its start is what the fair-share reservation bounds."""
        for job in self.open_jobs:
            if self.eligible(job, now):
                if job.first_in_line is None:
                    job.first_in_line = now
                return

    def _backfill(self, now: float) -> None:
        """One sched/backfill cycle (module docstring): start what fits around the plans, plan the rest."""
        self.plans = []
        usable = self._usable()
        idle = set(usable) - self.busy_nodes()
        if not idle:
            return  # nothing can start now; the plans only matter for what starts
        res = BF_RESOLUTION
        # When each usable node is free by the running jobs' limits; one in KillWait past its
        # limit is completing, free a second from now (backfill.c: start_time = now + 1).
        free_at = dict.fromkeys(usable, now)
        for job in self.running:
            assert job.started is not None
            end = job.started + (YEAR if job.time_limit is None else job.time_limit)
            for node in job.nodes:
                if node in free_at:
                    free_at[node] = max(free_at[node], end, now + 1)
        window_end = (now + BF_WINDOW) // res * res
        tested, planned_tasks = 0, dict[int, int]()
        for job in self.open_jobs:
            if not self.eligible(job, now):
                continue
            need = job.nodes_needed
            if job.spec.array is not None:
                if planned_tasks.get(job.job_id, 0) >= BF_MAX_JOB_ARRAY_RESV:
                    continue
                planned_tasks[job.job_id] = planned_tasks.get(job.job_id, 0) + 1
            tested += 1
            if tested > BF_MAX_JOB_TEST:
                return
            if need > len(usable):
                continue  # insufficient nodes: skipped, nothing planned
            length = YEAR if job.time_limit is None else job.time_limit
            start, nodes = self._earliest(need, length, now, free_at, usable)
            if start is None or start > window_end:
                continue  # no plan past the window
            if start <= now:
                self._start(job, nodes, now)
                for node in nodes:
                    free_at[node] = now + length
                idle -= set(nodes)
                if not idle:
                    return
                continue
            end = (start + length + res - 1) // res * res
            self.plans.append(Plan(job, frozenset(nodes), start // res * res, end))

    def _earliest(
        self, need: int, length: float, now: float, free_at: dict[str, float], usable: list[str]
    ) -> tuple[float | None, list[str]]:
        """The earliest time `need` usable nodes are free for `length` seconds by the running jobs'
        limits and clear of every plan (a plan blocks a job whose end reaches its start: backfill.c's
        node_space test `begin_time <= end_time`), and the lowest-numbered such nodes."""
        times = sorted({now, *free_at.values(), *(p.end for p in self.plans)})
        # Per node, the ends of the plans that hold it, in order, and the earliest start among each
        # end and the later ones: of the plans ending after t, one starts by t + length when the
        # earliest start does (as `any` over the plans, in one bisect instead of a walk of them all).
        held: dict[str, tuple[list[float], list[float]]] = {}
        for n in usable:
            spans = sorted((p.end, p.start) for p in self.plans if n in p.nodes)
            starts = [start for _, start in spans]
            for i in range(len(starts) - 2, -1, -1):
                starts[i] = min(starts[i], starts[i + 1])
            held[n] = ([end for end, _ in spans], starts)
        for t in times:
            if t < now:
                continue
            nodes = []
            for n in usable:
                if free_at[n] <= t:
                    ends, starts = held[n]
                    i = bisect.bisect_right(ends, t)  # the plans ending after t
                    if i == len(ends) or starts[i] > t + length:
                        nodes.append(n)
            if len(nodes) >= need:
                return t, nodes[:need]
        return None, []

    def _cancel_never_satisfied(self, now: float) -> None:
        """afterok on a job that ended otherwise (TIMEOUT, CANCELLED) can never be satisfied: with
        kill_invalid_depend slurmctld cancels the job, else it pends with reason
        DependencyNeverSatisfied for good (slurm.conf.5 DependencyParameters; seen on slurmctld
        26.05.5, tests/engines/test_slurm_submit.py)."""
        for job in self.open_jobs:
            parents = self.by_name.get(job.spec.after or "", [])
            if job.state == PENDING and parents and any(p.state in (TIMEOUT, CANCELLED) for p in parents):
                job.state, job.finished, job.reason = CANCELLED, now, NEVER_SATISFIED

    # ------------------------------------------------------------ slurmrestd

    def reason(self, job: SlurmJob, now: float) -> tuple[str, float]:
        """A pending job's state_reason and the start_time the job list shows: what holds it back
        (`_held_back`), else what the real slurmctld 26.05.5 said of work a node would start
        (tests/engines/test_runnable_jobs.py): PartitionConfig with no node registered,
        PartitionNodeLimit while fewer nodes exist than the job needs, else Resources. The real
        reason changes at slurmctld's next scheduling pass, the twin's at once."""
        held_back = self._held_back(job, now)
        if held_back is not None:
            return held_back
        if not self.nodes:
            return "PartitionConfig", 0.0
        if job.nodes_needed > len(self.nodes):
            return "PartitionNodeLimit", 0.0
        return "Resources", 0.0

    def _running_tasks(self, job: SlurmJob) -> int:
        return sum(1 for j in self.by_name[job.spec.name] if j.job_id == job.job_id and j.state == RUNNING)

    def job_list(self, now: float) -> list[dict]:
        """The pending and running jobs as slurmrestd's GET /slurm/v0.0.44/jobs/ lists them (the
        fields components/runnable_jobs.py reads): an array's pending tasks are one record whose
        array_task_string names them ("2-7%2"), each started task a record of its own."""

        def number(value: float) -> dict:
            return {"set": True, "infinite": False, "number": int(value)}

        records: list[dict] = []
        pending_arrays: dict[int, list[SlurmJob]] = {}
        for job in self.open_jobs:
            if job.spec.array and job.state == PENDING:
                pending_arrays.setdefault(job.job_id, []).append(job)
                continue
            records.append(self._record(job, now, number))
        for tasks in pending_arrays.values():
            first = self.by_name[tasks[0].spec.name][0].seq
            indices = ",".join(str(t.seq - first) for t in tasks)
            record = self._record(tasks[0], now, number)
            throttle = tasks[0].spec.throttle
            record["array_task_string"] = indices + (f"%{throttle}" if throttle else "")
            records.append(record)
        return records

    def _record(self, job: SlurmJob, now: float, number: Callable[[float], dict]) -> dict:
        reason, start = self.reason(job, now) if job.state == PENDING else ("None", job.started or 0.0)
        array = {"array_job_id": number(job.job_id if job.spec.array else 0), "array_task_string": ""}
        # eligible_time is the begin while that is ahead; dependency names each parent and its state,
        # emptied once it is met (both as the real slurmctld 26.05.5 listed them).
        dependency = ""
        if reason in ("Dependency", NEVER_SATISFIED):  # a pending job with an afterok
            parents = self.by_name.get(job.spec.after or "", [])
            state = "failed" if reason == NEVER_SATISFIED else "unfulfilled"
            dependency = ",".join(f"afterok:{p.job_id}({state})" for p in parents) or "afterok:0(unfulfilled)"
        return {
            "job_id": number(job.job_id),
            "priority": number(0 if job.held else 1),  # one priority for all: the queue is by submission
            "submit_time": number(job.spec.submit),
            "job_state": [job.state],
            "state_reason": reason,
            "partition": job.partition,
            "node_count": number(job.min_nodes),
            "max_nodes": number(job.max_nodes),
            "start_time": number(start),
            "eligible_time": number(job.begin if job.begin > now else 0.0),
            "dependency": dependency,
            "hold": job.held,
            "array_max_tasks": number(job.spec.throttle or 0),
            **array,
        }

    # ------------------------------------------------------------ metrics

    def partition_metrics(self, now: float) -> dict[str, dict[str, float]]:
        """As src/slurmctld/statistics.c counts them (checked on the real slurmctld, tests/engines): a
        drained node that runs nothing is IDLE and DRAINED, a down one DOWN and, if drained, DRAINED;
        a drained node with a job is MIXED and DRAINING."""
        busy = self.busy_nodes()
        up = [n for n in self.nodes.values() if not n.down]
        alloc = sum(1 for n in up if n.name in busy)
        idle = sum(1 for n in up if n.name not in busy)
        drained = sum(1 for n in self.nodes.values() if n.drain and n.name not in busy)
        out = {}
        for p in self.partitions:
            pending = [j for j in self.open_jobs if j.partition == p and j.state == PENDING]
            nohold = [j for j in pending if not j.held]
            out[p] = {
                # A 1-GPU job on a 4-CPU node leaves CPUs free: MIXED, as on the testbed.
                "slurm_partition_nodes_alloc": 0.0,
                "slurm_partition_nodes_mixed": float(alloc),
                "slurm_partition_nodes_idle": float(idle),
                "slurm_partition_nodes_drained": float(drained),
                "slurm_partition_nodes_draining": float(sum(1 for n in up if n.drain and n.name in busy)),
                "slurm_partition_nodes_down": float(len(self.nodes) - len(up)),
                "slurm_partition_nodes": float(len(self.nodes)),
                "slurm_partition_jobs_pending": float(len(pending)),
                "slurm_partition_jobs_hold": float(len(pending) - len(nohold)),
                "slurm_partition_jobs_running": float(sum(1 for j in self.running if j.partition == p)),
                "slurm_partition_jobs_max_job_nodes_nohold": float(
                    max((max(j.max_nodes, j.min_nodes) for j in nohold), default=0)
                ),
            }
        return out


_NONE: frozenset[str] = frozenset()


def _ordinal(name: str) -> int:
    return int(name.rsplit("-", 1)[1])

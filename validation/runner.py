"""The run loop: wait for an idle cluster, observe, submit when due, stop when done or time is up.

Each turn records one sample (NodeSet replicas, Slurm jobs, GPU pods with the GPUs read
inside them, the processes on every GPU, Kubernetes job states), then submits whatever has
become due. The run ends when every job has finished and, if Slurm was used, slurmd has been
scaled back to 0.

A run survives the cluster's hiccups: a sample whose reads fail is retried a few times, then
skipped (the gap and the error are recorded); a submission that failed is retried next turn
after looking for what it may have left. Every ending (done, timeout, Ctrl-C, too many errors,
a cluster that never went idle) returns the timeline so far with `outcome` and `ended` set;
anything the run submitted is cancelled or deleted unless it completed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

from validation.cluster import Clock, Cluster, ClusterError
from validation.scenarios import (
    AFTER_BUILD,
    AFTER_SCALE_DOWN,
    AT_START,
    BUILD_DIR,
    SLURM,
    WHILE_SLURM_HOLDS_ALL,
    Planned,
    PlannedKube,
    PlannedSlurm,
)
from validation.timeline import (
    FAILED,
    FINISHED,
    PENDING,
    RUNNING,
    SLURMD,
    SUCCEEDED,
    KubeJob,
    RunError,
    Sample,
    Submission,
    Timeline,
    job_lives,
    slurm_holds_every_gpu,
)

SAMPLE_ATTEMPTS = 3  # tries per sample before it is skipped
RETRY_PAUSE = 2.0  # seconds between tries of one sample
ERROR_BUDGET = 20  # samples lost and submissions failed in a whole run before it gives up
IDLE_TIMEOUT = 600.0  # a previous run's slurmd scales to 0 after KEDA's 300 s cooldown


class GaveUp(Exception):
    """The error budget is spent."""


@dataclass
class RunState:
    """What the loop carries from one turn to the next."""

    uuid_cache: dict[str, tuple[str, ...]] = field(default_factory=dict)  # pod uid -> UUIDs
    submitted: list[tuple[Planned, str]] = field(default_factory=list)  # (plan, Slurm job id or name)
    failed_submits: set[str] = field(default_factory=set)  # plans whose submit raised: may exist


def observe(cluster: Cluster, clock: Clock, start: float, state: RunState) -> Sample:
    t = clock.now() - start
    pods = []
    for pod in cluster.gpu_pods():
        uuids = state.uuid_cache.get(pod.uid, ())
        if not uuids and pod.phase == "Running":
            # A pod keeps its GPU for life: read it once, when it first runs.
            uuids = cluster.read_gpu_uuids(pod)
            if uuids:
                state.uuid_cache[pod.uid] = uuids
        pods.append(replace(pod, uuids=uuids))
    replicas, ready = cluster.nodeset()
    kube_jobs = tuple(
        KubeJob(plan.kind, plan.name, cluster.kube_job_phase(plan.obj))
        for plan, _ in state.submitted
        if isinstance(plan, PlannedKube)
    )
    slurm_jobs = tuple(cluster.slurm_jobs())
    processes, probed = cluster.gpu_processes()
    return Sample(
        t=t,
        nodeset_replicas=replicas,
        slurmd_ready=ready,
        slurm_jobs=slurm_jobs,
        kube_jobs=kube_jobs,
        gpu_pods=tuple(pods),
        t_end=clock.now() - start,
        processes=tuple(processes),
        probed=probed,
    )


def busy(sample: Sample) -> list[str]:
    """Why the cluster is not idle: anything holding or wanting a GPU, or Slurm work."""
    reasons = []
    live = [p for p in sample.gpu_pods if p.phase in ("Pending", "Running")]  # a finished Job's pods stay
    slurmd = [p for p in live if p.holder == SLURMD]
    if sample.nodeset_replicas or slurmd:
        reasons.append(f"slurmd replicas {sample.nodeset_replicas}, pods {len(slurmd)}")
    others = sorted(p.key for p in live if p.holder != SLURMD)
    if others:
        reasons.append("GPU pods " + ", ".join(others[:5]) + (" ..." if len(others) > 5 else ""))
    slurm = sorted(f"{j.job_id} {j.state}" for j in sample.slurm_jobs if j.phase in (PENDING, RUNNING))
    if slurm:
        reasons.append("Slurm jobs " + ", ".join(slurm[:5]))
    return reasons


def slurm_all_done_and_gone(timeline: Timeline) -> bool:
    """Every submitted Slurm job finished, and the latest sample shows no slurmd at all."""
    lives = [life for life in job_lives(timeline) if life.kind == SLURM]
    latest = timeline.samples[-1]
    return (
        all(life.final_phase in FINISHED for life in lives)
        and latest.nodeset_replicas == 0
        and not latest.slurmd_pods()
    )


def builds_ended(timeline: Timeline, builds: frozenset[str]) -> str | None:
    """SUCCEEDED once every build Job of the run succeeded, FAILED once one failed, else None."""
    lives = {life.name: life.final_phase for life in job_lives(timeline) if life.name in builds}
    if any(phase == FAILED for phase in lives.values()):
        return FAILED
    if builds and len(lives) == len(builds) and all(phase == SUCCEEDED for phase in lives.values()):
        return SUCCEEDED
    return None


def due(plan: Planned, timeline: Timeline, builds: frozenset[str] = frozenset()) -> bool:
    """`builds`: the names of the run's build Jobs (jobs/build/)."""
    if plan.after == AT_START:
        return True
    if plan.after == AFTER_BUILD:
        return builds_ended(timeline, builds) == SUCCEEDED
    if plan.after == AFTER_SCALE_DOWN:
        # Only after slurmd had been up for this run's work: at the very start it is 0 as well.
        first = min((s.t for s in timeline.submissions), default=None)
        was_up = first is not None and any(
            s.nodeset_replicas > 0 or s.slurmd_pods() for s in timeline.samples if s.t >= first
        )
        return was_up and slurm_all_done_and_gone(timeline)
    if plan.after == WHILE_SLURM_HOLDS_ALL:
        return slurm_holds_every_gpu(timeline.samples[-1], timeline.gpus_total)
    raise ValueError(f"unknown trigger {plan.after!r}")


def finished(timeline: Timeline, waiting: list[Planned]) -> bool:
    if waiting or not timeline.submissions:
        return False
    if any(life.final_phase not in FINISHED for life in job_lives(timeline)):
        return False
    uses_slurm = any(s.kind == SLURM for s in timeline.submissions)
    return not uses_slurm or slurm_all_done_and_gone(timeline)


def submit(cluster: Cluster, plan: Planned, state: RunState) -> str:
    """Submit once; after a failed try, first look for what that try may have created."""
    if isinstance(plan, PlannedSlurm):
        if plan.name in state.failed_submits:
            found = [j.job_id for j in cluster.slurm_jobs() if j.name == plan.name]
            if found:
                return found[0]
        return cluster.submit_slurm(plan.name, plan.script)
    cluster.create(plan.obj)  # an object of this run's name that exists already counts as created
    return plan.name


class Recorder:
    """Records every failed try in the timeline; what stayed failed counts against the budget."""

    def __init__(self, timeline: Timeline, log: Callable[[str], None], budget: int) -> None:
        self.timeline, self.log, self.budget = timeline, log, budget
        self.spent = 0

    def failed(self, t: float, during: str, error: Exception, *, final: bool = True) -> None:
        self.timeline.errors.append(RunError(round(t, 3), during, str(error)))
        self.log(f"{t:6.0f}s {during} failed: {error}")
        if final:
            self.spent += 1
            if self.spent >= self.budget:
                raise GaveUp(f"{self.spent} cluster errors (last, {during}: {error})")


def take_sample(cluster: Cluster, clock: Clock, start: float, state: RunState, record: Recorder) -> Sample | None:
    for attempt in range(1, SAMPLE_ATTEMPTS + 1):
        try:
            return observe(cluster, clock, start, state)
        except ClusterError as error:
            last = attempt == SAMPLE_ATTEMPTS
            record.failed(clock.now() - start, f"sample (try {attempt} of {SAMPLE_ATTEMPTS})", error, final=last)
            if not last:
                clock.sleep(RETRY_PAUSE)
    return None


def wait_until_idle(
    cluster: Cluster, clock: Clock, state: RunState, record: Recorder, interval: float, limit: float
) -> Sample | None:
    """Sample until nothing holds a GPU; the last busy sample if `limit` seconds pass first."""
    start = clock.now()
    last = None
    while True:
        sample = take_sample(cluster, clock, start, state, record)
        if sample is not None:
            last = sample
            if not busy(sample):
                return None
        if clock.now() - start >= limit:
            return last
        clock.sleep(interval)


def cleanup(cluster: Cluster, state: RunState, record: Recorder, t: float) -> None:
    """Cancel and delete what the run submitted; a failure is recorded and the rest still tried."""
    slurm_ids = [ref for plan, ref in state.submitted if isinstance(plan, PlannedSlurm)]
    steps: list[tuple[str, Callable[[], None]]] = []
    if slurm_ids:
        steps.append((f"scancel {' '.join(slurm_ids)}", lambda: cluster.cancel_slurm(slurm_ids)))
    for plan, _ in state.submitted:
        if isinstance(plan, PlannedKube):
            steps.append((f"delete {plan.kind} {plan.namespace}/{plan.name}", partial(cluster.delete, plan.obj)))
    for what, step in steps:
        record.log(what)
        try:
            step()
        except ClusterError as error:
            record.timeline.errors.append(RunError(round(t, 3), f"cleanup: {what}", str(error)))
            record.log(f"could not {what} ({error}): do it by hand")


def run(
    planned: list[Planned],
    cluster: Cluster,
    clock: Clock,
    *,
    scenario: str,
    gpus_total: int,
    interval: float,
    timeout: float,
    started_at: str,
    log: Callable[[str], None] = print,
    idle_timeout: float = IDLE_TIMEOUT,
    error_budget: int = ERROR_BUDGET,
) -> Timeline:
    timeline = Timeline(scenario, gpus_total, interval, started_at)
    state = RunState()
    record = Recorder(timeline, log, error_budget)
    waiting = list(planned)
    builds = frozenset(p.name for p in planned if isinstance(p, PlannedKube) and p.source.startswith(BUILD_DIR))
    clean_exit = False
    start = clock.now()
    t0_epoch = clock.epoch()
    t = 0.0
    try:
        try:
            cluster.start_probe()  # it starts while the runner waits for an idle cluster
        except ClusterError as error:
            record.failed(0.0, "start the process probe", error, final=False)
        still_busy = wait_until_idle(cluster, clock, state, record, interval, idle_timeout)
        timeline.waited_for_idle = round(clock.now() - start, 3)
        if still_busy is not None:
            timeline.outcome = "not-idle"
            timeline.ended = f"the cluster was still busy after {idle_timeout:.0f} s: " + "; ".join(busy(still_busy))
            timeline.samples.append(replace(still_busy, t=0.0, t_end=0.0))
            log(timeline.ended)
            clean_exit = True  # nothing submitted
            return timeline
        if timeline.waited_for_idle:
            log(f"waited {timeline.waited_for_idle:.0f} s for the cluster to be idle")
        start, t0_epoch = clock.now(), clock.epoch()
        while True:
            t = clock.now() - start
            sample = take_sample(cluster, clock, start, state, record)
            if sample is not None:
                timeline.samples.append(sample)
                if builds_ended(timeline, builds) == FAILED:
                    for plan in [p for p in waiting if p.after == AFTER_BUILD]:
                        waiting.remove(plan)  # what it would run is not there: never submitted
                        log(f"{t:6.0f}s not submitting {plan.name}: the build it needs failed")
                for plan in [p for p in waiting if due(p, timeline, builds)]:
                    submitted_at = clock.now() - start
                    try:
                        ref = submit(cluster, plan, state)
                    except ClusterError as error:
                        state.failed_submits.add(plan.name)
                        record.failed(submitted_at, f"submit {plan.name}", error)
                        continue
                    state.submitted.append((plan, ref))
                    timeline.submissions.append(Submission(plan.name, plan.kind, submitted_at, plan.gpus, ref))
                    waiting.remove(plan)
                    log(f"{submitted_at:6.0f}s submitted {plan.kind} {plan.name} ({ref})")
                if finished(timeline, waiting):
                    clean_exit = True
                    timeline.ended = f"every job finished after {t:.0f} s"
                    break
            if t >= timeout:
                timeline.outcome = "timeout"
                timeline.ended = f"timed out after {timeout:.0f} s"
                log(f"{t:6.0f}s timeout")
                break
            clock.sleep(interval)
    except KeyboardInterrupt:
        timeline.outcome = "interrupted"
        timeline.ended = f"interrupted (Ctrl-C) after {clock.now() - start:.0f} s"
        log("interrupted")
    except GaveUp as error:
        timeline.outcome = "error"
        timeline.ended = f"gave up after {clock.now() - start:.0f} s: {error}"
        log(timeline.ended)
    except Exception as error:  # a bug or an answer nobody expected: still write what was seen
        timeline.outcome = "error"
        timeline.ended = f"stopped by an error after {clock.now() - start:.0f} s: {type(error).__name__}: {error}"
        log(timeline.ended)
    finally:
        # On every ending but a clean one: never leave our jobs holding GPUs.
        if not clean_exit:
            cleanup(cluster, state, record, clock.now() - start)
        finish(cluster, timeline, record, clock.now() - start, t0_epoch)
        read_outputs(cluster, timeline, state, record, clock.now() - start)
    return timeline


def read_outputs(cluster: Cluster, timeline: Timeline, state: RunState, record: Recorder, t: float) -> None:
    """The output of every job that reports a result (an all-reduce's bus bandwidth), once it ended."""
    for plan, ref in state.submitted:
        if not plan.collective:
            continue
        try:
            timeline.outputs[plan.name] = cluster.job_output(plan.kind, plan.name, ref)
        except ClusterError as error:
            timeline.errors.append(RunError(round(t, 3), f"read the output of {plan.name}", str(error)))
            record.log(f"could not read the output of {plan.name} ({error})")


def finish(cluster: Cluster, timeline: Timeline, record: Recorder, t: float, t0_epoch: float) -> None:
    """Remove the probe; read dcgm-exporter's record of the run (best effort, errors kept)."""
    record.log(f"delete DaemonSet of the process probe ({t:.0f} s)")
    try:
        cluster.stop_probe()
    except ClusterError as error:
        timeline.errors.append(RunError(round(t, 3), "cleanup: delete the process probe", str(error)))
        record.log(f"could not delete the process probe ({error}): do it by hand")
    if not timeline.samples:
        return
    try:
        timeline.dcgm = cluster.dcgm_holdings(t0_epoch, timeline.samples[-1].end, timeline.interval)
    except ClusterError as error:
        timeline.errors.append(RunError(round(t, 3), "read dcgm-exporter's record", str(error)))

"""The run loop: observe, submit when due, stop when everything is done or time is up.

Each turn records one sample (NodeSet replicas, Slurm jobs, GPU pods with the UUIDs read
inside them, Kubernetes job states), then submits whatever has become due. The run ends
when every job has finished and, if Slurm was used, slurmd has been scaled back to 0.
Ctrl-C, a timeout or an error cancels and deletes everything the run submitted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from validation.cluster import Clock, Cluster
from validation.scenarios import AFTER_SCALE_DOWN, AT_START, SLURM, Planned, PlannedKube, PlannedSlurm
from validation.timeline import (
    FINISHED,
    KubeJob,
    Sample,
    Submission,
    Timeline,
    job_lives,
)


@dataclass
class RunState:
    """What the loop carries from one turn to the next."""

    uuid_cache: dict[str, tuple[str, ...]] = field(default_factory=dict)  # pod uid -> UUIDs
    submitted: list[tuple[Planned, str]] = field(default_factory=list)  # (plan, Slurm job id or name)


def observe(cluster: Cluster, t: float, state: RunState) -> Sample:
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
    return Sample(
        t=t,
        nodeset_replicas=replicas,
        slurmd_ready=ready,
        slurm_jobs=tuple(cluster.slurm_jobs()),
        kube_jobs=kube_jobs,
        gpu_pods=tuple(pods),
    )


def slurm_all_done_and_gone(timeline: Timeline) -> bool:
    """Every submitted Slurm job finished, and the latest sample shows no slurmd at all."""
    lives = [life for life in job_lives(timeline) if life.kind == SLURM]
    latest = timeline.samples[-1]
    return (
        all(life.final_phase in FINISHED for life in lives)
        and latest.nodeset_replicas == 0
        and not latest.slurmd_pods()
    )


def due(plan: Planned, timeline: Timeline) -> bool:
    if plan.after == AT_START:
        return True
    if plan.after == AFTER_SCALE_DOWN:
        # Only after slurmd had been up: at the very start it is 0 as well.
        was_up = any(s.nodeset_replicas > 0 or s.slurmd_pods() for s in timeline.samples)
        return was_up and slurm_all_done_and_gone(timeline)
    raise ValueError(f"unknown trigger {plan.after!r}")


def finished(timeline: Timeline, waiting: list[Planned]) -> bool:
    if waiting or not timeline.submissions:
        return False
    if any(life.final_phase not in FINISHED for life in job_lives(timeline)):
        return False
    uses_slurm = any(s.kind == SLURM for s in timeline.submissions)
    return not uses_slurm or slurm_all_done_and_gone(timeline)


def submit(cluster: Cluster, plan: Planned) -> str:
    if isinstance(plan, PlannedSlurm):
        return cluster.submit_slurm(plan.name, plan.script)
    cluster.create(plan.obj)
    return plan.name


def cleanup(cluster: Cluster, state: RunState, log: Callable[[str], None]) -> None:
    slurm_ids = [ref for plan, ref in state.submitted if isinstance(plan, PlannedSlurm)]
    if slurm_ids:
        log(f"cancelling Slurm jobs {', '.join(slurm_ids)}")
        cluster.cancel_slurm(slurm_ids)
    for plan, _ in state.submitted:
        if isinstance(plan, PlannedKube):
            log(f"deleting {plan.kind} {plan.namespace}/{plan.name}")
            cluster.delete(plan.obj)


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
) -> Timeline:
    timeline = Timeline(scenario, gpus_total, interval, started_at)
    state = RunState()
    waiting = list(planned)
    start = clock.now()
    clean_exit = False
    try:
        while True:
            t = clock.now() - start
            timeline.samples.append(observe(cluster, t, state))
            for plan in [p for p in waiting if due(p, timeline)]:
                ref = submit(cluster, plan)
                state.submitted.append((plan, ref))
                timeline.submissions.append(Submission(plan.name, plan.kind, t, plan.gpus, ref))
                waiting.remove(plan)
                log(f"{t:6.0f}s submitted {plan.kind} {plan.name} ({ref})")
            if finished(timeline, waiting):
                clean_exit = True
                break
            if t >= timeout:
                timeline.outcome = "timeout"
                log(f"{t:6.0f}s timeout")
                break
            clock.sleep(interval)
    except KeyboardInterrupt:
        timeline.outcome = "interrupted"
        log("interrupted")
    finally:
        # Also on an error from the cluster: never leave our jobs holding GPUs.
        if not clean_exit:
            cleanup(cluster, state, log)
    return timeline

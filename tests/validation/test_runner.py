"""The run loop end to end against the simulated cluster, on a fake clock (no sleeping)."""

import math

import pytest
from validation_fakes import FakeClock, FakeCluster, Faults

from validation.checks import evaluate, expectations, gpu_return_latency, scale_up_latency
from validation.runner import run
from validation.scenarios import SCENARIOS, plan
from validation.timeline import job_lives

DURATIONS = {"mpi-gpu": 120, "pytorchjob": 90, "inference": 60, "gpu-smoke": 15, "hold-gpus": 120, "leak-probe": 30}


def replay(name, faults=None, timeout=3000.0, **cluster_args):
    clock = FakeClock()
    cluster = FakeCluster(clock, durations=DURATIONS, faults=faults or Faults(), **cluster_args)
    planned = plan(SCENARIOS[name], "t1")
    log = []
    timeline = run(
        planned,
        cluster,
        clock,
        scenario=name,
        gpus_total=4,
        interval=5.0,
        timeout=timeout,
        started_at="2026-01-01T00:00:00+00:00",
        log=log.append,
    )
    checks = evaluate(timeline, expectations(SCENARIOS[name], planned, 4))
    return timeline, {c.name: c for c in checks}, cluster, log


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_scenario_passes_on_a_well_behaved_cluster(name):
    timeline, checks, cluster, _ = replay(name)
    assert [n for n, c in checks.items() if not c.passed] == []
    assert timeline.outcome == "completed"
    assert cluster.cancelled == [] and cluster.deleted == []  # a clean run leaves its jobs for their logs


def test_latencies_follow_the_simulated_cluster():
    timeline, _, cluster, _ = replay("mixed", pod_start=8, slurmd_register=15, cooldown=300)
    # The twin, at its default phase set (the runnable-jobs exporter scraped at 16 s past each half
    # minute, slurmctld at 27, KEDA's poll at 13 and 28, the HPA's sync at 0 and 15): sbatch at 0,
    # first seen pending at 5. Until slurmctld's first scrape the rule reads its metrics as lost
    # (the run starts with none) and adds no pod, so the exporter's earlier scrape does not hasten
    # this first job; its two pods are asked for by 45 (NodeSet 2 seen then), run and register,
    # seen Ready at 70. Sampling blurs by up to one interval.
    assert scale_up_latency(timeline) == 65
    # The job ends at 188 (seen at 190); the last subquery step that saw its nodes busy is 180 (the
    # scrape at 177), so the demand-aware warmth (busy within the last 330 s) ends at 510: the HPA's
    # sync at 510 scales to 1, KEDA's poll at 523 to 0, and the pod is gone after its termination,
    # as the Slinky release has it (twin/program.py slinky_behaviour: 5 s on 1.0.5, the default,
    # seen at 530; the 30 s grace before 1.0.5, seen at 555): the cooldown plus up to a scrape, a
    # poll and the termination.
    gone = 523 + cluster.twin.kube.slurmd_termination
    assert gpu_return_latency(timeline) == math.ceil(gone / 5) * 5 - 190


def test_uuids_are_read_once_per_pod():
    timeline, _, cluster, _ = replay("mixed")
    pods = {p.uid for s in timeline.samples for p in s.gpu_pods if p.phase == "Running"}
    assert cluster.uuid_reads == len(pods) == 4


def test_handoff_submits_the_pytorchjob_only_after_slurmd_is_gone():
    timeline, checks, _, _ = replay("handoff")
    smoke, ddp = job_lives(timeline)
    gone = next(
        s.t for s in timeline.samples if s.t > smoke.finished and s.nodeset_replicas == 0 and not s.slurmd_pods()
    )
    assert ddp.submitted == gone
    assert checks["GPU handed from Slurm to Kubernetes"].passed


def test_heavy_mix_queues_then_runs_everything():
    timeline, checks, _, _ = replay("heavy-mixed")
    assert checks["queued work waited, then ran"].passed
    assert max(life.wait for life in job_lives(timeline)) > 60


def test_a_device_plugin_that_double_books_is_caught():
    _, checks, _, _ = replay("mixed", Faults(share_gpus=True))
    assert not checks["no GPU held twice"].passed
    assert "mpi-gpu" not in checks["no GPU held twice"].detail  # it names pods, e.g. slurm-worker-slinky-0
    assert "slurm-worker-slinky" in checks["no GPU held twice"].detail


def test_scale_down_that_never_comes_times_out_and_cleans_up():
    timeline, checks, cluster, log = replay("hpc-parallel", Faults(never_scale_down=True), timeout=900)
    assert timeline.outcome == "timeout"
    assert not checks["run completed"].passed
    assert not checks["GPUs returned by slurmd"].passed
    assert checks["every job succeeded"].passed
    assert sorted(cluster.cancelled) == sorted(s.ref for s in timeline.submissions)
    assert any("timeout" in line for line in log)


def test_a_failing_job_fails_the_run():
    _, checks, _, _ = replay("mixed", Faults(fail_jobs=("pytorchjob",)))
    assert not checks["every job succeeded"].passed
    assert "pytorchjob-ddp-t1-2 failed" in checks["every job succeeded"].detail


def test_ctrl_c_cancels_and_deletes_what_was_submitted():
    timeline, checks, cluster, _ = replay("heavy-mixed", Faults(interrupt_at=50))
    assert timeline.outcome == "interrupted"
    assert not checks["run completed"].passed
    slurm = [s.ref for s in timeline.submissions if s.kind == "slurm"]
    kube = [s.name for s in timeline.submissions if s.kind != "slurm"]
    assert len(slurm) == 2 and len(kube) == 3
    assert cluster.cancelled == slurm and cluster.deleted == kube


def test_an_unexpected_error_ends_the_run_cleans_up_and_keeps_what_was_seen():
    clock = FakeClock()
    cluster = FakeCluster(clock, durations=DURATIONS)
    broken = iter(range(10))

    def nodeset():
        if next(broken) == 3:
            raise RuntimeError("api server went away")
        return FakeCluster.nodeset(cluster)

    cluster.nodeset = nodeset
    timeline = run(
        plan(SCENARIOS["mixed"], "t1"),
        cluster,
        clock,
        scenario="mixed",
        gpus_total=4,
        interval=5,
        timeout=100,
        started_at="x",
        log=lambda _: None,
    )
    assert timeline.outcome == "error"
    assert (
        timeline.ended.startswith("stopped by an error after ")
        and "RuntimeError: api server went away" in timeline.ended
    )
    assert len(timeline.samples) == 2 and len(timeline.submissions) == 2
    assert len(cluster.cancelled) == 1 and len(cluster.deleted) == 1

from dataclasses import replace

from validation_builders import GPU_A, handoff_samples, handoff_timeline, kube_pod, sample, slurmd_pod, smoke

from validation.timeline import (
    FAILED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    Timeline,
    batch_job_phase,
    gpu_owner,
    holdings,
    job_lives,
    pod_gpus,
    pytorchjob_phase,
    slurm_phase,
)


def test_slurm_states_map_to_phases():
    assert [slurm_phase(s) for s in ("PENDING", "RUNNING", "COMPLETING", "COMPLETED")] == [
        PENDING,
        RUNNING,
        RUNNING,
        SUCCEEDED,
    ]
    assert {slurm_phase(s) for s in ("FAILED", "CANCELLED", "CANCELLED+", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")} == {
        FAILED
    }


def test_pytorchjob_phase_is_the_strongest_true_condition():
    created = {"type": "Created", "status": "True"}
    running = {"type": "Running", "status": "True"}
    assert pytorchjob_phase([]) == PENDING
    assert pytorchjob_phase([created]) == PENDING
    assert pytorchjob_phase([created, running]) == RUNNING
    assert (
        pytorchjob_phase([created, {"type": "Running", "status": "False"}, {"type": "Succeeded", "status": "True"}])
        == SUCCEEDED
    )
    assert pytorchjob_phase([created, running, {"type": "Failed", "status": "True"}]) == FAILED


def test_a_pytorchjob_kueue_suspends_is_pending_again_and_running_once_resumed():
    # kubeflow/training-operator@v1.8.1:pkg/controller.v1/common/job.go sets Running False and
    # Suspended True on suspension (Kueue's eviction), Suspended False on resume, then Running True.
    created = {"type": "Created", "status": "True"}
    suspended = [created, {"type": "Running", "status": "False"}, {"type": "Suspended", "status": "True"}]
    assert pytorchjob_phase(suspended) == PENDING
    resumed = [created, {"type": "Suspended", "status": "False"}, {"type": "Running", "status": "True"}]
    assert pytorchjob_phase(resumed) == RUNNING


def test_batch_job_counts_as_running_only_once_a_pod_is_ready():
    assert batch_job_phase({"active": 1}) == PENDING  # active includes Pending pods
    assert batch_job_phase({"active": 1, "ready": 1}) == RUNNING
    assert batch_job_phase({"conditions": [{"type": "Complete", "status": "True"}]}) == SUCCEEDED
    assert batch_job_phase({"conditions": [{"type": "Failed", "status": "True"}]}) == FAILED


def test_job_lives_measure_wait_and_run_from_samples():
    lives = {life.name: life for life in job_lives(handoff_timeline())}
    assert (lives["smoke"].wait, lives["smoke"].run, lives["smoke"].final_phase) == (25, 10, SUCCEEDED)
    assert (lives["ddp"].wait, lives["ddp"].run) == (15, 30)


def test_a_job_seen_only_finished_gets_a_zero_run_not_a_negative_one():
    tl = handoff_timeline([sample(0, slurm=[smoke("PENDING", ())]), sample(10, slurm=[smoke("COMPLETED")])])
    smoke_life = job_lives(tl)[0]
    assert (smoke_life.started, smoke_life.finished, smoke_life.run) == (10, 10, 0)


def test_holdings_span_first_to_last_sample_per_pod_uid():
    held = [(h.uuid, h.pod, h.start, h.end, h.running_from) for h in holdings(handoff_timeline())]
    # Scheduled pods hold their GPU before they run: slurmd from 10 (Running at 20), the master from 360.
    assert held == [
        ("GPU-a", "slurm/slurm-worker-slinky-0", 10, 340, 20),
        ("GPU-a", "default/ddp-master-0", 360, 370, 370),
        ("GPU-b", "default/ddp-worker-0", 370, 370, 370),
    ]


def test_a_pod_that_never_ran_holds_its_nodes_only_gpu_and_an_unscheduled_one_holds_nothing():
    pending = kube_pod("late", "master-0", 0, phase="Pending")
    unscheduled = replace(kube_pod("nowhere", "master-0", 0, phase="Pending"), node="", scheduled=False)
    tl = handoff_timeline([*handoff_samples()[:3], sample(25, pods=[pending, unscheduled])])
    assert pod_gpus(tl)[pending.uid] == (GPU_A,) and unscheduled.uid not in pod_gpus(tl)
    assert [(h.pod, h.start, h.running_from) for h in holdings(tl) if h.pod_uid == pending.uid] == [
        ("default/late-master-0", 25, None)
    ]
    assert gpu_owner(tl.samples[-1], GPU_A, pod_gpus(tl)) == ("reserved", "late-master-0")


def test_a_recreated_pod_with_the_same_name_is_a_new_holding():
    tl = handoff_timeline(
        [
            sample(0, pods=[slurmd_pod(0, GPU_A, uid="first")]),
            sample(10),
            sample(20, pods=[slurmd_pod(0, GPU_A, uid="second")]),
        ]
    )
    assert [(h.pod_uid, h.start, h.end) for h in holdings(tl)] == [("first", 0, 0), ("second", 20, 20)]


def test_gpu_owner_tells_a_busy_slurmd_from_an_idle_one():
    samples = handoff_timeline().samples
    assert gpu_owner(samples[3], GPU_A) == ("slurm-job", "smoke")
    assert gpu_owner(samples[5], GPU_A) == ("slurmd-idle", "slurm-worker-slinky-0")
    assert gpu_owner(samples[8], GPU_A) == ("kubernetes", "ddp")
    assert gpu_owner(samples[6], GPU_A) is None


def test_timeline_round_trips_through_json(tmp_path):
    tl = handoff_timeline()
    tl.save(tmp_path / "t.json")
    assert Timeline.load(tmp_path / "t.json") == tl

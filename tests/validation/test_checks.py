"""Each check on a clean timeline, and on one broken in exactly the way that check must catch."""

from dataclasses import replace
from itertools import product

from validation_builders import GPU_A, GPU_B, handoff_samples, handoff_timeline, kube_pod, sample, slurmd_pod, smoke

from validation.checks import (
    Expectations,
    check_gpu_exclusive,
    check_gpu_return,
    check_handoff,
    check_jobs_succeeded,
    check_queued_work,
    check_scale_up,
    check_uuids_read,
    describe_checks,
    evaluate,
    gpu_return_latency,
    scale_up_bounds,
    scale_up_latency,
    slurmd_gone,
)
from validation.timeline import KubeJob, SlurmJob, Submission

ALL = Expectations(slurm=True, queueing=False, handoff=True)


def test_a_clean_handoff_passes_every_check():
    checks = evaluate(handoff_timeline(), ALL)
    assert [c.name for c in checks if not c.passed] == []
    assert len(checks) == 9


def test_latencies_are_derived_from_the_samples():
    tl = handoff_timeline()
    assert scale_up_latency(tl) == 20  # pending at 10, slurmd Ready at 30
    assert gpu_return_latency(tl) == 310  # done at 40, slurmd gone at 350


def test_an_overlap_on_one_gpu_fails_exclusivity():
    samples = handoff_samples()
    # The PyTorchJob master shows up on GPU-a while slurmd still holds it.
    samples[5] = replace(samples[5], gpu_pods=(*samples[5].gpu_pods, kube_pod("ddp", "master-0", 0, GPU_A)))
    check = check_gpu_exclusive(handoff_timeline(samples))
    assert not check.passed
    assert "GPU-a: slurm/slurm-worker-slinky-0 [10-340s] and default/ddp-master-0 [340-370s]" in check.detail


def test_a_scheduled_pod_reserving_a_held_gpu_fails_exclusivity():
    """Reserved counts: a pod bound to the GPU (pulling its image) while slurmd still runs on it."""
    samples = handoff_samples()
    samples[5] = replace(samples[5], gpu_pods=(*samples[5].gpu_pods, kube_pod("ddp", "master-0", 0, phase="Pending")))
    check = check_gpu_exclusive(handoff_timeline(samples))
    assert not check.passed and "default/ddp-master-0 [340-370s]" in check.detail


def test_two_pods_on_one_gpu_in_one_sample_fail_exclusivity():
    tl = handoff_timeline([sample(0, pods=[kube_pod("x", "master-0", 0, GPU_B), kube_pod("y", "master-0", 0, GPU_B)])])
    assert not check_gpu_exclusive(tl).passed


def test_back_to_back_holders_of_one_gpu_do_not_overlap():
    check = check_gpu_exclusive(handoff_timeline())
    assert check.passed and "3 holdings of 2 GPUs" in check.detail


def test_no_holding_at_all_proves_nothing():
    assert not check_gpu_exclusive(handoff_timeline([sample(0)])).passed


def test_a_job_that_never_ran_fails():
    samples = [s for s in handoff_samples()]
    samples = [
        replace(
            s,
            kube_jobs=tuple(replace(j, phase="pending") for j in s.kube_jobs),
            gpu_pods=tuple(p for p in s.gpu_pods if p.holder == "slurmd"),
        )
        for s in samples
    ]
    check = check_jobs_succeeded(handoff_timeline(samples))
    assert not check.passed and check.detail == "ddp never ran (last seen pending)"


def test_a_failed_job_fails():
    samples = handoff_samples()
    samples[4] = replace(samples[4], slurm_jobs=(smoke("FAILED"),))
    samples[5] = replace(samples[5], slurm_jobs=(smoke("FAILED"),))
    samples[6] = replace(samples[6], slurm_jobs=(smoke("FAILED"),))
    check = check_jobs_succeeded(handoff_timeline(samples))
    assert not check.passed and "smoke failed" in check.detail


def test_a_job_never_seen_at_all_fails():
    tl = handoff_timeline()
    tl.submissions.append(Submission("ghost", "slurm", 0, 1, "99"))
    assert "ghost never ran (last seen never)" in check_jobs_succeeded(tl).detail


def test_scale_down_that_never_came_fails():
    samples = [s for s in handoff_samples() if s.t <= 340]
    samples += [sample(t, 1, 1, [smoke("COMPLETED")], pods=[slurmd_pod(0, GPU_A)]) for t in (350, 700, 1000)]
    tl = handoff_timeline(samples)
    check = check_gpu_return(tl)
    assert not check.passed and "never scaled to 0" in check.detail
    assert gpu_return_latency(tl) is None


def test_slurmd_that_never_became_ready_fails_scale_up():
    samples = [replace(s, slurmd_ready=0) for s in handoff_samples()]
    assert not check_scale_up(handoff_timeline(samples)).passed


def test_an_unread_gpu_pod_fails_the_uuid_check():
    samples = handoff_samples()
    samples[8] = replace(samples[8], gpu_pods=(kube_pod("ddp", "master-0", 0, GPU_A), kube_pod("ddp", "worker-0", 1)))
    check = check_uuids_read(handoff_timeline(samples))
    assert not check.passed and check.detail == "unread: default/ddp-worker-0"


def test_handoff_needs_the_kubernetes_holding_after_the_slurmd_one():
    samples = handoff_samples()
    # The PyTorchJob lands only on the GPU Slurm never had.
    samples[8] = replace(samples[8], gpu_pods=(kube_pod("ddp", "master-0", 1, GPU_B),))
    assert check_handoff(handoff_timeline()).passed
    assert not check_handoff(handoff_timeline(samples)).passed


def busy_samples(late_job_starts: bool):
    """Two GPUs both held by `ddp`; `late` waits, then runs only if late_job_starts."""
    both = [kube_pod("ddp", "master-0", 0, GPU_A), kube_pod("ddp", "worker-0", 1, GPU_B)]
    late_phase = "running" if late_job_starts else "pending"
    return [
        sample(0, kube=[KubeJob("PyTorchJob", "ddp", "running"), KubeJob("Job", "late", "pending")], pods=both),
        sample(10, kube=[KubeJob("PyTorchJob", "ddp", "succeeded"), KubeJob("Job", "late", "pending")]),
        sample(
            20,
            kube=[KubeJob("PyTorchJob", "ddp", "succeeded"), KubeJob("Job", "late", late_phase)],
            pods=[kube_pod("late", "x", 0, GPU_A)] if late_job_starts else [],
        ),
    ]


def queue_timeline(late_job_starts: bool):
    tl = handoff_timeline(busy_samples(late_job_starts))
    tl.submissions = [Submission("ddp", "PyTorchJob", 0, 2, "ddp"), Submission("late", "Job", 0, 1, "late")]
    return tl


def test_work_beyond_the_gpus_waited_then_ran():
    check = check_queued_work(queue_timeline(late_job_starts=True))
    assert check.passed and check.detail == "late waited 20 s"


def test_work_that_waited_and_never_ran_fails():
    check = check_queued_work(queue_timeline(late_job_starts=False))
    assert not check.passed and check.detail == "waited and never ran: late"


def test_no_waiting_while_gpus_were_free_fails_the_queue_check():
    tl = handoff_timeline()  # never more than 1 of 2 GPUs held while something pended
    assert not check_queued_work(tl).passed


def test_expectations_choose_the_checks():
    names = [c.name for c in evaluate(handoff_timeline(), Expectations(slurm=False, queueing=False, handoff=False))]
    assert names == [
        "run completed",
        "every job succeeded",
        "GPU UUIDs read",
        "no GPU held twice",
        "GPU processes only in their GPU's pod",
        "dcgm-exporter agrees",
    ]


def test_latencies_carry_the_uncertainty_of_slow_samples():
    """Pending first seen in the sample [10, 14]; Ready first seen in [30, 33] after one at 20."""
    samples = handoff_samples()
    samples[1] = replace(samples[1], t_end=14.0)
    samples[3] = replace(samples[3], t_end=33.0)
    bounds = scale_up_bounds(handoff_timeline(samples))
    assert (bounds.value, bounds.low, bounds.high) == (20, 6, 33)
    assert str(bounds) == "20 s (between 6 and 33 s)"
    assert (
        "first pending -> slurmd Ready in 20 s (between 6 and 33 s)" in check_scale_up(handoff_timeline(samples)).detail
    )


def test_a_slurm_job_requeued_after_a_failure_has_not_finished():
    """NODE_FAIL then PENDING again (Slurm requeues it): slurmd going away is no GPU return."""
    samples = handoff_samples()
    samples[4] = replace(samples[4], slurm_jobs=(smoke("NODE_FAIL"),))
    samples[5] = replace(samples[5], slurm_jobs=(smoke("PENDING", ()),))
    samples[6] = replace(samples[6], slurm_jobs=(smoke("PENDING", ()),))
    check = check_gpu_return(handoff_timeline(samples))
    assert not check.passed and check.detail == "a Slurm job never finished"


def test_one_unfinished_slurm_job_among_finished_ones_fails_the_gpu_return():
    tl = handoff_timeline()
    tl.submissions.append(Submission("stuck", "slurm", 5, 1, "8"))
    tl.samples = [replace(s, slurm_jobs=(*s.slurm_jobs, SlurmJob("8", "stuck", "RUNNING"))) for s in tl.samples]
    check = check_gpu_return(tl)
    assert not check.passed and check.detail == "a Slurm job never finished"


def test_a_slurm_job_gone_from_squeue_after_it_finished_stays_finished():
    samples = handoff_samples()
    samples[6] = replace(samples[6], slurm_jobs=())  # squeue forgets completed jobs after MinJobAge
    check = check_gpu_return(handoff_timeline(samples))
    assert check.passed and check.detail == "last Slurm job done -> slurmd gone in 310 s (between 300 and 320 s)"


def test_without_slurm_submissions_the_gpu_return_is_unproven():
    tl = handoff_timeline()
    tl.submissions = [s for s in tl.submissions if s.kind != "slurm"]
    assert not check_gpu_return(tl).passed


def test_the_plan_describes_each_check_it_will_run():
    assert describe_checks(Expectations(slurm=True, queueing=True, handoff=True)) == [
        "run ends before the timeout and was not interrupted",
        "every submitted job finished successfully",
        "every pod that held a GPU had its GPU UUID read from inside it",
        "no GPU UUID held by two pods at overlapping times",
        "every process on a GPU runs in a pod allocated that GPU, one pod per GPU at a time (the probe)",
        "dcgm-exporter's pod per GPU: one at a time, and the GPU the pod read (a second record)",
        "slurmd scaled up after work pended (scale-up latency: first pending -> slurmd Ready)",
        "slurmd scaled to 0 after the last Slurm job (GPU return latency: last Slurm job done -> slurmd gone)",
        "work beyond the GPUs waited while every GPU was held, then ran",
        "a GPU held by slurmd was later held by a Kubernetes job",
    ]
    assert len(describe_checks(Expectations(slurm=False, queueing=False, handoff=False))) == 6


def test_the_plan_promises_exactly_the_checks_evaluate_runs():
    """Every combination of expectations: one promise per check run, in the same order, and each
    promise a different check (describe_checks and evaluate read one table)."""
    for slurm, queueing, handoff, leak, nccl in product((False, True), repeat=5):
        exp = Expectations(slurm, queueing, handoff, ("probe",) if leak else (), (("nccl", "slurm"),) if nccl else ())
        promises, checks = describe_checks(exp), evaluate(handoff_timeline(), exp)
        assert len(promises) == len(checks) == len({c.name for c in checks}) == len(set(promises)), exp
        assert len(checks) == 6 + 2 * slurm + queueing + handoff + leak + nccl, exp


def test_handoff_names_the_gpus_handed_over_and_says_why_not():
    passed = check_handoff(handoff_timeline())
    assert (passed.name, passed.passed, passed.detail) == (
        "GPU handed from Slurm to Kubernetes",
        True,
        "1 GPU(s): GPU-a",
    )
    samples = handoff_samples()
    samples[8] = replace(samples[8], gpu_pods=(kube_pod("ddp", "master-0", 1, GPU_B),))
    failed = check_handoff(handoff_timeline(samples))
    assert (failed.name, failed.passed, failed.detail) == (
        "GPU handed from Slurm to Kubernetes",
        False,
        "no GPU went from slurmd to a Kubernetes job",
    )


def test_a_kubernetes_pod_seen_in_slurmds_last_sample_is_no_handoff():
    """Seen together in one sample, the two held the GPU at once: that is a clash, not a hand-off."""
    samples = [s for s in handoff_samples() if s.t <= 340]
    samples[-1] = replace(samples[-1], gpu_pods=(*samples[-1].gpu_pods, kube_pod("ddp", "master-0", 0, GPU_A)))
    assert not check_handoff(handoff_timeline(samples)).passed


def test_slurmd_is_gone_only_with_no_replica_and_no_pod():
    assert slurmd_gone(sample(0))
    assert not slurmd_gone(sample(0, 0, 0, pods=[slurmd_pod(0, GPU_A, phase="Terminating")]))
    assert not slurmd_gone(sample(0, 1, 0))


def test_queue_check_names_every_job_that_waited():
    tl = queue_timeline(late_job_starts=True)
    tl.submissions.append(Submission("later", "Job", 0, 1, "later"))
    tl.samples = [
        replace(s, kube_jobs=(*s.kube_jobs, KubeJob("Job", "later", "running" if s.t >= 20 else "pending")))
        for s in tl.samples
    ]
    check = check_queued_work(tl)
    assert (check.name, check.passed, check.detail) == (
        "queued work waited, then ran",
        True,
        "late waited 20 s, later waited 20 s",
    )
    never = check_queued_work(queue_timeline(late_job_starts=False))
    assert (never.name, never.passed) == ("queued work waited, then ran", False)
    idle = check_queued_work(handoff_timeline())
    assert (idle.name, idle.passed, idle.detail) == (
        "queued work waited, then ran",
        False,
        "no job ever waited while all GPUs were held",
    )


def test_without_a_pending_slurm_job_scale_up_is_unproven():
    samples = [replace(s, slurm_jobs=()) for s in handoff_samples()]
    check = check_scale_up(handoff_timeline(samples))
    assert (check.name, check.passed, check.detail) == (
        "slurmd scaled up",
        False,
        "no Slurm job pended, or slurmd never became Ready after it",
    )
    ok = check_scale_up(handoff_timeline())
    assert (ok.name, ok.passed, ok.detail) == (
        "slurmd scaled up",
        True,
        "first pending -> slurmd Ready in 20 s (between 10 and 30 s)",
    )

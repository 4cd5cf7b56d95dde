"""Builders for constructed timelines: each test states only what matters to it."""

from __future__ import annotations

from validation.timeline import KUBERNETES, SLURMD, GpuPod, KubeJob, Sample, SlurmJob, Submission, Timeline

GPU_A, GPU_B = "GPU-a", "GPU-b"


def slurmd_pod(index: int, uuid: str = "", *, uid: str | None = None, phase: str = "Running") -> GpuPod:
    return GpuPod(
        "slurm",
        f"slurm-worker-slinky-{index}",
        uid or f"slurmd-{index}",
        f"gpu-worker-{index}",
        phase,
        SLURMD,
        f"slinky-{index}",
        "slurmd",
        (uuid,) if uuid else (),
    )


def kube_pod(job: str, replica: str, node: int, uuid: str = "", *, phase: str = "Running") -> GpuPod:
    return GpuPod(
        "default",
        f"{job}-{replica}",
        f"{job}-{replica}-uid",
        f"gpu-worker-{node}",
        phase,
        KUBERNETES,
        job,
        "pytorch",
        (uuid,) if uuid else (),
    )


def sample(t: float, replicas: int = 0, ready: int = 0, slurm=(), kube=(), pods=()) -> Sample:
    return Sample(t, replicas, ready, tuple(slurm), tuple(kube), tuple(pods))


def smoke(state: str, nodes: tuple[str, ...] = ("slinky-0",)) -> SlurmJob:
    return SlurmJob("7", "smoke", state, nodes)


def handoff_samples() -> list[Sample]:
    """A clean hand-off on 2 GPUs: a Slurm job on slinky-0, cooldown, slurmd gone, a PyTorchJob on both."""
    return [
        sample(0),
        sample(10, 1, 0, [smoke("PENDING", ())], pods=[slurmd_pod(0, phase="Pending")]),
        sample(20, 1, 0, [smoke("PENDING", ())], pods=[slurmd_pod(0, GPU_A)]),
        sample(30, 1, 1, [smoke("RUNNING")], pods=[slurmd_pod(0, GPU_A)]),
        sample(40, 1, 1, [smoke("COMPLETED")], pods=[slurmd_pod(0, GPU_A)]),
        sample(340, 1, 1, [smoke("COMPLETED")], pods=[slurmd_pod(0, GPU_A)]),
        sample(350, 0, 0, [smoke("COMPLETED")]),
        sample(
            360, 0, 0, [], [KubeJob("PyTorchJob", "ddp", "pending")], [kube_pod("ddp", "master-0", 0, phase="Pending")]
        ),
        sample(
            370,
            0,
            0,
            [],
            [KubeJob("PyTorchJob", "ddp", "running")],
            [kube_pod("ddp", "master-0", 0, GPU_A), kube_pod("ddp", "worker-0", 1, GPU_B)],
        ),
        sample(400, 0, 0, [], [KubeJob("PyTorchJob", "ddp", "succeeded")]),
    ]


def handoff_timeline(samples: list[Sample] | None = None) -> Timeline:
    subs = [Submission("smoke", "slurm", 5, 1, "7"), Submission("ddp", "PyTorchJob", 355, 2, "ddp")]
    return Timeline("handoff", 2, 10, "2026-01-01T00:00:00+00:00", samples or handoff_samples(), subs)

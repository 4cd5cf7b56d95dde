"""Builders for constructed timelines: each test states only what matters to it."""

from __future__ import annotations

from validation.timeline import (
    KUBERNETES,
    SLURMD,
    DcgmHolding,
    GpuPod,
    GpuProcess,
    KubeJob,
    Sample,
    SlurmJob,
    Submission,
    Timeline,
)

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


def sample(t: float, replicas: int = 0, ready: int = 0, slurm=(), kube=(), pods=(), procs=None) -> Sample:
    """A sample; by default the probe sees a process in every Running pod that holds a read GPU
    (slurmd pods only while a Slurm job runs on them)."""
    if procs is None:
        busy = {n for j in slurm if j.state == "RUNNING" for n in j.nodes}
        procs = [
            proc(u, p.uid, p.node)
            for p in pods
            if p.phase == "Running" and (p.holder == KUBERNETES or p.owner in busy)
            for u in p.uuids
        ]
    return Sample(t, replicas, ready, tuple(slurm), tuple(kube), tuple(pods), processes=tuple(procs), probed=True)


def proc(uuid: str, pod_uid: str, node: str = "gpu-worker-0", pid: int = 4000) -> GpuProcess:
    return GpuProcess(uuid, pid, node, pod_uid)


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


def handoff_dcgm() -> list[DcgmHolding]:
    """dcgm-exporter's record of the same hand-off, scraped every 15 s."""
    return [
        DcgmHolding(GPU_A, "slurm/slurm-worker-slinky-0", 15, 345),
        DcgmHolding(GPU_A, "default/ddp-master-0", 375, 390),
        DcgmHolding(GPU_B, "default/ddp-worker-0", 375, 390),
    ]


def handoff_timeline(samples: list[Sample] | None = None, dcgm: list[DcgmHolding] | None = None) -> Timeline:
    subs = [Submission("smoke", "slurm", 5, 1, "7"), Submission("ddp", "PyTorchJob", 355, 2, "ddp")]
    timeline = Timeline("handoff", 2, 10, "2026-01-01T00:00:00+00:00", samples or handoff_samples(), subs)
    timeline.dcgm = handoff_dcgm() if dcgm is None else dcgm
    return timeline

"""The EC2 instance types the testbed accepts or knowingly refuses, with their specifications.

One catalogue, read by the settings rules (control and worker types) and nowhere else.
Recorded 2026-12 from the AWS "Amazon EC2 instance type specifications" pages (vCPU, memory,
GPU count) and cross-checked for GPU model and count against
vantage-sh/ec2instances.info@4fd40665:scraper/aws/ec2/gpu_data.go. A type missing here is
refused with the list of accepted ones: add it here, with its specification, to use it.
"""

from __future__ import annotations

from dataclasses import dataclass

CATALOGUE_DATED = "2026-12"

# NVIDIA GPU generations, oldest first. The bootstrap installs the `-open` kernel modules
# (components/scripts/gpu-worker.sh), which support Turing and later only (NVIDIA Driver
# Installation Guide, "Kernel Modules"): Kepler, Maxwell and Volta GPUs do not initialise.
GPU_GENERATIONS = ("Kepler", "Maxwell", "Volta", "Turing", "Ampere", "Ada Lovelace", "Hopper")
OPEN_MODULE_FIRST_GENERATION = "Turing"

# The node AMI is Canonical Ubuntu 24.04 amd64 (components/ec2.py), so every node is x86_64.
NODE_ARCHITECTURE = "x86_64"
GPUS_PER_WORKER = 1  # one slurmd pod and one GRES gpu per worker: KEDA and Kueue count workers as GPUs

# kubeadm's preflight minimum for a control-plane node is 2 CPUs and 1700 MiB
# (kubernetes/kubernetes@v1.34.0:cmd/kubeadm/app/constants/constants.go ControlPlaneNumCPU,
# ControlPlaneMem); 4 GiB leaves room for etcd, the API server, slurmctld and Prometheus.
MIN_CONTROL_VCPU = 2
MIN_CONTROL_MEMORY_GIB = 4


@dataclass(frozen=True)
class InstanceType:
    vcpu: int
    memory_gib: float
    architecture: str  # "x86_64" or "arm64"
    gpu_count: int = 0
    gpu_vendor: str = ""  # "NVIDIA", "AMD"
    gpu_model: str = ""
    gpu_generation: str = ""  # one of GPU_GENERATIONS for NVIDIA GPUs


def _nvidia(vcpu: int, memory_gib: float, gpus: int, model: str, generation: str) -> InstanceType:
    return InstanceType(vcpu, memory_gib, NODE_ARCHITECTURE, gpus, "NVIDIA", model, generation)


def _cpu(vcpu: int, memory_gib: float, architecture: str = NODE_ARCHITECTURE) -> InstanceType:
    return InstanceType(vcpu, memory_gib, architecture)


T4, A10G, L4, L40S = "Tesla T4", "A10G", "L4", "L40S"

CATALOGUE: dict[str, InstanceType] = {
    # General purpose and compute optimised (control-plane candidates)
    "t3.micro": _cpu(2, 1),
    "t3.small": _cpu(2, 2),
    "t3.medium": _cpu(2, 4),
    "t3.large": _cpu(2, 8),
    "t3.xlarge": _cpu(4, 16),
    "t3.2xlarge": _cpu(8, 32),
    "t3a.medium": _cpu(2, 4),
    "t3a.large": _cpu(2, 8),
    "t3a.xlarge": _cpu(4, 16),
    "t4g.medium": _cpu(2, 4, "arm64"),
    "m5.large": _cpu(2, 8),
    "m5.xlarge": _cpu(4, 16),
    "m6i.large": _cpu(2, 8),
    "m6i.xlarge": _cpu(4, 16),
    "m7i.large": _cpu(2, 8),
    "m7i.xlarge": _cpu(4, 16),
    "m6g.large": _cpu(2, 8, "arm64"),
    "c5.large": _cpu(2, 4),
    "c5.xlarge": _cpu(4, 8),
    "c6i.large": _cpu(2, 4),
    "c6i.xlarge": _cpu(4, 8),
    "r5.large": _cpu(2, 16),
    # G4dn: NVIDIA T4 (Turing)
    "g4dn.xlarge": _nvidia(4, 16, 1, T4, "Turing"),
    "g4dn.2xlarge": _nvidia(8, 32, 1, T4, "Turing"),
    "g4dn.4xlarge": _nvidia(16, 64, 1, T4, "Turing"),
    "g4dn.8xlarge": _nvidia(32, 128, 1, T4, "Turing"),
    "g4dn.16xlarge": _nvidia(64, 256, 1, T4, "Turing"),
    "g4dn.12xlarge": _nvidia(48, 192, 4, T4, "Turing"),
    "g4dn.metal": _nvidia(96, 384, 8, T4, "Turing"),
    # G5: NVIDIA A10G (Ampere)
    "g5.xlarge": _nvidia(4, 16, 1, A10G, "Ampere"),
    "g5.2xlarge": _nvidia(8, 32, 1, A10G, "Ampere"),
    "g5.4xlarge": _nvidia(16, 64, 1, A10G, "Ampere"),
    "g5.8xlarge": _nvidia(32, 128, 1, A10G, "Ampere"),
    "g5.16xlarge": _nvidia(64, 256, 1, A10G, "Ampere"),
    "g5.12xlarge": _nvidia(48, 192, 4, A10G, "Ampere"),
    "g5.24xlarge": _nvidia(96, 384, 4, A10G, "Ampere"),
    "g5.48xlarge": _nvidia(192, 768, 8, A10G, "Ampere"),
    # G6 and Gr6: NVIDIA L4 (Ada Lovelace)
    "g6.xlarge": _nvidia(4, 16, 1, L4, "Ada Lovelace"),
    "g6.2xlarge": _nvidia(8, 32, 1, L4, "Ada Lovelace"),
    "g6.4xlarge": _nvidia(16, 64, 1, L4, "Ada Lovelace"),
    "g6.8xlarge": _nvidia(32, 128, 1, L4, "Ada Lovelace"),
    "g6.16xlarge": _nvidia(64, 256, 1, L4, "Ada Lovelace"),
    "g6.12xlarge": _nvidia(48, 192, 4, L4, "Ada Lovelace"),
    "g6.48xlarge": _nvidia(192, 768, 8, L4, "Ada Lovelace"),
    "gr6.4xlarge": _nvidia(16, 128, 1, L4, "Ada Lovelace"),
    "gr6.8xlarge": _nvidia(32, 256, 1, L4, "Ada Lovelace"),
    # G6e: NVIDIA L40S (Ada Lovelace)
    "g6e.xlarge": _nvidia(4, 32, 1, L40S, "Ada Lovelace"),
    "g6e.2xlarge": _nvidia(8, 64, 1, L40S, "Ada Lovelace"),
    "g6e.4xlarge": _nvidia(16, 128, 1, L40S, "Ada Lovelace"),
    "g6e.8xlarge": _nvidia(32, 256, 1, L40S, "Ada Lovelace"),
    "g6e.16xlarge": _nvidia(64, 512, 1, L40S, "Ada Lovelace"),
    "g6e.12xlarge": _nvidia(48, 384, 4, L40S, "Ada Lovelace"),
    # P: data-centre GPUs
    "p3.2xlarge": _nvidia(8, 61, 1, "Tesla V100", "Volta"),
    "p3.8xlarge": _nvidia(32, 244, 4, "Tesla V100", "Volta"),
    "p4d.24xlarge": _nvidia(96, 1152, 8, "A100", "Ampere"),
    "p5.4xlarge": _nvidia(16, 256, 1, "H100", "Hopper"),
    "p5.48xlarge": _nvidia(192, 2048, 8, "H100", "Hopper"),
    # Older NVIDIA generations and other vendors: refused with the reason
    "p2.xlarge": _nvidia(4, 61, 1, "Tesla K80", "Kepler"),
    "g3s.xlarge": _nvidia(4, 30.5, 1, "Tesla M60", "Maxwell"),
    "g4ad.xlarge": InstanceType(4, 16, NODE_ARCHITECTURE, 1, "AMD", "Radeon Pro V520"),
    "g4ad.2xlarge": InstanceType(8, 32, NODE_ARCHITECTURE, 1, "AMD", "Radeon Pro V520"),
    "g5g.xlarge": InstanceType(4, 8, "arm64", 1, "NVIDIA", "T4G", "Turing"),
    "g5g.2xlarge": InstanceType(8, 16, "arm64", 1, "NVIDIA", "T4G", "Turing"),
}


# The share of an instance's listed memory a job may ask on it: slurmd reports RealMemory as the
# system's physical pages (SchedMD/slurm@slurm-25-11-6-1: src/slurmd/slurmd/get_mach_stat.c
# get_memory, sysconf(_SC_PHYS_PAGES): the kernel's MemTotal), which is less than the listed GiB
# (firmware and the kernel keep part). The exact
# figure of a type is seen only on a live node (`slurmd -C`); 90 % keeps a request that passes
# job_submit.lua's check within it (docs/handoff.md).
SLURM_MEMORY_SHARE = 0.9


def slurm_memory_mb(name: str) -> int:
    """The most memory (MiB) job_submit.lua lets a job ask on one node of type `name`."""
    return int(CATALOGUE[name].memory_gib * 1024 * SLURM_MEMORY_SHARE)


def control_problem(name: str) -> str | None:
    """None if `name` can run the control plane, else what is wrong with it."""
    spec = CATALOGUE[name]
    if spec.gpu_count:
        return "is a GPU type; the control node runs no GPU work (the control-plane taint keeps it off)"
    if spec.architecture != NODE_ARCHITECTURE:
        return f"is {spec.architecture}; the node image is Ubuntu 24.04 {NODE_ARCHITECTURE}"
    if spec.vcpu < MIN_CONTROL_VCPU or spec.memory_gib < MIN_CONTROL_MEMORY_GIB:
        return (
            f"has {spec.vcpu} vCPU and {spec.memory_gib:g} GiB; the control plane needs at least "
            f"{MIN_CONTROL_VCPU} vCPU and {MIN_CONTROL_MEMORY_GIB} GiB"
        )
    return None


def worker_problem(name: str) -> str | None:
    """None if `name` is a GPU worker the bootstrap supports, else what is wrong with it."""
    spec = CATALOGUE[name]
    if spec.gpu_count == 0:
        return "has no GPU"
    if spec.gpu_vendor != "NVIDIA":
        return f"has an {spec.gpu_vendor} {spec.gpu_model} GPU; the workers run the NVIDIA driver and device plugin"
    if spec.architecture != NODE_ARCHITECTURE:
        return f"is {spec.architecture}; the node image is Ubuntu 24.04 {NODE_ARCHITECTURE}"
    if GPU_GENERATIONS.index(spec.gpu_generation) < GPU_GENERATIONS.index(OPEN_MODULE_FIRST_GENERATION):
        return (
            f"has a {spec.gpu_model} ({spec.gpu_generation}); the open NVIDIA kernel modules the workers "
            f"install support {OPEN_MODULE_FIRST_GENERATION} and later only"
        )
    if spec.gpu_count != GPUS_PER_WORKER:
        return (
            f"has {spec.gpu_count} GPUs; each worker must have exactly one (one slurmd pod and one GRES "
            "gpu per worker, KEDA counts workers as GPUs)"
        )
    return None


def accepted_controls() -> list[str]:
    return [n for n in CATALOGUE if control_problem(n) is None]


def accepted_workers() -> list[str]:
    return [n for n in CATALOGUE if worker_problem(n) is None]

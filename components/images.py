"""The images every GPU worker pulls during its bootstrap, so that neither the first slurmd
scale-up nor the first example job waits for a multi-GB pull: the readiness gate waits for
every node's bootstrap, so the stack is ready only once they are on every worker."""

from __future__ import annotations

from pathlib import Path

import yaml

from components import slinky, training_operator

JOBS_DIR = Path(__file__).resolve().parent.parent / "jobs" / "kubernetes"


def _pod_specs(obj: dict) -> list[dict]:
    spec = obj.get("spec", {})
    if obj.get("kind") == "PyTorchJob":
        return [r["template"]["spec"] for r in spec["pytorchReplicaSpecs"].values()]
    return [spec["template"]["spec"]]


def example_job_images(jobs_dir: Path = JOBS_DIR) -> list[str]:
    """Every container image the example Kubernetes jobs run."""
    images = []
    for path in sorted(jobs_dir.glob("*.yaml")):
        for obj in yaml.safe_load_all(path.read_text()):
            for pod in _pod_specs(obj):
                images += [c["image"] for c in (*pod.get("initContainers", []), *pod["containers"])]
    return images


def worker_images(slurm_image_tag: str) -> tuple[str, ...]:
    """slurmd (following slurmImageTag), the example jobs' images, and the init container the
    Training Operator adds to every PyTorchJob Worker; each once, in a stable order."""
    slurmd = f"{slinky.IMAGES}/slurmd:{slurm_image_tag}"  # as slinky.slurm_values sets it (tested)
    found = [slurmd, *example_job_images(), training_operator.INIT_CONTAINER_IMAGE]
    return tuple(dict.fromkeys(found))

"""The images every GPU worker pulls during its bootstrap, so that neither the first slurmd
scale-up nor the first example job waits for a multi-GB pull: the readiness gate waits for
every node's bootstrap, so the stack is ready only once they are on every worker."""

from __future__ import annotations

import functools
from pathlib import Path

from components import training_operator
from core import trusted_yaml
from core.names import GPU_RESOURCE

JOBS_DIR = Path(__file__).resolve().parent.parent / "jobs" / "kubernetes"


def _pod_specs(obj: dict) -> list[dict]:
    spec = obj.get("spec", {})
    if obj.get("kind") == "PyTorchJob":
        return [r["template"]["spec"] for r in spec["pytorchReplicaSpecs"].values()]
    return [spec["template"]["spec"]]


def _example_jobs(jobs_dir: Path) -> list[dict]:
    # parsed once per version of the files: the twin asks for them on every run it sets up
    files = tuple((path, path.stat().st_mtime_ns) for path in sorted(jobs_dir.glob("*.yaml")))
    return _parsed_jobs(files)


@functools.cache
def _parsed_jobs(files: tuple[tuple[Path, int], ...]) -> list[dict]:
    return [obj for path, _ in files for obj in trusted_yaml.load_all(path.read_text())]


def example_job_images(jobs_dir: Path = JOBS_DIR) -> list[str]:
    """Every container image the example Kubernetes jobs run."""
    images = []
    for obj in _example_jobs(jobs_dir):
        for pod in _pod_specs(obj):
            images += [c["image"] for c in (*pod.get("initContainers", []), *pod["containers"])]
    return images


def example_gpu_images(jobs_dir: Path = JOBS_DIR) -> dict[str, str]:
    """By kind (PyTorchJob, Job): the image of the first example job's container that asks for a GPU."""
    found: dict[str, str] = {}
    for obj in _example_jobs(jobs_dir):
        for pod in _pod_specs(obj):
            for c in pod["containers"]:
                if GPU_RESOURCE in c.get("resources", {}).get("limits", {}):
                    found.setdefault(obj["kind"], c["image"])
    return found


def nodeset_pod_images(slurm_values: dict) -> list[str]:
    """Both images of a slurmd pod in the rendered slurm chart values: slurmd, and the `logfile`
    sidecar the operator adds as an init container with restartPolicy Always
    (SlinkyProject/slurm-operator@v1.0.0:internal/builder/worker_app.go, common.go logfileContainer;
    helm/slurm/templates/nodeset/nodeset-cr.yaml)."""
    nodesets = [n for n in slurm_values["nodesets"].values() if n.get("enabled")]
    return [f"{c['image']['repository']}:{c['image']['tag']}" for n in nodesets for c in (n["slurmd"], n["logfile"])]


def worker_images(slurm_values: dict) -> tuple[str, ...]:
    """The slurmd pod's images (following slurmImageTag), the example jobs' images, and the init
    container the Training Operator adds to every PyTorchJob Worker; each once, in a stable order."""
    found = [*nodeset_pod_images(slurm_values), *example_job_images(), training_operator.INIT_CONTAINER_IMAGE]
    return tuple(dict.fromkeys(found))

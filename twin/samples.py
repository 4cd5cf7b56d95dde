"""The twin's samples: every SAMPLE_INTERVAL seconds, what a live run's timeline would record (the
NodeSet's replicas, each job's state, each GPU pod), in validation/timeline.py's shape."""

from __future__ import annotations

from twin import kube as k8s
from twin.slurm import REFUSED, RUNNING, SlurmJob
from twin.world import World, gpu_uuid

SAMPLE_INTERVAL = 15.0


class Sampler:
    def __init__(self) -> None:
        self.samples: list[dict] = []
        # Each job's last sample row and what it was built from: a sample builds only the rows of
        # jobs that changed since (a pending array task stays pending for hours).
        self._rows: dict[int, tuple[object, dict]] = {}

    def sample(self, world: World, now: float) -> None:
        self.samples.append(self._sample(world, now))

    def _sample(self, world: World, now: float) -> dict:
        return {
            "t": now,
            "nodeset_replicas": world.nodeset.replicas,
            "slurmd_ready": sum(1 for p in world.nodeset.pods() if p.owner in world.slurm.nodes),
            "slurm_jobs": self._slurm_rows(world),
            "kube_jobs": self._kube_rows(world, now),
            "gpu_pods": [
                {
                    "namespace": world.setup.namespace if p.holder == k8s.SLURMD else "default",
                    "name": p.name,
                    "uid": f"{p.name}@{p.created:g}",
                    "node": f"gpu-worker-{p.gpu}" if p.gpu is not None else "",
                    "phase": "Running" if p.running(now) else "Pending",
                    "holder": p.holder,
                    "owner": p.owner,
                    "container": "slurmd" if p.holder == k8s.SLURMD else "pytorch",
                    "uuids": [gpu_uuid(p.gpu)] if p.gpu is not None and p.running(now) else [],
                }
                for p in world.kube.live_pods()
            ],
        }

    def _slurm_rows(self, world: World) -> list[dict]:
        """Each Slurm job's sample row, the same object while its state and nodes are the same."""
        out, rows = [], self._rows
        for j in world.slurm.jobs:
            last = rows.get(id(j))
            if last is None or last[0] != (j.state, j.nodes):
                last = rows[id(j)] = ((j.state, j.nodes), _slurm_row(j))
            out.append(last[1])
        return out

    def _kube_rows(self, world: World, now: float) -> list[dict]:
        """Each Kubernetes job's sample row, the same object while its phase is the same."""
        out, rows = [], self._rows
        for j in world.kube.jobs:
            phase, last = _kube_phase(j, now), rows.get(id(j))
            if last is None or last[0] != phase:
                last = rows[id(j)] = (phase, {"kind": j.kind, "name": j.name, "phase": phase})
            out.append(last[1])
        return out


def _slurm_row(j: SlurmJob) -> dict:
    return {
        "job_id": str(j.job_id),
        "name": j.spec.name,
        "state": "CANCELLED" if j.state == REFUSED else j.state,
        "nodes": list(j.nodes) if j.state == RUNNING else [],
    }


def _kube_phase(j: k8s.KubeJob, now: float) -> str:
    if j.finished is not None:
        return "succeeded"
    return "running" if j.started is not None else "pending"

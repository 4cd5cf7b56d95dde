"""The Slinky 1.0.0 NodeSet controller: slurmd pods for `.spec.replicas`, drain-first scale-in.

Followed: SlinkyProject/slurm-operator@v1.0.0
* internal/controller/nodeset/nodeset_sync.go: scale-out un-cordons and un-drains every existing
  pod, then creates pods at the lowest free ordinals (doPodScaleOut); scale-in sorts the pods,
  un-cordons the ones kept, and for each condemned pod drains its Slurm node and deletes the pod
  only once `IsNodeDrained` (processCondemned, doPodScaleIn).
* internal/controller/nodeset/utils/sort.go (ActivePods.Less): unassigned first, Pending before
  Running, not ready before ready, earlier Slurm deadline first (none = idle = first), cordoned
  first, then the highest ordinal.
* A slurmd pod gated by Kueue is an active pod like any other: it counts toward `.spec.replicas`
  (nodeset_sync.go), and as unassigned and Pending it is condemned first on scale-in (sort.go).
* internal/controller/nodeset/slurmcontrol/slurmcontrol.go: with no Slurm client, MakeNodeDrain
  does nothing, IsNodeDrained returns true and GetNodeDeadlines is empty.
* internal/controller/slurmclient/slurmclient_sync.go: the client exists only while the restapi
  Deployment has a ready replica.
* internal/builder/worker_app.go: slurmd's preStop sets its Slurm node down (`twin.slurm.node_gone`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from twin.kube import SLURMD, Kubernetes, Pod
from twin.slurm import Slurmctld

SLURMD_REGISTER = 15.0  # slurmd Running -> Slurm node registered (assumption)


@dataclass
class NodeSetController:
    pod_prefix: str  # slurm-worker-slinky
    host_prefix: str  # slinky (the Slurm node name is <host_prefix>-<ordinal>)
    kube: Kubernetes
    slurm: Slurmctld
    replicas: int = 0
    cordoned: set[str] = field(default_factory=set)
    starts: int = 0
    register_delay: float = SLURMD_REGISTER

    def pods(self) -> list[Pod]:
        """Active pods: live and not being deleted."""
        return [p for p in self.kube.live_pods() if p.holder == SLURMD and p.terminating_at is None]

    def _ordinal(self, pod: Pod) -> int:
        return int(pod.name.rsplit("-", 1)[1])

    def reconcile(self, now: float, client: bool, can_create: bool = True) -> list[str]:
        """One sync; returns the Slurm jobs killed by pods deleted under them. `can_create` false:
        the API server refuses new pods (Kueue's pod webhook, failurePolicy Fail, is down); the
        controller tries again on its next sync."""
        killed: list[str] = []
        for pod in self.pods():
            if pod.running(now) and now >= pod.running_at + self.register_delay:
                self.slurm.register(pod.owner, now)
        pods = self.pods()
        if len(pods) < self.replicas:
            for pod in pods:
                self._uncordon(pod, client)
            if not can_create:
                return killed
            used = {self._ordinal(p) for p in pods} | {
                self._ordinal(p) for p in self.kube.live_pods() if p.holder == SLURMD
            }
            ordinal = 0
            for _ in range(self.replicas - len(pods)):
                while ordinal in used:
                    ordinal += 1
                used.add(ordinal)
                self.kube.create_pod(
                    Pod(f"{self.pod_prefix}-{ordinal}", SLURMD, f"{self.host_prefix}-{ordinal}", "slurmd", now)
                )
                self.starts += 1
        elif len(pods) > self.replicas:
            ordered = sorted(pods, key=lambda p: self._victim_key(p, now, client))
            condemned, kept = ordered[: len(pods) - self.replicas], ordered[len(pods) - self.replicas :]
            for pod in kept:
                self._uncordon(pod, client)
            for pod in condemned:
                drained = True if not client else self.slurm.is_drained(pod.owner)
                if pod.running(now) and not drained:
                    self.cordoned.add(pod.name)
                    self.slurm.set_drain(pod.owner, True)  # MakeNodeDrain: needs the client
                    continue
                self.kube.delete(pod, now)
                self.cordoned.discard(pod.name)
                killed += [j.spec.name for j in self.slurm.node_gone(pod.owner, now)]
        else:
            for pod in pods:
                self._uncordon(pod, client)
        return killed

    def _uncordon(self, pod: Pod, client: bool) -> None:
        if pod.name in self.cordoned:
            self.cordoned.discard(pod.name)
        if client:
            self.slurm.set_drain(pod.owner, False)

    def _victim_key(self, pod: Pod, now: float, client: bool) -> tuple:
        deadline = self.slurm.deadline(pod.owner) if client else None
        return (
            pod.gpu is not None,  # unassigned first
            pod.running(now),  # Pending before Running
            pod.running(now) and pod.owner in self.slurm.nodes,  # not ready before ready
            deadline is not None,  # the zero deadline (idle) sorts before any real one
            deadline or 0.0,
            pod.name not in self.cordoned,  # cordoned first
            -self._ordinal(pod),  # highest ordinal first
        )

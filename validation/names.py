"""Names of the cluster objects the runner talks to.

The platform layer creates these; the defaults are what Slinky 1.0.0 builds for a release
`slurm` in namespace `slurm` (SlinkyProject/slurm-operator@v1.0.0: internal/builder/labels/labels.go
names the containers `slurmctld` and `slurmd`; helm/slurm/templates/nodeset/nodeset-cr.yaml
names the NodeSet `<release>-worker-<key>`).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SlurmNames:
    namespace: str = "slurm"
    controller_pod: str = "slurm-controller-0"
    controller_statefulset: str = "slurm-controller"
    controller_container: str = "slurmctld"
    controller_labels: str = "app.kubernetes.io/name=slurmctld,app.kubernetes.io/instance=slurm"
    nodeset: str = "slurm-worker-slinky"
    nodeset_group: str = "slinky.slurm.net"
    nodeset_version: str = "v1beta1"
    nodeset_plural: str = "nodesets"
    slurmd_labels: str = "app.kubernetes.io/name=slurmd"
    slurmd_container: str = "slurmd"
    # Slinky sets this label to the pod's hostname, which is also its Slurm node name
    # (slurm-operator@v1.0.0: api/v1beta1/well_known.go LabelNodeSetPodHostname).
    slurmd_hostname_label: str = "nodeset.slinky.slurm.net/pod-hostname"
    partition: str = "all"
    scaledobject: str = "slurmd"
    cooldown_seconds: int = 300
    training_namespace: str = "kubeflow"
    jobs_namespace: str = "default"
    shared_dir: str = "/mnt/share"

    def exec_prefix(self) -> str:
        """The `kubectl exec` that users type to reach slurmctld."""
        return (
            f"kubectl exec -i -n {self.namespace} {self.controller_pod} "
            f"-c {self.controller_container} --"
        )

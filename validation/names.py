"""Names of the cluster objects the runner talks to, taken from the platform layer's own
derivations (components/), so the runner and the deployment cannot drift apart."""

from __future__ import annotations

from dataclasses import dataclass

from components import host_layout, keda, slinky, training_operator
from components.slurm_names import DEFAULT_PARTITION, SLURMCTLD_CONTAINER, SLURMD_CONTAINER, label_selector
from stacks.settings import SETTINGS_BY_KEY

_PLATFORM = slinky.names("slinky")  # the nodesetName default


@dataclass(frozen=True)
class SlurmNames:
    namespace: str = _PLATFORM.namespace
    controller_pod: str = _PLATFORM.controller_pod
    controller_statefulset: str = _PLATFORM.controller_statefulset
    controller_container: str = SLURMCTLD_CONTAINER
    controller_labels: str = label_selector(_PLATFORM.slurmctld_selector)
    nodeset: str = _PLATFORM.nodeset_resource
    nodeset_group: str = "slinky.slurm.net"
    nodeset_version: str = "v1beta1"
    nodeset_plural: str = "nodesets"
    slurmd_labels: str = "app.kubernetes.io/name=slurmd"
    slurmd_container: str = SLURMD_CONTAINER
    # Slinky sets this label to the pod's hostname, which is also its Slurm node name
    # (slurm-operator@v1.0.0: api/v1beta1/well_known.go LabelNodeSetPodHostname).
    slurmd_hostname_label: str = "nodeset.slinky.slurm.net/pod-hostname"
    partition: str = DEFAULT_PARTITION
    scaledobject: str = keda.SCALED_OBJECT
    cooldown_seconds: int = SETTINGS_BY_KEY["kedaCooldownSeconds"].default
    training_namespace: str = training_operator.NAMESPACE
    jobs_namespace: str = "default"
    shared_dir: str = host_layout.SHARE_DIR

    def exec_prefix(self) -> str:
        """The `kubectl exec` that users type to reach slurmctld."""
        return f"kubectl exec -i -n {self.namespace} {self.controller_pod} -c {self.controller_container} --"

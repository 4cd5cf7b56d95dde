"""Object names the Slinky chart and operator derive from the release; derived here once.

Evidence: SlinkyProject/slurm-operator@v1.0.0 helm/slurm/templates/_helpers.tpl (fullname),
nodeset/nodeset-cr.yaml (`<fullname>-worker-<key>`), internal/builder/controller_app.go
(StatefulSet `<controller>-controller`, volumeClaimTemplate `statesave`, mount
/var/spool/slurmctld/<ClusterName>), internal/builder/labels/labels.go (labels)."""

from __future__ import annotations

from dataclasses import dataclass

CHART_NAME = "slurm"
DEFAULT_PARTITION = "all"  # the chart's partitions.all has Default=YES: plain `sbatch` lands there
SLURMCTLD_CONTAINER = "slurmctld"
SLURMD_CONTAINER = "slurmd"
STATESAVE_VOLUME = "statesave"


def helm_fullname(release: str, chart: str = CHART_NAME) -> str:
    """`slurm.fullname`: the release name if it contains the chart name, else `<release>-<chart>`."""
    name = release if chart in release else f"{release}-{chart}"
    return name[:63].rstrip("-")


@dataclass(frozen=True)
class SlurmNames:
    release: str
    namespace: str
    nodeset: str  # the key under `nodesets:`; also the Slurm partition and host prefix

    @property
    def fullname(self) -> str:
        return helm_fullname(self.release)

    @property
    def controller_statefulset(self) -> str:
        return f"{self.fullname}-controller"

    @property
    def controller_pod(self) -> str:
        return f"{self.controller_statefulset}-0"

    @property
    def statesave_claim(self) -> str:
        """The PVC the StatefulSet's volumeClaimTemplate creates for pod 0."""
        return f"{STATESAVE_VOLUME}-{self.controller_pod}"

    @property
    def nodeset_resource(self) -> str:
        return f"{self.fullname}-worker-{self.nodeset}"

    @property
    def cluster_name(self) -> str:
        return f"{self.namespace}_{self.fullname}"

    @property
    def slurmctld_selector(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": "slurmctld", "app.kubernetes.io/instance": self.fullname}

    @property
    def slurmd_selector(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": "slurmd", "app.kubernetes.io/instance": self.nodeset_resource}


def label_selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))

"""API server hardening that `kubeadm join` survives: pure renderers.

What is applied and what is left, with the reasons, is listed in docs/security-and-day2.md's "Security"
section; a test keeps that list and `APPLIED` here in step. kubeadm v1beta4 takes component
flags as lists of {name, value} and host mounts as extraVolumes {name, hostPath, mountPath,
readOnly, pathType} (kubernetes/kubernetes@v1.34.0:cmd/kubeadm/app/apis/kubeadm/v1beta4/types.go
ControlPlaneComponent, HostPathMount). CIS numbers are the CIS Kubernetes Benchmark v1.9's, as
kube-bench encodes them (aquasecurity/kube-bench@a73ce378:cfg/cis-1.9/master.yaml); the audit
log keeps less than its suggested 30 days / 10 files ("or as appropriate"): a small disk.
"""

from __future__ import annotations

import json

from core import names

CONFIG_DIR = "/etc/kubernetes/testbed"  # one read-only mount for both files below
AUDIT_POLICY_FILE = f"{CONFIG_DIR}/audit-policy.json"
ADMISSION_CONFIG_FILE = f"{CONFIG_DIR}/admission.json"
AUDIT_LOG_DIR = "/var/log/kubernetes/audit"
AUDIT_LOG_FILE = f"{AUDIT_LOG_DIR}/audit.log"
AUDIT_LOG_MAX_AGE_DAYS = 7
AUDIT_LOG_MAX_BACKUPS = 5
AUDIT_LOG_MAX_SIZE_MB = 100  # at most ~600 MB of audit log on the 40 GiB control volume
POD_SECURITY_LEVEL = "baseline"

# Namespaces whose pods need more than Pod Security `baseline`, and why (checked at the pins).
PRIVILEGED_NAMESPACES = {
    "kube-system": "kubeadm's static control-plane pods and kube-proxy use hostNetwork and hostPath",
    "kube-flannel": "Flannel uses hostNetwork, NET_ADMIN/NET_RAW and hostPath, and labels its namespace "
    "privileged (flannel-io/flannel@v0.27.4:Documentation/kube-flannel.yml)",
    names.DEVICE_PLUGIN_NAMESPACE: "the device plugin mounts the kubelet's device-plugins directory by hostPath "
    "(NVIDIA/k8s-device-plugin@v0.17.0:deployments/helm/nvidia-device-plugin/templates/daemonset-device-plugin.yml)",
    names.MONITORING_NAMESPACE: "node-exporter uses hostNetwork, hostPID and the host's root by hostPath "
    "(prometheus-community/helm-charts:charts/prometheus-node-exporter/values.yaml); dcgm-exporter adds "
    "SYS_ADMIN and mounts pod-resources by hostPath (NVIDIA/dcgm-exporter@4.4.2-4.7.1:deployment/values.yaml)",
    names.SLURM_NAMESPACE: "slurmd runs privileged (SlinkyProject/slurm-operator@v1.0.0:internal/builder/"
    "worker_app.go) and the Slurm pods mount the NFS share by hostPath",
}

# One line per applied item; docs/security-and-day2.md's Security section lists the same.
APPLIED = (
    "profiling off in the API server, controller manager and scheduler (CIS 1.2.15, 1.3.2, 1.4.1)",
    f"audit log {AUDIT_LOG_FILE}: metadata of every request, no bodies, rotated "
    f"({AUDIT_LOG_MAX_SIZE_MB} MB x {AUDIT_LOG_MAX_BACKUPS}, {AUDIT_LOG_MAX_AGE_DAYS} days) (CIS 1.2.16-1.2.19)",
    f"Pod Security `{POD_SECURITY_LEVEL}` enforced (and warned) on every namespace except those listed, "
    "`restricted` recorded in the audit log",
    "terminated pods garbage-collected beyond 1000 (CIS 1.3.1)",
)


def _args(**flags: str | int) -> list[dict[str, str]]:
    return [{"name": k.replace("_", "-"), "value": str(v)} for k, v in flags.items()]


def _mount(name: str, path: str, path_type: str, read_only: bool) -> dict:
    return {"name": name, "hostPath": path, "mountPath": path, "readOnly": read_only, "pathType": path_type}


def control_plane_files(kubernetes_minor: str) -> list[tuple[str, str]]:
    """(path, content) the control node needs before `kubeadm init` starts the API server.
    Compact JSON (which the API server reads as YAML): user-data has 16 KiB."""

    def compact(doc: dict) -> str:
        return json.dumps(doc, separators=(",", ":")) + "\n"

    return [
        (AUDIT_POLICY_FILE, compact(audit_policy())),
        (ADMISSION_CONFIG_FILE, compact(admission_configuration(kubernetes_minor))),
    ]


def cluster_configuration_fields() -> dict:
    """The hardening part of kubeadm's ClusterConfiguration (merged with certSANs by the caller).

    Left as kubeadm sets it: anonymous-auth (join discovery reads the kube-public cluster-info
    ConfigMap anonymously, and health probes call /livez and /readyz without credentials) and
    NodeRestriction among the admission plugins (kubeadm's default)."""
    return {
        "apiServer": {
            "extraArgs": _args(
                profiling="false",
                audit_policy_file=AUDIT_POLICY_FILE,
                audit_log_path=AUDIT_LOG_FILE,
                audit_log_maxage=AUDIT_LOG_MAX_AGE_DAYS,
                audit_log_maxbackup=AUDIT_LOG_MAX_BACKUPS,
                audit_log_maxsize=AUDIT_LOG_MAX_SIZE_MB,
                admission_control_config_file=ADMISSION_CONFIG_FILE,
            ),
            "extraVolumes": [
                _mount("testbed-config", CONFIG_DIR, "Directory", True),
                _mount("audit-log", AUDIT_LOG_DIR, "DirectoryOrCreate", False),
            ],
        },
        "controllerManager": {"extraArgs": _args(profiling="false", terminated_pod_gc_threshold=1000)},
        "scheduler": {"extraArgs": _args(profiling="false")},
    }


def audit_policy() -> dict:
    """A small policy: routine system traffic not at all, everything else at Metadata (who did
    what to which object, never a body, so no Secret or token lands in the log)."""
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [
            {"level": "None", "nonResourceURLs": ["/healthz*", "/livez*", "/readyz*", "/version"]},
            {"level": "None", "users": ["system:kube-proxy"], "verbs": ["watch"]},
            {"level": "None", "userGroups": ["system:nodes"], "verbs": ["get", "list", "watch"]},
            {
                "level": "None",
                "verbs": ["get", "update", "watch"],
                "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}],
            },
            {"level": "None", "resources": [{"group": "", "resources": ["events"]}]},
            {"level": "Metadata"},
        ],
    }


def admission_configuration(kubernetes_minor: str) -> dict:
    """Pod Security admission for the whole cluster, pinned to the cluster's minor."""
    version = f"v{kubernetes_minor}"
    return {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [
            {
                "name": "PodSecurity",
                "configuration": {
                    "apiVersion": "pod-security.admission.config.k8s.io/v1",
                    "kind": "PodSecurityConfiguration",
                    "defaults": {
                        "enforce": POD_SECURITY_LEVEL,
                        "enforce-version": version,
                        "audit": "restricted",
                        "audit-version": version,
                        "warn": POD_SECURITY_LEVEL,
                        "warn-version": version,
                    },
                    "exemptions": {"usernames": [], "runtimeClasses": [], "namespaces": sorted(PRIVILEGED_NAMESPACES)},
                },
            }
        ],
    }

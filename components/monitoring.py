"""Prometheus (kube-prometheus-stack: operator, ServiceMonitor CRD, Grafana) and dcgm-exporter.

Prometheus selects ServiceMonitors labelled `release: <release>`; the Slinky operator's
slurmctld ServiceMonitor and dcgm-exporter's carry that label."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from components import dashboard, helm, runnable_exporter, slurmd_scaling
from core import host_layout
from core.names import KUEUE_NAMESPACE, KUEUE_RELEASE, MONITORING_NAMESPACE, MONITORING_RELEASE, Names

PROMETHEUS_REPO = "https://prometheus-community.github.io/helm-charts"
DCGM_REPO = "https://nvidia.github.io/dcgm-exporter/helm-charts"
DASHBOARD_LABEL = ("grafana_dashboard", "1")  # the Grafana sidecar's default label


@dataclass
class RemoteWrite:
    """Where Prometheus writes the evidence (components/managed_prometheus.py)."""

    url: pulumi.Output[str]  # the workspace's remote-write URL
    region: str  # SigV4 signs for the workspace's region
    stack: str  # the external label every written series carries


@dataclass
class MonitoringArgs:
    kube_prometheus_stack_version: str
    dcgm_exporter_version: str
    names: Names  # the dashboard's queries name the Slurm and KEDA objects
    provider: k8s.Provider
    remote_write: RemoteWrite | None = None  # None: managedPrometheus false, metrics stay in the cluster


def stack_chart(version: str) -> helm.Chart:
    return helm.Chart(MONITORING_RELEASE, MONITORING_NAMESPACE, "kube-prometheus-stack", version, PROMETHEUS_REPO)


def dcgm_chart(version: str) -> helm.Chart:
    return helm.Chart("dcgm-exporter", MONITORING_NAMESPACE, "dcgm-exporter", version, DCGM_REPO)


def service_monitor_labels() -> dict[str, str]:
    """What kube-prometheus-stack's default serviceMonitorSelector matches."""
    return {"release": MONITORING_RELEASE}


def stack_values(version: str, n: Names) -> dict:
    """The stack's values, with the rules that alert while slurmctld's metrics, or another input of
    the scaling rule (Kueue's metrics, kube-state-metrics, slurmrestd, the runnable-jobs exporter), are missing
    (`additionalPrometheusRulesMap` becomes PrometheusRule objects the stack's Prometheus selects:
    prometheus-community/helm-charts@kube-prometheus-stack-80.9.2:charts/kube-prometheus-stack/
    templates/prometheus/additionalPrometheusRules.yaml)."""
    target = slurmd_scaling.scaling_target(n)
    rules = {
        "testbed-slurm-metrics": {"groups": [slurmd_scaling.metrics_alert_rules(target)]},
        "testbed-handoff-inputs": {"groups": [slurmd_scaling.input_alert_rules(target)]},
        "testbed-runnable-jobs": {"groups": [runnable_exporter.alert_rules(n)]},
    }
    return helm.merged_values(
        stack_chart(version), {"fullnameOverride": MONITORING_RELEASE, "additionalPrometheusRulesMap": rules}
    )


# The series worth keeping after the cluster is gone: who held each GPU and how busy it was
# (dcgm-exporter), what Slurm, Kueue and KEDA saw and decided, and the pods, nodes and HPA they
# acted on. Everything else (cAdvisor, the API server, node-exporter, kubelet) is dropped before
# it is written: a few thousand series instead of tens of thousands, which is what AMP charges by
# (samples ingested). A test checks that every series the dashboard and KEDA query is kept.
EVIDENCE_SERIES = (
    "DCGM_FI_.+",
    "slurm_.+",
    "testbed_slurm_.+",  # the runnable-jobs exporter (components/runnable_jobs.py)
    "kueue_.+",
    "keda_.+",
    "kube_pod_(status_phase|status_unschedulable|container_resource_requests|info|owner)",
    "kube_node_(info|status_condition)",
    "kube_deployment_status_replicas_available",
    "kube_horizontalpodautoscaler_(spec|status)_.+",
    "up",
)
# Histogram buckets multiply a series by its bucket count (Kueue's admission wait times): dropped;
# their _sum and _count stay.
DROPPED_SERIES = ".+_bucket"
STACK_LABEL = "testbed_stack"  # an external label: only written series carry it, local queries do not


def remote_write_values(url: str, region: str, stack: str) -> dict:
    """Prometheus' overrides for writing the evidence to the workspace with SigV4.

    sigv4 with only a region signs with the default AWS credential chain, which ends at the
    instance role (prometheus-operator 0.87.1, the CRD kube-prometheus-stack 80.9.2 ships:
    charts/crds/crds/crd-prometheuses.yaml remoteWrite[].sigv4: "If not specified, the
    environment variable AWS_ACCESS_KEY_ID is used", region "from the default credentials
    chain"). The role is the control node's: Prometheus runs there, in the host's network
    namespace, so it reaches IMDSv2 with the hop limit of 1 every node keeps (values.yaml
    prometheusSpec.hostNetwork).
    docs/evidence-and-budget.md says why this and not a hop limit of 2."""
    return {
        "prometheus": {
            "prometheusSpec": {
                "hostNetwork": True,
                # in-cluster names still resolve from the host's network namespace (set explicitly:
                # the chart's values.yaml says the operator does so, which this does not rely on)
                "dnsPolicy": "ClusterFirstWithHostNet",
                "nodeSelector": {host_layout.CONTROL_PLANE_NODE_LABEL: ""},
                "tolerations": [{"key": host_layout.CONTROL_PLANE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
                "externalLabels": {STACK_LABEL: stack},
                "remoteWrite": [
                    {
                        "url": url,
                        "sigv4": {"region": region},
                        "writeRelabelConfigs": [
                            {
                                "sourceLabels": ["__name__"],
                                "regex": "|".join(EVIDENCE_SERIES),
                                "action": "keep",
                            },
                            {"sourceLabels": ["__name__"], "regex": DROPPED_SERIES, "action": "drop"},
                        ],
                    }
                ],
            }
        }
    }


# dcgm-exporter watches every GPU of its node without being allocated one. The toolkit on the
# workers honours NVIDIA_VISIBLE_DEVICES only for containers whose bounding set holds
# CAP_SYS_ADMIN (NVIDIA/nvidia-container-toolkit@v1.18.1:internal/config/image/privileged.go);
# the chart's default container securityContext adds it for the profiling metrics
# (NVIDIA/dcgm-exporter@4.4.2-4.7.1:deployment/values.yaml), restated here because a values
# override replacing it would blind the exporter. The image sets the variable to all
# (docker/Dockerfile); set it on the container too, so it does not depend on the image.
DCGM_SECURITY_CONTEXT = {
    "runAsNonRoot": False,
    "runAsUser": 0,
    "capabilities": {"add": ["SYS_ADMIN"], "drop": ["ALL"]},
    "allowPrivilegeEscalation": False,
}
DCGM_ENV = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]


def dcgm_values(version: str) -> dict:
    key, value = host_layout.GPU_NODE_LABEL
    return helm.merged_values(
        dcgm_chart(version),
        {
            "nodeSelector": {key: value},
            "serviceMonitor": {"enabled": True, "additionalLabels": service_monitor_labels()},
            "securityContext": DCGM_SECURITY_CONTEXT,
            "extraEnv": DCGM_ENV,
        },
    )


# Kueue's metrics (the demand-aware scaler reads its pending GPUs) are served over HTTPS on
# 8443 behind controller-runtime's authn/authz filter: the scraper needs a token allowed to GET
# the /metrics non-resource URL (kubernetes-sigs/kueue@v0.19.2: cmd/kueue/main.go
# SecureServing + WithAuthenticationAndAuthorization; the chart's ClusterRole
# <release>-metrics-reader, charts/kueue/templates/rbac/metrics_reader_role.yaml). The chart's
# own ServiceMonitor (enablePrometheus) carries no `release` label, so this Prometheus would not
# select it, and its RoleBinding names kube-prometheus' service accounts (prometheus-k8s), not
# this stack's. So the program scrapes with its own ServiceMonitor and a service account that can
# read /metrics and nothing else, not Prometheus' own token (which reads the whole cluster).
# With Kueue's internal certificate management the metrics certificate is self-signed in memory
# (main.go: no certificate watcher), so there is no CA to verify: insecureSkipVerify, as the
# chart's ServiceMonitor does; the token sent can only read metrics.
KUEUE_SCRAPER = "prometheus-kueue-metrics"


def kueue_scrape_manifests() -> list[dict]:
    """The ServiceMonitor for Kueue's metrics Service and the token it scrapes with."""
    sa = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": KUEUE_SCRAPER, "namespace": KUEUE_NAMESPACE},
    }
    token = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/service-account-token",  # the token controller fills it
        "metadata": {
            "name": KUEUE_SCRAPER,
            "namespace": KUEUE_NAMESPACE,
            "annotations": {"kubernetes.io/service-account.name": KUEUE_SCRAPER},
        },
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": KUEUE_SCRAPER},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": f"{KUEUE_RELEASE}-metrics-reader",
        },
        "subjects": [{"kind": "ServiceAccount", "name": KUEUE_SCRAPER, "namespace": KUEUE_NAMESPACE}],
    }
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {
            "name": f"{KUEUE_RELEASE}-metrics",
            "namespace": KUEUE_NAMESPACE,
            "labels": service_monitor_labels(),
        },
        "spec": {
            # the chart's metrics Service labels (charts/kueue/templates/_helpers.tpl kueue.metricsService.labels)
            "selector": {
                "matchLabels": {
                    "app.kubernetes.io/name": "kueue",
                    "app.kubernetes.io/instance": KUEUE_RELEASE,
                    "app.kubernetes.io/component": "metrics-service",
                }
            },
            "endpoints": [
                {
                    "port": "https",
                    "scheme": "https",
                    "path": "/metrics",
                    "authorization": {"type": "Bearer", "credentials": {"name": KUEUE_SCRAPER, "key": "token"}},
                    "tlsConfig": {"insecureSkipVerify": True},
                }
            ],
        },
    }
    return [sa, token, binding, monitor]


def dashboard_config_maps(n: Names) -> list[dict]:
    """The hand-off dashboard as a ConfigMap labelled for the Grafana sidecar."""
    key, value = DASHBOARD_LABEL
    board = dashboard.handoff_dashboard(n)
    metadata = {"name": f"dashboard-{dashboard.UID}", "namespace": MONITORING_NAMESPACE, "labels": {key: value}}
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata,
            "data": {f"{dashboard.UID}.json": json.dumps(board, indent=1, sort_keys=True)},
        }
    ]


class Monitoring(pulumi.ComponentResource):
    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:platform:Monitoring", name, None, opts)
        password = random.RandomPassword(
            f"{name}-grafana-password", length=24, special=False, opts=pulumi.ResourceOptions(parent=self)
        )
        self.grafana_password: pulumi.Output[str] = pulumi.Output.secret(password.result)
        write = args.remote_write
        values = pulumi.Output.all(self.grafana_password, write.url if write else None).apply(
            lambda v: helm.deep_merge(
                helm.deep_merge(
                    stack_values(args.kube_prometheus_stack_version, args.names), {"grafana": {"adminPassword": v[0]}}
                ),
                remote_write_values(v[1], write.region, write.stack) if write else {},
            )
        )
        self.stack = helm.release(
            f"{name}-stack", stack_chart(args.kube_prometheus_stack_version), values, args.provider, parent=self
        )
        # dcgm-exporter creates a ServiceMonitor: the CRD comes with the stack.
        self.dcgm_exporter = helm.release(
            f"{name}-dcgm-exporter",
            dcgm_chart(args.dcgm_exporter_version),
            dcgm_values(args.dcgm_exporter_version),
            args.provider,
            parent=self,
            depends_on=[self.stack],
        )
        for manifest in dashboard_config_maps(args.names):
            k8s.core.v1.ConfigMap(
                f"{name}-{manifest['metadata']['name']}",
                metadata=manifest["metadata"],
                data=manifest["data"],
                opts=pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=[self.stack]),
            )
        self.register_outputs({"prometheusUrl": args.names.prometheus_url})

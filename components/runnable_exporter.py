"""The runnable-jobs exporter in the cluster (components/runnable_jobs.py, shipped as it is in a
ConfigMap to the stock Python image the fair-share controller runs): pure renderers, then the
component that creates them once the Slurm cluster (the Token CRD and the chart's JWT key) and the
monitoring stack (the ServiceMonitor CRD) are up.

* Its namespace is the slurm namespace: a Token reads its JWT key Secret, and writes its token
  Secret, in its own namespace only (SlinkyProject/slurm-operator@v1.0.5: api/v1beta1/token_keys.go
  JwtHs256Key and SecretKey take `o.Namespace`; internal/builder/token_secret.go), and the key is the
  chart's, there. That namespace runs slurmd, so it enforces no Pod Security level; this pod meets
  `restricted` anyway (below). It serves its metrics on a port, but no NetworkPolicy guards it, as
  none guards the fair-share controller: Flannel enforces none (flannel-io/flannel@v0.27.4
  README.md), and what it serves is counts of pending jobs.

* Its token: slurm-operator's Token (slinky.slurm.net/v1beta1; SlinkyProject/slurm-operator@v1.0.5:
  api/v1beta1/token_types.go, token_keys.go, internal/builder/token_secret.go) signs a JWT for
  `username` with the chart's JWT key (`<fullname>-auth-jwths256`, key `jwt_hs256.key`:
  helm/slurm/templates/_slurm.tpl slurm.authJwtHs256Ref) into Secret `<token>-jwt-<username>`, key
  `SLURM_JWT`, renewed before it expires (`refresh`). The user is `nobody`, the CRD's own default:
  not an operator or admin, so the token reads jobs and changes no one else's (tests/engines/
  test_runnable_jobs.py); 15 min, the CRD's default lifetime, keeps a leaked one short-lived, as
  slurmctld mints no longer one for `nobody` (components/slinky.py _auth_alt_parameters).
* Its pod: non-root, no privilege escalation, every capability dropped, a read-only root, no
  service-account token (it calls no Kubernetes API); it mounts only its code and the JWT.
* Prometheus scrapes it through a ServiceMonitor labelled as kube-prometheus-stack selects
  (components/monitoring.py service_monitor_labels).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from components import fair_share_controller, runnable_jobs, slurmd_scaling
from core.names import CODE_HASH_ANNOTATION, NODESET_GROUP, NODESET_VERSION, SLURMRESTD_PORT, Names

NAME = "slurm-runnable-jobs"
MISSING_ALERT = slurmd_scaling.RUNNABLE_JOBS_MISSING_ALERT  # a row of slurmd_scaling.outage_bounds
MISSING_FOR = slurmd_scaling.INPUT_LOST_FOR  # as the other inputs' alerts
TOKEN_API = f"{NODESET_GROUP}/{NODESET_VERSION}"  # slurm-operator's API group: NodeSet, Token
TOKEN_USER = "nobody"
TOKEN_LIFETIME = "15m"
CODE = Path(runnable_jobs.__file__)
APP_DIR = "/opt/runnable-jobs"
JWT_DIR = "/var/run/slurm-jwt"
JWT_KEY = "SLURM_JWT"  # token_keys.go SecretRef's default key
PORT = 8080
LABELS = {"app.kubernetes.io/name": NAME}


def token_secret_name() -> str:
    """The Secret the operator writes the JWT to (token_keys.go SecretKey: `<name>-jwt-<username>`)."""
    return f"{NAME}-jwt-{TOKEN_USER}"


def manifests(n: Names, image: str, monitor_labels: dict[str, str]) -> list[dict]:
    """Token, ConfigMap (the code), Deployment, Service and ServiceMonitor, in the slurm namespace;
    `monitor_labels` are those the stack's Prometheus selects ServiceMonitors by
    (components/monitoring.py service_monitor_labels)."""
    ns = n.slurm.namespace
    meta = {"name": NAME, "namespace": ns, "labels": LABELS}
    target = slurmd_scaling.scaling_target(n)
    token = {
        "apiVersion": TOKEN_API,
        "kind": "Token",
        "metadata": meta,
        "spec": {
            "jwtHs256KeyRef": {"name": f"{n.slurm.fullname}-auth-jwths256", "key": "jwt_hs256.key"},
            "username": TOKEN_USER,
            "lifetime": TOKEN_LIFETIME,
            "refresh": True,
        },
    }
    code = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {CODE.name: CODE.read_text()}}
    env = {
        runnable_jobs.ENV_URL: f"http://{n.slurm.restapi_service}.{ns}:{SLURMRESTD_PORT}",
        runnable_jobs.ENV_TOKEN_FILE: f"{JWT_DIR}/{JWT_KEY}",
        runnable_jobs.ENV_PARTITIONS: ",".join(target.partitions),
        runnable_jobs.ENV_PORT: str(PORT),
    }
    container = {
        "name": "exporter",
        "image": image,
        "command": ["python", "-m", f"components.{CODE.stem}"],
        "workingDir": APP_DIR,
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "ports": [{"name": "metrics", "containerPort": PORT}],
        "readinessProbe": {"httpGet": {"path": "/metrics", "port": "metrics"}},
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "96Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "code", "mountPath": f"{APP_DIR}/components", "readOnly": True},
            {"name": "jwt", "mountPath": JWT_DIR, "readOnly": True},
        ],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": LABELS},
            "template": {
                "metadata": {
                    "labels": LABELS,
                    "annotations": {CODE_HASH_ANNOTATION: hashlib.sha256(CODE.read_bytes()).hexdigest()},
                },
                "spec": {
                    "automountServiceAccountToken": False,
                    # Beside slurmrestd and Prometheus, off the GPU workers, as the fair-share controller.
                    **fair_share_controller.on_the_control_node(),
                    "securityContext": fair_share_controller.pod_security_context(),
                    "containers": [container],
                    "volumes": [
                        {"name": "code", "configMap": {"name": NAME}},
                        {
                            "name": "jwt",
                            "secret": {"secretName": token_secret_name(), "items": [{"key": JWT_KEY, "path": JWT_KEY}]},
                        },
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {"selector": LABELS, "ports": [{"name": "metrics", "port": PORT, "targetPort": "metrics"}]},
    }
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {**meta, "labels": {**LABELS, **monitor_labels}},
        "spec": {
            "selector": {"matchLabels": LABELS},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": f"{n.metrics_interval_seconds}s"}],
        },
    }
    return [token, code, deployment, service, monitor]


def alert_rules(n: Names) -> dict:
    """A Prometheus rule group: the alert that fires while the exporter's series are missing (it,
    slurmrestd or its token is down), naming what the scaler does meanwhile; in the stack's
    additionalPrometheusRulesMap (components/monitoring.py), with the exporter deployed."""
    partition = slurmd_scaling.scaling_target(n).partitions[0]
    # a stall is found STALL_SECONDS after the pod is up, which takes about a hand-off
    bounds = slurmd_scaling.stack_reclaim_bounds(n)
    stall_minutes = round((slurmd_scaling.STALL_SECONDS + bounds.handoff_s) / 60)
    memory_minutes = slurmd_scaling.STALL_MEMORY_SECONDS // 60
    return {
        "name": "testbed-runnable-jobs",
        "rules": [
            {
                "alert": MISSING_ALERT,
                "expr": f'absent({runnable_jobs.RUNNABLE_JOBS}{{partition="{partition}"}})',
                "for": MISSING_FOR,
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "The runnable-jobs exporter's metrics are missing: slurmd scaling counts every pending job",
                    "description": (
                        f"No {runnable_jobs.RUNNABLE_JOBS}: the exporter, slurmrestd or its token ({token_secret_name()}) "
                        "is down. The scaler and the fair-share controller fall back to slurmctld's pending counts "
                        "and the stall term: work waiting for its --begin, a dependency or an array throttle may "
                        f"bring up a slurmd pod for about {stall_minutes} minutes, then not for {memory_minutes}, "
                        f"and work that becomes runnable in those {memory_minutes} minutes waits for them, even "
                        "once the exporter is back. Bounds: `plan`, docs/handoff.md 'One input lost'."
                    ),
                },
            }
        ],
    }


@dataclass
class RunnableExporterArgs:
    names: Names
    image: str  # setting controllerImage: the pinned stock Python the fair-share controller runs too
    monitor_labels: dict[str, str]
    provider: k8s.Provider
    slurm_after: Sequence[pulumi.Resource]  # the Slurm chart: the Token CRD's operator, the JWT key, slurmrestd
    monitoring_after: Sequence[pulumi.Resource]  # the monitoring stack: the ServiceMonitor CRD


class RunnableExporter(pulumi.ComponentResource):
    """The Token, the code, the Deployment mounting both, its Service, then its ServiceMonitor."""

    def __init__(self, name: str, args: RunnableExporterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:platform:RunnableExporter", name, None, opts)
        token, code, deploy, svc, monitor = manifests(args.names, args.image, args.monitor_labels)
        child = pulumi.ResourceOptions(parent=self, provider=args.provider)

        def after(*resources: pulumi.Resource) -> pulumi.ResourceOptions:
            return pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=list(resources)))

        def custom(suffix: str, obj: dict, *before: pulumi.Resource) -> k8s.apiextensions.CustomResource:
            return k8s.apiextensions.CustomResource(
                f"{name}-{suffix}",
                api_version=obj["apiVersion"],
                kind=obj["kind"],
                metadata=obj["metadata"],
                spec=obj["spec"],
                opts=after(*before),
            )

        token_ = custom("token", token, *args.slurm_after)
        code_ = k8s.core.v1.ConfigMap(
            f"{name}-code", metadata=code["metadata"], data=code["data"], opts=after(*args.slurm_after)
        )
        self.deployment = k8s.apps.v1.Deployment(
            f"{name}-deployment", metadata=deploy["metadata"], spec=deploy["spec"], opts=after(token_, code_)
        )
        service = k8s.core.v1.Service(
            f"{name}-service", metadata=svc["metadata"], spec=svc["spec"], opts=after(*args.slurm_after)
        )
        self.service_monitor = custom("service-monitor", monitor, service, *args.monitoring_after)
        self.register_outputs({"deployment": f"{args.names.slurm.namespace}/{NAME}"})

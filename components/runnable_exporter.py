"""The runnable-jobs exporter in the cluster (components/runnable_jobs.py, shipped as it is in a
ConfigMap to a stock Python image): its manifests as pure renderers, for the program to create in
the slurm namespace once the monitoring stack (the ServiceMonitor CRD) and the Slinky operator (the
Token CRD) are up. The program does not create them yet.

* Its token: slurm-operator's Token (slinky.slurm.net/v1beta1; SlinkyProject/slurm-operator@v1.0.5:
  api/v1beta1/token_types.go, token_keys.go, internal/builder/token_secret.go) signs a JWT for
  `username` with the chart's JWT key (`<fullname>-auth-jwths256`, key `jwt_hs256.key`:
  helm/slurm/templates/_slurm.tpl slurm.authJwtHs256Ref) into Secret `<token>-jwt-<username>`, key
  `SLURM_JWT`, renewed before it expires (`refresh`). The user is `nobody`, the CRD's own default:
  not an operator or admin, so the token reads jobs and changes no one else's (tests/engines/
  test_runnable_jobs.py); 15 min, the CRD's default lifetime, keeps a leaked one short-lived.
* Its pod: non-root, no privilege escalation, every capability dropped, a read-only root, no
  service-account token (it calls no Kubernetes API); it mounts only its code and the JWT.
* Prometheus scrapes it through a ServiceMonitor labelled as kube-prometheus-stack selects
  (components/monitoring.py service_monitor_labels).
"""

from __future__ import annotations

from pathlib import Path

from components import runnable_jobs, slurmd_scaling
from components.monitoring import service_monitor_labels
from core.names import SLURMRESTD_PORT, Names

NAME = "slurm-runnable-jobs"
MISSING_ALERT = "SlurmRunnableJobsMissing"
MISSING_FOR = "2m"  # as the other inputs' alerts (components/slurmd_scaling.py INPUT_LOST_FOR)
TOKEN_USER = "nobody"
TOKEN_LIFETIME = "15m"
CODE = Path(runnable_jobs.__file__)
APP_DIR = "/opt/runnable-jobs"
JWT_DIR = "/var/run/slurm-jwt"
JWT_KEY = "SLURM_JWT"  # token_keys.go SecretRef's default key
PORT = 8080
RUN_AS = 65534
LABELS = {"app.kubernetes.io/name": NAME}


def token_secret_name() -> str:
    """The Secret the operator writes the JWT to (token_keys.go SecretKey: `<name>-jwt-<username>`)."""
    return f"{NAME}-jwt-{TOKEN_USER}"


def manifests(n: Names, image: str) -> list[dict]:
    """Token, ConfigMap (the code), Deployment, Service and ServiceMonitor, in the slurm namespace."""
    ns = n.slurm.namespace
    meta = {"name": NAME, "namespace": ns, "labels": LABELS}
    target = slurmd_scaling.scaling_target(n)
    token = {
        "apiVersion": "slinky.slurm.net/v1beta1",
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
                "metadata": {"labels": LABELS},
                "spec": {
                    "automountServiceAccountToken": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": RUN_AS,
                        "runAsGroup": RUN_AS,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
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
        "metadata": {**meta, "labels": {**LABELS, **service_monitor_labels()}},
        "spec": {
            "selector": {"matchLabels": LABELS},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": f"{n.metrics_interval_seconds}s"}],
        },
    }
    return [token, code, deployment, service, monitor]


def alert_rules(n: Names) -> dict:
    """A Prometheus rule group: the alert that fires while the exporter's series are missing (it,
    slurmrestd or its token is down), naming what the scaler does meanwhile. For the stack's
    additionalPrometheusRulesMap once the exporter is deployed: before, it would always fire."""
    partition = slurmd_scaling.scaling_target(n).partitions[0]
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
                        "is down. The scaler falls back to slurmctld's pending counts and the stall term: work "
                        "waiting for its --begin, a dependency or an array throttle may bring up a slurmd pod for "
                        "about 4 minutes, then not for 30, and work that becomes runnable in those 30 minutes "
                        "waits for them."
                    ),
                },
            }
        ],
    }

"""cert-manager with its CRDs, and the gate everything that needs its webhook waits for."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_command as command
import pulumi_kubernetes as k8s

from components import helm
from components.webhook_gate import HealthCheck, webhook_gate
from core.names import CERT_MANAGER_NAMESPACE, CERT_MANAGER_RELEASE

REPO = "https://charts.jetstack.io"
WEBHOOK_HEALTH_PORT = 6080  # the webhook container's `healthcheck` port (readiness probe /healthz)


@dataclass
class CertManagerArgs:
    version: str
    provider: k8s.Provider
    control_connection: command.remote.ConnectionArgs


def chart(version: str) -> helm.Chart:
    return helm.Chart(CERT_MANAGER_RELEASE, CERT_MANAGER_NAMESPACE, "cert-manager", version, REPO)


def webhook_probe() -> dict:
    """A ClusterIssuer the webhook must validate; only ever dry-run, never stored."""
    return {
        "apiVersion": "cert-manager.io/v1",
        "kind": "ClusterIssuer",
        "metadata": {"name": "testbed-webhook-probe"},
        "spec": {"selfSigned": {}},
    }


def webhook_health() -> HealthCheck:
    selector = f"app.kubernetes.io/name=webhook,app.kubernetes.io/instance={CERT_MANAGER_RELEASE},app.kubernetes.io/component=webhook"
    return HealthCheck(CERT_MANAGER_NAMESPACE, selector, WEBHOOK_HEALTH_PORT)


class CertManager(pulumi.ComponentResource):
    def __init__(self, name: str, args: CertManagerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:platform:CertManager", name, None, opts)
        self.release = helm.release(
            f"{name}-release", chart(args.version), helm.base_values(chart(args.version)), args.provider, parent=self
        )
        # Dependents wait for this, not for the release: a Ready pod is not a working webhook.
        self.webhook_gate = webhook_gate(
            f"{name}-webhook-gate",
            webhook_probe(),
            webhook_health(),
            args.control_connection,
            parent=self,
            release=self.release,
        )
        self.register_outputs({"release": self.release.name})

"""A webhook gate: a step on the control node that succeeds only once the API server admits a
server-side dry-run through the webhook (and, optionally, the webhook pod says /healthz ok)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_command as command
import pulumi_kubernetes as k8s

from components import helm, remote_script

GATE_SCRIPT = "wait-webhook.sh"
GATE_TIMEOUT_SECONDS = 10 * 60


@dataclass(frozen=True)
class HealthCheck:
    namespace: str
    label_selector: str
    port: int
    path: str = "healthz"


def gate_arguments(probe: dict, health: HealthCheck | None) -> list[str]:
    args = [str(GATE_TIMEOUT_SECONDS), json.dumps(probe, sort_keys=True)]
    if health:
        args += [health.namespace, health.label_selector, str(health.port), health.path]
    return args


def webhook_gate(
    name: str,
    probe: dict,
    health: HealthCheck | None,
    connection: command.remote.ConnectionArgs,
    parent: pulumi.Resource,
    release: k8s.helm.v3.Release,
) -> command.remote.Command:
    """Passes once `release`'s webhook serves; proven again whenever the release is upgraded."""
    return remote_script.run_script(
        name,
        GATE_SCRIPT,
        gate_arguments(probe, health),
        connection,
        parent=parent,
        depends_on=[release],
        triggers=helm.upgrade_triggers(release),
    )

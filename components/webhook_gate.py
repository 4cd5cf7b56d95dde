"""A webhook gate: a step on the control node that succeeds only once the API server admits a
server-side dry-run through the webhook (and, optionally, the webhook pod's health endpoint
answers 200)."""

from __future__ import annotations

import json
from collections.abc import Sequence
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


def gate_step(
    probe: dict, health: HealthCheck | None, triggers: Sequence[pulumi.Input] = ()
) -> remote_script.RemoteStep:
    args = {"TIMEOUT_SECONDS": str(GATE_TIMEOUT_SECONDS), "PROBE_MANIFEST": json.dumps(probe, sort_keys=True)}
    if health:
        args |= {
            "HEALTH_NAMESPACE": health.namespace,
            "HEALTH_SELECTOR": health.label_selector,
            "HEALTH_PORT": str(health.port),
            "HEALTH_PATH": health.path,
        }
    return remote_script.RemoteStep(GATE_SCRIPT, args, triggers=triggers)


def webhook_gate(
    name: str,
    probe: dict,
    health: HealthCheck | None,
    connection: command.remote.ConnectionArgs,
    parent: pulumi.Resource,
    release: k8s.helm.v3.Release,
) -> command.remote.Command:
    """Passes once `release`'s webhook serves; proven again whenever the release is upgraded."""
    step = gate_step(probe, health, triggers=helm.upgrade_triggers(release))
    return remote_script.run(name, step, connection, parent=parent, depends_on=[release])

"""Layer 2: cluster identity, readiness gate, kubeconfig and the Kubernetes provider."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_command as command
import pulumi_kubernetes as k8s

from components import host_layout
from components.cluster_identity import ClusterIdentity
from components.readiness_gate import ReadinessGate, ReadinessGateArgs
from stacks.infrastructure import Infrastructure
from stacks.settings import Settings

# Driver install and kubeadm join on the workers dominate: ~10-20 minutes is typical.
READINESS_TIMEOUT_SECONDS = 45 * 60


@dataclass
class ClusterAccess:
    gate: ReadinessGate
    kubeconfig: pulumi.Output[str]
    provider: k8s.Provider
    control_connection: command.remote.ConnectionArgs  # for later steps that run on the control node


def build_identity() -> ClusterIdentity:
    return ClusterIdentity("testbed-identity")


def build_access(s: Settings, infra: Infrastructure, identity: ClusterIdentity) -> ClusterAccess:
    connection = infra.ssh.connection(infra.control.public_ip)
    gate = ReadinessGate(
        "testbed-readiness",
        ReadinessGateArgs(
            connection=connection,
            region=s.region,
            node_ips=[s.control_private_ip, *s.worker_private_ips],
            nodes=[infra.control.instance, *(w.instance for w in infra.workers)],
            timeout_seconds=READINESS_TIMEOUT_SECONDS,
            after=[infra.control.eip_association],
        ),
    )
    kubeconfig = identity.kubeconfig(f"testbed-{s.stack}", infra.control.public_ip, host_layout.API_SERVER_PORT)
    provider = k8s.Provider(
        "testbed-k8s",
        kubeconfig=kubeconfig,
        # a cluster that is already gone must not block `pulumi destroy`
        delete_unreachable=True,
        opts=pulumi.ResourceOptions(depends_on=[gate]),
    )
    return ClusterAccess(gate=gate, kubeconfig=kubeconfig, provider=provider, control_connection=connection)

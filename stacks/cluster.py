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
# Steps after the readiness gate reach a node that answered SSH already; on delete the node may
# be gone: 10 dials of 30 s bound that wait (the default limit, provider/pkg/provider/remote/connection.go).
DIAL_ERROR_LIMIT = 10
REMOTE_COMMAND = "command:remote:Command"


def lives_in_cluster(type_: str) -> bool:
    """Kubernetes objects and Helm releases, and the steps run on the control node over SSH."""
    return type_.startswith("kubernetes:") or type_ == REMOTE_COMMAND


def deleted_with(node: pulumi.Resource) -> pulumi.ResourceTransformation:
    """Everything that lives in the cluster is deleted with the control node: `pulumi destroy`
    then never calls a provider that cannot reach it (delete_unreachable does not cover Helm
    releases, pulumi/pulumi-kubernetes#2675). The engine skips the provider's Delete when the
    deletedWith resource is deleted in the same run (pulumi/pulumi@v3.272.0:
    pkg/resource/deploy/step.go DeleteStep.Apply, isDeletedWith)."""

    def transform(args: pulumi.ResourceTransformationArgs) -> pulumi.ResourceTransformationResult | None:
        if not lives_in_cluster(args.type_):
            return None
        return pulumi.ResourceTransformationResult(
            args.props, pulumi.ResourceOptions.merge(args.opts, pulumi.ResourceOptions(deleted_with=node))
        )

    return transform


@dataclass
class ClusterAccess:
    gate: ReadinessGate
    kubeconfig: pulumi.Output[str]
    provider: k8s.Provider
    control_connection: command.remote.ConnectionArgs  # for later steps that run on the control node


def build_identity() -> ClusterIdentity:
    return ClusterIdentity("testbed-identity")


def build_access(s: Settings, infra: Infrastructure, identity: ClusterIdentity) -> ClusterAccess:
    # registered first: it applies to every resource created after it
    pulumi.runtime.register_stack_transformation(deleted_with(infra.control.instance))
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
    return ClusterAccess(
        gate=gate,
        kubeconfig=kubeconfig,
        provider=provider,
        control_connection=infra.ssh.connection(infra.control.public_ip, DIAL_ERROR_LIMIT),
    )

"""Layer 2: cluster identity, readiness gate, kubeconfig and the Kubernetes provider."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_command as command
import pulumi_kubernetes as k8s

from components import bootstrap, remote_script
from components.cluster_identity import ClusterIdentity
from components.readiness_gate import BootstrapWatch, ReadinessGate, ReadinessGateArgs
from core import host_layout
from core.names import AI_USER_ROLE, REMOTE_COMMAND_TYPE_TOKEN, hpc_user_role, slurm_names
from core.settings import Settings
from stacks.infrastructure import Infrastructure

# Driver install and kubeadm join on the workers dominate: ~10-20 minutes is typical.
READINESS_TIMEOUT_SECONDS = 45 * 60
# Steps after the readiness gate reach a node that answered SSH already; on delete the node may
# be gone: 10 dials of 30 s bound that wait (the default limit, provider/pkg/provider/remote/connection.go).
DIAL_ERROR_LIMIT = 10


def lives_in_cluster(type_: str) -> bool:
    """Kubernetes objects and Helm releases, and the steps run on the control node over SSH."""
    return type_.startswith("kubernetes:") or type_ == REMOTE_COMMAND_TYPE_TOKEN


def lives_and_dies_with(node: pulumi.Resource) -> pulumi.ResourceTransformation:
    """Everything that lives in the cluster is deleted with the control node: `pulumi destroy`
    then never calls a provider that cannot reach it (delete_unreachable does not cover Helm
    releases, pulumi/pulumi-kubernetes#2675). The engine skips the provider's Delete when the
    deletedWith resource is deleted in the same run (pulumi/pulumi@v3.272.0:
    pkg/resource/deploy/step.go DeleteStep.Apply, isDeletedWith).

    And it is replaced with the control node (replaceWith): a rebuilt control node is a new,
    empty cluster, so every release, object and step is created again in it. Delete before
    create: the new cluster answers at the same address, and deleting the old release after
    installing the new one would uninstall the new one."""

    def transform(args: pulumi.ResourceTransformationArgs) -> pulumi.ResourceTransformationResult | None:
        if not lives_in_cluster(args.type_):
            return None
        options = pulumi.ResourceOptions(deleted_with=node, replace_with=[node], delete_before_replace=True)
        return pulumi.ResourceTransformationResult(args.props, pulumi.ResourceOptions.merge(args.opts, options))

    return transform


@dataclass
class ClusterAccess:
    gate: ReadinessGate
    kubeconfig: pulumi.Output[str]  # the operator's, short-lived; the provider has its own
    provider: k8s.Provider
    control_connection: command.remote.ConnectionArgs  # for later steps that run on the control node
    role_kubeconfigs: dict[str, pulumi.Output[str]]  # the HPC and AI users', by stack output name


def build_identity() -> ClusterIdentity:
    return ClusterIdentity("testbed-identity")


def ca_key_step(ca_key_pem: pulumi.Input[str], triggers: list[pulumi.Input] | None = None) -> remote_script.RemoteStep:
    """The CA key reaches the control node over SSH, never in user-data; control-plane.sh
    waits for it before `kubeadm init`."""
    return remote_script.RemoteStep(
        "deliver-ca-key.sh",
        {"CA_KEY_FILE": bootstrap.CA_KEY_FILE},
        secrets={"CA_KEY_PEM": ca_key_pem},
        triggers=triggers or [],
        timeout_seconds=bootstrap.CA_KEY_WAIT_SECONDS,
    )


def join_token_step(
    private_ip: str,
    token: pulumi.Input[str],
    region: str,
    instance_id: pulumi.Input[str],
    watch: BootstrapWatch,
    triggers: list[pulumi.Input] | None = None,
) -> remote_script.RemoteStep:
    """One worker's own token, valid for hours, registered when the worker (or its replacement)
    is created and deleted once it is Ready: a replaced or spot-replacement worker joins by itself.
    A failed bootstrap of the worker or of the control node ends the wait at once (`watch`)."""
    return remote_script.RemoteStep(
        "join-token.sh",
        {
            "NODE_IP": private_ip,
            "REGION": region,  # for the console-log command printed on failure
            "INSTANCE_ID": instance_id,
            "TTL_SECONDS": str(bootstrap.JOIN_TOKEN_TTL_SECONDS),
            "TIMEOUT_SECONDS": str(READINESS_TIMEOUT_SECONDS),
            "NODE_REACH": watch.reach(private_ip),
            **watch.control_args(),
            **watch.args(),
        },
        secrets={"JOIN_TOKEN": token, **watch.secrets()},
        triggers=triggers or [],
        timeout_seconds=READINESS_TIMEOUT_SECONDS + 5 * 60,
    )


def deliver_node_credentials(
    s: Settings,
    infra: Infrastructure,
    identity: ClusterIdentity,
    connection: command.remote.ConnectionArgs,
    watch: BootstrapWatch,
) -> list[command.remote.Command]:
    """What `pulumi up` hands the nodes over SSH rather than in user-data: the CA key (again to
    a replaced control node) and each worker's join token (again for a replaced worker)."""
    parent = pulumi.ComponentResource("testbed:cluster:NodeCredentials", "testbed-node-credentials")
    ssh_ready = [infra.control.eip_association]  # SSH goes through the Elastic IP
    control = infra.control.instance
    steps = [
        remote_script.run(
            "testbed-ca-key",
            ca_key_step(identity.ca_key_pem, [control.id]),
            connection,
            parent=parent,
            depends_on=[control, *ssh_ready],
        )
    ]
    for index, (worker, private_ip, token) in enumerate(
        zip(infra.workers, s.worker_private_ips, infra.join_tokens, strict=True)
    ):
        steps.append(
            remote_script.run(
                f"testbed-worker-{index}-join-token",
                join_token_step(private_ip, token, s.region, worker.instance.id, watch, [worker.instance.id]),
                connection,
                parent=parent,
                depends_on=[worker.instance, *ssh_ready],
            )
        )
    return steps


def build_access(s: Settings, infra: Infrastructure, identity: ClusterIdentity) -> ClusterAccess:
    # registered first: it applies to every resource created after it
    pulumi.runtime.register_stack_transformation(lives_and_dies_with(infra.control.instance))
    connection = infra.control_connection()
    # the gate passes once every node is Ready and its join token deleted
    watch = BootstrapWatch.over(connection, s.control_private_ip)
    credentials = deliver_node_credentials(s, infra, identity, connection, watch)
    gate = ReadinessGate(
        "testbed-readiness",
        ReadinessGateArgs(
            connection=connection,
            region=s.region,
            watch=watch,
            node_ips=[s.control_private_ip, *s.worker_private_ips],
            nodes=[infra.control.instance, *(w.instance for w in infra.workers)],
            timeout_seconds=READINESS_TIMEOUT_SECONDS,
            # and each worker's joined step: it finishes before the device plugin is installed, so it
            # asks for a GPU only of a worker that replaces one in a running cluster
            after=[infra.control.eip_association, *credentials, *(w.joined for w in infra.workers)],
        ),
    )
    cluster_name, port = f"testbed-{s.stack}", host_layout.API_SERVER_PORT
    # the provider's credential and the operator's differ: see ClusterIdentity.program_kubeconfig
    program_kubeconfig = identity.program_kubeconfig(cluster_name, infra.control.public_ip, port)
    operator_kubeconfig = identity.operator_kubeconfig(
        s.role_credential_hours, cluster_name, infra.control.public_ip, port
    )
    role_kubeconfigs = {
        role.output: identity.role_kubeconfig(
            role, s.role_credential_hours, cluster_name, infra.control.public_ip, port
        )
        for role in (hpc_user_role(slurm_names(s.nodeset_name)), AI_USER_ROLE)
    }
    provider = k8s.Provider(
        "testbed-k8s",
        kubeconfig=program_kubeconfig,
        # a cluster that is already gone must not block `pulumi destroy`
        delete_unreachable=True,
        opts=pulumi.ResourceOptions(depends_on=[gate]),
    )
    return ClusterAccess(
        gate=gate,
        kubeconfig=operator_kubeconfig,
        provider=provider,
        control_connection=infra.control_connection(DIAL_ERROR_LIMIT),
        role_kubeconfigs=role_kubeconfigs,
    )

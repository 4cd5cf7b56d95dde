"""Layer 1: network, SSH key, control node and GPU workers (pulumi-aws)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_command as command

from components import bootstrap, ec2, images, slinky
from components.cluster_identity import ClusterIdentity
from components.control_node import ControlNode, ControlNodeArgs
from components.gpu_worker import GpuWorker, JoinedArgs
from components.managed_prometheus import ManagedPrometheus, ManagedPrometheusArgs
from components.network import Network, NetworkArgs
from components.ssh_access import SshAccess
from core.names import Names
from core.settings import PROJECT, Settings


@dataclass
class Infrastructure:
    network: Network
    ssh: SshAccess
    control: ControlNode
    workers: list[GpuWorker]
    join_tokens: list[pulumi.Output[str]]  # one per worker, same order
    evidence: ManagedPrometheus | None  # None: managedPrometheus false
    control_host_key: pulumi.Output[str]  # what the control node published; every SSH step pins it

    def control_connection(self, dial_error_limit: int = -1) -> command.remote.ConnectionArgs:
        """The control node over SSH, by the stack's key, its host key pinned."""
        return self.ssh.connection(self.control.public_ip, self.control_host_key, dial_error_limit)


CONTROL_PLANE_SETTINGS_OUTPUT = "controlPlaneSettings"
GENERATION = "controlPlaneGeneration"
WORKER_IPS_OUTPUT = "workerPrivateIps"


def control_plane_settings(s: Settings) -> dict[str, str]:
    """The settings the control node is built from: a change to any of them replaces it (its
    user-data, subnet or region changes), and with it the whole cluster and what lived in it."""
    return {
        "region": s.region,
        "availabilityZone": s.availability_zone,
        "vpcCidr": s.vpc_cidr,
        "kubernetesVersion": s.kubernetes_version,
        "flannelVersion": s.flannel_version,
        "sshPublicKey": s.ssh_public_key,
        GENERATION: str(s.control_plane_generation),
    }


def rebuild_refusal(deployed: Mapping[str, Any] | None, wanted: Mapping[str, str]) -> str | None:
    """Why this run must not go on, or None: settings that replace the control node changed
    since the last deployment while controlPlaneGeneration did not."""
    if not deployed:
        return None  # a first deployment
    changed = sorted(k for k in wanted if k != GENERATION and deployed.get(k) != wanted[k])
    if not changed or deployed.get(GENERATION) != wanted[GENERATION]:
        return None
    rebuild = int(wanted[GENERATION]) + 1
    return (
        f"{', '.join(changed)}: changed since the last deployment; they replace the control node, "
        "which wipes the cluster (Slurm state, Prometheus data, jobs) and installs everything again. "
        f"To rebuild on purpose also set {GENERATION}={rebuild} (pulumi config set {GENERATION} {rebuild}); "
        "to keep the cluster, set them back"
    )


@dataclass
class LastDeployment:
    """What the program reads of the last deployment, through the stack's reference to itself;
    each None on a first deployment."""

    control_plane: pulumi.Output[Any]  # its controlPlaneSettings
    worker_ips: pulumi.Output[Any]  # its workerPrivateIps


def last_deployment() -> LastDeployment:
    reference = pulumi.StackReference(f"{pulumi.get_organization()}/{pulumi.get_project()}/{pulumi.get_stack()}")
    return LastDeployment(
        control_plane=reference.get_output(CONTROL_PLANE_SETTINGS_OUTPUT),
        worker_ips=reference.get_output(WORKER_IPS_OUTPUT),
    )


def guard_control_plane(s: Settings, last: LastDeployment) -> pulumi.Output[dict[str, str]]:
    """The control-plane settings, once checked against those of the last deployment: refused at
    preview, before any AWS resource."""
    wanted = control_plane_settings(s)

    def check(previous: Mapping[str, Any] | None) -> dict[str, str]:
        problem = rebuild_refusal(previous, wanted)
        if problem:
            raise pulumi.RunError(problem)
        return wanted

    return last.control_plane.apply(check)


def waits_for_previous_worker(
    index: int,
    deployed: Mapping[str, Any] | None,
    deployed_worker_ips: Sequence[str] | None,
    wanted: Mapping[str, str],
) -> bool:
    """Whether worker `index` may be replaced only once the worker before it has joined: on a
    deployed stack whose control node stays, and for a worker deployed before, so that a
    worker-only change takes one GPU away at a time. A first deployment boots every worker at
    once (one at a time would cost ~10 minutes a worker), so do workers added by a larger
    workerCount, and so does a rebuild (controlPlaneGeneration raised): its cluster starts empty.
    Where the last worker list is unknown, every worker waits."""
    if index == 0 or not deployed or deployed.get(GENERATION) != wanted[GENERATION]:
        return False
    return deployed_worker_ips is None or index < len(deployed_worker_ips)


class ZoneError(ValueError):
    """No usable zone for the worker type (the program and preflight say the same)."""


def choose_zone(s: Settings, zones: list[str]) -> str:
    """The configured zone, or the first (sorted) zone of the region that offers the worker
    type; either way a zone that does not offer it is refused with a clear message."""
    if not zones:
        raise ZoneError(
            f'workerInstanceType: "{s.worker_instance_type}" is not offered in any zone '
            f"of region {s.region}; choose another region or instance type"
        )
    if s.availability_zone and s.availability_zone not in zones:
        raise ZoneError(
            f'availabilityZone: "{s.availability_zone}" does not offer '
            f"{s.worker_instance_type}; zones that do: {', '.join(sorted(zones))}"
        )
    return s.availability_zone or sorted(zones)[0]


def availability_zone(s: Settings, opts: pulumi.InvokeOptions) -> pulumi.Output[str]:
    offerings = aws.ec2.get_instance_type_offerings_output(
        location_type="availability-zone",
        filters=[
            {"name": "instance-type", "values": [s.worker_instance_type]},
            {"name": "location", "values": [f"{s.region}*"]},
        ],
        opts=opts,
    )

    def choose(zones: list[str]) -> str:
        try:
            return choose_zone(s, zones)
        except ZoneError as error:
            raise pulumi.RunError(str(error)) from None

    return offerings.locations.apply(choose)


def build(
    s: Settings,
    identity: ClusterIdentity,
    aws_provider: aws.Provider,
    last: LastDeployment,
    in_cluster: Callable[[pulumi.Resource], pulumi.ResourceTransformation],
) -> Infrastructure:
    """`in_cluster(control)`: what makes a step live, die and be rebuilt with the control node."""
    opts = pulumi.ResourceOptions(provider=aws_provider)
    network = Network(
        "testbed-network",
        NetworkArgs(
            vpc_cidr=s.vpc_cidr,
            subnet_cidr=s.subnet_cidr,
            admin_cidr=s.admin_cidr,
            availability_zone=availability_zone(s, pulumi.InvokeOptions(provider=aws_provider)),
        ),
        opts=opts,
    )
    ssh = SshAccess("testbed-ssh", opts=opts)
    ami = s.ami_id or ec2.ubuntu_ami(network)
    authorized_keys = (s.ssh_public_key,) if s.ssh_public_key else ()

    def node(
        role: str,
        instance_type: str,
        private_ip: str,
        root_gb: int,
        user_data: pulumi.Input[str] = "",
        spot: bool = False,
    ) -> ec2.NodeSpec:
        return ec2.NodeSpec(
            role=role,
            instance_type=instance_type,
            ami_id=ami,
            subnet_id=network.subnet_id,
            security_group_id=network.security_group_id,
            key_name=ssh.key_name,
            private_ip=private_ip,
            root_volume_gb=root_gb,
            user_data=user_data,
            spot=spot,
            after=[network.internet_route],
        )

    # Prometheus runs on the control node when it writes to the workspace: only that node's role
    # may write, and no GPU worker gets credentials (docs/evidence-and-budget.md)
    evidence = (
        ManagedPrometheus(
            "testbed-evidence",
            ManagedPrometheusArgs(alias=f"{PROJECT}-{s.stack}", keep_on_destroy=s.managed_prometheus_keep),
            opts=opts,
        )
        if s.managed_prometheus
        else None
    )
    control = ControlNode(
        "testbed-control",
        ControlNodeArgs(
            node=dataclasses.replace(
                node("control-plane", s.control_instance_type, s.control_private_ip, s.control_root_volume_gb),
                # generation 1 sets no trigger, so a stack deployed before this setting existed
                # is not rebuilt by it; 2, 3, ... each replace the control node once
                rebuild_generation=s.control_plane_generation if s.control_plane_generation > 1 else None,
                instance_profile=evidence.instance_profile.name if evidence else None,
            ),
            kubernetes_version=s.kubernetes_version,
            kubernetes_minor=s.kubernetes_minor,
            flannel_version=s.flannel_version,
            share_export_cidr=s.subnet_cidr,
            authorized_keys=authorized_keys,
            bootstrap_token=identity.bootstrap_token,
            ca_cert_pem=identity.ca_cert_pem,
        ),
        opts=opts,
    )

    # the slurm chart values the platform renders: the slurmd pod's images come from them
    slurm_values = slinky.slurm_values(s.slinky_version, s.slurm_image_tag, Names.from_settings(s).slurm)

    def worker_user_data(token: pulumi.Output[str]) -> pulumi.Output[str]:
        return pulumi.Output.all(bootstrap_token=token, ca_cert_hash=identity.ca_cert_hash).apply(
            lambda v: bootstrap.gpu_worker_user_data(
                bootstrap.WorkerBootstrap(
                    kubernetes_version=s.kubernetes_version,
                    kubernetes_minor=s.kubernetes_minor,
                    nvidia_driver_branch=s.nvidia_driver_branch,
                    nvidia_container_toolkit_version=s.nvidia_container_toolkit_version,
                    control_plane_ip=s.control_private_ip,
                    authorized_keys=authorized_keys,
                    prepull_images=images.worker_images(slurm_values),
                    **v,
                )
            )
        )

    names = [f"testbed-worker-{index}" for index in range(len(s.worker_private_ips))]
    join_tokens = [identity.token(f"{name}-token") for name in names]
    control_host_key = ssh.host_key("testbed-control", control.instance, s.region)
    joined = JoinedArgs(
        connection=ssh.connection(control.public_ip, control_host_key), region=s.region, after=[control.eip_association]
    )
    worker_opts = pulumi.ResourceOptions.merge(
        opts, pulumi.ResourceOptions(transformations=[in_cluster(control.instance)])
    )
    wanted = control_plane_settings(s)

    def once_joined(index: int, step: pulumi.Resource) -> pulumi.Output[Any]:  # the step, or None: none
        return pulumi.Output.all(last.control_plane, last.worker_ips).apply(
            lambda v: step if waits_for_previous_worker(index, v[0], v[1], wanted) else None
        )

    workers: list[GpuWorker] = []
    for index, (name, private_ip, token) in enumerate(zip(names, s.worker_private_ips, join_tokens, strict=True)):
        spec = node(
            "gpu-worker",
            s.worker_instance_type,
            private_ip,
            s.worker_root_volume_gb,
            worker_user_data(token),
            s.spot_workers,
        )
        if workers:
            # Where it must, this worker waits for the previous worker's joined step (an item
            # that resolves to None is no dependency: pulumi 3.272.0 sdk/python/lib/pulumi/runtime/
            # _depends_on.py). The SDK sends a registration once every depends_on URN resolved
            # (runtime/rpc.py _add_dependency), a URN resolves when the engine answers, and the
            # engine answers once the step applied (pulumi/pulumi@1b5949891b, v3.259.0+14, the
            # newest engine source at hand: pkg/resource/deploy/source_eval.go RegisterResource
            # waits on step.done; step.go). The engine decides to replace this worker, deleting it
            # first, only on its registration: so only after the previous one rejoined. A failed
            # step cancels the update (step_executor.go cancelDueToError) or, under
            # --continue-on-error, skips what depends on it (deployment_executor.go). A depends_on
            # edge is no property dependency, so the previous worker's replacement does not take
            # this one with it (step_generator.go calculateDependentReplacements).
            spec = dataclasses.replace(spec, after=[*spec.after, once_joined(index, workers[-1].joined)])
        workers.append(GpuWorker(name, spec, joined, opts=worker_opts))
    return Infrastructure(
        network=network,
        ssh=ssh,
        control=control,
        workers=workers,
        join_tokens=join_tokens,
        evidence=evidence,
        control_host_key=control_host_key,
    )

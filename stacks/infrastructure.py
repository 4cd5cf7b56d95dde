"""Layer 1: network, SSH key, control node and GPU workers (pulumi-aws)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from components import bootstrap, ec2, images
from components.cluster_identity import ClusterIdentity
from components.control_node import ControlNode, ControlNodeArgs
from components.gpu_worker import GpuWorker
from components.network import Network, NetworkArgs
from components.ssh_access import SshAccess
from stacks.settings import Settings


@dataclass
class Infrastructure:
    network: Network
    ssh: SshAccess
    control: ControlNode
    workers: list[GpuWorker]
    join_tokens: list[pulumi.Output[str]]  # one per worker, same order


CONTROL_PLANE_SETTINGS_OUTPUT = "controlPlaneSettings"
GENERATION = "controlPlaneGeneration"


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


def guard_control_plane(s: Settings) -> pulumi.Output[dict[str, str]]:
    """The control-plane settings, once checked against those of the last deployment (read
    through the stack's reference to itself): refused at preview, before any AWS resource."""
    wanted = control_plane_settings(s)
    deployed = pulumi.StackReference(
        f"{pulumi.get_organization()}/{pulumi.get_project()}/{pulumi.get_stack()}"
    ).get_output(CONTROL_PLANE_SETTINGS_OUTPUT)

    def check(previous: Mapping[str, Any] | None) -> dict[str, str]:
        problem = rebuild_refusal(previous, wanted)
        if problem:
            raise pulumi.RunError(problem)
        return wanted

    return deployed.apply(check)


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


def build(s: Settings, identity: ClusterIdentity, aws_provider: aws.Provider) -> Infrastructure:
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

    control = ControlNode(
        "testbed-control",
        ControlNodeArgs(
            node=dataclasses.replace(
                node("control-plane", s.control_instance_type, s.control_private_ip, s.control_root_volume_gb),
                # generation 1 sets no trigger, so a stack deployed before this setting existed
                # is not rebuilt by it; 2, 3, ... each replace the control node once
                rebuild_generation=s.control_plane_generation if s.control_plane_generation > 1 else None,
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
                    prepull_images=images.worker_images(s.slurm_image_tag),
                    **v,
                )
            )
        )

    names = [f"testbed-worker-{index}" for index in range(len(s.worker_private_ips))]
    join_tokens = [identity.token(f"{name}-token") for name in names]
    workers = [
        GpuWorker(
            name,
            node(
                "gpu-worker",
                s.worker_instance_type,
                private_ip,
                s.worker_root_volume_gb,
                worker_user_data(token),
                s.spot_workers,
            ),
            opts=opts,
        )
        for name, private_ip, token in zip(names, s.worker_private_ips, join_tokens, strict=True)
    ]
    return Infrastructure(network=network, ssh=ssh, control=control, workers=workers, join_tokens=join_tokens)

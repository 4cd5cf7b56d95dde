"""The one way this project launches an EC2 node: hardened defaults in one place."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

UBUNTU_OWNER = "099720109477"  # Canonical
UBUNTU_2404_AMD64 = "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*"


@dataclass
class NodeSpec:
    role: str  # control-plane | gpu-worker
    instance_type: str
    ami_id: pulumi.Input[str]
    subnet_id: pulumi.Input[str]
    security_group_id: pulumi.Input[str]
    key_name: pulumi.Input[str]
    private_ip: str
    root_volume_gb: int
    user_data: pulumi.Input[str]
    spot: bool = False
    # e.g. the internet route; an Output that resolves to None adds nothing
    after: Sequence[pulumi.Input[pulumi.Resource]] = field(default_factory=tuple)
    rebuild_generation: int | None = None  # a new value replaces the instance (a deliberate rebuild)
    # the control node's (components/managed_prometheus.py); None: the node gets no AWS credentials.
    # A change attaches or detaches it in place, the instance stays (hashicorp/terraform-provider-aws
    # internal/service/ec2/ec2_instance.go: iam_instance_profile is not ForceNew; the update calls
    # associateInstanceProfile / ReplaceIamInstanceProfileAssociation).
    instance_profile: pulumi.Input[str] | None = None


def ubuntu_ami(parent: pulumi.Resource) -> pulumi.Output[str]:
    return aws.ec2.get_ami_output(
        owners=[UBUNTU_OWNER],
        most_recent=True,
        filters=[
            {"name": "name", "values": [UBUNTU_2404_AMD64]},
            {"name": "architecture", "values": ["x86_64"]},
            {"name": "virtualization-type", "values": ["hvm"]},
        ],
        opts=pulumi.InvokeOptions(parent=parent),
    ).id


def launch(name: str, spec: NodeSpec, parent: pulumi.Resource) -> aws.ec2.Instance:
    spot: aws.ec2.InstanceInstanceMarketOptionsArgsDict | None = None
    if spec.spot:
        # One-time + terminate: deleting the instance ends the request. A persistent request
        # outlives the instance on `pulumi destroy`, relaunches into the subnet and blocks
        # the VPC's deletion (hashicorp/terraform-provider-aws#38142).
        spot = {
            "market_type": "spot",
            "spot_options": {"spot_instance_type": "one-time", "instance_interruption_behavior": "terminate"},
        }
    # Pods must not read user-data (it holds a join token): one hop, tokens only.
    metadata: aws.ec2.InstanceMetadataOptionsArgsDict = {
        "http_endpoint": "enabled",
        "http_tokens": "required",
        "http_put_response_hop_limit": 1,
    }
    root: aws.ec2.InstanceRootBlockDeviceArgsDict = {
        "volume_type": "gp3",
        "volume_size": spec.root_volume_gb,
        "encrypted": True,
        "delete_on_termination": True,
    }
    return aws.ec2.Instance(
        name,
        ami=spec.ami_id,
        instance_type=spec.instance_type,
        subnet_id=spec.subnet_id,
        vpc_security_group_ids=[spec.security_group_id],
        key_name=spec.key_name,
        iam_instance_profile=spec.instance_profile,
        private_ip=spec.private_ip,
        user_data=spec.user_data,
        # cloud-init runs once per instance: a changed bootstrap needs a new instance.
        user_data_replace_on_change=True,
        metadata_options=metadata,
        root_block_device=root,
        instance_market_options=spot,
        tags={"Name": name, "testbed:role": spec.role, "testbed:stack": pulumi.get_stack()},
        opts=pulumi.ResourceOptions(
            parent=parent,
            depends_on=list(spec.after),
            # The private IP is fixed, so the old instance must go before its replacement;
            # a newer AMI found later must not replace a running node (pin amiId to move).
            delete_before_replace=True,
            ignore_changes=["ami"],
            replacement_trigger=spec.rebuild_generation,
        ),
    )

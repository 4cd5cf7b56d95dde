"""The control-plane node: a fixed private IP and an Elastic IP allocated before it boots."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from components import ec2


@dataclass
class ControlNodeArgs:
    node: ec2.NodeSpec  # user_data is filled in here
    # The API certificate must name the public IP, so user-data is rendered from it.
    user_data_for_public_ip: Callable[[pulumi.Output[str]], pulumi.Output[str]]


class ControlNode(pulumi.ComponentResource):
    public_ip: pulumi.Output[str]
    instance: aws.ec2.Instance
    eip_association: aws.ec2.EipAssociation
    user_data: pulumi.Output[str]

    def __init__(self, name: str, args: ControlNodeArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:aws:ControlNode", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        address = aws.ec2.Eip(
            f"{name}-eip",
            domain="vpc",
            tags={"Name": f"{name}-eip"},
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.node.after)),
        )
        self.user_data = args.user_data_for_public_ip(address.public_ip)
        self.instance = ec2.launch(
            f"{name}-instance", dataclasses.replace(args.node, user_data=self.user_data), parent=self
        )
        self.eip_association = aws.ec2.EipAssociation(
            f"{name}-eip-association", allocation_id=address.allocation_id, instance_id=self.instance.id, opts=child
        )
        self.public_ip = address.public_ip
        self.register_outputs({"publicIp": self.public_ip, "privateIp": self.instance.private_ip})

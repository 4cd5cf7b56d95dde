"""The control-plane node: a fixed private IP, an Elastic IP allocated before it boots, and the
user-data it renders for itself (the API certificate must name that public IP)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from components import bootstrap, ec2


@dataclass
class ControlNodeArgs:
    node: ec2.NodeSpec  # its user_data is rendered here
    kubernetes_version: str
    kubernetes_minor: str
    flannel_version: str
    share_export_cidr: str
    authorized_keys: tuple[str, ...]
    bootstrap_token: pulumi.Output[str]
    ca_cert_pem: pulumi.Output[str]  # the key is not here: it comes over SSH (stacks/cluster.py)


def render_user_data(args: ControlNodeArgs, public_ip: pulumi.Output[str]) -> pulumi.Output[str]:
    def render(v: dict[str, str]) -> str:
        return bootstrap.control_plane_user_data(
            bootstrap.ControlPlaneBootstrap(
                kubernetes_version=args.kubernetes_version,
                kubernetes_minor=args.kubernetes_minor,
                flannel_version=args.flannel_version,
                private_ip=args.node.private_ip,
                share_export_cidr=args.share_export_cidr,
                authorized_keys=args.authorized_keys,
                **v,
            )
        )

    return pulumi.Output.all(
        public_ip=public_ip,
        bootstrap_token=args.bootstrap_token,
        ca_cert_pem=args.ca_cert_pem,
    ).apply(render)


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
        self.user_data = render_user_data(args, address.public_ip)
        self.instance = ec2.launch(
            f"{name}-instance", dataclasses.replace(args.node, user_data=self.user_data), parent=self
        )
        self.eip_association = aws.ec2.EipAssociation(
            f"{name}-eip-association", allocation_id=address.allocation_id, instance_id=self.instance.id, opts=child
        )
        self.public_ip = address.public_ip
        self.register_outputs({"publicIp": self.public_ip, "privateIp": self.instance.private_ip})

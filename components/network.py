"""VPC, one public subnet, internet route, and the one security group every node shares."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from core import host_layout


@dataclass
class NetworkArgs:
    vpc_cidr: str
    subnet_cidr: str
    availability_zone: pulumi.Input[str]
    admin_cidr: str


def admin_ingress_rules(admin_cidr: str) -> list[aws.ec2.SecurityGroupIngressArgsDict]:
    """SSH (for the readiness gate and you) and the API server, from the admin range only."""
    return [
        {"description": description, "protocol": "tcp", "from_port": port, "to_port": port, "cidr_blocks": [admin_cidr]}
        for description, port in (
            ("SSH from the admin range", 22),
            ("Kubernetes API from the admin range", host_layout.API_SERVER_PORT),
        )
    ]


class Network(pulumi.ComponentResource):
    vpc_id: pulumi.Output[str]
    subnet_id: pulumi.Output[str]
    security_group_id: pulumi.Output[str]
    # Nodes and addresses wait for the internet route: they boot with a way out, and on
    # destroy the route goes only after them (and after everything reached through them).
    internet_route: aws.ec2.RouteTableAssociation

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:aws:Network", name, None, opts)
        self._name = name
        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=args.vpc_cidr,
            enable_dns_hostnames=True,
            enable_dns_support=True,
            tags={"Name": f"{name}-vpc"},
            opts=pulumi.ResourceOptions(parent=self),
        )
        subnet, self.internet_route = self._create_public_subnet(vpc, args)
        self.security_group_id = self._create_node_security_group(vpc, args.admin_cidr).id
        self.vpc_id = vpc.id
        self.subnet_id = subnet.id
        self.register_outputs(
            {"vpcId": self.vpc_id, "subnetId": self.subnet_id, "securityGroupId": self.security_group_id}
        )

    def _create_public_subnet(
        self, vpc: aws.ec2.Vpc, args: NetworkArgs
    ) -> tuple[aws.ec2.Subnet, aws.ec2.RouteTableAssociation]:
        name, child = self._name, pulumi.ResourceOptions(parent=self)
        gateway = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, tags={"Name": f"{name}-igw"}, opts=child)
        subnet = aws.ec2.Subnet(
            f"{name}-subnet",
            vpc_id=vpc.id,
            cidr_block=args.subnet_cidr,
            availability_zone=args.availability_zone,
            map_public_ip_on_launch=True,
            tags={"Name": f"{name}-subnet"},
            opts=child,
        )
        routes = aws.ec2.RouteTable(
            f"{name}-routes",
            vpc_id=vpc.id,
            routes=[{"cidr_block": "0.0.0.0/0", "gateway_id": gateway.id}],
            tags={"Name": f"{name}-routes"},
            opts=child,
        )
        association = aws.ec2.RouteTableAssociation(
            f"{name}-routes-subnet", subnet_id=subnet.id, route_table_id=routes.id, opts=child
        )
        return subnet, association

    def _create_node_security_group(self, vpc: aws.ec2.Vpc, admin_cidr: str) -> aws.ec2.SecurityGroup:
        return aws.ec2.SecurityGroup(
            f"{self._name}-nodes",
            description="testbed nodes: admin SSH/API, everything between nodes",
            vpc_id=vpc.id,
            ingress=[
                *admin_ingress_rules(admin_cidr),
                # Flannel VXLAN (UDP 8472), kubelet, NFS and API server -> webhook traffic.
                {
                    "description": "all traffic between testbed nodes",
                    "protocol": "-1",
                    "from_port": 0,
                    "to_port": 0,
                    "self": True,
                },
            ],
            egress=[
                {
                    "description": "all egress (packages, images)",
                    "protocol": "-1",
                    "from_port": 0,
                    "to_port": 0,
                    "cidr_blocks": ["0.0.0.0/0"],
                    "ipv6_cidr_blocks": ["::/0"],
                }
            ],
            tags={"Name": f"{self._name}-nodes"},
            opts=pulumi.ResourceOptions(parent=self),
        )

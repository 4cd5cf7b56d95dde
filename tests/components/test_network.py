import re

from components import network
from tests import tokens
from tests.conftest import ADMIN_CIDR, by_type, depends, run_program

ANYWHERE = ("0.0.0.0/0", "::/0")


def ingress_sources(rule: dict) -> list[str]:
    return rule.get("cidrBlocks", []) + rule.get("ipv6CidrBlocks", [])


def test_no_ingress_from_anywhere_by_default(default_run):
    for group in by_type(default_run, tokens.SECURITY_GROUP):
        for rule in group.inputs["ingress"]:
            assert not set(ingress_sources(rule)) & set(ANYWHERE), rule


def test_only_ssh_and_the_api_server_are_open_and_only_to_the_admin_range(default_run):
    (group,) = by_type(default_run, tokens.SECURITY_GROUP)
    external = [r for r in group.inputs["ingress"] if ingress_sources(r)]
    assert sorted((r["protocol"], r["fromPort"], r["toPort"]) for r in external) == [
        ("tcp", 22, 22),
        ("tcp", 6443, 6443),
    ]
    assert all(ingress_sources(r) == [ADMIN_CIDR] for r in external)


def test_nodes_reach_each_other_on_every_port_for_vxlan_kubelet_nfs_and_webhooks(default_run):
    (group,) = by_type(default_run, tokens.SECURITY_GROUP)
    internal = [r for r in group.inputs["ingress"] if r.get("self")]
    assert internal == [
        {"description": "all traffic between testbed nodes", "protocol": "-1", "fromPort": 0, "toPort": 0, "self": True}
    ]


def test_open_ingress_only_with_the_explicit_opt_in():
    rec = run_program(adminCidr="0.0.0.0/0", allowOpenIngress=True)
    (group,) = by_type(rec, tokens.SECURITY_GROUP)
    assert any("0.0.0.0/0" in ingress_sources(r) for r in group.inputs["ingress"])


def test_subnet_is_in_the_vpc_and_routes_to_the_internet_gateway(default_run):
    (vpc,) = by_type(default_run, tokens.VPC)
    (subnet,) = by_type(default_run, tokens.SUBNET)
    (routes,) = by_type(default_run, tokens.ROUTE_TABLE)
    (gateway,) = by_type(default_run, tokens.INTERNET_GATEWAY)
    assert subnet.inputs["cidrBlock"] == default_run.settings.subnet_cidr
    assert subnet.inputs["vpcId"] == f"{vpc.name}-placeholder"
    assert routes.inputs["routes"][0]["gatewayId"] == f"{gateway.name}-placeholder"
    assert gateway.urn in routes.depends_on


def test_zone_defaults_to_the_first_zone_offering_the_worker_type(default_run):
    (subnet,) = by_type(default_run, tokens.SUBNET)
    assert subnet.inputs["availabilityZone"] == "us-east-1a"
    rec = run_program(region="eu-west-1", availabilityZone="eu-west-1c")
    (subnet,) = by_type(rec, tokens.SUBNET)
    assert subnet.inputs["availabilityZone"] == "eu-west-1c"


def test_a_worker_type_the_region_does_not_offer_is_refused_by_name():
    import pulumi
    import pytest

    from stacks import offline
    from tests.conftest import config

    class NoOfferings(offline.TestbedMocks):
        def call(self, args):
            if args.token.endswith("getInstanceTypeOfferings"):
                return {"id": "none", "locations": [], "instanceTypes": [], "locationTypes": []}
            return super().call(args)

    with pytest.raises(
        pulumi.RunError, match=r'workerInstanceType: "g5.xlarge" is not offered in any zone of region eu-west-1'
    ):
        offline.run(config(region="eu-west-1", workerInstanceType="g5.xlarge"), mocks=NoOfferings())


def test_a_configured_zone_that_does_not_offer_the_worker_type_is_refused():
    import pulumi
    import pytest

    from stacks import offline
    from tests.conftest import config

    class OffersAToD(offline.TestbedMocks):
        """AWS's answer for a type offered in four zones of six (the default mock offers every zone)."""

        def call(self, args):
            if args.token.endswith("getInstanceTypeOfferings"):
                zones = [f"us-east-1{z}" for z in "abcd"]
                return {"id": "x", "locations": zones, "instanceTypes": ["x"] * 4, "locationTypes": ["x"] * 4}
            return super().call(args)

    with pytest.raises(
        pulumi.RunError, match=r'availabilityZone: "us-east-1e" does not offer g4dn.xlarge; zones that do: us-east-1a'
    ):
        offline.run(config(availabilityZone="us-east-1e"), mocks=OffersAToD())


def test_nodes_and_the_elastic_ip_wait_for_the_internet_route_and_go_before_it_on_destroy(default_run):
    (association,) = by_type(default_run, tokens.ROUTE_TABLE_ASSOCIATION)
    (gateway,) = by_type(default_run, tokens.INTERNET_GATEWAY)
    waiting = [
        *by_type(default_run, tokens.INSTANCE),
        *by_type(default_run, tokens.EIP),
        *by_type(default_run, tokens.EIP_ASSOCIATION),
    ]
    for r in waiting:
        assert depends(default_run, r, association) and depends(default_run, r, gateway), r.name
    # everything reached through the nodes (SSH steps, the Kubernetes provider) goes first on destroy
    gate = default_run.named("testbed-readiness-wait")
    assert depends(default_run, gate, association)


def test_nodes_reach_package_mirrors_and_registries_on_every_protocol(default_run):
    (group,) = by_type(default_run, tokens.SECURITY_GROUP)
    assert group.inputs["egress"] == [
        {
            "description": "all egress (packages, images)",
            "protocol": "-1",
            "fromPort": 0,
            "toPort": 0,
            "cidrBlocks": ["0.0.0.0/0"],
            "ipv6CidrBlocks": ["::/0"],
        }
    ]
    assert group.inputs["vpcId"] == f"{by_type(default_run, tokens.VPC)[0].name}-placeholder"


# What EC2 accepts in a VPC security group's and its rules' descriptions (EC2 API reference,
# CreateSecurityGroup GroupDescription and IpRange Description): the mock engine takes anything.
AWS_DESCRIPTION = re.compile(r"[a-zA-Z0-9 ._\-:/()#,@\[\]+=&;{}!$*]{1,255}")


def test_the_group_and_every_rule_have_a_description_ec2_accepts(default_run):
    (group,) = by_type(default_run, tokens.SECURITY_GROUP)
    rules = group.inputs["ingress"] + group.inputs["egress"]
    descriptions = [group.inputs["description"]] + [rule["description"] for rule in rules]
    assert [d for d in descriptions if not AWS_DESCRIPTION.fullmatch(d)] == []


def test_admin_rules_name_their_purpose_and_only_the_admin_range():
    rules = network.admin_ingress_rules("192.0.2.0/24")
    assert rules == [
        {
            "description": "SSH from the admin range",
            "protocol": "tcp",
            "from_port": 22,
            "to_port": 22,
            "cidr_blocks": ["192.0.2.0/24"],
        },
        {
            "description": "Kubernetes API from the admin range",
            "protocol": "tcp",
            "from_port": 6443,
            "to_port": 6443,
            "cidr_blocks": ["192.0.2.0/24"],
        },
    ]


def test_the_vpc_resolves_names_and_the_subnet_gives_public_addresses(default_run):
    (vpc,) = by_type(default_run, tokens.VPC)
    assert vpc.inputs["cidrBlock"] == default_run.settings.vpc_cidr
    assert (vpc.inputs["enableDnsHostnames"], vpc.inputs["enableDnsSupport"]) == (True, True)
    (subnet,) = by_type(default_run, tokens.SUBNET)
    assert subnet.inputs["mapPublicIpOnLaunch"] is True  # workers reach the internet without a NAT gateway
    (routes,) = by_type(default_run, tokens.ROUTE_TABLE)
    assert [r["cidrBlock"] for r in routes.inputs["routes"]] == ["0.0.0.0/0"]
    assert routes.inputs["vpcId"] == f"{vpc.name}-placeholder"
    (gateway,) = by_type(default_run, tokens.INTERNET_GATEWAY)
    assert gateway.inputs["vpcId"] == f"{vpc.name}-placeholder"
    (association,) = by_type(default_run, tokens.ROUTE_TABLE_ASSOCIATION)
    assert (association.inputs["subnetId"], association.inputs["routeTableId"]) == (
        f"{subnet.name}-placeholder",
        f"{routes.name}-placeholder",
    )
    for r in (vpc, subnet, routes, gateway, group_of(default_run)):
        assert r.inputs["tags"] == {"Name": r.name}, r.name


def group_of(rec):
    (group,) = by_type(rec, tokens.SECURITY_GROUP)
    return group

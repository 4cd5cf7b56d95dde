"""The deployer policy reaches only the testbed: each attack path of issue 30 is refused, and the
program's own calls are allowed, as moto's IAM policy evaluator decides them, statement by statement.

Where moto's evaluator ends (moto 5.2.5 moto/iam/access_control.py IAMPolicyStatement and
moto/iam/policy_conditions.py), and what this module does past it:
* moto implements one condition operator, StringEquals, and passes any other: the policy may use
  only StringEquals (checked below), so no condition is waved through;
* moto reads only sts:ExternalId from a request, and skips a key the request lacks: here every
  request carries every condition key the policy names, an absent one as a value no policy holds
  (in AWS a missing key fails StringEquals);
* moto treats an Allow statement whose condition fails as an explicit deny of the whole request:
  here each statement is asked alone and, as AWS does, any statement that allows it allows it;
* AWS authorises a call once per resource it touches (RunInstances: the instance, its volume,
  interface, subnet, security group, key pair and image): a request here lists each resource ARN
  with its own context, and is allowed only when each one is.
What only AWS shows: which resources and context keys each call really carries (Service
Authorization Reference tables), and the Terraform provider tagging on create, which this
module takes as the reference lists them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from moto.iam.access_control import IAMPolicyStatement, PermissionResult

from components.ec2 import UBUNTU_OWNER

ROOT = Path(__file__).resolve().parents[2]
POLICY = json.loads((ROOT / "iam" / "testbed-policy.json").read_text())
TAG_KEY, TAG_VALUE = "testbed:project", "gpu-testbed"
ABSENT = "<absent>"
ACCOUNT = "123456789012"
BOUNDARY = "arn:aws:iam::aws:policy/AmazonPrometheusRemoteWriteAccess"


def condition_keys() -> set[str]:
    return {key for s in POLICY["Statement"] for op in s.get("Condition", {}).values() for key in op}


def arn(kind: str, ident: str, service="ec2") -> str:
    return f"arn:aws:{service}:us-east-1:{ACCOUNT}:{kind}/{ident}"


@dataclass
class On:
    """One resource a call touches, and what AWS knows of it."""

    arn: str
    tagged: bool = False  # carries testbed:project=gpu-testbed already
    request_tagged: bool = False  # the call asks to tag it so (tag on create)
    keys: dict[str, str] = field(default_factory=dict)

    def context(self) -> dict[str, str]:
        known = {
            f"aws:ResourceTag/{TAG_KEY}": TAG_VALUE if self.tagged else ABSENT,
            f"aws:RequestTag/{TAG_KEY}": TAG_VALUE if self.request_tagged else ABSENT,
            **self.keys,
        }
        return {key: known.get(key, ABSENT) for key in condition_keys()}


def allowed(action: str, *resources: On) -> bool:
    statements = [IAMPolicyStatement(s) for s in POLICY["Statement"]]
    return all(
        any(s.is_action_permitted(action, r.arn, None, r.context()) == PermissionResult.PERMITTED for s in statements)
        for r in resources
    )


def instance(tagged=True, **keys) -> On:
    return On(arn("instance", "i-0abc"), tagged=tagged, keys=keys)


def launch(
    subnet_tagged=True, group_tagged=True, key_tagged=True, image_owner=UBUNTU_OWNER, instance_type="g4dn.xlarge"
) -> tuple[On, ...]:
    """RunInstances as the program calls it, each resource as AWS authorises it."""
    return (
        On(arn("instance", "*"), request_tagged=True, keys={"ec2:InstanceType": instance_type}),
        On(arn("volume", "*"), request_tagged=True),
        On(arn("network-interface", "*")),
        On(arn("subnet", "subnet-1"), tagged=subnet_tagged),
        On(arn("security-group", "sg-1"), tagged=group_tagged),
        On(arn("key-pair", "testbed-key"), tagged=key_tagged),
        On("arn:aws:ec2:us-east-1::image/ami-1", keys={"ec2:Owner": image_owner}),
    )


def test_the_policy_uses_only_what_the_evaluator_enforces():
    operators = {op for s in POLICY["Statement"] for op in s.get("Condition", {})}
    assert operators == {"StringEquals"}
    assert all(s["Effect"] == "Allow" for s in POLICY["Statement"])  # no Deny for moto to misjudge


# The program's own calls: deploy, change and destroy still work
DEPLOYS = {
    "create a tagged VPC": ("ec2:CreateVpc", On(arn("vpc", "*"), request_tagged=True)),
    "a subnet in it": (
        "ec2:CreateSubnet",
        On(arn("subnet", "*"), request_tagged=True),
        On(arn("vpc", "vpc-1"), tagged=True),
    ),
    "tag while creating": (
        "ec2:CreateTags",
        On(arn("instance", "*"), request_tagged=True, keys={"ec2:CreateAction": "RunInstances"}),
    ),
    "launch": ("ec2:RunInstances", *launch()),
    "open its own group": (
        "ec2:AuthorizeSecurityGroupIngress",
        On(arn("security-group", "sg-1"), tagged=True),
        On(arn("security-group-rule", "*")),
    ),
    "attach its address": (
        "ec2:AssociateAddress",
        On(arn("elastic-ip", "eipalloc-1"), tagged=True),
        instance(),
    ),
    "read its console": ("ec2:GetConsoleOutput", instance()),
    "terminate": ("ec2:TerminateInstances", instance()),
    "create the workspace": ("aps:CreateWorkspace", On(arn("workspace", "*", "aps"), request_tagged=True)),
    "delete the workspace": ("aps:DeleteWorkspace", On(arn("workspace", "ws-1", "aps"), tagged=True)),
    "the writer role, bounded": (
        "iam:CreateRole",
        On(
            f"arn:aws:iam::{ACCOUNT}:role/testbed-evidence-writer-role-1a2b", keys={"iam:PermissionsBoundary": BOUNDARY}
        ),
    ),
}


@pytest.mark.parametrize("call", DEPLOYS)
def test_the_programs_own_calls_are_allowed(call):
    action, *resources = DEPLOYS[call]
    assert allowed(action, *resources)


FOREIGN_INSTANCE = instance(tagged=False)
# Issue 30's attack paths, each refused
ATTACKS = {
    "tag any instance as the testbed's, then delete it": (
        "ec2:CreateTags",
        On(arn("instance", "i-foreign"), request_tagged=True),
    ),
    "tag any VPC as the testbed's": ("ec2:CreateTags", On(arn("vpc", "vpc-foreign"), request_tagged=True)),
    "tag any AMP workspace as the testbed's": (
        "aps:TagResource",
        On(arn("workspace", "ws-foreign", "aps"), request_tagged=True),
    ),
    "delete a foreign VPC": ("ec2:DeleteVpc", On(arn("vpc", "vpc-foreign"))),
    "delete a foreign workspace": ("aps:DeleteWorkspace", On(arn("workspace", "ws-foreign", "aps"))),
    "stop any instance": ("ec2:StopInstances", FOREIGN_INSTANCE),
    "rewrite any instance's user-data": ("ec2:ModifyInstanceAttribute", FOREIGN_INSTANCE),
    "start it again": ("ec2:StartInstances", FOREIGN_INSTANCE),
    "terminate any instance": ("ec2:TerminateInstances", FOREIGN_INSTANCE),
    "launch into any subnet": ("ec2:RunInstances", *launch(subnet_tagged=False)),
    "launch into any security group": ("ec2:RunInstances", *launch(group_tagged=False)),
    "launch with another key pair": ("ec2:RunInstances", *launch(key_tagged=False)),
    "launch another AMI": ("ec2:RunInstances", *launch(image_owner="111122223333")),
    "launch another instance type": ("ec2:RunInstances", *launch(instance_type="p5.48xlarge")),
    "launch untagged": ("ec2:RunInstances", On(arn("instance", "*"), keys={"ec2:InstanceType": "g4dn.xlarge"})),
    "open any security group": (
        "ec2:AuthorizeSecurityGroupIngress",
        On(arn("security-group", "sg-foreign")),
        On(arn("security-group-rule", "*")),
    ),
    "move any Elastic IP": ("ec2:AssociateAddress", On(arn("elastic-ip", "eipalloc-foreign")), instance()),
    "move the testbed's address onto any instance": (
        "ec2:AssociateAddress",
        On(arn("elastic-ip", "eipalloc-1"), tagged=True),
        FOREIGN_INSTANCE,
    ),
    "read any instance's user-data": ("ec2:DescribeInstanceAttribute", FOREIGN_INSTANCE),
    "read any instance's console": ("ec2:GetConsoleOutput", FOREIGN_INSTANCE),
    "give the writer role another trust": (
        "iam:UpdateAssumeRolePolicy",
        On(f"arn:aws:iam::{ACCOUNT}:role/testbed-evidence-writer-role-1a2b"),
    ),
    "create the writer role without its boundary": (
        "iam:CreateRole",
        On(f"arn:aws:iam::{ACCOUNT}:role/testbed-evidence-writer-role-1a2b", keys={"iam:PermissionsBoundary": ABSENT}),
    ),
    "create a VPC without the tag": ("ec2:CreateVpc", On(arn("vpc", "*"))),
    "create a workspace without the tag": ("aps:CreateWorkspace", On(arn("workspace", "*", "aps"))),
}


@pytest.mark.parametrize("path", ATTACKS)
def test_each_attack_path_is_refused(path):
    action, *resources = ATTACKS[path]
    assert not allowed(action, *resources)

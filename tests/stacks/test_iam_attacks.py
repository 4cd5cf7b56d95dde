"""The deployer policy reaches only the testbed: each attack path of issue 30 is refused, and the
program's own calls are allowed, as moto's IAM policy evaluator decides them, statement by statement.
The writer role's boundary (iam/writer-boundary.json) is evaluated the same way, with the role's
own policy, for what any session of that role may do, whoever its trust lets in.

Where moto's evaluator ends (moto 5.2.5 moto/iam/access_control.py IAMPolicyStatement and
moto/iam/policy_conditions.py), and what this module does past it:
* moto implements one condition operator, StringEquals, and passes any other: the deployer policy
  may use only StringEquals (checked below), so no condition is waved through; the boundary also
  uses Null, which `permits` evaluates here (AWS: "true" holds when the key is absent, "false"
  when it is present) before moto sees the statement;
* moto compares a policy variable such as ${aws:PrincipalAccount} as literal text: `permits`
  resolves the one variable the policies use to the caller's account first, as AWS does (IAM User
  Guide, "IAM policy elements: Variables and tags": variables in string condition values);
* moto reads only sts:ExternalId from a request, and skips a key the request lacks: here every
  request carries every condition key the policies name, an absent one as a value no policy holds
  (in AWS a missing key fails StringEquals); so iam:PermissionsBoundary is the value the request
  names (CreateRole, PutRolePermissionsBoundary) or the role already has (PutRolePolicy,
  DeleteRolePolicy), as the Service Authorization Reference describes the key;
* moto treats an Allow statement whose condition fails as an explicit deny of the whole request:
  here each statement is asked alone and, as AWS does, any statement that allows it allows it;
* AWS authorises a call once per resource it touches (RunInstances: the instance, its volume,
  interface, subnet, security group, key pair and image): a request here lists each resource ARN
  with its own context, and is allowed only when each one is;
* moto never reads a role's permissions boundary (access_control.py has no mention of one), and
  fills iam:PermissionsBoundary from no request (utils.py format_incoming_conditional_values):
  a role's session is allowed what both its own policy and its boundary allow (IAM User Guide,
  "Permissions boundaries for IAM entities"), so `role_may` asks moto about both.
What only AWS shows: which resources and context keys each call really carries (Service
Authorization Reference tables), the Terraform provider tagging on create, which this module takes
as the reference lists them, and that AMP's RemoteWrite sees aws:Ec2InstanceSourceVPC in the
request context of the control node's instance credentials.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from components.ec2 import UBUNTU_OWNER
from components.managed_prometheus import write_policy
from core.names import writer_boundary_arn

ROOT = Path(__file__).resolve().parents[2]
POLICY = json.loads((ROOT / "iam" / "testbed-policy.json").read_text())
BOUNDARY_POLICY = json.loads((ROOT / "iam" / "writer-boundary.json").read_text())
TAG_KEY, TAG_VALUE = "testbed:project", "gpu-testbed"
ABSENT = "<absent>"
ACCOUNT = "123456789012"
OUTSIDE_ACCOUNT = "999988887777"
BOUNDARY = writer_boundary_arn(ACCOUNT)  # what the program names (tests/stacks/test_iam.py)
OLD_BOUNDARY = "arn:aws:iam::aws:policy/AmazonPrometheusRemoteWriteAccess"  # aps:RemoteWrite on "*"
ADMIN = "arn:aws:iam::aws:policy/AdministratorAccess"
WRITER_ROLE = f"arn:aws:iam::{ACCOUNT}:role/testbed-evidence-writer-role-1a2b"
# moto and parliament imported where used, on the worker of the other AWS tools (test_iam_tools.py)
pytestmark = pytest.mark.xdist_group("aws-tools")
VARIABLES = {"${aws:PrincipalAccount}": ACCOUNT}  # the caller's account, in every request
INSTANCE_CREDENTIALS = {"aws:Ec2InstanceSourceVPC": "vpc-1"}  # credentials IMDS handed to an instance


def condition_keys() -> set[str]:
    policies = (POLICY, BOUNDARY_POLICY)
    return {key for p in policies for s in p["Statement"] for op in s.get("Condition", {}).values() for key in op}


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


def resolved(value: str | list[str]) -> str | list[str]:
    if isinstance(value, list):
        return [resolved(v) for v in value]
    for variable, known in VARIABLES.items():
        value = value.replace(variable, known)
    assert "${" not in value, value  # a variable this evaluator does not know
    return value


def permits(statement: dict, action: str, on: On) -> bool:
    """One Allow statement, as AWS evaluates it: Null and the policy variables here, the rest by moto."""
    condition = statement.get("Condition", {})
    context = on.context()
    for key, absent in condition.get("Null", {}).items():
        if (context[key] == ABSENT) != (absent == "true"):
            return False
    strings = {key: resolved(value) for key, value in condition.get("StringEquals", {}).items()}
    asked = {**statement, "Condition": {"StringEquals": strings}} if strings else dict(statement, Condition={})
    from moto.iam.access_control import IAMPolicyStatement, PermissionResult

    return IAMPolicyStatement(asked).is_action_permitted(action, on.arn, None, context) == PermissionResult.PERMITTED


def allowed(action: str, *resources: On) -> bool:
    return all(any(permits(s, action, r) for s in POLICY["Statement"]) for r in resources)


def role_may(action: str, on: On, own_policy: dict) -> bool:
    """A session of the writer role: what its own policy allows, within its boundary."""
    return all(any(permits(s, action, on) for s in p["Statement"]) for p in (own_policy, BOUNDARY_POLICY))


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


def test_the_policies_use_only_what_the_evaluator_enforces():
    operators = {op for s in POLICY["Statement"] for op in s.get("Condition", {})}
    assert operators == {"StringEquals"}
    assert {op for s in BOUNDARY_POLICY["Statement"] for op in s["Condition"]} == {"StringEquals", "Null"}
    for policy in (POLICY, BOUNDARY_POLICY):
        assert all(s["Effect"] == "Allow" for s in policy["Statement"])  # no Deny for moto to misjudge
        variables = set(re.findall(r"\$\{[^}]*\}", json.dumps(policy)))
        assert variables <= set(VARIABLES)


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
    "the writer role, bounded": ("iam:CreateRole", On(WRITER_ROLE, keys={"iam:PermissionsBoundary": BOUNDARY})),
    "its write grant": ("iam:PutRolePolicy", On(WRITER_ROLE, keys={"iam:PermissionsBoundary": BOUNDARY})),
    "pass it to the control node": ("iam:PassRole", On(WRITER_ROLE, keys={"iam:PassedToService": "ec2.amazonaws.com"})),
    "a stack deployed with the old boundary takes the new one in place": (
        "iam:PutRolePermissionsBoundary",
        On(WRITER_ROLE, keys={"iam:PermissionsBoundary": BOUNDARY}),
    ),
    "destroy: its grant": ("iam:DeleteRolePolicy", On(WRITER_ROLE, keys={"iam:PermissionsBoundary": BOUNDARY})),
    "destroy: the role": ("iam:DeleteRole", On(WRITER_ROLE)),
    "preflight reads the boundary": ("iam:GetPolicyVersion", On(BOUNDARY)),
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
    "give the writer role another trust": ("iam:UpdateAssumeRolePolicy", On(WRITER_ROLE)),
    "create the writer role without its boundary": (
        "iam:CreateRole",
        On(WRITER_ROLE, keys={"iam:PermissionsBoundary": ABSENT}),
    ),
    "create it within the AWS managed remote-write policy (every workspace)": (
        "iam:CreateRole",
        On(WRITER_ROLE, keys={"iam:PermissionsBoundary": OLD_BOUNDARY}),
    ),
    "create it within AdministratorAccess": (
        "iam:CreateRole",
        On(WRITER_ROLE, keys={"iam:PermissionsBoundary": ADMIN}),
    ),
    "create it within a same-named policy of another account": (
        "iam:CreateRole",
        On(WRITER_ROLE, keys={"iam:PermissionsBoundary": writer_boundary_arn(OUTSIDE_ACCOUNT)}),
    ),
    "create another role within the boundary": (
        "iam:CreateRole",
        On(f"arn:aws:iam::{ACCOUNT}:role/admin", keys={"iam:PermissionsBoundary": BOUNDARY}),
    ),
    "grant a role that has another boundary": (
        "iam:PutRolePolicy",
        On(WRITER_ROLE, keys={"iam:PermissionsBoundary": OLD_BOUNDARY}),
    ),
    "delete the role's boundary": (
        "iam:DeleteRolePermissionsBoundary",
        On(WRITER_ROLE, keys={"iam:PermissionsBoundary": BOUNDARY}),
    ),
    "replace the role's boundary with AdministratorAccess": (
        "iam:PutRolePermissionsBoundary",
        On(WRITER_ROLE, keys={"iam:PermissionsBoundary": ADMIN}),
    ),
    "attach a managed policy to the role": (
        "iam:AttachRolePolicy",
        On(WRITER_ROLE, keys={"iam:PermissionsBoundary": BOUNDARY, "iam:PolicyARN": ADMIN}),
    ),
    "pass the role to another service": (
        "iam:PassRole",
        On(WRITER_ROLE, keys={"iam:PassedToService": "lambda.amazonaws.com"}),
    ),
    "edit the boundary: a new default version": ("iam:CreatePolicyVersion", On(BOUNDARY)),
    "edit the boundary: an older version as default": ("iam:SetDefaultPolicyVersion", On(BOUNDARY)),
    "edit the boundary: drop a version": ("iam:DeletePolicyVersion", On(BOUNDARY)),
    "delete the boundary": ("iam:DeletePolicy", On(BOUNDARY)),
    "create it again with other content": ("iam:CreatePolicy", On(BOUNDARY)),
    "create a VPC without the tag": ("ec2:CreateVpc", On(arn("vpc", "*"))),
    "create a workspace without the tag": ("aps:CreateWorkspace", On(arn("workspace", "*", "aps"))),
}


@pytest.mark.parametrize("path", ATTACKS)
def test_each_attack_path_is_refused(path):
    action, *resources = ATTACKS[path]
    assert not allowed(action, *resources)


def test_no_iam_condition_reads_a_trust_policy():
    """So no deployer policy can refuse CreateRole with an outside account in the trust: the
    Service Authorization Reference (parliament 1.6.4 ships it as iam_definition.json) lists for
    CreateRole only the boundary and the tags, for UpdateAssumeRolePolicy nothing. The boundary
    (below) is what makes such a trust worthless."""
    import parliament

    reference = json.loads((Path(parliament.__file__).parent / "iam_definition.json").read_text())

    def condition_keys_of(prefix: str, action: str) -> set[str]:
        return {  # the reference lists IAM twice (two service names): both entries count
            key
            for service in reference
            if service["prefix"] == prefix
            for p in service["privileges"]
            if p["privilege"] == action
            for r in p["resource_types"]
            for key in r["condition_keys"]
        }

    assert condition_keys_of("iam", "CreateRole") == {
        "iam:PermissionsBoundary",
        "aws:TagKeys",
        "aws:RequestTag/${TagKey}",
    }
    assert condition_keys_of("iam", "UpdateAssumeRolePolicy") == set()
    # and the boundary's tag condition is one RemoteWrite takes: the workspace's aws:ResourceTag
    assert "aws:ResourceTag/${TagKey}" in condition_keys_of("aps", "RemoteWrite")
    (aps,) = [service for service in reference if service["prefix"] == "aps"]
    (workspace,) = [r for r in aps["resources"] if r["resource"] == "workspace"]
    assert "aws:ResourceTag/${TagKey}" in workspace["condition_keys"]


WORKSPACE = arn("workspace", "ws-testbed", "aps")
OWN_POLICY = json.loads(write_policy(WORKSPACE))  # the grant the program gives the role
ANYTHING = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


def test_prometheus_on_the_control_node_writes_into_its_workspace():
    on = On(WORKSPACE, tagged=True, keys=INSTANCE_CREDENTIALS)
    assert role_may("aps:RemoteWrite", on, OWN_POLICY)


# What a session of a writer role can do, whatever its trust and whatever grant the deployer
# puts on it (ANYTHING: PutRolePolicy is the deployer's): the boundary refuses each
OUTSIDE_SESSION = {}  # assumed through sts:AssumeRole by whoever the trust names: no instance credentials
BOUNDED = {
    "an outside account trusted by the role writes into the testbed's workspace": (
        "aps:RemoteWrite",
        On(WORKSPACE, tagged=True, keys=OUTSIDE_SESSION),
    ),
    "the instance writes into a workspace not the testbed's": (
        "aps:RemoteWrite",
        On(arn("workspace", "ws-foreign", "aps"), keys=INSTANCE_CREDENTIALS),
    ),
    "it reads the workspace": ("aps:QueryMetrics", On(WORKSPACE, tagged=True, keys=INSTANCE_CREDENTIALS)),
    "it deletes the workspace": ("aps:DeleteWorkspace", On(WORKSPACE, tagged=True, keys=INSTANCE_CREDENTIALS)),
    "it makes itself a user": ("iam:CreateUser", On(f"arn:aws:iam::{ACCOUNT}:user/x", keys=INSTANCE_CREDENTIALS)),
    "it reads a bucket": ("s3:GetObject", On("arn:aws:s3:::any-bucket/key", keys=INSTANCE_CREDENTIALS)),
}


@pytest.mark.parametrize("path", BOUNDED)
def test_the_boundary_refuses_whatever_the_trust_and_the_grant(path):
    action, on = BOUNDED[path]
    assert not role_may(action, on, ANYTHING)
    assert not role_may(action, on, OWN_POLICY)

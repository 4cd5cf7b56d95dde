"""iam/testbed-policy.json: exactly the actions the program, its invokes and the tools call."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from core import trusted_yaml
from core.names import WRITER_BOUNDARY_POLICY
from tests.conftest import BUDGET_AND_WORKSPACE_NOT_KEPT, run_program

ROOT = Path(__file__).resolve().parents[2]
POLICY = json.loads((ROOT / "iam" / "testbed-policy.json").read_text())
ACTIONS = trusted_yaml.load((ROOT / "iam" / "actions.yaml").read_text())
INSTANCE = "aws:ec2/instance:Instance"


def granted() -> set[str]:
    return {a for s in POLICY["Statement"] if s["Effect"] == "Allow" for a in s["Action"]}


def mapped() -> set[str]:
    groups = [*ACTIONS["resources"].values(), *ACTIONS["invokes"].values(), ACTIONS["spot"], *ACTIONS["tools"].values()]
    return {a for group in groups for a in group}


def aws_types(rec) -> set[str]:
    return {r.type for r in rec.resources if r.type.startswith("aws:") or r.type == "pulumi:providers:aws"}


def test_the_policy_grants_exactly_the_mapped_actions():
    assert granted() == mapped()
    assert all(re.fullmatch(r"(ec2|sts|servicequotas|iam|aps|budgets):[A-Z][A-Za-z]+", a) for a in granted())
    assert not any(s["Effect"] != "Allow" or "*" in "".join(s["Action"]) for s in POLICY["Statement"])


def test_every_aws_type_and_invoke_the_program_uses_is_mapped(default_run, spot_run, budget_run):
    used = aws_types(default_run) | aws_types(spot_run) | aws_types(budget_run)
    assert used == set(ACTIONS["resources"]), "a resource type without actions, or a stale entry"
    invokes = {token for rec in (default_run, spot_run) for token, _ in rec.invokes if token.startswith("aws:")}
    assert invokes == set(ACTIONS["invokes"])
    spot = [r for r in spot_run.of_type(INSTANCE) if (r.inputs.get("instanceMarketOptions") or {}).get("marketType")]
    assert spot and set(ACTIONS["spot"]) <= granted()


@pytest.fixture(scope="module")
def budget_run():
    return run_program(**BUDGET_AND_WORKSPACE_NOT_KEPT)


def statements_granting(action: str) -> list[dict]:
    return [s for s in POLICY["Statement"] if action in s["Action"]]


def test_iam_and_budget_actions_reach_only_the_programs_own_role_profile_and_budget(default_run, budget_run):
    """Resource patterns are the Pulumi names the program registers plus the engine's auto-name suffix."""
    boundary = default_run.named("testbed-evidence-writer-role").inputs["permissionsBoundary"]
    registered = {
        "role": default_run.named("testbed-evidence-writer-role").name,
        "instance-profile": default_run.named("testbed-evidence-writer-profile").name,
        "budget": budget_run.of_type("aws:budgets/budget:Budget")[0].name,
        "policy": boundary.rpartition(":policy/")[2],  # the administrator's, which the role names
    }
    for s in POLICY["Statement"]:
        services = {a.split(":")[0] for a in s["Action"]}
        if s["Action"] == ["iam:CreateServiceLinkedRole"]:
            continue  # the spot statement, checked by its own condition
        if services & {"iam", "budgets"}:
            assert len(services) == 1, s["Sid"]
            (kind, name) = re.fullmatch(r"arn:aws:(?:iam|budgets)::\*:([a-z-]+)/(.+?)(?:-\*)?", s["Resource"]).groups()
            assert name == registered[kind], s["Sid"]
            # a policy by its exact name (the boundary), nothing else by name without the auto-name suffix
            assert (kind == "policy") == (not s["Resource"].endswith("-*")), s["Sid"]
    (passing,) = statements_granting("iam:PassRole")
    assert passing["Condition"] == {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}
    # the nodes' role may only write to the workspace, which is the program's, not this policy's, grant
    assert "aps:RemoteWrite" not in granted()


def test_roles_are_created_and_given_policies_only_within_the_administrators_boundary(default_run):
    """CreateRole, PutRolePolicy, DeleteRolePolicy and PutRolePermissionsBoundary only with the
    boundary the program's role carries, in the caller's own account (the policy variable
    aws:PrincipalAccount), and nothing that drops a boundary, attaches a policy or writes one: the
    deployer can never mint a role that does more than the boundary allows (AWS IAM condition
    key iam:PermissionsBoundary; test_iam_attacks.py evaluates it)."""
    role = default_run.named("testbed-evidence-writer-role")
    boundary = role.inputs["permissionsBoundary"]
    (workspace,) = default_run.of_type("aws:amp/workspace:Workspace")
    account = workspace.outputs["arn"].split(":")[4]  # where the workspace lives, as the engine returned it
    assert "aws:index/getCallerIdentity:getCallerIdentity" in default_run.invoke_args  # the deploying account
    assert boundary == f"arn:aws:iam::{account}:policy/{WRITER_BOUNDARY_POLICY}"
    as_the_policy_names_it = boundary.replace(f"::{account}:", "::${aws:PrincipalAccount}:")
    for action in ("iam:CreateRole", "iam:PutRolePolicy", "iam:DeleteRolePolicy", "iam:PutRolePermissionsBoundary"):
        (s,) = statements_granting(action)
        assert s["Condition"] == {"StringEquals": {"iam:PermissionsBoundary": as_the_policy_names_it}}, action
    assert not {"iam:DeleteRolePermissionsBoundary", "iam:AttachRolePolicy"} & granted()
    # on policies: read the boundary (preflight), nothing else
    on_policies = {a for s in POLICY["Statement"] if ":policy/" in str(s["Resource"]) for a in s["Action"]}
    assert on_policies == {"iam:GetPolicy", "iam:GetPolicyVersion"}
    written = {a for a in granted() if re.fullmatch(r"iam:(Create|Delete|Set|Put|Attach)\w*Polic\w*", a)}
    assert written == {"iam:PutRolePolicy", "iam:DeleteRolePolicy"}  # inline, on the bounded role only


def test_every_change_create_and_delete_is_limited_to_the_providers_default_tag(default_run):
    """Outside plain reads, every grant needs the tag the provider puts on everything it creates
    (on the resource, or asked for in the create), a create in progress, or a name the program
    owns; the user-data and console reads too. tests/stacks/test_iam_attacks.py walks the paths."""
    (provider,) = default_run.of_type("pulumi:providers:aws")
    default_tags = json.loads(provider.inputs["defaultTags"])["tags"]  # the provider carries it as JSON
    tagged = {f"aws:{kind}Tag/testbed:project": default_tags["testbed:project"] for kind in ("Resource", "Request")}
    (reads,) = [s for s in POLICY["Statement"] if s["Sid"] == "ReadOnlyLookups"]
    assert all(re.fullmatch(r"[a-z0-9]+:(Describe|List|Get)[A-Za-z]+", a) for a in reads["Action"])
    assert not {"ec2:DescribeInstanceAttribute", "ec2:GetConsoleOutput"} & set(reads["Action"])
    for s in POLICY["Statement"]:
        if s is reads:
            continue
        condition = s.get("Condition", {}).get("StringEquals", {})
        resources = [s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"]
        named = all(
            re.fullmatch(r"arn:aws:(iam|budgets)::\*:[a-z-]+/(testbed-|aws-service-role/).+", r) for r in resources
        )
        by_tag = any(condition.get(key) == value for key, value in tagged.items())
        assert named or by_tag or s["Sid"] in UNTAGGED_BY_DESIGN, s["Sid"]
    # ec2:CreateTags only inside a create, of what the program creates
    (tag_on_create,) = statements_granting("ec2:CreateTags")
    assert set(tag_on_create["Condition"]["StringEquals"]["ec2:CreateAction"]) == {
        a.removeprefix("ec2:")
        for a in granted()
        if re.fullmatch(r"ec2:(Create(?!Tags|Route$)[A-Za-z]+|RunInstances|AllocateAddress|ImportKeyPair)", a)
    }
    assert "ec2:DeleteTags" not in granted() and "iam:UpdateAssumeRolePolicy" not in granted()


# RunInstances' resources that are not tagged: each held by its own condition or the call's others
UNTAGGED_BY_DESIGN = {
    "LaunchOnlyCanonicalUbuntuImages",  # ec2:Owner
    "LaunchWithInterfacesThatLandInTheTestbedSubnet",  # the subnet must be tagged
    "NewSecurityGroupRulesOnlyOnTestbedGroups",  # the group must be tagged
}


def test_launches_take_only_the_programs_image_owner_and_the_catalogue_types():
    from components.ec2 import UBUNTU_OWNER
    from core import instance_types

    (image,) = [s for s in POLICY["Statement"] if s["Sid"] == "LaunchOnlyCanonicalUbuntuImages"]
    assert image["Condition"] == {"StringEquals": {"ec2:Owner": UBUNTU_OWNER}}
    (types,) = [s for s in POLICY["Statement"] if "ec2:InstanceType" in s.get("Condition", {}).get("StringEquals", {})]
    assert set(types["Condition"]["StringEquals"]["ec2:InstanceType"]) == set(instance_types.accepted_controls()) | set(
        instance_types.accepted_workers()
    )


# What the policy's tag-on-create statements let the deployer create, by the resource type that calls it
TAGGED_ON_CREATE = {
    "aws:ec2/vpc:Vpc": "ec2:CreateVpc",
    "aws:ec2/subnet:Subnet": "ec2:CreateSubnet",
    "aws:ec2/securityGroup:SecurityGroup": "ec2:CreateSecurityGroup",
    "aws:ec2/internetGateway:InternetGateway": "ec2:CreateInternetGateway",
    "aws:ec2/routeTable:RouteTable": "ec2:CreateRouteTable",
    "aws:ec2/eip:Eip": "ec2:AllocateAddress",
    "aws:ec2/keyPair:KeyPair": "ec2:ImportKeyPair",
    "aws:ec2/instance:Instance": "ec2:RunInstances",
    "aws:amp/workspace:Workspace": "aps:CreateWorkspace",
}


def test_everything_the_program_creates_carries_the_tag_the_policy_asks_for(default_run, spot_run):
    """Each resource whose create the policy conditions on aws:RequestTag is made through the
    provider whose default tags carry it, and none overrides or drops the tag."""
    (provider,) = default_run.of_type("pulumi:providers:aws")
    assert json.loads(provider.inputs["defaultTags"])["tags"]["testbed:project"] == "gpu-testbed"
    conditioned = {
        a
        for s in POLICY["Statement"]
        if s.get("Condition", {}).get("StringEquals", {}).get("aws:RequestTag/testbed:project") == "gpu-testbed"
        for a in s["Action"]
    }
    assert set(TAGGED_ON_CREATE.values()) <= conditioned
    for rec in (default_run, spot_run):
        made = [r for r in rec.resources if r.type in TAGGED_ON_CREATE]
        for r in made:
            assert r.provider.startswith(provider.urn + "::"), r.name
            assert (r.inputs.get("tags") or {}).get("testbed:project", "gpu-testbed") == "gpu-testbed", r.name
    assert {r.type for r in default_run.resources} & set(TAGGED_ON_CREATE) == set(TAGGED_ON_CREATE)

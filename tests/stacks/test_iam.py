"""iam/testbed-policy.json: exactly the actions the program, its invokes and the tools call."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_program

ROOT = Path(__file__).resolve().parents[2]
POLICY = json.loads((ROOT / "iam" / "testbed-policy.json").read_text())
ACTIONS = yaml.safe_load((ROOT / "iam" / "actions.yaml").read_text())
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
    return run_program(budgetMonthlyUsd=100, budgetEmail="ops@example.com")


def statements_granting(action: str) -> list[dict]:
    return [s for s in POLICY["Statement"] if action in s["Action"]]


def test_iam_and_budget_actions_reach_only_the_programs_own_role_profile_and_budget(default_run, budget_run):
    """Resource patterns are the Pulumi names the program registers plus the engine's auto-name suffix."""
    registered = {
        "role": default_run.named("testbed-evidence-writer-role"),
        "instance-profile": default_run.named("testbed-evidence-writer-profile"),
        "budget": budget_run.of_type("aws:budgets/budget:Budget")[0],
    }
    for s in POLICY["Statement"]:
        services = {a.split(":")[0] for a in s["Action"]}
        if s["Action"] == ["iam:CreateServiceLinkedRole"]:
            continue  # the spot statement, checked by its own condition
        if services & {"iam", "budgets"}:
            assert len(services) == 1, s["Sid"]
            (kind, name) = re.fullmatch(r"arn:aws:(?:iam|budgets)::\*:([a-z-]+)/(.+)-\*", s["Resource"]).groups()
            assert name == registered[kind].name, s["Sid"]
    (passing,) = statements_granting("iam:PassRole")
    assert passing["Condition"] == {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}
    # the nodes' role may only write to the workspace, which is the program's, not this policy's, grant
    assert "aps:RemoteWrite" not in granted()


def test_roles_are_created_and_given_policies_only_within_the_remote_write_boundary(default_run):
    """CreateRole, PutRolePolicy and DeleteRolePolicy only with the boundary the program's role carries,
    and nothing that changes or drops a boundary: the deployer can never mint a role that does more
    than remote-write metrics (AWS IAM condition key iam:PermissionsBoundary)."""
    boundary = default_run.named("testbed-evidence-writer-role").inputs["permissionsBoundary"]
    assert boundary.endswith(":policy/AmazonPrometheusRemoteWriteAccess")
    for action in ("iam:CreateRole", "iam:PutRolePolicy", "iam:DeleteRolePolicy"):
        for s in statements_granting(action):
            assert s["Condition"] == {"StringEquals": {"iam:PermissionsBoundary": boundary}}, (action, s["Sid"])
    assert (
        not {"iam:PutRolePermissionsBoundary", "iam:DeleteRolePermissionsBoundary", "iam:AttachRolePolicy"} & granted()
    )


def test_deletes_are_limited_to_resources_carrying_the_providers_default_tag(default_run):
    (provider,) = default_run.of_type("pulumi:providers:aws")
    default_tags = json.loads(provider.inputs["defaultTags"])["tags"]  # the provider carries it as JSON
    (deletes,) = [s for s in POLICY["Statement"] if "ec2:TerminateInstances" in s["Action"]]
    ((key, value),) = deletes["Condition"]["StringEquals"].items()
    assert key.startswith("aws:ResourceTag/") and default_tags[key.removeprefix("aws:ResourceTag/")] == value
    # every call that removes a whole resource is in the tag-limited statement
    removes = (
        r"ec2:(Delete(Vpc|Subnet|SecurityGroup|InternetGateway|RouteTable|KeyPair)|TerminateInstances|ReleaseAddress)"
    )
    assert {a for a in granted() if re.fullmatch(removes, a)} == set(deletes["Action"])
    # the evidence workspace too (when managedPrometheusKeep is false, or managedPrometheus turns false)
    (workspace_deletes,) = statements_granting("aps:DeleteWorkspace")
    assert workspace_deletes["Condition"] == deletes["Condition"] and workspace_deletes["Action"] == [
        "aps:DeleteWorkspace"
    ]

"""The deployer policy through tools we did not write: parliament 1.6.4 with its community
auditors, and cloudsplaining 0.9.1 (privilege escalation, resource exposure, data exfiltration,
credentials exposure, unconstrained writes and tagging). Every HIGH finding is fixed or explained
here; the attack paths they do not name are walked in test_iam_attacks.py.

Both tools count a Condition as a constraint without reading it; whether a condition holds is
test_iam_attacks.py's part (moto's evaluator)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.names import writer_boundary_arn

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "iam" / "testbed-policy.json").read_text()
POLICY = json.loads(TEXT)
BOUNDARY_TEXT = (ROOT / "iam" / "writer-boundary.json").read_text()
# parliament, cloudsplaining and moto take seconds to import: imported where used, and their tests
# on one worker (tests/cli/test_preflight.py), so the other never imports them
pytestmark = pytest.mark.xdist_group("aws-tools")


def parliament_findings(text: str) -> list:
    """parliament's findings with its community auditors' configuration."""
    from parliament import analyze_policy_string

    return analyze_policy_string(text, include_community_auditors=True).findings


def policy_document(policy: dict):
    from cloudsplaining.scan.policy_document import PolicyDocument

    return PolicyDocument(policy)


def statement(sid: str) -> dict:
    (found,) = [s for s in POLICY["Statement"] if s["Sid"] == sid]
    return found


def high_findings() -> list:
    """parliament's findings rated HIGH by its community auditors' configuration."""
    findings = parliament_findings(TEXT)
    return [f for f in findings if f.issue in {"PRIVILEGE_ESCALATION", "CREDENTIALS_EXPOSURE", "SENSITIVE_ACCESS"}]


def test_parliaments_one_high_finding_is_the_bounded_writer_role_passed_to_the_instances():
    """CreateEC2WithExistingIP (iam:PassRole + ec2:RunInstances): an instance launched with a role
    acts as the role. The only role the deployer may pass is the writer role, only to EC2, and
    that role can never do more than its boundary, the administrator's iam/writer-boundary.json
    (remote-write into the testbed's workspaces): CreateRole, PutRolePolicy and
    PutRolePermissionsBoundary need that boundary, and nothing may drop it or edit the policy."""
    (escalation,) = high_findings()
    assert escalation.issue == "PRIVILEGE_ESCALATION"
    assert escalation.location["type"] == "CreateEC2WithExistingIP"  # parliament puts it there
    passing = statement("PassTheControlNodeRoleToEc2Only")
    assert passing["Resource"] == "arn:aws:iam::*:role/testbed-evidence-writer-role-*"
    assert passing["Condition"] == {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}
    bounded = statement("TheControlNodeRoleOnlyWithinItsBoundary")
    assert bounded["Resource"] == passing["Resource"]
    assert bounded["Condition"]["StringEquals"]["iam:PermissionsBoundary"] == writer_boundary_arn(
        "${aws:PrincipalAccount}"
    )
    granted = {a for s in POLICY["Statement"] for a in s["Action"]}
    assert not {"iam:DeleteRolePermissionsBoundary", "iam:AttachRolePolicy", "iam:CreatePolicyVersion"} & granted


def test_cloudsplaining_finds_no_escalation_exposure_exfiltration_or_unconstrained_write():
    document = policy_document(POLICY)
    assert document.allows_privilege_escalation == []  # the old policy: ModifyEC2InstanceUserDataThenRestart
    assert document.permissions_management_without_constraints == []  # resource exposure
    assert document.allows_data_exfiltration_actions == []
    assert document.credentials_exposure == []
    assert document.write_actions_without_constraints == []  # the old policy: 34


def test_cloudsplainings_one_tagging_finding_is_tagging_only_inside_a_create():
    """It names ec2:CreateTags on Resource "*": the statement allows it only inside one of the
    program's create calls, with the testbed's tag (test_iam_attacks.py: tagging any instance or
    VPC as the testbed's is refused)."""
    assert policy_document(POLICY).tagging_actions_without_constraints == ["ec2:CreateTags"]
    condition = statement("TagOnlyWhileCreating")["Condition"]["StringEquals"]
    assert (
        condition["aws:RequestTag/testbed:project"] == "gpu-testbed" and "RunInstances" in condition["ec2:CreateAction"]
    )


def test_the_writer_boundary_is_clean_in_both_tools():
    """parliament finds nothing at all in the boundary (its condition keys are ones RemoteWrite and
    every request take); cloudsplaining finds no write, escalation or exposure in it."""
    assert parliament_findings(BOUNDARY_TEXT) == []
    document = policy_document(json.loads(BOUNDARY_TEXT))
    assert document.allows_privilege_escalation == [] and document.permissions_management_without_constraints == []
    assert document.write_actions_without_constraints == [] and document.allows_data_exfiltration_actions == []
    assert document.tagging_actions_without_constraints == [] and document.credentials_exposure == []

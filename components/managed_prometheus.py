"""Evidence that outlives the cluster: an Amazon Managed Service for Prometheus workspace, the
instance role of the node whose Prometheus writes to it, and the remote-write it uses.

The grant is `aps:RemoteWrite` on this workspace's ARN and nothing else, on the control node's
role only: the GPU workers get no instance profile at all. How the in-cluster Prometheus reaches
the role's credentials (host networking on the control node, IMDSv2 hop limit 1 kept on every
node) is docs/evidence-and-budget.md's first section."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from core.names import writer_boundary_arn

# The path a workspace's remote-write API lives under, below its prometheus_endpoint (which ends
# in "/"): AWS "Amazon Managed Service for Prometheus User Guide", "Ingest Prometheus metrics to the
# workspace" (https://aps-workspaces.REGION.amazonaws.com/workspaces/ID/api/v1/remote_write).
REMOTE_WRITE_PATH = "api/v1/remote_write"
WRITE_ACTION = "aps:RemoteWrite"


def remote_write_url(prometheus_endpoint: str) -> str:
    """The remote-write URL of the workspace whose endpoint this is."""
    return prometheus_endpoint.rstrip("/") + "/" + REMOTE_WRITE_PATH


def trust_policy() -> str:
    """Only EC2 may assume the role (for the instance profile)."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}
            ],
        },
        sort_keys=True,
    )


def write_policy(workspace_arn: str) -> str:
    """Write samples into this one workspace: no query, no other workspace, nothing else."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "RemoteWriteThisWorkspace",
                    "Effect": "Allow",
                    "Action": WRITE_ACTION,
                    "Resource": workspace_arn,
                }
            ],
        },
        sort_keys=True,
    )


@dataclass
class ManagedPrometheusArgs:
    alias: str  # the workspace's name in the console: project and stack
    keep_on_destroy: bool  # managedPrometheusKeep


class ManagedPrometheus(pulumi.ComponentResource):
    workspace: aws.amp.Workspace
    role: aws.iam.Role
    instance_profile: aws.iam.InstanceProfile
    remote_write_url: pulumi.Output[str]

    def __init__(self, name: str, args: ManagedPrometheusArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:aws:ManagedPrometheus", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        # retain_on_delete: `pulumi destroy` (or managedPrometheus false) drops the workspace from
        # the stack without deleting it, so the run's samples stay queryable; a later `pulumi up`
        # creates a new workspace (pulumi 3.272.0 sdk/python/lib/pulumi/resource.py retain_on_delete).
        self.workspace = aws.amp.Workspace(
            f"{name}-workspace",
            alias=args.alias,
            opts=pulumi.ResourceOptions(parent=self, retain_on_delete=args.keep_on_destroy),
        )
        # The boundary is the administrator's policy (core/names.py WRITER_BOUNDARY_POLICY, from
        # iam/writer-boundary.json, once per account, in the account the provider deploys into):
        # aps:RemoteWrite only into workspaces carrying the testbed's tag, with EC2 instance
        # credentials only. The deployer may create this role only with it, and may neither edit
        # nor drop it (iam/testbed-policy.json); IAM has no condition on a trust policy's content,
        # so a role made with another trust, an outside account's say, gets no more than that.
        account = aws.get_caller_identity_output(opts=pulumi.InvokeOptions(parent=self)).account_id
        self.role = aws.iam.Role(
            f"{name}-writer-role",
            assume_role_policy=trust_policy(),
            permissions_boundary=account.apply(writer_boundary_arn),
            description="the testbed control node's Prometheus: remote-write to the stack's AMP workspace only",
            opts=child,
        )
        aws.iam.RolePolicy(
            f"{name}-remote-write",
            role=self.role.name,
            policy=self.workspace.arn.apply(write_policy),
            opts=child,
        )
        self.instance_profile = aws.iam.InstanceProfile(f"{name}-writer-profile", role=self.role.name, opts=child)
        self.remote_write_url = self.workspace.prometheus_endpoint.apply(remote_write_url)
        self.register_outputs(
            {"workspaceArn": self.workspace.arn, "remoteWriteUrl": self.remote_write_url, "role": self.role.name}
        )

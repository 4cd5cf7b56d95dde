"""What the HPC and AI users' kubeconfigs may do: one Role and RoleBinding each, bound to the
group their client certificate carries (components/cluster_identity.py `role_kubeconfig`).

HPC users reach Slurm only through slurmctld (`kubectl exec ... -- sbatch`, `squeue`,
`scancel`, and `cat` of their output under /mnt/share, which slurmctld mounts): `get` and
`pods/exec` on that one pod, by name. AI users create and watch Jobs, PyTorchJobs and Pods in
`default`, read their logs, and read Kueue's workloads there. Nothing is cluster-scoped, so no
ClusterRole; what each can still do is in docs/security-and-day2.md."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from core.names import AI_USER_ROLE, KUEUE_GROUP_VERSION, SlurmNames, UserRole, hpc_user_role

RBAC_API_VERSION = "rbac.authorization.k8s.io/v1"
WATCH = ["get", "list", "watch"]


def hpc_role(slurm: SlurmNames) -> dict:
    """`kubectl exec` reads the pod first (get), then opens pods/exec: over WebSocket (kubectl
    >= 1.31's default) an HTTP GET, over SPDY a POST (create); both only on slurmctld's pod."""
    role = hpc_user_role(slurm)
    pod = [slurm.controller_pod]
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "Role",
        "metadata": {"name": role.role, "namespace": role.namespace},
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], "resourceNames": pod},
            {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"], "resourceNames": pod},
        ],
    }


def ai_role() -> dict:
    """No update, patch or delete: every AI user shares `default`, and one must not change or end
    another's job (a job ends by its run limit; the operator's kubeconfig deletes)."""
    kueue_group = KUEUE_GROUP_VERSION.split("/")[0]
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "Role",
        "metadata": {"name": AI_USER_ROLE.role, "namespace": AI_USER_ROLE.namespace},
        "rules": [
            {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", *WATCH]},
            {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": ["create", *WATCH]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", *WATCH]},
            {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
            {"apiGroups": [kueue_group], "resources": ["workloads"], "verbs": WATCH},
        ],
    }


def role_binding(role: UserRole) -> dict:
    return {
        "apiVersion": RBAC_API_VERSION,
        "kind": "RoleBinding",
        "metadata": {"name": role.role, "namespace": role.namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role.role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": role.group}],
    }


def manifests(slurm: SlurmNames) -> list[dict]:
    """Each role, then its binding."""
    return [hpc_role(slurm), role_binding(hpc_user_role(slurm)), ai_role(), role_binding(AI_USER_ROLE)]


@dataclass
class UserRolesArgs:
    slurm: SlurmNames
    provider: k8s.Provider
    after: list[pulumi.Resource]  # the Slurm namespace


class UserRoles(pulumi.ComponentResource):
    def __init__(self, name: str, args: UserRolesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:platform:UserRoles", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=list(args.after))
        for manifest in manifests(args.slurm):
            meta = manifest["metadata"]
            resource_name = f"{name}-{meta['name']}-{manifest['kind'].lower()}"
            if manifest["kind"] == "Role":
                k8s.rbac.v1.Role(resource_name, metadata=meta, rules=manifest["rules"], opts=child)
            else:
                k8s.rbac.v1.RoleBinding(
                    resource_name,
                    metadata=meta,
                    role_ref=manifest["roleRef"],
                    subjects=manifest["subjects"],
                    opts=child,
                )
        self.register_outputs({})

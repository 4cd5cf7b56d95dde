"""What each kind of user may do, as Kubernetes RBAC: one Role and RoleBinding per tenant group,
bound to the group in that tenant's client certificate (components/cluster_identity.py
role_kubeconfig; the API server reads O= as the group). Nothing cluster-wide.

* hpc (`testbed:hpc`): find slurmctld's pod in the Slurm namespace and exec into slurmctld, and
  nothing else: sbatch, squeue, scancel and reading output under /mnt/share/slurm all run there.
  kubectl exec authorises `create` on pods/exec, also over WebSockets (kubernetes@v1.34.0
  AuthorizePodWebsocketUpgradeCreatePermission, on by default since v1.31).
* ai (`testbed:ai`): create, watch and delete Jobs, PyTorchJobs and Pods in the jobs' namespace,
  read their logs, and read Kueue's workloads and local queues there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from core.names import JOBS_NAMESPACE, SlurmNames

RBAC_API = "rbac.authorization.k8s.io/v1"
WORK_VERBS = ["create", "get", "list", "watch", "patch", "delete"]  # patch: kubectl apply again
READ_VERBS = ["get", "list", "watch"]


@dataclass(frozen=True)
class Tenant:
    role: str  # the stack output is <role>Kubeconfig
    user: str  # CN= of its client certificate
    group: str  # O=: what the binding names
    namespace: str


def tenants(slurm: SlurmNames) -> tuple[Tenant, ...]:
    return (
        Tenant("hpc", "testbed-hpc", "testbed:hpc", slurm.namespace),
        Tenant("ai", "testbed-ai", "testbed:ai", JOBS_NAMESPACE),
    )


def rules(tenant: Tenant, slurm: SlurmNames) -> list[dict]:
    if tenant.role == "hpc":
        return [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
            {
                "apiGroups": [""],
                "resources": ["pods/exec"],
                "resourceNames": [slurm.controller_pod],
                "verbs": ["create"],
            },
        ]
    return [
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": WORK_VERBS},
        {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": WORK_VERBS},
        {"apiGroups": [""], "resources": ["pods"], "verbs": WORK_VERBS},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads", "localqueues"], "verbs": READ_VERBS},
    ]


def role_name(tenant: Tenant) -> str:
    return f"testbed-{tenant.role}"


def objects(slurm: SlurmNames) -> list[dict]:
    """Each tenant's Role, then its RoleBinding."""
    out = []
    for tenant in tenants(slurm):
        meta = {"name": role_name(tenant), "namespace": tenant.namespace}
        out.append({"apiVersion": RBAC_API, "kind": "Role", "metadata": meta, "rules": rules(tenant, slurm)})
        out.append(
            {
                "apiVersion": RBAC_API,
                "kind": "RoleBinding",
                "metadata": meta,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name(tenant)},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": tenant.group}],
            }
        )
    return out


@dataclass
class TenantRolesArgs:
    slurm: SlurmNames
    provider: k8s.Provider
    after: Sequence[pulumi.Resource]  # the cluster answering


class TenantRoles(pulumi.ComponentResource):
    """The Roles and their bindings."""

    def __init__(self, name: str, args: TenantRolesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:platform:TenantRoles", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=list(args.after))
        for obj in objects(args.slurm):
            suffix = obj["metadata"]["name"].removeprefix("testbed-")
            if obj["kind"] == "Role":
                k8s.rbac.v1.Role(f"{name}-{suffix}", metadata=obj["metadata"], rules=obj["rules"], opts=child)
            else:
                k8s.rbac.v1.RoleBinding(
                    f"{name}-{suffix}-binding",
                    metadata=obj["metadata"],
                    role_ref=obj["roleRef"],
                    subjects=obj["subjects"],
                    opts=child,
                )
        self.register_outputs({})

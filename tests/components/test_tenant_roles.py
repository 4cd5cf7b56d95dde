"""The tenants' RBAC: what each role's kubeconfig may do is what the README's first job does and no
more. The rules are evaluated as the API server's RBAC authorizer matches a rule
(kubernetes@v1.34.0 plugin/pkg/auth/authorizer/rbac/rbac.go RuleAllows: API group, resource with
its subresource, verb, resource name; a Role reaches only its namespace)."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from components import cluster_identity, tenant_roles
from core import names

SLURM = names.slurm_names("slinky")
CONTROLLER = SLURM.controller_pod


def allows(group: str, verb: str, api_group: str, resource: str, namespace: str | None, name: str = "") -> bool:
    objs = tenant_roles.objects(SLURM)
    bound = {
        (b["metadata"]["namespace"], b["roleRef"]["name"])
        for b in objs
        if b["kind"] == "RoleBinding" and any(s["kind"] == "Group" and s["name"] == group for s in b["subjects"])
    }
    for role in (o for o in objs if o["kind"] == "Role"):
        if (role["metadata"]["namespace"], role["metadata"]["name"]) not in bound or role["metadata"][
            "namespace"
        ] != namespace:
            continue
        for rule in role["rules"]:
            if (
                api_group in rule["apiGroups"]
                and resource in rule["resources"]
                and verb in rule["verbs"]
                and (not rule.get("resourceNames") or name in rule["resourceNames"])
            ):
                return True
    return False


HPC, AI = "testbed:hpc", "testbed:ai"
# What the README's first-job commands ask of the API server, by role
README_CALLS = {
    HPC: [
        ("get", "", "pods", SLURM.namespace, CONTROLLER),  # kubectl exec reads the pod first
        ("create", "", "pods/exec", SLURM.namespace, CONTROLLER),  # sbatch, squeue, scancel, cat the output
        ("list", "", "pods", SLURM.namespace, ""),  # sbatchCommand finds slurmctld by its labels
    ],
    AI: [
        ("create", "kubeflow.org", "pytorchjobs", names.JOBS_NAMESPACE, ""),
        ("watch", "kubeflow.org", "pytorchjobs", names.JOBS_NAMESPACE, ""),
        ("create", "batch", "jobs", names.JOBS_NAMESPACE, ""),
        ("create", "", "pods", names.JOBS_NAMESPACE, ""),
        ("get", "", "pods/log", names.JOBS_NAMESPACE, "nccl-allreduce-master-0"),
        ("list", "kueue.x-k8s.io", "workloads", names.JOBS_NAMESPACE, ""),
        ("delete", "batch", "jobs", names.JOBS_NAMESPACE, "gpu-inference"),
        ("get", "kubeflow.org", "pytorchjobs", names.JOBS_NAMESPACE, "pytorch-ddp"),  # kubectl apply reads first
        ("patch", "kubeflow.org", "pytorchjobs", names.JOBS_NAMESPACE, "pytorch-ddp"),  # and patches on re-apply
    ],
}
FORBIDDEN = {
    HPC: [
        ("create", "", "pods/exec", SLURM.namespace, "slurm-worker-slinky-0"),  # a privileged slurmd pod
        ("get", "", "secrets", SLURM.namespace, ""),
        ("create", "", "pods", SLURM.namespace, ""),
        ("delete", "", "pods", SLURM.namespace, CONTROLLER),
        ("patch", "slinky.slurm.net", "nodesets", SLURM.namespace, ""),
        ("create", "batch", "jobs", names.JOBS_NAMESPACE, ""),
        ("list", "", "nodes", None, ""),
        ("create", "rbac.authorization.k8s.io", "rolebindings", SLURM.namespace, ""),
    ],
    AI: [
        ("create", "", "pods/exec", names.JOBS_NAMESPACE, "x"),
        ("update", "", "pods/ephemeralcontainers", names.JOBS_NAMESPACE, "x"),
        ("get", "", "secrets", names.JOBS_NAMESPACE, ""),
        ("create", "", "pods", SLURM.namespace, ""),
        ("create", "", "pods/exec", SLURM.namespace, CONTROLLER),
        ("update", "kueue.x-k8s.io", "workloads", names.JOBS_NAMESPACE, ""),
        ("delete", "admissionregistration.k8s.io", "validatingadmissionpolicies", None, ""),
        ("create", "", "persistentvolumes", None, ""),
        ("create", "rbac.authorization.k8s.io", "rolebindings", names.JOBS_NAMESPACE, ""),
    ],
}


@pytest.mark.parametrize(("group", "call"), [(g, c) for g, calls in README_CALLS.items() for c in calls])
def test_each_role_may_do_what_the_readme_does(group, call):
    assert allows(group, *call)


@pytest.mark.parametrize(("group", "call"), [(g, c) for g, calls in FORBIDDEN.items() for c in calls])
def test_and_no_more(group, call):
    assert not allows(group, *call)


def test_the_roles_are_namespaced_grant_no_wildcards_and_pass_the_1_34_schemas():
    for obj in tenant_roles.objects(SLURM):
        kubernetes_validate.validate(obj, "1.34", strict=True)
        assert obj["kind"] in ("Role", "RoleBinding")  # nothing cluster-wide
        for rule in obj.get("rules", []):
            assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"]
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])


def test_the_program_outputs_a_short_lived_kubeconfig_per_role_in_its_group(default_run):
    for tenant in tenant_roles.tenants(SLURM):
        config = yaml.safe_load(default_run.outputs[f"{tenant.role}Kubeconfig"])
        (user,) = config["users"]
        assert user["name"] == tenant.user
        csr = default_run.named(f"testbed-identity-{tenant.role}-csr")
        assert csr.inputs["subject"]["organization"] == tenant.group  # the group its binding names
        cert = default_run.named(f"testbed-identity-{tenant.role}-cert")
        assert cert.inputs["validityPeriodHours"] == cluster_identity.ROLE_VALIDITY_HOURS <= 24
        # due for renewal from its first hour: every `pulumi up` issues a new one
        assert cert.inputs["earlyRenewalHours"] == cluster_identity.ROLE_VALIDITY_HOURS - 1
        assert "client_auth" in cert.inputs["allowedUses"]

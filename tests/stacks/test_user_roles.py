"""The HPC and AI kubeconfigs allow what the README's first-job commands do and no more: the
RBAC the program deploys, evaluated for the user and groups their certificates carry
(tests/stacks/rbac_evaluator.py, the API server's RBAC rules), and the kubeconfigs reach the
cluster with the cluster CA and a certificate that lasts roleCredentialHours."""

from __future__ import annotations

import base64
import re
import shlex
from pathlib import Path

import pytest

from core import host_layout, trusted_yaml
from core.names import AI_USER_ROLE, SLURMCTLD_CONTAINER, Names, hpc_user_role, slurm_names
from stacks.offline import reveal
from tests import tokens
from tests.conftest import by_type, run_program
from tests.stacks.rbac_evaluator import Request, allowed

ROOT = Path(__file__).resolve().parents[2]
HOURS = 3  # not the default, so the certificate's validity can only come from the setting
KUEUE = "kueue.x-k8s.io"
# kubectl's resource names as typed, to (group, resource); kinds in files, the same
RESOURCES = {
    "workloads": (KUEUE, "workloads"),
    "pytorchjob": ("kubeflow.org", "pytorchjobs"),
    "pytorchjobs": ("kubeflow.org", "pytorchjobs"),
    "jobs": ("batch", "jobs"),
    "pods": ("", "pods"),
}
KINDS = {"PyTorchJob": ("kubeflow.org", "pytorchjobs"), "Job": ("batch", "jobs"), "Pod": ("", "pods")}


@pytest.fixture(scope="module")
def run():
    return run_program(roleCredentialHours=HOURS)


def rbac_objects(rec) -> list[dict]:
    """Every Role, ClusterRole and binding the program registers (the Helm charts' own bind
    service accounts, which no user certificate names)."""
    types = {tokens.ROLE, tokens.ROLE_BINDING, tokens.CLUSTER_ROLE, tokens.CLUSTER_ROLE_BINDING}
    found = [r for r in rec.resources if r.type in types]
    assert found and all(reveal(r.inputs)["kind"] == r.type.rsplit(":", 1)[1] for r in found)
    return [reveal(r.inputs) for r in found]


def slurm_of(rec):
    return Names.from_settings(rec.settings).slurm


def identity(rec, role) -> tuple[str, list[str]]:
    """The user and groups the API server reads from the role's certificate (CN, O)."""
    subject = reveal(rec.named(f"testbed-identity-{role.role}-csr").inputs["subject"])
    return subject["commonName"], [subject["organization"]]


def kubectl_requests(line: str, namespace: str) -> list[Request]:
    """The requests one README kubectl line makes (its context's namespace unless -n)."""
    words = shlex.split(line.split(" < ")[0].split("  #")[0])
    assert words[0] == "kubectl", line
    if "-n" in words:
        namespace = words[words.index("-n") + 1]
    verb_at = next(i for i, w in enumerate(words) if i > 0 and not w.startswith("-") and words[i - 1] != "--kubeconfig")
    action, rest = words[verb_at], words[verb_at + 1 :]
    if action == "exec":
        pod = next(w for w in rest if not w.startswith("-") and w != SLURMCTLD_CONTAINER)
        # kubectl reads the pod, then opens exec: WebSocket (GET) first, SPDY (POST) as fallback
        return [
            Request("get", "", "pods", namespace, pod),
            Request("get", "", "pods", namespace, pod, "exec"),
            Request("create", "", "pods", namespace, pod, "exec"),
        ]
    if action == "create":
        docs = [d for d in trusted_yaml.load_all((ROOT / rest[rest.index("-f") + 1]).read_text()) if d]
        return [
            Request("create", *KINDS[d["kind"]], d["metadata"].get("namespace", namespace), d["metadata"]["name"])
            for d in docs
        ]
    if action == "get":
        names = [w for w in rest if not w.startswith("-")]
        group, resource = RESOURCES[names[0]]
        if len(names) == 1:
            requests = [Request("list", group, resource, namespace)]
        else:
            requests = [Request("get", group, resource, namespace, names[1])]
        if "-w" in rest:
            requests += [Request("list", group, resource, namespace), Request("watch", group, resource, namespace)]
        return requests
    if action == "logs":
        return [Request("get", "", "pods", namespace, rest[0]), Request("get", "", "pods", namespace, rest[0], "log")]
    raise AssertionError(f"no request mapping for {line!r}")


def readme_lines(kubeconfig_file: str) -> list[str]:
    """The role's commands in the README's first-job block and in docs/using.md."""
    block = Path(ROOT / "README.md").read_text().split("## First Slurm job")[1].split("```")[1]
    using = (ROOT / "docs" / "using.md").read_text()
    lines = [
        line for line in (block + using).splitlines() if line.startswith(f"kubectl --kubeconfig {kubeconfig_file} ")
    ]
    assert len(lines) >= 3, kubeconfig_file
    return lines


def context_namespace(rec, role) -> str:
    kubeconfig = trusted_yaml.load(rec.outputs[role.output])
    return kubeconfig["contexts"][0]["context"]["namespace"]


def test_each_readme_command_is_allowed(run):
    objects = rbac_objects(run)
    for role in (hpc_user_role(slurm_of(run)), AI_USER_ROLE):
        user, groups = identity(run, role)
        for line in readme_lines(role.kubeconfig_file):
            for request in kubectl_requests(line, context_namespace(run, role)):
                assert allowed(objects, user, groups, request), f"{line}: {request}"


def test_the_hpc_user_reaches_slurmctld_and_nothing_else(run):
    objects = rbac_objects(run)
    slurm = slurm_of(run)
    user, groups = identity(run, hpc_user_role(slurm))
    ns = slurm.namespace
    slurmd = f"{slurm.slurmd_pod_prefix}0"
    refused = [
        Request("create", "", "pods", ns, slurmd, "exec"),  # root on a GPU node's pod
        Request("get", "", "pods", ns, slurmd, "exec"),
        Request("create", "", "pods", ns, slurm.controller_pod, "attach"),
        Request("create", "", "pods", ns, slurm.controller_pod, "portforward"),
        Request("create", "", "pods", ns, slurm.controller_pod, "ephemeralcontainers"),
        Request("patch", "", "pods", ns, slurm.controller_pod, "ephemeralcontainers"),
        Request("update", "", "pods", ns, slurm.controller_pod),
        Request("delete", "", "pods", ns, slurm.controller_pod),
        Request("list", "", "pods", ns),
        Request("create", "", "pods", ns),
        Request("get", "", "secrets", ns, "slurm-auth-slurm"),
        Request("list", "", "secrets", ns),
        Request("get", "", "pods", "default", slurm.controller_pod),
        Request("create", "", "pods", "kube-system", slurm.controller_pod, "exec"),
        Request("patch", "slinky.slurm.net", "nodesets", ns, slurm.nodeset_resource),
        Request("create", "", "pods", AI_USER_ROLE.namespace),
    ]
    refused += common_refusals(ns)
    for request in refused:
        assert not allowed(objects, user, groups, request), str(request)


def test_the_ai_user_runs_jobs_in_default_and_nothing_else(run):
    objects = rbac_objects(run)
    user, groups = identity(run, AI_USER_ROLE)
    ns = AI_USER_ROLE.namespace
    slurm = slurm_of(run)
    refused = [
        Request("delete", "kubeflow.org", "pytorchjobs", ns, "someone-elses"),
        Request("patch", "batch", "jobs", ns, "someone-elses"),
        Request("update", "kueue.x-k8s.io", "workloads", ns, "w"),
        Request("patch", KUEUE, "workloads", ns, "w", "status"),  # admit itself
        Request("create", "", "pods", ns, "p", "exec"),
        Request("create", "", "pods", ns, "p", "ephemeralcontainers"),
        Request("list", "", "secrets", ns),
        Request("create", "", "serviceaccounts", ns, "", "token"),
        Request("create", "", "pods", slurm.namespace),
        Request("create", "", "pods", slurm.namespace, slurm.controller_pod, "exec"),
        Request("create", "batch", "jobs", "kube-system"),
        Request("list", KUEUE, "clusterqueues", ""),
        Request("patch", KUEUE, "clusterqueues", "", "ai"),
        Request("create", KUEUE, "localqueues", ns),
        Request("delete", "admissionregistration.k8s.io", "validatingadmissionpolicies", "", "x"),
    ]
    refused += common_refusals(ns)
    for request in refused:
        assert not allowed(objects, user, groups, request), str(request)


def common_refusals(ns: str) -> list[Request]:
    rbac = "rbac.authorization.k8s.io"
    return [
        Request("delete", "", "nodes", "", "worker-0"),
        Request("patch", "", "nodes", "", "worker-0"),
        Request("get", "", "secrets", "kube-system", "bootstrap-token-abcdef"),
        Request("create", rbac, "clusterrolebindings", ""),
        Request("create", rbac, "rolebindings", ns),
        Request("escalate", rbac, "roles", ns),
        Request("bind", rbac, "clusterroles", "", "cluster-admin"),
        Request("impersonate", "", "users", "", "testbed-admin"),
        Request("impersonate", "", "groups", "", "kubeadm:cluster-admins"),
        Request("create", "certificates.k8s.io", "certificatesigningrequests", ""),
        Request("create", "", "namespaces", ""),
    ]


def test_each_certificate_carries_the_group_its_binding_names_and_lasts_the_setting(run):
    objects = rbac_objects(run)
    ca_key = run.named("testbed-identity-ca-key").outputs["privateKeyPem"]
    for role in (hpc_user_role(slurm_of(run)), AI_USER_ROLE):
        user, groups = identity(run, role)
        bindings = [o for o in objects if o["kind"] == "RoleBinding" and o["metadata"]["name"] == role.role]
        (binding,) = bindings
        assert [s["name"] for s in binding["subjects"] if s["kind"] == "Group"] == groups
        assert binding["metadata"]["namespace"] == context_namespace(run, role)
        assert not any(g.startswith("system:") for g in groups) and groups != ["kubeadm:cluster-admins"]
        cert = run.named(f"testbed-identity-{role.role}-cert")
        assert cert.inputs["validityPeriodHours"] == run.settings.role_credential_hours == HOURS
        # `pulumi up` renews it after half its life (the provider plans a replacement then)
        assert 0 < cert.inputs["earlyRenewalHours"] < cert.inputs["validityPeriodHours"]
        assert cert.inputs["allowedUses"] == ["digital_signature", "key_encipherment", "client_auth"]
        assert reveal(cert.inputs["caPrivateKeyPem"]) == ca_key
        csr = run.named(f"testbed-identity-{role.role}-csr")
        assert reveal(cert.inputs["certRequestPem"]) == csr.outputs["certRequestPem"]
        assert user == role.user != "testbed-admin"


def test_role_kubeconfigs_reach_the_cluster_with_its_ca_and_their_own_certificate(run):
    (eip,) = by_type(run, tokens.EIP)
    (ca,) = by_type(run, tokens.SELF_SIGNED_CERT)
    admin = trusted_yaml.load(run.outputs["kubeconfig"])
    for role in (hpc_user_role(slurm_of(run)), AI_USER_ROLE):
        assert role.output in run.secret_outputs
        kubeconfig = trusted_yaml.load(run.outputs[role.output])
        cluster = kubeconfig["clusters"][0]["cluster"]
        assert cluster["server"] == f"https://{eip.outputs['publicIp']}:{host_layout.API_SERVER_PORT}"
        assert base64.b64decode(cluster["certificate-authority-data"]).decode() == ca.outputs["certPem"]
        user = kubeconfig["users"][0]["user"]
        cert = run.named(f"testbed-identity-{role.role}-cert").outputs["certPem"]
        key = run.named(f"testbed-identity-{role.role}-key").outputs["privateKeyPem"]
        assert base64.b64decode(user["client-certificate-data"]).decode() == cert
        assert base64.b64decode(user["client-key-data"]).decode() == key
        assert user != admin["users"][0]["user"]


def test_the_users_are_bound_by_one_role_binding_each_and_nothing_cluster_scoped(run):
    roles = (hpc_user_role(slurm_of(run)), AI_USER_ROLE)
    names = {n for role in roles for n in (*identity(run, role)[1], identity(run, role)[0])}
    binding_kinds = {"RoleBinding", "ClusterRoleBinding"}
    naming = [o for o in rbac_objects(run) if o["kind"] in binding_kinds and {s["name"] for s in o["subjects"]} & names]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in naming) == sorted(("RoleBinding", r.role) for r in roles)


def test_the_readme_saves_each_kubeconfig_from_its_output():
    readme = (ROOT / "README.md").read_text()
    saved = dict(re.findall(r"pulumi stack output --show-secrets (\w+) > ([\w.-]+)", readme))
    for role in (hpc_user_role(slurm_names("slinky")), AI_USER_ROLE):
        assert saved[role.output] == role.kubeconfig_file


def test_no_service_account_an_ai_user_could_run_a_pod_as_is_granted_anything(run):
    """AI users create Pods in `default`, as any service account there: the program binds none."""
    for o in rbac_objects(run):
        for subject in o.get("subjects", []):
            assert not (subject["kind"] == "ServiceAccount" and subject.get("namespace") == AI_USER_ROLE.namespace), o

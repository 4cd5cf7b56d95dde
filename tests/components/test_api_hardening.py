"""API server hardening as the control node receives it: the kubeadm
ClusterConfiguration uses only kubeadm v1beta4 fields, every flag's file is delivered and
mounted, Pod Security exempts exactly the namespaces that need it, and the audit policy logs
no request bodies."""

import json
from pathlib import Path

from components import api_hardening, bootstrap
from core import names, trusted_yaml
from stacks.offline import reveal
from tests import tokens

ROOT = Path(__file__).resolve().parents[2]

# Field names of the kubeadm v1beta4 types the program writes (kubernetes/kubernetes@v1.34.0:
# cmd/kubeadm/app/apis/kubeadm/v1beta4/types.go): a misspelt key is silently ignored by
# kubeadm's lenient decoding in older releases and refused by the strict one in 1.34.
V1BETA4_FIELDS = {
    "ClusterConfiguration": {
        "apiVersion", "kind", "etcd", "networking", "kubernetesVersion", "controlPlaneEndpoint", "apiServer",
        "controllerManager", "scheduler", "dns", "proxy", "certificatesDir", "imageRepository", "featureGates",
        "clusterName", "encryptionAlgorithm", "certificateValidityPeriod", "caCertificateValidityPeriod",
    },
    "ControlPlaneComponent": {"extraArgs", "extraVolumes", "extraEnvs"},
    "APIServer": {"extraArgs", "extraVolumes", "extraEnvs", "certSANs"},
    "HostPathMount": {"name", "hostPath", "mountPath", "readOnly", "pathType"},
    "Networking": {"serviceSubnet", "podSubnet", "dnsDomain"},
}  # fmt: skip
HOST_PATH_TYPES = {"", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice", "BlockDevice"}


def control_files(rec) -> dict[str, dict]:
    user_data = reveal(rec.named("testbed-control-instance").inputs["userData"])
    return {f["path"]: f for f in trusted_yaml.load(user_data)["write_files"]}


def cluster_configuration(rec) -> dict:
    _, cluster = trusted_yaml.load_all(control_files(rec)[bootstrap.KUBEADM_CONFIG]["content"])
    return cluster


def flags(component: dict) -> dict[str, str]:
    args = component["extraArgs"]
    assert all(set(a) == {"name", "value"} and isinstance(a["value"], str) for a in args)  # v1beta4 Arg
    return {a["name"]: a["value"] for a in args}


def test_the_cluster_configuration_uses_only_kubeadm_v1beta4_fields(default_run):
    cluster = cluster_configuration(default_run)
    assert set(cluster) <= V1BETA4_FIELDS["ClusterConfiguration"]
    assert set(cluster["apiServer"]) <= V1BETA4_FIELDS["APIServer"]
    assert set(cluster["networking"]) <= V1BETA4_FIELDS["Networking"]
    for component in ("controllerManager", "scheduler"):
        assert set(cluster[component]) <= V1BETA4_FIELDS["ControlPlaneComponent"]
    for mount in cluster["apiServer"]["extraVolumes"]:
        assert set(mount) <= V1BETA4_FIELDS["HostPathMount"] and mount["pathType"] in HOST_PATH_TYPES


def test_profiling_is_off_in_every_control_plane_component(default_run):
    cluster = cluster_configuration(default_run)
    for component in ("apiServer", "controllerManager", "scheduler"):
        assert flags(cluster[component])["profiling"] == "false", component


def _mount_of(path: str, mounts: list[dict]) -> dict:
    (mount,) = [m for m in mounts if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mount["hostPath"] == mount["mountPath"]  # the flag names the same path on the host and in the pod
    return mount


def test_every_file_an_api_server_flag_names_is_delivered_and_mounted(default_run):
    cluster, files = cluster_configuration(default_run), control_files(default_run)
    api = flags(cluster["apiServer"])
    mounts = cluster["apiServer"]["extraVolumes"]
    for flag in ("audit-policy-file", "admission-control-config-file"):
        path = api[flag]
        assert files[path]["permissions"] == "0600", flag
        json.loads(files[path]["content"])  # the API server reads it as YAML; JSON is YAML
        mount = _mount_of(path, mounts)
        assert mount["readOnly"] and mount["pathType"] in ("File", "Directory")
    log_mount = _mount_of(api["audit-log-path"], mounts)
    assert not log_mount["readOnly"] and log_mount["pathType"] == "DirectoryOrCreate"
    assert int(api["audit-log-maxsize"]) * (int(api["audit-log-maxbackup"]) + 1) <= 1024  # MB on a 40 GiB disk
    assert int(api["audit-log-maxage"]) >= 1


def test_pod_security_is_baseline_pinned_to_the_cluster_minor_with_the_needed_exemptions(default_run):
    admission = json.loads(control_files(default_run)[api_hardening.ADMISSION_CONFIG_FILE]["content"])
    (plugin,) = admission["plugins"]
    assert plugin["name"] == "PodSecurity"
    config = plugin["configuration"]
    minor = "v" + ".".join(default_run.settings.kubernetes_version.split(".")[:2])
    assert config["defaults"]["enforce"] == "baseline"
    assert {config["defaults"][f"{mode}-version"] for mode in ("enforce", "audit", "warn")} == {minor}
    privileged = {"kube-system", "kube-flannel"} | {
        names.SLURM_NAMESPACE,  # slurmd privileged
        names.MONITORING_NAMESPACE,  # node-exporter, dcgm-exporter
        names.DEVICE_PLUGIN_NAMESPACE,  # hostPath device-plugins
    }
    assert set(config["exemptions"]["namespaces"]) == privileged
    assert config["exemptions"]["usernames"] == [] and config["exemptions"]["runtimeClasses"] == []


BASELINE_NAMESPACES = {  # the charts here run without host access or extra capabilities
    names.CERT_MANAGER_NAMESPACE,
    names.KEDA_NAMESPACE,
    names.SLINKY_OPERATOR_NAMESPACE,
    names.TRAINING_NAMESPACE,
    names.JOBS_NAMESPACE,
    # Kueue's manager: runAsNonRoot, no host network or paths (kubernetes-sigs/kueue@v0.19.2 charts/kueue/values.yaml)
    names.KUEUE_NAMESPACE,
}


def test_every_namespace_the_program_installs_into_was_decided(default_run):
    """A new release namespace must be added to one side on purpose."""
    installed = {r.inputs["namespace"] for r in default_run.of_type(tokens.RELEASE)}
    exempt = set(api_hardening.PRIVILEGED_NAMESPACES)
    assert installed <= exempt | BASELINE_NAMESPACES, installed - exempt - BASELINE_NAMESPACES
    assert not exempt & BASELINE_NAMESPACES


def _level(policy: dict, user: str, groups: list[str], verb: str, resource=None, url=None) -> str:
    """First matching rule, as k8s.io/apiserver pkg/audit/policy/checker.go evaluates it."""
    for rule in policy["rules"]:
        if rule.get("users") and user not in rule["users"]:
            continue
        if rule.get("userGroups") and not set(groups) & set(rule["userGroups"]):
            continue
        if rule.get("verbs") and verb not in rule["verbs"]:
            continue
        if url is not None:
            if rule.get("resources"):
                continue
            if rule.get("nonResourceURLs") and not any(
                url == p or (p.endswith("*") and url.startswith(p[:-1])) for p in rule["nonResourceURLs"]
            ):
                continue
        else:
            if rule.get("nonResourceURLs"):
                continue
            if rule.get("resources") and not any(
                resource[0] == r.get("group", "") and resource[1] in r.get("resources", [resource[1]])
                for r in rule["resources"]
            ):
                continue
        return rule["level"]
    return "None"


def test_the_audit_policy_records_who_did_what_and_never_a_body(default_run):
    policy = json.loads(control_files(default_run)[api_hardening.AUDIT_POLICY_FILE]["content"])
    assert (policy["apiVersion"], policy["kind"]) == ("audit.k8s.io/v1", "Policy")
    assert {r["level"] for r in policy["rules"]} <= {"None", "Metadata"}  # no Request/RequestResponse
    admin = ("kubernetes-admin", ["kubeadm:cluster-admins", "system:authenticated"])
    assert _level(policy, *admin, "get", resource=("", "secrets")) == "Metadata"
    assert _level(policy, *admin, "create", resource=("", "pods")) == "Metadata"
    assert _level(policy, *admin, "create", resource=("", "pods/exec")) == "Metadata"
    assert _level(policy, "system:anonymous", ["system:unauthenticated"], "get", url="/readyz") == "None"
    node = ("system:node:ip-10-0-0-20", ["system:nodes", "system:authenticated"])
    assert _level(policy, *node, "update", resource=("coordination.k8s.io", "leases")) == "None"
    assert _level(policy, *node, "watch", resource=("", "pods")) == "None"
    assert _level(policy, *node, "patch", resource=("", "nodes")) == "Metadata"


def test_the_readme_lists_what_is_applied_and_every_exemption_with_its_reason():
    security = (ROOT / "docs" / "security-and-day2.md").read_text()
    for item in api_hardening.APPLIED:
        assert item in security, item
    for namespace in api_hardening.PRIVILEGED_NAMESPACES:
        assert f"`{namespace}`" in security, namespace

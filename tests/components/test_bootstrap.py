"""The node bootstrap renderers and scripts, checked directly and as deployed."""

import hashlib
import ipaddress
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from components import bootstrap
from core import host_layout, trusted_yaml
from stacks.offline import placeholder_key_pem, reveal
from tests import tokens
from tests.conftest import by_type, step_args, step_secrets

SHELLCHECK = Path(sys.executable).parent / "shellcheck"


def user_data_of(rec, name):
    return reveal(rec.named(name).inputs["userData"])


def written_file(user_data: str, path: str) -> str:
    files = {f["path"]: f for f in trusted_yaml.load(user_data)["write_files"]}
    return bootstrap.file_text(files[path])


def spki_hash(public_pem: str) -> str:
    key = serialization.load_pem_public_key(public_pem.encode())
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def test_discovery_hash_is_sha256_of_der_subject_public_key_info():
    _, public_pem, _ = placeholder_key_pem("any")
    assert bootstrap.discovery_token_ca_cert_hash(public_pem) == spki_hash(public_pem)


def test_workers_pin_the_ca_the_control_plane_is_given(default_run):
    """The join hash in worker user-data is derived from the very CA key sent to the control node
    (over SSH, on the step's stdin), and the certificate beside it in user-data is public only."""
    ca_key = serialization.load_pem_private_key(
        step_secrets(default_run, "testbed-ca-key")["CA_KEY_PEM"].encode(), password=None
    )
    expected = (
        "sha256:"
        + hashlib.sha256(
            ca_key.public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        ).hexdigest()
    )
    join = trusted_yaml.load(
        written_file(user_data_of(default_run, "testbed-worker-0-instance"), bootstrap.KUBEADM_CONFIG)
    )
    assert join["discovery"]["bootstrapToken"]["caCertHashes"] == [expected]


def test_each_worker_joins_with_its_own_short_lived_token_registered_over_ssh(default_run):
    init, _ = trusted_yaml.load_all(
        written_file(user_data_of(default_run, "testbed-control-instance"), bootstrap.KUBEADM_CONFIG)
    )
    (init_token,) = init["bootstrapTokens"]
    assert init_token["ttl"] == "1h0m0s"  # hours, not a year: no node uses kubeadm init's own token
    join_tokens = [init_token["token"]]
    for index, ip in enumerate(default_run.settings.worker_private_ips):
        join = trusted_yaml.load(
            written_file(user_data_of(default_run, f"testbed-worker-{index}-instance"), bootstrap.KUBEADM_CONFIG)
        )
        token = join["discovery"]["bootstrapToken"]["token"]
        step = f"testbed-worker-{index}-join-token"
        assert step_secrets(default_run, step).keys() == {"JOIN_TOKEN", "SSH_PRIVATE_KEY"}
        assert step_secrets(default_run, step)["JOIN_TOKEN"] == token
        assert step_args(default_run, step)["NODE_IP"] == ip
        assert int(step_args(default_run, step)["TTL_SECONDS"]) <= 4 * 3600
        # a replaced worker gets its token registered again
        worker = default_run.named(f"testbed-worker-{index}-instance")
        assert default_run.named(step).inputs["triggers"] == [f"{worker.name}-placeholder"]
        join_tokens.append(token)
    assert all(re.fullmatch(r"[a-z0-9]{6}\.[a-z0-9]{16}", t) for t in join_tokens)
    assert len(set(join_tokens)) == len(join_tokens)


def test_no_user_data_holds_a_private_key(default_run):
    for node in by_type(default_run, tokens.INSTANCE):
        text = reveal(node.inputs["userData"])
        assert not re.search(r"-----BEGIN [A-Z ]*PRIVATE KEY-----", text), node.name
    key = step_secrets(default_run, "testbed-ca-key")["CA_KEY_PEM"]
    assert (
        "PRIVATE KEY-----" in key and step_args(default_run, "testbed-ca-key")["CA_KEY_FILE"] == bootstrap.CA_KEY_FILE
    )


def test_kubeadm_init_never_prints_the_token():
    assert "--skip-token-print" in bootstrap.script("control-plane.sh")


def test_api_certificate_names_the_elastic_ip_and_workers_reach_the_fixed_private_ip(default_run):
    eip = by_type(default_run, tokens.EIP)[0].outputs["publicIp"]
    _, cluster = trusted_yaml.load_all(
        written_file(user_data_of(default_run, "testbed-control-instance"), bootstrap.KUBEADM_CONFIG)
    )
    control_ip = default_run.named("testbed-control-instance").inputs["privateIp"]
    assert eip in cluster["apiServer"]["certSANs"] and control_ip in cluster["apiServer"]["certSANs"]
    assert cluster["controlPlaneEndpoint"] == f"{control_ip}:{host_layout.API_SERVER_PORT}"
    assert cluster["kubernetesVersion"] == f"v{default_run.settings.kubernetes_version}"
    join = trusted_yaml.load(
        written_file(user_data_of(default_run, "testbed-worker-1-instance"), bootstrap.KUBEADM_CONFIG)
    )
    assert join["discovery"]["bootstrapToken"]["apiServerEndpoint"] == cluster["controlPlaneEndpoint"]
    env = written_file(user_data_of(default_run, "testbed-worker-1-instance"), bootstrap.ENV_FILE)
    assert f"CONTROL_PLANE_IP={control_ip}\n" in env


def test_gpu_workers_register_with_the_device_plugin_label(default_run):
    join = trusted_yaml.load(
        written_file(user_data_of(default_run, "testbed-worker-3-instance"), bootstrap.KUBEADM_CONFIG)
    )
    args = join["nodeRegistration"]["kubeletExtraArgs"]
    assert {"name": "node-labels", "value": "nvidia.com/gpu.present=true"} in args


@pytest.mark.parametrize("node", ["testbed-control-instance", "testbed-worker-0-instance"])
def test_user_data_is_cloud_config_within_the_ec2_limit_and_runs_the_delivered_scripts(default_run, node):
    text = user_data_of(default_run, node)
    assert text.startswith("#cloud-config\n")
    assert len(text.encode()) <= bootstrap.USER_DATA_LIMIT
    doc = trusted_yaml.load(text)
    paths = {f["path"] for f in doc["write_files"]}
    command = doc["runcmd"][0][2]
    run_scripts = [p for p in command.replace("(", " ").replace(")", " ").split() if p.startswith("/opt/testbed/")]
    assert run_scripts and all(p in paths for p in run_scripts)
    assert f"{bootstrap.NODE_SCRIPT_DIR}/testbed-lib.sh" in paths  # sourced by every script


def test_secret_files_are_root_only(default_run):
    files = trusted_yaml.load(user_data_of(default_run, "testbed-control-instance"))["write_files"]
    modes = {f["path"]: f["permissions"] for f in files}
    for secret in (bootstrap.KUBEADM_CONFIG, bootstrap.ENV_FILE):
        assert modes[secret] == "0600"


def test_env_file_quotes_values_so_they_cannot_run_shell():
    text = bootstrap.env_file({"A": "x; rm -rf /", "B": "plain"})
    result = subprocess.run(
        ["bash", "-c", f'set -a; {text}\nprintf \'%s|%s\' "$A" "$B"'], capture_output=True, text=True, check=True
    )
    assert result.stdout == "x; rm -rf /|plain"


def test_every_parameter_a_script_requires_is_in_its_env_file(default_run):
    for node, role_script in (
        ("testbed-control-instance", "control-plane.sh"),
        ("testbed-worker-0-instance", "gpu-worker.sh"),
    ):
        env = written_file(user_data_of(default_run, node), bootstrap.ENV_FILE)
        given = {line.split("=", 1)[0] for line in env.splitlines()}
        for name in ("node-common.sh", role_script):
            required = [line.split()[1:] for line in bootstrap.script(name).splitlines() if line.startswith("require ")]
            missing = {v for group in required for v in group} - given
            assert not missing, f"{node}: {name} requires {missing}"


def test_scripts_pass_shellcheck():
    scripts = sorted(bootstrap.SCRIPTS_DIR.glob("*.sh"))
    result = subprocess.run(
        [str(SHELLCHECK), "-x", "-f", "gcc", *map(str, scripts)],
        capture_output=True,
        text=True,
        cwd=bootstrap.SCRIPTS_DIR,
    )
    assert result.returncode == 0, result.stdout


def test_oversized_user_data_is_refused():
    with pytest.raises(ValueError, match="user-data is"):
        bootstrap.cloud_config([{"path": "/x", "content": "x" * bootstrap.USER_DATA_LIMIT}], [], ())


# flannel-io/flannel@v0.27.4:Documentation/kube-flannel.yml, net-conf.json: Network and Backend.
FLANNEL_TAG, FLANNEL_NETWORK = "v0.27.4", "10.244.0.0/16"
# kubernetes/kubernetes staging/src/k8s.io/cluster-bootstrap/token/api/consts.go
KNOWN_TOKEN_USAGES = ("signing", "authentication")  # signing: cluster-info for discovery; authentication: TLS bootstrap
BOOTSTRAP_GROUP_PATTERN = r"system:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]"  # BootstrapGroupPattern, anchored


def kubeadm_docs(rec, node: str) -> list[dict]:
    return list(trusted_yaml.load_all(written_file(user_data_of(rec, node), bootstrap.KUBEADM_CONFIG)))


def test_kubeadm_init_config_is_what_kubeadm_v1beta4_and_flannel_need(default_run):
    init, cluster = kubeadm_docs(default_run, "testbed-control-instance")
    control_ip = default_run.named("testbed-control-instance").inputs["privateIp"]
    assert (init["apiVersion"], init["kind"]) == ("kubeadm.k8s.io/v1beta4", "InitConfiguration")
    assert (cluster["apiVersion"], cluster["kind"]) == ("kubeadm.k8s.io/v1beta4", "ClusterConfiguration")
    assert init["localAPIEndpoint"] == {"advertiseAddress": control_ip, "bindPort": 6443}
    assert init["nodeRegistration"] == {"criSocket": "unix:///var/run/containerd/containerd.sock"}
    (token,) = init["bootstrapTokens"]
    assert set(token) == {"token", "ttl", "groups", "usages"}
    assert sorted(token["usages"]) == sorted(KNOWN_TOKEN_USAGES)
    assert token["groups"] == ["system:bootstrappers:kubeadm:default-node-token"]  # what kubeadm's RBAC binds
    assert all(re.fullmatch(BOOTSTRAP_GROUP_PATTERN, g) for g in token["groups"])
    assert token["ttl"] == "1h0m0s"  # hours, not a year: each worker joins with its own token (join-token.sh)
    # Flannel's manifest is applied unchanged, so the pod network kubeadm hands out must be its Network.
    assert cluster["networking"] == {"podSubnet": FLANNEL_NETWORK, "serviceSubnet": "10.96.0.0/12"}
    pods, services = (ipaddress.ip_network(cluster["networking"][k]) for k in ("podSubnet", "serviceSubnet"))
    assert not pods.overlaps(services) and not pods.overlaps(ipaddress.ip_network(default_run.settings.vpc_cidr))
    assert default_run.settings.flannel_version == FLANNEL_TAG  # a new tag: read its manifest again
    env = written_file(user_data_of(default_run, "testbed-control-instance"), bootstrap.ENV_FILE)
    assert f"FLANNEL_VERSION={FLANNEL_TAG}\n" in env


def test_kubeadm_join_config_is_a_v1beta4_join_through_the_containerd_socket(default_run):
    for i in range(default_run.settings.worker_count):
        (join,) = kubeadm_docs(default_run, f"testbed-worker-{i}-instance")
        assert (join["apiVersion"], join["kind"]) == ("kubeadm.k8s.io/v1beta4", "JoinConfiguration")
        assert join["nodeRegistration"]["criSocket"] == "unix:///var/run/containerd/containerd.sock"
        assert set(join["discovery"]) == {"bootstrapToken"}
        assert set(join["discovery"]["bootstrapToken"]) == {"apiServerEndpoint", "token", "caCertHashes"}


def expected_env(s, role: str) -> dict[str, str]:
    common = {
        "KUBERNETES_VERSION": s.kubernetes_version,
        "KUBERNETES_MINOR": s.kubernetes_minor,
        "SHARE_DIR": "/mnt/share",
        "KUBEADM_CONFIG": "/etc/testbed/kubeadm.yaml",
        "BOOTSTRAP_STATUS": "/var/log/testbed-bootstrap.status",  # beside the log, where the gate reads it
    }
    if role == "control":
        return {
            **common,
            "FLANNEL_VERSION": s.flannel_version,
            "SHARE_EXPORT_CIDR": s.subnet_cidr,
            "SLURM_STATE_DIR": "/var/spool/slurmctld",
            "SLURM_UID": "401",
            "TOOLS_UID": "402",
            "ADMIN_KUBECONFIG": "/etc/kubernetes/admin.conf",
            "SSH_USER": "ubuntu",
            # deliver-ca-key.sh copies the key here over SSH; control-plane.sh waits for it
            "CA_KEY_FILE": "/etc/kubernetes/pki/ca.key",
            "CA_KEY_WAIT_SECONDS": "1800",
            # what read-host-key.sh looks for on the console (components/ssh_access.py)
            "HOST_KEY_MARKER": "testbed-host-key:",
        }
    return {
        **common,
        "API_SERVER_PORT": "6443",
        "NVIDIA_DRIVER_BRANCH": s.nvidia_driver_branch,
        "NVIDIA_CONTAINER_TOOLKIT_VERSION": s.nvidia_container_toolkit_version,
        "CONTROL_PLANE_IP": s.control_private_ip,
        "CRI_SOCKET": "unix:///var/run/containerd/containerd.sock",
        # the slurmd pod's (slurmd at the chart's tag, its logfile sidecar), then the example jobs'
        # and the Training Operator's images
        "PREPULL_IMAGES": f"ghcr.io/slinkyproject/slurmd:{s.slurm_image_tag} docker.io/library/alpine:3.22.1 "
        "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime alpine:3.10",
        # the GPU diagnostic before the join: DCGM packages for the driver's CUDA major (580: 13)
        "GPU_DIAG_LEVEL": "1",
        "DCGM_VERSION": "4.4.2",
        "DCGM_CUDA_MAJOR": "13",
        "CUDA_REPO": "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64",
    }


def parsed_env(text: str) -> dict[str, str]:
    result = subprocess.run(
        ["bash", "-c", f"set -a; {text}\nenv -0"], capture_output=True, text=True, check=True, env={}
    )
    values = dict(item.split("=", 1) for item in result.stdout.split("\0") if "=" in item)
    return {k: v for k, v in values.items() if k.isupper() and k not in ("PWD", "SHLVL", "_", "OLDPWD")}


@pytest.mark.parametrize(
    "node, role, scripts",
    [
        ("testbed-control-instance", "control", ("node-common.sh", "control-plane.sh")),
        ("testbed-worker-0-instance", "worker", ("node-common.sh", "gpu-worker.sh")),
    ],
)
def test_each_node_gets_its_parameters_files_and_scripts_in_order(default_run, node, role, scripts):
    doc = trusted_yaml.load(user_data_of(default_run, node))
    files = {f["path"]: f for f in doc["write_files"]}
    assert parsed_env(files[bootstrap.ENV_FILE]["content"]) == expected_env(default_run.settings, role)
    assert {f["owner"] for f in doc["write_files"]} == {"root:root"}
    for name in ("testbed-lib.sh", *scripts):
        script_file = files[f"/opt/testbed/{name}"]
        assert bootstrap.file_text(script_file) == bootstrap.shipped(name) and script_file["permissions"] == "0755"
    (command,) = doc["runcmd"]
    chain = " && ".join(f"/opt/testbed/{n}" for n in scripts)
    log = "/var/log/testbed-bootstrap.log"  # created 0600 before anything is logged: it may hold tokens' traces
    assert command == [
        "bash",
        "-c",
        f"set -o pipefail; touch {log} && chmod 0600 {log} && ({chain}) 2>&1 | tee -a {log}",
    ]
    if role == "control":
        assert files["/etc/kubernetes/pki/ca.crt"]["permissions"] == "0644"
        # the CA key is not in user-data: deliver-ca-key.sh hands the program's key over SSH
        ca_key = default_run.named("testbed-identity-ca-key").outputs["privateKeyPem"]
        assert "/etc/kubernetes/pki/ca.key" not in files
        assert step_secrets(default_run, "testbed-ca-key")["CA_KEY_PEM"] == ca_key
    else:
        assert not [p for p in files if p.startswith("/etc/kubernetes/")]  # a worker never holds the CA key


def test_scripts_stay_readable_in_user_data(default_run):
    """Multi-line files are YAML literal blocks: each script line appears as written, but for
    the comment lines, which stay in the repository (EC2's 16 KiB)."""
    text = user_data_of(default_run, "testbed-control-instance")
    lines = bootstrap.script("control-plane.sh").splitlines()
    kept = [line for line in lines if not line.lstrip().startswith("# ") or line.startswith("# shellcheck ")]
    assert len(kept) < len(lines)
    for line in kept:
        assert ("    " + line).rstrip() in text.splitlines(), line
    assert (
        "    # Control node: NFS export of the shared directory, Slurm state directory, kubeadm init with" not in text
    )


def test_shipped_scripts_keep_the_shebang_shellcheck_directives_code_and_here_documents(tmp_path):
    (tmp_path / "x.sh").write_text(
        "#!/usr/bin/env bash\n# why\n  # indented why\n# shellcheck source=lib.sh\n. lib.sh\n"
        "cat <<'EOF'\n# kept: data\nEOF\nx <<<\"$y\"  # trailing comment kept\n# gone\necho '#'\n"
    )
    original = bootstrap.SCRIPTS_DIR
    try:
        bootstrap.SCRIPTS_DIR = tmp_path
        shipped = bootstrap.shipped("x.sh")
    finally:
        bootstrap.SCRIPTS_DIR = original
    assert shipped == (
        "#!/usr/bin/env bash\n# shellcheck source=lib.sh\n. lib.sh\n"
        "cat <<'EOF'\n# kept: data\nEOF\nx <<<\"$y\"  # trailing comment kept\necho '#'\n"
    )


def test_user_data_of_exactly_the_ec2_limit_is_accepted():
    def of_size(n: int) -> str:
        return bootstrap.cloud_config([{"path": "/x", "content": "x" * n}], [], ())

    n = 1 + bootstrap.USER_DATA_LIMIT - len(of_size(1).encode())
    assert len(of_size(n).encode()) == bootstrap.USER_DATA_LIMIT
    with pytest.raises(ValueError, match=f"user-data is {bootstrap.USER_DATA_LIMIT + 1} bytes; EC2 allows 16384"):
        of_size(n + 1)


def test_rendered_files_keep_a_stable_readable_order(default_run):
    """Byte-identical renders across runs, and in the order people read them."""
    user_data = user_data_of(default_run, "testbed-control-instance")
    env = written_file(user_data, bootstrap.ENV_FILE).splitlines()
    assert env == sorted(env) and len(env) == 15
    kubeadm = written_file(user_data, bootstrap.KUBEADM_CONFIG)
    assert kubeadm.startswith("apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\nbootstrapTokens:\n")
    assert "\n---\napiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\n" in kubeadm
    assert user_data.startswith("#cloud-config\nwrite_files:\n- path: /etc/testbed/bootstrap.env\n")


def test_the_gate_and_the_join_token_steps_read_each_nodes_status_where_its_bootstrap_records_it(default_run):
    """Where the bootstrap records (its parameter file) is where the steps on the control node read;
    they reach a worker over SSH with the stack's key, and tell you the command that reaches each node."""
    s = default_run.settings
    (eip,) = by_type(default_run, tokens.EIP)
    public_ip = eip.outputs["publicIp"]
    nodes = [("testbed-control-instance", s.control_private_ip)] + [
        (f"testbed-worker-{i}-instance", ip) for i, ip in enumerate(s.worker_private_ips)
    ]
    for name, _ in nodes:
        assert parsed_env(written_file(user_data_of(default_run, name), bootstrap.ENV_FILE))["BOOTSTRAP_STATUS"] == (
            host_layout.BOOTSTRAP_STATUS
        )
    gate = step_args(default_run, "testbed-readiness-wait")
    reach = {s.control_private_ip: f"ssh ubuntu@{public_ip}"} | {
        ip: f"ssh -J ubuntu@{public_ip} ubuntu@{ip}" for ip in s.worker_private_ips
    }
    assert gate["NODES"].splitlines() == [
        f"{'control' if ip == s.control_private_ip else 'worker'} {ip} {name}-placeholder {reach[ip]}"
        for name, ip in nodes
    ]
    key = default_run.outputs["sshPrivateKey"]
    assert step_secrets(default_run, "testbed-readiness-wait")["SSH_PRIVATE_KEY"] == key
    for index, ip in enumerate(s.worker_private_ips):
        step = f"testbed-worker-{index}-join-token"
        args = step_args(default_run, step)
        assert args["BOOTSTRAP_STATUS"] == gate["BOOTSTRAP_STATUS"] == host_layout.BOOTSTRAP_STATUS
        assert args["BOOTSTRAP_LOG"] == gate["BOOTSTRAP_LOG"] == host_layout.BOOTSTRAP_LOG
        assert (args["NODE_REACH"], args["CONTROL_IP"], args["CONTROL_REACH"]) == (
            reach[ip],
            s.control_private_ip,
            reach[s.control_private_ip],
        )
        assert args["SSH_USER"] == gate["SSH_USER"] == host_layout.SSH_USER
        assert step_secrets(default_run, step)["SSH_PRIVATE_KEY"] == key

"""The node bootstrap renderers and scripts, checked directly and as deployed."""

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization

from components import bootstrap, host_layout
from stacks.offline import placeholder_key_pem, reveal
from tests import tokens
from tests.conftest import by_type, step_args, step_secrets

SHELLCHECK = Path(sys.executable).parent / "shellcheck"


def user_data_of(rec, name):
    return reveal(rec.named(name).inputs["userData"])


def written_file(user_data: str, path: str) -> str:
    files = {f["path"]: f for f in yaml.safe_load(user_data)["write_files"]}
    return files[path]["content"]


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
    join = yaml.safe_load(
        written_file(user_data_of(default_run, "testbed-worker-0-instance"), bootstrap.KUBEADM_CONFIG)
    )
    assert join["discovery"]["bootstrapToken"]["caCertHashes"] == [expected]


def test_each_worker_joins_with_its_own_short_lived_token_registered_over_ssh(default_run):
    import re

    init, _ = yaml.safe_load_all(
        written_file(user_data_of(default_run, "testbed-control-instance"), bootstrap.KUBEADM_CONFIG)
    )
    (init_token,) = init["bootstrapTokens"]
    assert init_token["ttl"] == "1h0m0s"  # hours, not a year: no node uses kubeadm init's own token
    tokens = [init_token["token"]]
    for index, ip in enumerate(default_run.settings.worker_private_ips):
        join = yaml.safe_load(
            written_file(user_data_of(default_run, f"testbed-worker-{index}-instance"), bootstrap.KUBEADM_CONFIG)
        )
        token = join["discovery"]["bootstrapToken"]["token"]
        step = f"testbed-worker-{index}-join-token"
        assert step_secrets(default_run, step) == {"JOIN_TOKEN": token}
        assert step_args(default_run, step)["NODE_IP"] == ip
        assert int(step_args(default_run, step)["TTL_SECONDS"]) <= 4 * 3600
        # a replaced worker gets its token registered again
        worker = default_run.named(f"testbed-worker-{index}-instance")
        assert default_run.named(step).inputs["triggers"] == [f"{worker.name}-placeholder"]
        tokens.append(token)
    assert all(re.fullmatch(r"[a-z0-9]{6}\.[a-z0-9]{16}", t) for t in tokens)
    assert len(set(tokens)) == len(tokens)


def test_no_user_data_holds_a_private_key(default_run):
    import re

    for node in by_type(default_run, INSTANCE):
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
    _, cluster = yaml.safe_load_all(
        written_file(user_data_of(default_run, "testbed-control-instance"), bootstrap.KUBEADM_CONFIG)
    )
    control_ip = default_run.named("testbed-control-instance").inputs["privateIp"]
    assert eip in cluster["apiServer"]["certSANs"] and control_ip in cluster["apiServer"]["certSANs"]
    assert cluster["controlPlaneEndpoint"] == f"{control_ip}:{host_layout.API_SERVER_PORT}"
    assert cluster["kubernetesVersion"] == f"v{default_run.settings.kubernetes_version}"
    join = yaml.safe_load(
        written_file(user_data_of(default_run, "testbed-worker-1-instance"), bootstrap.KUBEADM_CONFIG)
    )
    assert join["discovery"]["bootstrapToken"]["apiServerEndpoint"] == cluster["controlPlaneEndpoint"]
    env = written_file(user_data_of(default_run, "testbed-worker-1-instance"), bootstrap.ENV_FILE)
    assert f"CONTROL_PLANE_IP={control_ip}\n" in env


def test_gpu_workers_register_with_the_device_plugin_label(default_run):
    join = yaml.safe_load(
        written_file(user_data_of(default_run, "testbed-worker-3-instance"), bootstrap.KUBEADM_CONFIG)
    )
    args = join["nodeRegistration"]["kubeletExtraArgs"]
    assert {"name": "node-labels", "value": "nvidia.com/gpu.present=true"} in args


@pytest.mark.parametrize("node", ["testbed-control-instance", "testbed-worker-0-instance"])
def test_user_data_is_cloud_config_within_the_ec2_limit_and_runs_the_delivered_scripts(default_run, node):
    text = user_data_of(default_run, node)
    assert text.startswith("#cloud-config\n")
    assert len(text.encode()) <= bootstrap.USER_DATA_LIMIT
    doc = yaml.safe_load(text)
    paths = {f["path"] for f in doc["write_files"]}
    command = doc["runcmd"][0][2]
    run_scripts = [p for p in command.replace("(", " ").replace(")", " ").split() if p.startswith("/opt/testbed/")]
    assert run_scripts and all(p in paths for p in run_scripts)
    assert f"{bootstrap.NODE_SCRIPT_DIR}/testbed-lib.sh" in paths  # sourced by every script


def test_secret_files_are_root_only(default_run):
    files = yaml.safe_load(user_data_of(default_run, "testbed-control-instance"))["write_files"]
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

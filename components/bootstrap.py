"""Pure renderers for node bootstrap: kubeadm configs, parameter files and cloud-config.

The shell lives in real files under `scripts/`; cloud-init delivers them unchanged with a
parameter file beside them, so nothing here assembles shell from strings.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from components import api_hardening
from core import host_layout, trusted_yaml

SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"
NODE_SCRIPT_DIR = "/opt/testbed"
LIBRARY = "testbed-lib.sh"  # the shell library every node script and remote step sources
ENV_FILE = "/etc/testbed/bootstrap.env"
KUBEADM_CONFIG = "/etc/testbed/kubeadm.yaml"
CRI_SOCKET = "unix:///var/run/containerd/containerd.sock"
KUBEADM_API = "kubeadm.k8s.io/v1beta4"
# kubeadm init always makes one token (without one it makes a 24 h default): this one joins no
# node and lives an hour. Each worker joins with its own token, registered over SSH by
# join-token.sh for JOIN_TOKEN_TTL_SECONDS and deleted once the worker is Ready.
BOOTSTRAP_TOKEN_TTL = "1h0m0s"
JOIN_TOKEN_TTL_SECONDS = 2 * 60 * 60
CA_CERT_FILE = "/etc/kubernetes/pki/ca.crt"
CA_KEY_FILE = "/etc/kubernetes/pki/ca.key"  # delivered over SSH (deliver-ca-key.sh), never in user-data
CA_KEY_WAIT_SECONDS = 30 * 60  # control-plane.sh waits this long for it
USER_DATA_LIMIT = 16384  # EC2's limit on user-data, in bytes
# kube-controller-manager's HPA tolerance, 0.1 by default: within 10 % of the current count the HPA
# makes no change (kubernetes/kubernetes@v1.34.0: pkg/controller/podautoscaler/replica_calculator.go
# Tolerances.isWithin), so from 10 slurmd pods on, the one more or one fewer that KEDA's whole-number
# metric asks for was lost (twin/autoscale.py). 0: every change the metric asks for. The flag is
# cluster-wide: an HPA of your own on a noisy metric then wants a stabilization window.
HPA_TOLERANCE = "0"
# GPU health before the worker joins: DCGM's diagnostic at run level 1 (deployment and software
# checks: NVML and CUDA libraries, permissions, page retirement, inforom; under a minute; the PCIe
# and memory tests are level 2, docs/evidence-and-budget.md), with the DCGM release the pinned dcgm-exporter image carries (NVIDIA/dcgm-exporter tag
# 4.4.2-4.7.1: DCGM 4.4.2). DCGM 4 comes as packages per CUDA major version of the driver, from
# NVIDIA's CUDA repository for Ubuntu 24.04 (NVIDIA DCGM documentation, "Install DCGM"); the
# driver branch fixes that major: 580 is CUDA 13 (CUDA 13.0 release notes, table 3: 580.65.06 or later).
GPU_DIAG_LEVEL = 1
DCGM_VERSION = "4.4.2"
DRIVER_CUDA_MAJOR = {"580": "13"}
CUDA_REPO = "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64"


def script(name: str) -> str:
    return (SCRIPTS_DIR / name).read_text()


_HEREDOC = re.compile(r"(?<!<)<<-?\s*['\"]?(\w+)['\"]?")


def shipped(name: str) -> str:
    """A node script as user-data carries it: without its comment lines, which only the
    repository's copy needs (EC2 allows 16 KiB of user-data). Its shebang, shellcheck
    directives and here-document bodies stay as written."""
    lines, heredoc_end = [], None
    for line in script(name).splitlines(keepends=True):
        if heredoc_end is not None:
            heredoc_end = None if line.strip() == heredoc_end else heredoc_end
        elif line.lstrip().startswith("#") and not line.lstrip().startswith(("#!", "# shellcheck ")):
            continue
        elif match := _HEREDOC.search(line):
            heredoc_end = match[1]
        lines.append(line)
    return "".join(lines)


def discovery_token_ca_cert_hash(ca_public_key_pem: str) -> str:
    """kubeadm's `--discovery-token-ca-cert-hash`: SHA-256 over the CA's DER SubjectPublicKeyInfo."""
    body = "".join(line for line in ca_public_key_pem.strip().splitlines() if not line.startswith("-----"))
    return "sha256:" + hashlib.sha256(base64.b64decode(body)).hexdigest()


def env_file(params: dict[str, str]) -> str:
    """KEY='value' lines the scripts source; values quoted, so no value can inject shell."""
    return "".join(f"{key}={shlex.quote(str(value))}\n" for key, value in sorted(params.items()))


def _yaml_documents(*docs: dict) -> str:
    return trusted_yaml.dump_all(docs, sort_keys=False, explicit_start=False)


@dataclass(frozen=True)
class ControlPlaneBootstrap:
    kubernetes_version: str
    kubernetes_minor: str
    flannel_version: str
    private_ip: str
    public_ip: str
    share_export_cidr: str
    bootstrap_token: str
    ca_cert_pem: str
    authorized_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class WorkerBootstrap:
    kubernetes_version: str
    kubernetes_minor: str
    nvidia_driver_branch: str
    nvidia_container_toolkit_version: str
    control_plane_ip: str
    bootstrap_token: str
    ca_cert_hash: str
    authorized_keys: tuple[str, ...] = ()
    prepull_images: tuple[str, ...] = ()  # components/images.py


def kubeadm_init_config(p: ControlPlaneBootstrap) -> str:
    init = {
        "apiVersion": KUBEADM_API,
        "kind": "InitConfiguration",
        "bootstrapTokens": [
            {
                "token": p.bootstrap_token,
                "ttl": BOOTSTRAP_TOKEN_TTL,
                "groups": ["system:bootstrappers:kubeadm:default-node-token"],
                "usages": ["signing", "authentication"],
            }
        ],
        "localAPIEndpoint": {"advertiseAddress": p.private_ip, "bindPort": host_layout.API_SERVER_PORT},
        "nodeRegistration": {"criSocket": CRI_SOCKET},
    }
    hardening = api_hardening.cluster_configuration_fields()
    cluster = {
        "apiVersion": KUBEADM_API,
        "kind": "ClusterConfiguration",
        "kubernetesVersion": f"v{p.kubernetes_version}",
        "controlPlaneEndpoint": f"{p.private_ip}:{host_layout.API_SERVER_PORT}",
        "networking": {"podSubnet": host_layout.POD_CIDR, "serviceSubnet": host_layout.SERVICE_CIDR},
        **hardening,
        # The Elastic IP is not on the NIC: name it so the API certificate covers it.
        "apiServer": {**hardening["apiServer"], "certSANs": [p.public_ip, p.private_ip]},
        "controllerManager": {
            "extraArgs": [
                *hardening["controllerManager"]["extraArgs"],
                {"name": "horizontal-pod-autoscaler-tolerance", "value": HPA_TOLERANCE},
            ]
        },
    }
    return _yaml_documents(init, cluster)


def kubeadm_join_config(p: WorkerBootstrap) -> str:
    label_key, label_value = host_layout.GPU_NODE_LABEL
    join = {
        "apiVersion": KUBEADM_API,
        "kind": "JoinConfiguration",
        "discovery": {
            "bootstrapToken": {
                "apiServerEndpoint": f"{p.control_plane_ip}:{host_layout.API_SERVER_PORT}",
                "token": p.bootstrap_token,
                "caCertHashes": [p.ca_cert_hash],
            }
        },
        "nodeRegistration": {
            "criSocket": CRI_SOCKET,
            "kubeletExtraArgs": [{"name": "node-labels", "value": f"{label_key}={label_value}"}],
        },
    }
    return _yaml_documents(join)


def _file(path: str, content: str, permissions: str, compressed: bool = False) -> dict:
    entry = {"path": path, "content": content, "owner": "root:root", "permissions": permissions}
    if compressed:
        # cloud-init's write_files decodes gz+b64 (cloudinit/config/cc_write_files.py
        # canonicalize_extraction); mtime 0 keeps two renders byte-identical
        packed = base64.b64encode(gzip.compress(content.encode(), mtime=0)).decode()
        entry.update(content=packed, encoding="gz+b64")
    return entry


def file_text(entry: dict) -> str:
    """A write_files entry's content as cloud-init writes it to disk."""
    if entry.get("encoding") == "gz+b64":
        return gzip.decompress(base64.b64decode(entry["content"])).decode()
    return entry["content"]


def _script_files(*names: str) -> list[dict]:
    """The shell library travels compressed (EC2 allows 16 KiB of user-data); the node's own
    scripts stay readable in it."""
    library = _file(f"{NODE_SCRIPT_DIR}/{LIBRARY}", shipped(LIBRARY), "0755", compressed=True)
    return [library, *(_file(f"{NODE_SCRIPT_DIR}/{n}", shipped(n), "0755") for n in names)]


def _run(*names: str) -> list[list[str]]:
    """One runcmd entry: the role's scripts in order, logged; the first failure stops the rest."""
    chain = " && ".join(f"{NODE_SCRIPT_DIR}/{n}" for n in names)
    log = host_layout.BOOTSTRAP_LOG  # 0600 before the first line: a failure may print a secret
    return [["bash", "-c", f"set -o pipefail; touch {log} && chmod 0600 {log} && ({chain}) 2>&1 | tee -a {log}"]]


def cloud_config(write_files: list[dict], runcmd: list, authorized_keys: tuple[str, ...]) -> str:
    doc: dict = {"write_files": write_files, "runcmd": runcmd}
    if authorized_keys:
        doc["ssh_authorized_keys"] = list(authorized_keys)
    text = "#cloud-config\n" + trusted_yaml.dump(
        doc, str_representer=trusted_yaml.literal_blocks, sort_keys=False, width=4096
    )
    if len(text.encode()) > USER_DATA_LIMIT:
        raise ValueError(f"user-data is {len(text.encode())} bytes; EC2 allows {USER_DATA_LIMIT}")
    return text


def _node_user_data(
    role_script: str,
    *,
    kubernetes_version: str,
    kubernetes_minor: str,
    role_params: dict[str, str],
    kubeadm_config: str,
    role_files: list[dict],
    authorized_keys: tuple[str, ...],
) -> str:
    """Every node: its parameter file, its kubeadm config, node-common.sh, then its role's script."""
    params = {
        "KUBERNETES_VERSION": kubernetes_version,
        "KUBERNETES_MINOR": kubernetes_minor,
        "SHARE_DIR": host_layout.SHARE_DIR,
        "KUBEADM_CONFIG": KUBEADM_CONFIG,
        "BOOTSTRAP_STATUS": host_layout.BOOTSTRAP_STATUS,
        **role_params,
    }
    files = [
        _file(ENV_FILE, env_file(params), "0600"),
        _file(KUBEADM_CONFIG, kubeadm_config, "0600"),
        *role_files,
        *_script_files("node-common.sh", role_script),
    ]
    return cloud_config(files, _run("node-common.sh", role_script), authorized_keys)


def control_plane_user_data(p: ControlPlaneBootstrap) -> str:
    return _node_user_data(
        "control-plane.sh",
        kubernetes_version=p.kubernetes_version,
        kubernetes_minor=p.kubernetes_minor,
        role_params={
            "ADMIN_KUBECONFIG": host_layout.ADMIN_KUBECONFIG,
            "SSH_USER": host_layout.SSH_USER,
            "FLANNEL_VERSION": p.flannel_version,
            "SHARE_EXPORT_CIDR": p.share_export_cidr,
            "SLURM_STATE_DIR": host_layout.SLURM_STATE_DIR,
            "SLURM_UID": str(host_layout.SLURM_UID),
            "TOOLS_UID": str(host_layout.SHARE_TOOLS_UID),
            "CA_KEY_FILE": CA_KEY_FILE,
            "CA_KEY_WAIT_SECONDS": str(CA_KEY_WAIT_SECONDS),
            "HOST_KEY_MARKER": host_layout.HOST_KEY_MARKER,
        },
        kubeadm_config=kubeadm_init_config(p),
        # kubeadm init keeps a CA it finds here: the program minted it, so workers can
        # verify the API server from its public key before the control plane exists.
        role_files=[
            _file(CA_CERT_FILE, p.ca_cert_pem, "0644"),
            *(_file(path, text, "0600") for path, text in api_hardening.control_plane_files(p.kubernetes_minor)),
        ],
        authorized_keys=p.authorized_keys,
    )


def gpu_worker_user_data(p: WorkerBootstrap) -> str:
    return _node_user_data(
        "gpu-worker.sh",
        kubernetes_version=p.kubernetes_version,
        kubernetes_minor=p.kubernetes_minor,
        role_params={
            "NVIDIA_DRIVER_BRANCH": p.nvidia_driver_branch,
            "NVIDIA_CONTAINER_TOOLKIT_VERSION": p.nvidia_container_toolkit_version,
            "CONTROL_PLANE_IP": p.control_plane_ip,
            "API_SERVER_PORT": str(host_layout.API_SERVER_PORT),
            "CRI_SOCKET": CRI_SOCKET,
            "PREPULL_IMAGES": " ".join(p.prepull_images),
            "GPU_DIAG_LEVEL": str(GPU_DIAG_LEVEL),
            "DCGM_VERSION": DCGM_VERSION,
            "DCGM_CUDA_MAJOR": DRIVER_CUDA_MAJOR[p.nvidia_driver_branch],
            "CUDA_REPO": CUDA_REPO,
        },
        kubeadm_config=kubeadm_join_config(p),
        role_files=[],
        authorized_keys=p.authorized_keys,
    )

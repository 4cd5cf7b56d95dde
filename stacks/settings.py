"""The one reader of Pulumi config: a typed, validated `Settings` object.

Every setting is declared once in `SETTINGS` (key, type, default, description, rule) and
again in `Pulumi.yaml` (a test keeps the two in step). Every problem is collected and
reported at once, before any resource exists.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

PROJECT = "gpu-testbed"

# Subnet layout: AWS reserves the first four and the last address of a subnet.
CONTROL_HOST_INDEX = 10
FIRST_WORKER_HOST_INDEX = 20
SUBNET_PREFIX = 24

# On-demand GPU types with NVIDIA GPUs the bootstrap supports (driver + toolkit path).
NVIDIA_GPU_INSTANCE_FAMILIES = ("g4dn", "g5", "g6", "g6e", "gr6", "p3", "p4d", "p5")
SLINKY_MIN_KUBERNETES = (1, 29)  # slurm-operator 1.0.0 Chart.yaml kubeVersion ">= 1.29.0-0"
MIN_WORKER_ROOT_GB = 60  # driver (~2 GiB), CUDA images (~10 GiB each), Slurm images
MIN_CONTROL_ROOT_GB = 20


class SettingsError(Exception):
    """All problems with the settings, one line each."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


# --------------------------------------------------------------------------- rules
# A rule takes the parsed value and returns None, or the phrase "what is allowed".


def _int_range(lo: int, hi: int) -> Callable[[Any], str | None]:
    return lambda v: None if lo <= v <= hi else f"an integer from {lo} to {hi}"


def _matches(pattern: str, what: str) -> Callable[[Any], str | None]:
    rx = re.compile(pattern)
    return lambda v: None if rx.fullmatch(v) else what


def _optional(rule: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    return lambda v: None if v == "" else rule(v)


def _ipv4_cidr(v: str) -> str | None:
    """The VPC, the Elastic IP and so SSH and the API server are IPv4 only."""
    try:
        if "/" not in v or ipaddress.ip_network(v, strict=True).version != 4:
            raise ValueError(v)
    except ValueError:
        return "an IPv4 network in CIDR form with no host bits set, e.g. 203.0.113.7/32 (the testbed is IPv4 only)"
    return None


def _private_vpc_cidr(v: str) -> str | None:
    try:
        net = ipaddress.ip_network(v, strict=True)
    except ValueError:
        return "a private IPv4 network in CIDR form, e.g. 10.0.0.0/16"
    if net.version != 4 or not net.is_private or not 16 <= net.prefixlen <= SUBNET_PREFIX:
        return f"a private IPv4 network from /16 to /{SUBNET_PREFIX}, e.g. 10.0.0.0/16"
    return None


def _gpu_instance_type(v: str) -> str | None:
    family = v.split(".", 1)[0]
    if "." in v and family in NVIDIA_GPU_INSTANCE_FAMILIES:
        return None
    return "an EC2 type with an NVIDIA GPU, from the families " + ", ".join(NVIDIA_GPU_INSTANCE_FAMILIES)


def _kubernetes_version(v: str) -> str | None:
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", v)
    if not m:
        return "a full Kubernetes release MAJOR.MINOR.PATCH, e.g. 1.34.7"
    if (int(m[1]), int(m[2])) < SLINKY_MIN_KUBERNETES:
        return "1.29.0 or later (Slinky 1.0.0 requires it), e.g. 1.34.7"
    return None


_SEMVER = r"\d+\.\d+\.\d+"
_VERSION = _matches(_SEMVER, "a version MAJOR.MINOR.PATCH, e.g. 1.2.3")
_V_VERSION = _matches("v" + _SEMVER, "a version vMAJOR.MINOR.PATCH with its leading v, e.g. v1.2.3")
_DNS_LABEL = _matches(
    r"[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?",
    "a DNS label: lower-case letters, digits and '-', 1-32 characters, starting and ending with a letter or digit",
)


# --------------------------------------------------------------------------- table


@dataclass(frozen=True)
class Setting:
    key: str
    kind: type  # str, int or bool: how the config string is parsed
    default: Any  # None: the setting is required
    description: str
    rule: Callable[[Any], str | None] | None = None

    @property
    def attribute(self) -> str:
        return re.sub(r"(?<!^)(?=[A-Z])", "_", self.key).lower()


SETTINGS: tuple[Setting, ...] = (
    # AWS
    Setting(
        "region",
        str,
        "us-east-1",
        "AWS region to build in.",
        _matches(r"[a-z]{2}(-gov)?-[a-z]+-\d", "an AWS region name, e.g. us-east-1"),
    ),
    Setting(
        "availabilityZone",
        str,
        "",
        "Availability zone for the subnet; empty picks the first zone that offers the worker type.",
        _optional(
            _matches(r"[a-z]{2}(-gov)?-[a-z]+-\d[a-z]", "an availability zone name in the region, e.g. us-east-1a")
        ),
    ),
    Setting(
        "adminCidr",
        str,
        None,
        "Who may reach SSH (22) and the API server (6443), e.g. your address as a.b.c.d/32. Required.",
        _ipv4_cidr,
    ),
    Setting(
        "allowOpenIngress", bool, False, "Opt in to adminCidr 0.0.0.0/0 (SSH and the API server open to the internet)."
    ),
    Setting(
        "vpcCidr",
        str,
        "10.0.0.0/16",
        "The testbed VPC's address range; the node subnet is its first /24.",
        _private_vpc_cidr,
    ),
    Setting(
        "amiId",
        str,
        "",
        "Pin an AMI; empty looks up the newest Canonical Ubuntu 24.04 amd64 image at first create.",
        _optional(_matches(r"ami-[0-9a-f]{8,17}", "an AMI id, e.g. ami-0123456789abcdef0")),
    ),
    Setting(
        "controlInstanceType",
        str,
        "t3.medium",
        "Control-plane instance type (2 vCPU, 4 GiB at least).",
        _matches(r"[a-z][a-z0-9-]*\.[a-z0-9]+", "an EC2 instance type, e.g. t3.medium"),
    ),
    Setting(
        "workerInstanceType", str, "g4dn.xlarge", "GPU worker instance type (one NVIDIA GPU each).", _gpu_instance_type
    ),
    Setting("workerCount", int, 4, "Number of GPU workers (and the most slurmd pods KEDA may run)."),
    Setting(
        "spotWorkers",
        bool,
        False,
        "Request the GPU workers as one-time spot instances; an interrupted worker is terminated "
        "and the next `pulumi up` replaces it.",
    ),
    Setting(
        "controlRootVolumeGb",
        int,
        40,
        "Control node root volume (gp3, encrypted), GiB.",
        _int_range(MIN_CONTROL_ROOT_GB, 16384),
    ),
    Setting(
        "workerRootVolumeGb",
        int,
        100,
        "GPU worker root volume (gp3, encrypted), GiB.",
        _int_range(MIN_WORKER_ROOT_GB, 16384),
    ),
    Setting(
        "sshPublicKey",
        str,
        "",
        "OpenSSH public key for user ubuntu; empty generates a key pair (output sshPrivateKey).",
        _optional(
            _matches(
                r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]+( .*)?",
                "an OpenSSH public key line, e.g. ssh-ed25519 AAAA... me@host",
            )
        ),
    ),
    # Kubernetes and node software
    Setting(
        "kubernetesVersion", str, "1.34.7", "kubelet/kubeadm/kubectl release (apt packages held).", _kubernetes_version
    ),
    Setting("flannelVersion", str, "v0.27.4", "Flannel CNI release applied by kubeadm init.", _V_VERSION),
    Setting(
        "nvidiaDriverBranch",
        str,
        "580",
        "NVIDIA server driver branch on the GPU workers.",
        _matches(r"\d{3}", "a three-digit NVIDIA driver branch, e.g. 580"),
    ),
    Setting("nvidiaContainerToolkitVersion", str, "1.18.1", "nvidia-container-toolkit release.", _VERSION),
    # Platform
    Setting("devicePluginVersion", str, "0.17.0", "NVIDIA device plugin Helm chart version.", _VERSION),
    Setting(
        "gpuFeatureDiscovery", bool, False, "Also deploy GPU feature discovery (with NFD) from the device plugin chart."
    ),
    Setting("certManagerVersion", str, "v1.19.2", "cert-manager Helm chart version (keeps its leading v).", _V_VERSION),
    Setting("slinkyVersion", str, "1.0.0", "Slinky slurm-operator, CRD and slurm chart version.", _VERSION),
    Setting(
        "slurmImageTag",
        str,
        "25.11.6-ubuntu24.04",
        "Tag of the Slinky slurmctld/slurmd/slurmrestd images.",
        _matches(r"\d+\.\d+(\.\d+)?-ubuntu\d+\.\d+", "a Slinky image tag, e.g. 25.11.6-ubuntu24.04"),
    ),
    Setting("nodesetName", str, "slinky", "Name of the GPU NodeSet (and its Slurm partition).", _DNS_LABEL),
    Setting("kubePrometheusStackVersion", str, "80.9.2", "kube-prometheus-stack Helm chart version.", _VERSION),
    Setting("dcgmExporterVersion", str, "4.7.1", "NVIDIA dcgm-exporter Helm chart version.", _VERSION),
    Setting("kedaVersion", str, "2.16.1", "KEDA Helm chart version.", _VERSION),
    Setting("kedaMinReplicas", int, 1, "slurmd replicas while Slurm has work (KEDA minReplicaCount)."),
    Setting("kedaMaxReplicas", int, 0, "Most slurmd replicas (KEDA maxReplicaCount); 0 means workerCount."),
    Setting(
        "kedaCooldownSeconds",
        int,
        300,
        "Idle seconds before slurmd scales to 0 (KEDA cooldownPeriod).",
        _int_range(1, 86400),
    ),
    Setting(
        "kedaPollingSeconds", int, 30, "How often KEDA reads the Slurm metrics (pollingInterval).", _int_range(1, 3600)
    ),
    Setting(
        "trainingOperatorVersion", str, "v1.8.1", "Kubeflow Training Operator release (standalone overlay).", _V_VERSION
    ),
)

SETTINGS_BY_KEY = {s.key: s for s in SETTINGS}


@dataclass(frozen=True)
class Settings:
    region: str
    availability_zone: str
    admin_cidr: str
    allow_open_ingress: bool
    vpc_cidr: str
    ami_id: str
    control_instance_type: str
    worker_instance_type: str
    worker_count: int
    spot_workers: bool
    control_root_volume_gb: int
    worker_root_volume_gb: int
    ssh_public_key: str
    kubernetes_version: str
    flannel_version: str
    nvidia_driver_branch: str
    nvidia_container_toolkit_version: str
    device_plugin_version: str
    gpu_feature_discovery: bool
    cert_manager_version: str
    slinky_version: str
    slurm_image_tag: str
    nodeset_name: str
    kube_prometheus_stack_version: str
    dcgm_exporter_version: str
    keda_version: str
    keda_min_replicas: int
    keda_max_replicas: int
    keda_cooldown_seconds: int
    keda_polling_seconds: int
    training_operator_version: str
    stack: str = field(default="dev")

    # Derived values: one place computes each.
    @property
    def kubernetes_minor(self) -> str:
        return ".".join(self.kubernetes_version.split(".")[:2])

    @property
    def subnet_cidr(self) -> str:
        return str(next(ipaddress.ip_network(self.vpc_cidr).subnets(new_prefix=SUBNET_PREFIX)))

    @property
    def control_private_ip(self) -> str:
        return str(ipaddress.ip_network(self.subnet_cidr)[CONTROL_HOST_INDEX])

    @property
    def worker_private_ips(self) -> list[str]:
        subnet = ipaddress.ip_network(self.subnet_cidr)
        return [str(subnet[FIRST_WORKER_HOST_INDEX + i]) for i in range(self.worker_count)]

    @property
    def slurmd_max_replicas(self) -> int:
        return self.keda_max_replicas or self.worker_count


def max_workers_for_subnet() -> int:
    """Workers take consecutive addresses from FIRST_WORKER_HOST_INDEX; AWS keeps the last one."""
    return 2 ** (32 - SUBNET_PREFIX) - 1 - FIRST_WORKER_HOST_INDEX


def _parse(setting: Setting, raw: Any) -> tuple[Any, str | None]:
    """Config values arrive as strings (or JSON-decoded values from Pulumi.<stack>.yaml)."""
    text = str(raw).strip() if not isinstance(raw, bool) else str(raw).lower()
    if setting.kind is bool:
        if text.lower() in ("true", "false"):
            return text.lower() == "true", None
        return None, "true or false"
    if setting.kind is int:
        if re.fullmatch(r"-?\d+", text):
            return int(text), None
        return None, "a whole number"
    return text, None


def _quote(raw: Any) -> str:
    return f'"{raw}"'


# RFC 5737 documentation ranges: the example stack's adminCidr lives here so that the offline
# plan runs as shipped, but nobody can connect from one, so a deployment refuses them.
DOCUMENTATION_NETWORKS = tuple(ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"))


def load(config: Mapping[str, Any], stack: str = "dev", offline: bool = False) -> Settings:
    """Build Settings from project-prefixed config (`gpu-testbed:key` -> value), or raise
    SettingsError listing every problem. `offline` (plan, render, tests) accepts the example
    adminCidr from a documentation range; a deployment does not."""
    problems: list[str] = []
    prefix = PROJECT + ":"
    given = {k[len(prefix) :]: v for k, v in config.items() if k.startswith(prefix)}

    for key in sorted(set(given) - set(SETTINGS_BY_KEY)):
        close = difflib.get_close_matches(key, list(SETTINGS_BY_KEY), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        problems.append(f"{key}: {_quote(given[key])} is not a setting of {PROJECT}{hint}")

    values: dict[str, Any] = {}
    for s in SETTINGS:
        if s.key not in given:
            if s.default is None:
                problems.append(f"{s.key}: missing; required: {s.description}")
            values[s.attribute] = s.default
            continue
        value, parse_problem = _parse(s, given[s.key])
        allowed = parse_problem or (s.rule(value) if s.rule else None)
        if allowed:
            problems.append(f"{s.key}: {_quote(given[s.key])} is not allowed; expected {allowed}")
        values[s.attribute] = value

    problems += _cross_checks(values, problems)
    if not offline and "adminCidr" in given and not any(p.startswith("adminCidr:") for p in problems):
        network = ipaddress.ip_network(values["admin_cidr"])
        if any(network.subnet_of(d) for d in DOCUMENTATION_NETWORKS if d.version == network.version):
            problems.append(
                f'adminCidr: "{values["admin_cidr"]}" is a documentation example address nobody '
                "connects from; expected your own, e.g. pulumi config set adminCidr "
                '"$(curl -s https://checkip.amazonaws.com)/32"'
            )
    if problems:
        raise SettingsError(problems)
    return Settings(**values, stack=stack)


def _cross_checks(v: dict[str, Any], earlier: list[str]) -> list[str]:
    """Rules between settings; a setting already reported is not reported again."""
    out: list[str] = []

    def ok(*keys: str) -> bool:
        bad = {p.split(":", 1)[0] for p in earlier + out}
        return not bad.intersection(keys)

    cap = max_workers_for_subnet()
    if ok("workerCount") and not 1 <= v["worker_count"] <= cap:
        out.append(
            f'workerCount: "{v["worker_count"]}" is not allowed; expected an integer from 1 to {cap} '
            f"(the /{SUBNET_PREFIX} node subnet's capacity)"
        )
    if (
        ok("adminCidr", "allowOpenIngress")
        and v["admin_cidr"] is not None
        and ipaddress.ip_network(v["admin_cidr"]).prefixlen == 0
        and not v["allow_open_ingress"]
    ):
        out.append(
            f'adminCidr: "{v["admin_cidr"]}" opens SSH and the API server to the whole internet; '
            "expected your own address range, or set allowOpenIngress true to accept that"
        )
    if (
        ok("availabilityZone", "region")
        and v["availability_zone"]
        and not v["availability_zone"].startswith(v["region"])
    ):
        out.append(
            f'availabilityZone: "{v["availability_zone"]}" is not allowed; expected a zone of region '
            f"{v['region']}, e.g. {v['region']}a"
        )
    if ok("kedaMinReplicas", "kedaMaxReplicas", "workerCount"):
        max_replicas = v["keda_max_replicas"] or v["worker_count"]
        if not 0 <= v["keda_max_replicas"] <= v["worker_count"]:
            out.append(
                f'kedaMaxReplicas: "{v["keda_max_replicas"]}" is not allowed; expected 0 (= workerCount) '
                f"or an integer from 1 to workerCount ({v['worker_count']}): each slurmd pod holds one worker's GPU"
            )
        elif not 1 <= v["keda_min_replicas"] <= max_replicas:
            out.append(
                f'kedaMinReplicas: "{v["keda_min_replicas"]}" is not allowed; expected an integer from 1 to '
                f"maxReplicaCount ({max_replicas}); KEDA scales to 0 through idleReplicaCount, which must be below it"
            )
    return out


def from_pulumi(offline: bool = False) -> Settings:
    """Settings from the running Pulumi program's config (the only reader of it)."""
    import pulumi
    from pulumi.runtime import config as runtime_config

    config = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    return load(config, stack=pulumi.get_stack(), offline=offline)

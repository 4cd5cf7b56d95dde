"""The one reader of Pulumi config: a typed, validated `Settings` object.

Every setting is declared once, as a field of the `Settings` dataclass (name, type, default,
description, what is accepted, rule); the table `SETTINGS` is derived from the fields, and
Pulumi.yaml, docs/settings.md and the refusal tests are checked against it. Every problem is
collected and reported at once, one line each, before any resource exists. A value echoed in
a problem is escaped and truncated, and one that looks like a secret is not echoed at all.
"""

from __future__ import annotations

import base64
import difflib
import ipaddress
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from core import host_layout, instance_types, trusted_yaml

ROOT = Path(__file__).resolve().parent.parent
PROJECT: str = trusted_yaml.load((ROOT / "Pulumi.yaml").read_text())["name"]  # config keys are "<PROJECT>:<key>"

# Subnet layout: AWS reserves the first four and the last address of a subnet.
CONTROL_HOST_INDEX = 10
FIRST_WORKER_HOST_INDEX = 20
SUBNET_PREFIX = 24

MIN_WORKER_ROOT_GB = 60  # driver (~2 GiB), CUDA images (~10 GiB each), Slurm images
MIN_CONTROL_ROOT_GB = 20
ADMIN_MIN_PREFIX = 16  # an adminCidr wider than this needs allowOpenIngress
MAX_INT_DIGITS = 9  # longer numbers are out of every range; int() refuses past 4300 digits anyway
SHOWN_CHARS = 60  # longest value echoed in a problem
MAX_BUDGET_USD = 100_000  # a testbed's monthly budget; more is a typo
# The image of the fair-share controller and the runnable-jobs exporter (components/fair_share_controller.py,
# components/runnable_exporter.py): the Docker Official
# python 3.12.12 slim image on Debian bookworm, its multi-platform index pinned by digest (as
# several public projects pin this tag; docs/versions.md).
CONTROLLER_IMAGE = (
    "python:3.12.12-slim-bookworm@sha256:593bd06efe90efa80dc4eee3948be7c0fde4134606dd40d8dd8dbcade98e669c"
)
# An address AWS Budgets can mail: local@domain.tld, ASCII, no spaces or quotes (no display name).
EMAIL = r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63})+"
SSH_KEY_MAX_CHARS = 1600  # an 8192-bit RSA key line is about 1400; every user-data carries it

# Commercial AWS partition only: the AMI lookup trusts Canonical's owner id there, which differs
# in aws-cn and aws-us-gov. boto/botocore@1.44.8:botocore/data/endpoints.json, partition "aws".
AWS_REGIONS = [
    "af-south-1",
    "ap-east-1",
    "ap-east-2",
    "ap-northeast-1",
    "ap-northeast-2",
    "ap-northeast-3",
    "ap-south-1",
    "ap-south-2",
    "ap-southeast-1",
    "ap-southeast-2",
    "ap-southeast-3",
    "ap-southeast-4",
    "ap-southeast-5",
    "ap-southeast-6",
    "ap-southeast-7",
    "ca-central-1",
    "ca-west-1",
    "eu-central-1",
    "eu-central-2",
    "eu-north-1",
    "eu-south-1",
    "eu-south-2",
    "eu-west-1",
    "eu-west-2",
    "eu-west-3",
    "il-central-1",
    "me-central-1",
    "me-south-1",
    "mx-central-1",
    "sa-east-1",
    "us-east-1",
    "us-east-2",
    "us-west-1",
    "us-west-2",
]
# Zone letters of the regions the price table covers (AWS "Regions and Zones", read 2026-12);
# elsewhere a zone is checked for its form here and against the offerings at run time.
REGION_ZONE_LETTERS = {
    "us-east-1": "abcdef",
    "us-east-2": "abc",
    "us-west-2": "abcd",
    "eu-west-1": "abc",
    "eu-central-1": "abc",
}
# Elsewhere which zones exist is not known offline: any letter, and preflight checks the zone.
OTHER_REGION_ZONE_LETTERS = "abcdefghijklmnopqrstuvwxyz"

RFC1918 = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
# RFC 5737 documentation ranges: the example stack's adminCidr lives here so that the offline
# plan runs as shipped, but nobody can connect from one, so a deployment refuses them.
DOCUMENTATION_NETWORKS = tuple(ipaddress.IPv4Network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"))
# IANA's IPv4 special-purpose ranges that no internet client connects from (RFC 6890 and its
# updates): written out, because `ipaddress.is_global` differs between Python releases (3.11
# counts 192.0.0.0/24 as global, 3.13 does not) and counts multicast as global.
NOT_INTERNET_NETWORKS = tuple(
    ipaddress.IPv4Network(n)
    for n in (
        "0.0.0.0/8",  # "this network"
        "10.0.0.0/8",  # private
        "100.64.0.0/10",  # shared (carrier-grade NAT)
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link-local
        "172.16.0.0/12",  # private
        "192.0.0.0/24",  # IETF protocol assignments
        "192.168.0.0/16",  # private
        "198.18.0.0/15",  # benchmarking
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, and the broadcast address
    )
)

# Slurm reads PartitionName=DEFAULT as defaults for the partitions after it (SchedMD/slurm
# slurm.conf.5), and the Slinky chart already defines the partition `all` (names.DEFAULT_PARTITION;
# a test keeps the two in step: names imports this module, so it cannot be imported here).
RESERVED_NODESET_NAMES = ("all", "default")

# Namespaces of config keys the program does not read although a user may expect it to.
EXPLICIT_PROVIDER_NAMESPACES = {
    "aws": "the program's AWS provider is explicit: its region is the setting region and its credentials "
    "come from the environment (AWS_PROFILE or AWS_ACCESS_KEY_ID)",
    "kubernetes": "the program's Kubernetes provider is explicit and uses the kubeconfig the program mints",
}


class SettingsError(Exception):
    """All problems with the settings, one line each."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


# --------------------------------------------------------------------------- showing values

_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY|PuTTY-User-Key-File|-----BEGIN PGP PRIVATE")
# Tokens by their documented shapes: AWS access key ids, GitHub (ghp_ and kin, github_pat_),
# GitLab personal tokens, Slack tokens and webhooks, Google API keys, JSON Web Tokens.
_TOKENS = (
    (re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"), "an AWS access key"),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36}|\bgithub_pat_[A-Za-z0-9_]{22,}"), "a GitHub token"),
    (re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"), "a GitLab token"),
    (
        re.compile(r"\bxox[abposre]-[A-Za-z0-9-]{10,}|\bxapp-[0-9]-[A-Za-z0-9-]{10,}|hooks\.slack\.com/"),
        "a Slack token",
    ),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}"), "a Google API key"),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\."), "a JSON Web Token"),
    (re.compile(r"\bpul-[0-9a-f]{40}\b"), "a Pulumi access token"),
    (re.compile(r"\b[sr]k_(live|test)_[A-Za-z0-9]{16,}"), "a Stripe key"),
    (re.compile(r"\bhf_[A-Za-z0-9]{30,}|\bnpm_[A-Za-z0-9]{36}"), "a Hugging Face or npm token"),
    # 32 or more lower-case hex digits, letters and digits mixed, standing alone: a hex-encoded key
    # or token. Not after "sha256:" (a digest) nor inside a base64 run (a public key's body).
    (
        re.compile(r"(?<![0-9A-Za-z:+/=_-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{32,}(?![0-9A-Za-z+/=])"),
        "a hex key or token",
    ),
)
# A run of base64 (standard or URL-safe) long enough to hold a key's header; a run of standard
# base64 alone for a random secret (URL-safe's - and _ join names and UUIDs into long runs).
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{20,}")
_STANDARD_RUN = re.compile(r"[A-Za-z0-9+/]{32,}")  # an AWS secret access key has 40
RANDOM_MIN_BITS = 3.9  # bits per character: 32 random base64 characters have 4.07 or more in 2,000 draws
# What names are made of: in 5,000 random 40-character strings, words cover at most 58% of one;
# in kubePrometheusStackVersion-like names, 60% and more.
_WORD = re.compile(r"[a-z]{4,}|[A-Z][a-z]{3,}")


def _decoded_head(run: str) -> bytes:
    """The first bytes `run` stands for as base64, or b"" if it is not base64."""
    head = run.replace("-", "+").replace("_", "/")[:24]
    try:
        return base64.b64decode(head[: len(head) // 4 * 4], validate=True)
    except ValueError:
        return b""


def _is_private_key_body(head: bytes) -> bool:
    """OpenSSH's private key format, or DER that opens like a private key: a SEQUENCE whose first
    element is a small version INTEGER (PKCS#1 RSA and DSA 0, SEC1 EC 1, PKCS#8 0 or 1, PKCS#12 3),
    where public keys and certificates open with a nested SEQUENCE instead."""
    if head.startswith(b"openssh-key-v1\0"):
        return True
    if len(head) < 6 or head[0] != 0x30:
        return False
    start = 2 if head[1] < 0x80 else 2 + (head[1] & 0x7F)
    return head[start : start + 2] == b"\x02\x01" and head[start + 2 : start + 3] in (b"\0", b"\1", b"\2", b"\3")


def _is_public(head: bytes) -> bool:
    """An SSH public key blob (a length, then ssh-..., ecdsa-... or sk-...) or DER opening with a
    nested SEQUENCE (a public key or a certificate): long and random, but not secret."""
    ssh = len(head) > 8 and int.from_bytes(head[:4], "big") < 64 and head[4:].startswith((b"ssh-", b"ecdsa-", b"sk-"))
    return ssh or (len(head) > 4 and head[0] == 0x30 and 0x30 in head[2:5])


def _looks_random(run: str) -> bool:
    """Of mixed classes, dense in information, and not made of words: a secret key or token."""
    if not (re.search("[a-z]", run) and re.search("[A-Z]", run) and re.search("[0-9]", run)):
        return False
    counts = [run.count(ch) for ch in set(run)]
    bits = -sum(c / len(run) * math.log2(c / len(run)) for c in counts)
    wordy = sum(len(w) for w in _WORD.findall(run)) / len(run)
    return bits >= RANDOM_MIN_BITS and wordy < 0.6


def secret_kind(text: str) -> str | None:
    """Why `text` looks like a secret, or None: a private key (its header, or only its base64
    body), a token of a known shape, or a long random string (a secret access key)."""
    if _PRIVATE_KEY.search(text):
        return "looks like a private key"
    for pattern, what in _TOKENS:
        if pattern.search(text):
            return f"looks like {what}"
    if any(_is_private_key_body(_decoded_head(run)) for run in _BASE64_RUN.findall(text)):
        return "looks like a private key"
    for run in _STANDARD_RUN.findall(text):
        if not _is_public(_decoded_head(run)) and _looks_random(run):
            return "looks like a secret key or token"
    return None


def escaped(text: str, limit: int = SHOWN_CHARS) -> str:
    """Text as a problem line shows it (a value, a config key, a command-line token): control
    and non-ASCII characters escaped, so no newline or terminal escape reaches a log raw, and
    cut at `limit` characters."""
    out: list[str] = []
    length = 0
    for ch in text:
        # ascii() leaves printable ASCII as it is and escapes the rest, the backslash included,
        # as Python writes them (\n, \x1b, \u0661); the quote the value is shown in, too
        piece = '\\"' if ch == '"' else ascii(ch)[1:-1]
        if length + len(piece) > limit:
            return "".join(out) + f"… ({len(text)} characters)"
        out.append(piece)
        length += len(piece)
    return "".join(out)


# A URL's user name and password (scheme://user:password@host) and its query (?token=...)
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@\"']*@")
_URL_QUERY = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s\"'?#]*)\?[^\s\"'#]*")


def without_url_credentials(text: str) -> str:
    """`text` with every URL's user information and query hidden: a password in AWS_ENDPOINT_URL
    or a token in a kubeconfig's server URL, echoed by an error message."""
    return _URL_QUERY.sub(r"\1?(hidden)", _URL_USERINFO.sub(r"\1(hidden)@", text))


def redacted(text: str, limit: int = 300) -> str:
    """A free-form message (argparse's, an error's, naming what was typed) as a problem line shows
    it: URL credentials and each word that looks like a secret hidden, the rest escaped and cut at
    `limit` characters."""
    words = re.split(r"(\s+)", without_url_credentials(text))
    return escaped("".join(f"(hidden: {kind})" if (kind := secret_kind(w)) else w for w in words), limit)


def key_shown(key: str) -> str:
    """A config key as a problem line names it: escaped, or hidden if a secret was pasted as one."""
    kind = secret_kind(key)
    return f"(key hidden: {kind})" if kind else escaped(key)


def show(raw: Any) -> str:
    """A value as a problem line echoes it: quoted and escaped, or hidden if it looks secret."""
    if isinstance(raw, Mapping) and "secure" in raw:
        return "(value hidden: encrypted with secure:)"
    text = str(raw)
    kind = secret_kind(text)
    return f"(value hidden: {kind})" if kind else f'"{escaped(text)}"'


# --------------------------------------------------------------------------- rules
# A rule takes the parsed value and returns None, or the phrase "what is allowed", or a pair
# (what is wrong, what is allowed).

Rule = Callable[[Any], "str | tuple[str, str] | None"]


def _int_range(lo: int, hi: int) -> Rule:
    return lambda v: None if lo <= v <= hi else f"an integer from {lo} to {hi}"


def _matches(pattern: str, what: str) -> Rule:
    rx = re.compile(pattern)
    return lambda v: None if rx.fullmatch(v) else what


def _optional(rule: Rule) -> Rule:
    return lambda v: None if v == "" else rule(v)


_NUMBER = r"(0|[1-9][0-9]{0,3})"  # ASCII digits only: `\d` and str.isdigit() accept any script's digits


def _release(series: str, tested: str, why: str, *, first_patch: int, leading_v: bool, article: str) -> Rule:
    """A release in the tested series: `series` fixes MAJOR (e.g. "80") or MAJOR.MINOR ("1.34");
    `article`, when set, is the reference article's exact release, accepted too (docs/versions.md)."""
    v = "v" if leading_v else ""
    fixed = tuple(int(p) for p in series.split("."))
    rx = re.compile(re.escape(v) + r"\.".join([_NUMBER] * 3))
    free = ".N" * (3 - len(fixed))
    floor = f", N from {first_patch}" if first_patch else ""
    also = f", or the reference article's {article}" if article else ""
    what = (
        f"a release {v}{series}{free} ({v}MAJOR.MINOR.PATCH in ASCII digits"
        f"{', with its leading v' if leading_v else ''}{floor}){also}: {why}; e.g. {tested}"
    )

    def rule(value: str) -> str | None:
        if article and value == article:
            return None
        m = rx.fullmatch(value)
        if not m:
            return what
        parts = tuple(int(p) for p in m.groups())
        if parts[: len(fixed)] != fixed or parts[2] < first_patch:
            return what
        return None

    return rule


def _ipv4_network(v: str) -> ipaddress.IPv4Network | None:
    """`v` as an IPv4 network with no host bits set, or None. ASCII digits only: ipaddress accepts
    no others today, and this does not depend on it."""
    try:
        if (
            re.fullmatch(r"[0-9]+(\.[0-9]+){3}/[0-9]+", v)
            and (net := ipaddress.ip_network(v, strict=True)).version == 4
        ):
            return ipaddress.IPv4Network(net)
    except ValueError:
        pass
    return None


def _not_canonical(v: str) -> str:
    """Canonical text only: ipaddress reads a prefix length of 028 as 28, but the text reaches the
    security group and the VPC as typed. The phrase to add to what is allowed, or ""."""
    net = _ipv4_network(v)
    return f", written without leading zeros (did you mean {net}?)" if net and str(net) != v else ""


def _ipv4_cidr(v: str) -> str | None:
    """The VPC, the Elastic IP and so SSH and the API server are IPv4 only."""
    if _ipv4_network(v) and not _not_canonical(v):
        return None
    allowed = "an IPv4 network in CIDR form with no host bits set, e.g. 203.0.113.7/32 (the testbed is IPv4 only)"
    return allowed + _not_canonical(v)


def _vpc_cidr(v: str) -> str | tuple[str, str] | None:
    allowed = (
        f"an RFC 1918 IPv4 network from /16 to /{SUBNET_PREFIX} outside the pod network "
        f"{host_layout.POD_CIDR} and the service network {host_layout.SERVICE_CIDR}, e.g. 10.0.0.0/16"
    )
    if _ipv4_cidr(v):
        return allowed + _not_canonical(v)
    net = ipaddress.IPv4Network(v)
    if not any(net.subnet_of(r) for r in RFC1918) or not 16 <= net.prefixlen <= SUBNET_PREFIX:
        return allowed
    for other, what in (
        (host_layout.POD_CIDR, "the pod network (Flannel)"),
        (host_layout.SERVICE_CIDR, "the service network"),
    ):
        if net.overlaps(ipaddress.ip_network(other)):
            return f"overlaps {what} {other}: node and cluster addresses would collide", allowed
    return None


def _region(v: str) -> str | None:
    if v in AWS_REGIONS:
        return None
    close = difflib.get_close_matches(v, AWS_REGIONS, n=1, cutoff=0.8)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"a region of the commercial AWS partition, e.g. us-east-1{hint}"


def _catalogue_type(role: str, problem: Callable[[str], str | None], accepted: Callable[[], list[str]]) -> Rule:
    def rule(v: str) -> str | tuple[str, str] | None:
        listed = f"a {role} type from core/instance_types.py: {', '.join(accepted())}"
        if v not in instance_types.CATALOGUE:
            close = difflib.get_close_matches(v, accepted(), n=1, cutoff=0.8)
            unknown = "is not in the instance catalogue" + (f" (did you mean {close[0]}?)" if close else "")
            return unknown, listed
        wrong = problem(v)
        return (wrong, listed) if wrong else None

    return rule


def _ssh_public_key(v: str) -> str | tuple[str, str] | None:
    """One OpenSSH public key line; RSA keys of 2048 bits or more (NIST SP 800-131A)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    allowed = (
        "one OpenSSH public key line (ssh-ed25519, ecdsa-sha2-nistp256/384/521, or ssh-rsa of 2048 bits or more), "
        f"at most {SSH_KEY_MAX_CHARS} characters"
    )
    if len(v) > SSH_KEY_MAX_CHARS:
        return f"is {len(v)} characters long (every node's user-data carries it, within 16 KiB)", allowed
    m = re.fullmatch(r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(?:256|384|521)) ([A-Za-z0-9+/]+={0,2})( [ -~]*)?", v)
    if not m:
        return allowed + ", e.g. ssh-ed25519 AAAA... me@host"
    try:
        key = serialization.load_ssh_public_key(f"{m[1]} {m[2]}".encode())
    except (ValueError, TypeError):  # cryptography's errors for a damaged or mislabelled key
        return "is not a readable key (damaged base64 or a type that does not match its label)", allowed
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < 2048:
        return f"is an RSA key of {key.key_size} bits", allowed
    return None


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?")


def _nodeset_name(v: str) -> str | tuple[str, str] | None:
    allowed = (
        "a DNS label: lower-case letters, digits and '-', 1-32 characters, starting and ending with a letter "
        f"or digit, and none of {', '.join(RESERVED_NODESET_NAMES)}"
    )
    if not _DNS_LABEL.fullmatch(v):
        return allowed
    if v == RESERVED_NODESET_NAMES[0]:
        return "clashes with the Slurm partition `all` the Slinky chart defines", allowed
    if v in RESERVED_NODESET_NAMES:
        return "is Slurm's keyword for partition defaults (PartitionName=DEFAULT)", allowed
    return None


# --------------------------------------------------------------------------- the declaration
# Each setting is declared once, as a field of `Settings`: its attribute name (the config key is
# its camelCase), its type (how the config string is parsed), and in the field's metadata its
# default, description, what is accepted and its rule. `SETTINGS`, the table `load` reads, is
# derived from the fields; Pulumi.yaml's config block, docs/settings.md's table and the refusal
# table are checked against it (tests/core/test_settings_declaration.py).

_DECLARATION = "setting"


@dataclass(frozen=True)
class _Declared:
    default: Any  # None: the setting is required
    description: str
    accepted: str  # what docs/settings.md's table says is accepted
    rule: Rule | None = None


def _declared(default: Any, description: str, accepted: str, rule: Rule | None = None) -> dict[str, _Declared]:
    """The metadata of a setting's field."""
    return {_DECLARATION: _Declared(default, description, accepted, rule)}


def _version(
    default: str,
    description: str,
    series: str,
    why: str,
    *,
    first_patch: int = 0,
    leading_v: bool = False,
    article: str = "",
) -> dict[str, _Declared]:
    """The metadata of a release setting: accepted within the tested `series`, and the reference
    article's exact release when it lies outside it."""
    v = "v" if leading_v else ""
    free = ".N" * (3 - len(series.split(".")))
    accepted = f"{v}{series}{free}" + (f", N from {first_patch}" if first_patch else "")
    accepted += f", or {article} (the reference article's)" if article else ""
    rule = _release(series, default, why, first_patch=first_patch, leading_v=leading_v, article=article)
    return _declared(default, description, accepted, rule)


@dataclass(frozen=True)
class Settings:
    """A stack's validated settings: one field per setting, in Pulumi.yaml's order."""

    # AWS
    region: str = field(metadata=_declared("us-east-1", "AWS region to build in.", "a commercial AWS region", _region))
    availability_zone: str = field(
        metadata=_declared(
            "",
            "Availability zone for the subnet; empty picks the first zone that offers the worker type.",
            "empty, or a zone name of the region",
        )
    )
    admin_cidr: str = field(
        metadata=_declared(
            None,
            "Who may reach SSH (22) and the API server (6443), e.g. your address as a.b.c.d/32. Required.",
            f"a public IPv4 CIDR, /{ADMIN_MIN_PREFIX} or narrower unless allowOpenIngress",
            _ipv4_cidr,
        )
    )
    allow_open_ingress: bool = field(
        metadata=_declared(
            False, "Opt in to adminCidr 0.0.0.0/0 (SSH and the API server open to the internet).", "true or false"
        )
    )
    vpc_cidr: str = field(
        metadata=_declared(
            "10.0.0.0/16",
            "The testbed VPC's address range; the node subnet is its first /24.",
            f"RFC 1918, /16 to /24, outside {host_layout.POD_CIDR} and {host_layout.SERVICE_CIDR}",
            _vpc_cidr,
        )
    )
    ami_id: str = field(
        metadata=_declared(
            "",
            "Pin an AMI; empty looks up the newest Canonical Ubuntu 24.04 amd64 image at first create.",
            "empty, or ami- and 8 or 17 hex digits",
            _optional(_matches(r"ami-([0-9a-f]{8}|[0-9a-f]{17})", "an AMI id, e.g. ami-0123456789abcdef0")),
        )
    )
    control_instance_type: str = field(
        metadata=_declared(
            "t3.medium",
            "Control-plane instance type (2 vCPU, 4 GiB at least).",
            "an x86_64 type of the catalogue with 2 vCPU and 4 GiB or more",
            _catalogue_type("control-plane", instance_types.control_problem, instance_types.accepted_controls),
        )
    )
    worker_instance_type: str = field(
        metadata=_declared(
            "g4dn.xlarge",
            "GPU worker instance type (one NVIDIA GPU each).",
            "a catalogue type with exactly one NVIDIA GPU, Turing or later",
            _catalogue_type("GPU worker", instance_types.worker_problem, instance_types.accepted_workers),
        )
    )
    worker_count: int = field(
        metadata=_declared(
            4,
            "Number of GPU workers (and the most slurmd pods KEDA may run).",
            f"1 to {2 ** (32 - SUBNET_PREFIX) - 1 - FIRST_WORKER_HOST_INDEX}",
        )
    )
    spot_workers: bool = field(
        metadata=_declared(
            False,
            "Request the GPU workers as one-time spot instances; an interrupted worker is terminated "
            "and the next `pulumi up` replaces it.",
            "true or false",
        )
    )
    control_root_volume_gb: int = field(
        metadata=_declared(
            40,
            "Control node root volume (gp3, encrypted), GiB.",
            f"{MIN_CONTROL_ROOT_GB} to 16384",
            _int_range(MIN_CONTROL_ROOT_GB, 16384),
        )
    )
    worker_root_volume_gb: int = field(
        metadata=_declared(
            100,
            "GPU worker root volume (gp3, encrypted), GiB.",
            f"{MIN_WORKER_ROOT_GB} to 16384",
            _int_range(MIN_WORKER_ROOT_GB, 16384),
        )
    )
    ssh_public_key: str = field(
        metadata=_declared(
            "",
            "OpenSSH public key for user ubuntu; empty generates a key pair (output sshPrivateKey).",
            "empty, or one ed25519, ECDSA or RSA (2048 bits or more) public key line",
            _optional(_ssh_public_key),
        )
    )
    control_plane_generation: int = field(
        metadata=_declared(
            1,
            "Raise it by one to rebuild the control node on purpose (a new, empty cluster; every release is "
            "installed again); a change that would replace the control node is refused without it.",
            "1 to 1000",
            _int_range(1, 1000),
        )
    )
    # Kubernetes and node software
    kubernetes_version: str = field(
        metadata=_version(
            "1.34.7",
            "kubelet/kubeadm/kubectl release (apt packages held).",
            "1.34",
            "the tested minor: the kubeadm v1beta4 config, the charts and the offline schemas are pinned for it",
        )
    )
    flannel_version: str = field(
        metadata=_version(
            "v0.27.4", "Flannel CNI release applied by kubeadm init.", "0.27", "the tested minor", leading_v=True
        )
    )
    nvidia_driver_branch: str = field(
        metadata=_declared(
            "580",
            "NVIDIA server driver branch on the GPU workers.",
            "580",
            _matches("580", "the tested branch 580 (its -server-open packages on Ubuntu 24.04)"),
        )
    )
    nvidia_container_toolkit_version: str = field(
        metadata=_version(
            "1.18.1",
            "nvidia-container-toolkit release.",
            "1.18",
            "1.18.0 wrote its containerd drop-in to the wrong directory",
            first_patch=1,
        )
    )
    # Platform
    device_plugin_version: str = field(
        metadata=_version("0.17.4", "NVIDIA device plugin Helm chart version.", "0.17", "the tested chart minor")
    )
    gpu_feature_discovery: bool = field(
        metadata=_declared(
            False, "Also deploy GPU feature discovery (with NFD) from the device plugin chart.", "true or false"
        )
    )
    cert_manager_version: str = field(
        metadata=_version(
            "v1.19.6",
            "cert-manager Helm chart version (keeps its leading v).",
            "1.19",
            "the tested chart minor",
            leading_v=True,
        )
    )
    slinky_version: str = field(
        metadata=_version(
            "1.0.5",
            "Slinky slurm-operator, CRD and slurm chart version.",
            "1.0",
            "the chart values and CRDs the program writes are those of 1.0 (1.1 no longer deletes a scaled-in "
            "node, drops the `all` partition and runs 26.05 images)",
        )
    )
    slurm_image_tag: str = field(
        metadata=_declared(
            "25.11.6-ubuntu24.04",
            "Tag of the Slinky slurmctld/slurmd/slurmrestd images.",
            "25.11.N-ubuntu24.04",
            _matches(
                r"25\.11\.(0|[1-9][0-9]{0,3})-ubuntu24\.04",
                "a Slinky image tag 25.11.N-ubuntu24.04 (the Slurm release Slinky 1.0 runs, on the tested image), "
                "e.g. 25.11.6-ubuntu24.04",
            ),
        )
    )
    nodeset_name: str = field(
        metadata=_declared(
            "slinky",
            "Name of the GPU NodeSet (and its Slurm partition).",
            "a DNS label of 1-32 characters, not all or default",
            _nodeset_name,
        )
    )
    kube_prometheus_stack_version: str = field(
        metadata=_version(
            "80.14.4",
            "kube-prometheus-stack Helm chart version.",
            "80",
            "the tested chart major (a new major changes CRDs and values)",
        )
    )
    dcgm_exporter_version: str = field(
        metadata=_version("4.7.1", "NVIDIA dcgm-exporter Helm chart version.", "4.7", "the tested chart minor")
    )
    keda_version: str = field(
        metadata=_version(
            "2.20.2",
            "KEDA Helm chart version.",
            "2.20",
            "the tested chart minor, smoke-tested upstream on Kubernetes 1.34",
            article="2.16.1",
        )
    )
    keda_min_replicas: int = field(
        metadata=_declared(
            1, "slurmd replicas while Slurm has work (KEDA minReplicaCount).", "1 to the most slurmd replicas"
        )
    )
    keda_max_replicas: int = field(
        metadata=_declared(
            0,
            "Most slurmd replicas (KEDA maxReplicaCount); 0 means every GPU slurmd may hold (workerCount, or HPC's share).",
            "0 to workerCount (to HPC's share when hpcBorrowsAiGpus is false)",
        )
    )
    keda_cooldown_seconds: int = field(
        metadata=_declared(
            300,
            "Idle seconds slurmd stays warm while no Kubernetes GPU work waits (the demand-aware query's window).",
            "1 to 86400",
            _int_range(1, 86400),
        )
    )
    keda_polling_seconds: int = field(
        metadata=_declared(
            30, "How often KEDA reads the Slurm metrics (pollingInterval).", "1 to 3600", _int_range(1, 3600)
        )
    )
    slurm_metrics_interval_seconds: int = field(
        metadata=_declared(
            30,
            "How often Prometheus scrapes slurmctld's metrics (the ServiceMonitor's interval; the triggers' subquery step).",
            "5 to 300",
            _int_range(5, 300),
        )
    )
    training_operator_version: str = field(
        metadata=_version(
            "v1.9.4",
            "Kubeflow Training Operator release (standalone overlay).",
            "1.9",
            "the tested minor, the v1 line Kueue 0.19 builds its PyTorchJob integration against",
            leading_v=True,
            article="v1.8.1",
        )
    )
    kueue_version: str = field(
        metadata=_version(
            "0.19.2",
            "Kueue Helm chart version (oci://registry.k8s.io/kueue/charts/kueue), the admission point for Kubernetes GPU work.",
            "0.19",
            "the tested minor: the v1beta2 queues and the manager configuration the program writes are those of 0.19; "
            "0.19.0 lacks the fix of a permanently inflated pending-GPU metric the scaler reads "
            "(kubernetes-sigs/kueue #13756, in 0.19.1)",
            first_patch=1,
        )
    )
    controller_image: str = field(
        metadata=_declared(
            CONTROLLER_IMAGE,
            "Image of the testbed's own in-cluster programs, the fair-share controller and the runnable-jobs "
            "exporter, by tag and digest (a stock Python that runs the repository's components/fair_share*.py and "
            "runnable_jobs.py, standard library only).",
            "python:3.12.N-slim-bookworm@sha256:<64 hex digits>",
            _matches(
                r"python:3\.12\.(0|[1-9][0-9]{0,3})-slim-bookworm@sha256:[0-9a-f]{64}",
                "a Docker Official python image of 3.12 by tag and digest, python:3.12.N-slim-bookworm@sha256:<64 hex "
                f"digits>, e.g. {CONTROLLER_IMAGE}",
            ),
        )
    )
    # GPU fairness between HPC (slurmd pods) and AI (queued jobs), both admitted by Kueue: components/kueue.py
    ai_guaranteed_gpus: int = field(
        metadata=_declared(
            -1,
            "AI's share of the GPUs (Kueue nominalQuota of queue ai); HPC's is the rest. -1: half, rounded down.",
            "-1 (half of workerCount, rounded down) or 0 to workerCount - 1",
        )
    )
    ai_borrows_hpc_gpus: bool = field(
        metadata=_declared(
            True,
            "Kueue may admit AI work onto HPC's idle share (false keeps that share for slurmd alone).",
            "true or false",
        )
    )
    hpc_borrows_ai_gpus: bool = field(
        metadata=_declared(
            True,
            "slurmd pods may take AI's idle share, so a Slurm job may span every worker; AI takes it back by "
            "draining (false caps slurmd at HPC's share).",
            "true or false",
        )
    )
    # The lend-and-reclaim bounds (docs/handoff.md): a borrowed GPU comes back when the job on it
    # ends, and these cap how long that can take.
    slurm_job_max_minutes: int = field(
        metadata=_declared(
            60,
            "Longest a Slurm job may run (the partitions' MaxTime; sbatch --time above it is refused). Bounds how "
            "long AI waits for a GPU slurmd borrowed.",
            "1 to 10080 (a week)",
            _int_range(1, 10080),
        )
    )
    ai_job_max_minutes: int = field(
        metadata=_declared(
            60,
            "Longest a queued AI job may run (its kueue.x-k8s.io/max-exec-time-seconds label, required and checked "
            "at submit). Bounds how long HPC waits for a GPU AI borrowed.",
            "1 to 10080 (a week)",
            _int_range(1, 10080),
        )
    )
    ai_preempts_lower_priority: bool = field(
        metadata=_declared(
            False,
            "A waiting ai-high job may evict running ai-normal jobs (never a slurmd pod); false: Kueue never evicts running AI work.",
            "true or false",
        )
    )
    # The operator's, HPC and AI users' kubeconfigs (components/cluster_identity.py, user_roles.py,
    # docs/security-and-day2.md)
    role_credential_hours: int = field(
        metadata=_declared(
            8,
            "Hours the kubeconfig (the operator's cluster-admin), hpcKubeconfig and aiKubeconfig client "
            "certificates are valid; `pulumi up` issues new ones once half of that has passed.",
            "1 to 168 (a week)",
            _int_range(1, 168),
        )
    )
    # Evidence and cost guard: components/managed_prometheus.py, components/budget.py, docs/evidence-and-budget.md
    managed_prometheus: bool = field(
        metadata=_declared(
            True,
            "Create an Amazon Managed Service for Prometheus workspace and remote-write the evidence series to it "
            "(SigV4, the control node's instance role); false keeps the metrics in the cluster only.",
            "true or false",
        )
    )
    managed_prometheus_keep: bool = field(
        metadata=_declared(
            True,
            "Keep the workspace and its samples after `pulumi destroy` (stored samples cost until you delete it); "
            "false deletes it with the stack.",
            "true or false",
        )
    )
    budget_monthly_usd: int = field(
        metadata=_declared(
            0,
            "An AWS Budget for the account's monthly cost, in USD, that emails budgetEmail when the forecast "
            "or the actual cost passes it; 0: no budget.",
            f"0, or 1 to {MAX_BUDGET_USD}",
            _int_range(0, MAX_BUDGET_USD),
        )
    )
    budget_email: str = field(
        metadata=_declared(
            "",
            "Who the budget alarm emails; required with budgetMonthlyUsd.",
            "empty, or one e-mail address (with budgetMonthlyUsd above 0)",
            _optional(_matches(EMAIL, "one e-mail address, e.g. you@example.com")),
        )
    )
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
    def gpu_shares(self) -> GpuShares:
        return GpuShares.split(
            self.worker_count,
            self.ai_guaranteed_gpus,
            self.ai_borrows_hpc_gpus,
            self.ai_preempts_lower_priority,
            self.hpc_borrows_ai_gpus,
        )

    @property
    def ai_gpus(self) -> int:
        """AI's share of the GPUs (-1: half of them, rounded down)."""
        return self.gpu_shares.ai_guaranteed_gpus

    @property
    def slurmd_max_replicas(self) -> int:
        """slurmd holds one GPU per pod: every GPU if it may borrow AI's idle share, else HPC's share."""
        return self.keda_max_replicas or self.gpu_shares.hpc_max_gpus


@dataclass(frozen=True)
class GpuShares:
    """How the workers' GPUs are split between HPC (slurmd pods) and AI (queued jobs). Both are
    Kueue workloads in one cohort: each side's nominalQuota is its share, and each lends its idle
    share to the other only if the policy says so (lendingLimit 0 otherwise)."""

    gpus_total: int
    ai_guaranteed_gpus: int
    ai_borrows_hpc_gpus: bool
    ai_preempts_lower_priority: bool
    hpc_borrows_ai_gpus: bool = True

    @classmethod
    def split(
        cls, workers: int, ai_guaranteed_gpus: int, ai_borrows: bool, ai_preempts: bool, hpc_borrows: bool
    ) -> GpuShares:
        """The split of `workers` workers' GPUs; an aiGuaranteedGpus of -1 is half of them, rounded down."""
        total = workers * instance_types.GPUS_PER_WORKER
        ai = total // 2 if ai_guaranteed_gpus == -1 else ai_guaranteed_gpus
        return cls(total, ai, ai_borrows, ai_preempts, hpc_borrows)

    @property
    def hpc_gpus(self) -> int:
        """HPC's share: everything AI's is not."""
        return self.gpus_total - self.ai_guaranteed_gpus

    @property
    def ai_max_gpus(self) -> int:
        """The most GPUs Kueue admits AI work onto at once."""
        return self.gpus_total if self.ai_borrows_hpc_gpus else self.ai_guaranteed_gpus

    @property
    def hpc_max_gpus(self) -> int:
        """The most slurmd pods Kueue admits at once."""
        return self.gpus_total if self.hpc_borrows_ai_gpus else self.hpc_gpus


@dataclass(frozen=True)
class Setting:
    """One row of the table `load` reads, derived from a field of `Settings`."""

    attribute: str  # the field of Settings
    kind: type  # str, int or bool: how the config string is parsed
    default: Any  # None: the setting is required
    description: str
    accepted: str
    rule: Rule | None = None

    @property
    def key(self) -> str:
        """The config key: the attribute in camelCase (`worker_count` is `workerCount`)."""
        head, *rest = self.attribute.split("_")
        return head + "".join(word.capitalize() for word in rest)


def _table() -> tuple[Setting, ...]:
    kinds = get_type_hints(Settings)
    return tuple(
        Setting(f.name, kinds[f.name], d.default, d.description, d.accepted, d.rule)
        for f in fields(Settings)
        if (d := f.metadata.get(_DECLARATION))
    )


SETTINGS: tuple[Setting, ...] = _table()
SETTINGS_BY_KEY = {s.key: s for s in SETTINGS}


def max_workers_for_subnet() -> int:
    """Workers take consecutive addresses from FIRST_WORKER_HOST_INDEX; AWS keeps the last one."""
    return 2 ** (32 - SUBNET_PREFIX) - 1 - FIRST_WORKER_HOST_INDEX


def _parse(setting: Setting, raw: Any) -> tuple[Any, str | None]:
    """Config values arrive as strings (Pulumi passes every scalar as its text)."""
    if not isinstance(raw, str):
        return None, "a plain value (not encrypted, not a list or mapping)"
    text = raw.strip()
    if setting.kind is bool:
        if text.lower() in ("true", "false"):
            return text.lower() == "true", None
        return None, "true or false"
    if setting.kind is int:
        m = re.fullmatch(r"(-?)([0-9]+)", text)
        if not m:
            return None, "a whole number in ASCII digits"
        canonical = (m[1] + m[2].lstrip("0")) if m[2].lstrip("0") else "0"
        if canonical != text:  # 010 is ten here and eight to YAML 1.1 and C: one spelling only
            return None, f"a whole number in ASCII digits without leading zeros or -0 (did you mean {canonical[:20]}?)"
        if len(m[2]) > MAX_INT_DIGITS:  # out of every range, whatever its sign: let the range say so
            return 10**MAX_INT_DIGITS, None
        return int(text), None
    return text, None


def _refusal(key: str, raw: Any, allowed: str | tuple[str, str]) -> str:
    what, expected = allowed if isinstance(allowed, tuple) else ("is not allowed", allowed)
    return f"{key}: {show(raw)} {what}; expected {expected}"


def _foreign_key(key: str, raw: Any) -> str | None:
    """A key outside the project's namespace that the user probably meant for the program."""
    namespace, sep, name = key.partition(":")
    shown_key = key_shown(key)
    if not key.strip():
        return f"(an empty key{', ' + show(key) if key else ''}) with the value {show(raw)}: not read; expected {PROJECT}:SETTING"
    if not sep:
        # gpu-testbed.workerCount, gpu_testbed/workerCount: the project and a setting, joined wrongly
        joined = re.fullmatch(r"(.+?)[./ _-]?([A-Za-z0-9]+)", key)
        setting = {k.lower(): k for k in SETTINGS_BY_KEY}.get(joined[2].lower()) if joined else None
        if (
            setting
            and joined
            and joined[1]
            and difflib.SequenceMatcher(None, joined[1].lower(), PROJECT).ratio() >= 0.8
        ):
            return f"{shown_key}: not read: a key's namespace ends at a colon; did you mean {PROJECT}:{setting}?"
        return f"{shown_key}: a key without a namespace is not read; write {PROJECT}:{shown_key}"
    if namespace in EXPLICIT_PROVIDER_NAMESPACES:
        if key == "aws:region":
            return (
                f"aws:region: {show(raw)} is not read: {EXPLICIT_PROVIDER_NAMESPACES['aws']}; "
                f"expected the setting region instead, e.g. pulumi config set region {show(raw)}"
            )
        return f"{shown_key}: not read: {EXPLICIT_PROVIDER_NAMESPACES[namespace]}"
    # case and punctuation typos too: gpu_testbed, GPU-testbed, gputestbed are all near; and any
    # namespace at all before a setting's own name (testbed:workerCount, gpu:workerCount)
    setting = {k.lower(): k for k in SETTINGS_BY_KEY}.get(name.lower())
    if setting is None and difflib.SequenceMatcher(None, namespace.lower(), PROJECT).ratio() < 0.8:
        return None  # another tool's configuration
    close = [setting] if setting else difflib.get_close_matches(name, list(SETTINGS_BY_KEY), n=1, cutoff=0.6)
    suggestion = f"; did you mean {PROJECT}:{close[0]}?" if close else ""
    return f"{shown_key}: not read: the project is {PROJECT}, so its keys start with {PROJECT}:{suggestion}"


def load(config: Mapping[str, Any], stack: str = "dev", offline: bool = False) -> Settings:
    """Build Settings from namespaced config (`gpu-testbed:key` -> value), or raise
    SettingsError listing every problem. `offline` (plan, render, tests) accepts the example
    adminCidr from a documentation range; a deployment does not."""
    problems: list[str] = []
    prefix = PROJECT + ":"
    given = {k[len(prefix) :]: v for k, v in config.items() if k.startswith(prefix)}

    meant: set[str] = set()  # settings a key outside the namespace names: not "missing" too
    for key in sorted(k for k in config if not k.startswith(prefix)):
        problem = _foreign_key(key, config[key])
        if problem:
            problems.append(problem)
            if problem.endswith(tuple(f"{PROJECT}:{k}?" for k in SETTINGS_BY_KEY)):
                meant.add(problem.rsplit(":", 1)[1].rstrip("?"))
    for key in sorted(set(given) - set(SETTINGS_BY_KEY)):
        close = difflib.get_close_matches(key, list(SETTINGS_BY_KEY), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        problems.append(f"{key_shown(key)}: {show(given[key])} is not a setting of {PROJECT}{hint}")

    values: dict[str, Any] = {}
    for s in SETTINGS:
        if s.key not in given:
            if s.default is None and s.key not in meant:
                problems.append(f"{s.key}: missing; required: {s.description}")
            values[s.attribute] = s.default
            continue
        value, parse_problem = _parse(s, given[s.key])
        allowed = parse_problem or (s.rule(value) if s.rule else None)
        if not allowed and isinstance(given[s.key], str) and secret_kind(given[s.key]):
            allowed = f"no secret in any setting: {s.accepted}"  # it would land in user-data and state
        if allowed:
            problems.append(_refusal(s.key, given[s.key], allowed))
        values[s.attribute] = value

    problems += _cross_checks(values, given, problems, offline)
    if problems:
        raise SettingsError(problems)
    return Settings(**values, stack=stack)


def _cross_checks(v: dict[str, Any], given: Mapping[str, Any], earlier: list[str], offline: bool) -> list[str]:
    """Rules between settings; a setting already reported is not reported again. Values are
    echoed as given (a number too long to parse stands in as one out of every range)."""
    out: list[str] = []

    def raw(key: str) -> str:
        return show(given.get(key, v[SETTINGS_BY_KEY[key].attribute]))

    def ok(*keys: str) -> bool:
        bad = {p.split(":", 1)[0] for p in earlier + out}
        return not bad.intersection(keys)

    cap = max_workers_for_subnet()
    if ok("workerCount") and not 1 <= v["worker_count"] <= cap:
        out.append(
            f"workerCount: {raw('workerCount')} is not allowed; expected an integer from 1 to {cap} "
            f"(the /{SUBNET_PREFIX} node subnet's capacity)"
        )
    if ok("adminCidr", "allowOpenIngress") and v["admin_cidr"] is not None:
        out += _admin_cidr_checks(v["admin_cidr"], raw("adminCidr"), v["allow_open_ingress"], offline)
    if ok("availabilityZone", "region") and v["availability_zone"]:
        zone, region = v["availability_zone"], v["region"]
        letters = REGION_ZONE_LETTERS.get(region, OTHER_REGION_ZONE_LETTERS)
        if not re.fullmatch(re.escape(region) + f"[{letters}]", zone):
            listed = (
                ", ".join(region + letter for letter in letters)
                if region in REGION_ZONE_LETTERS
                else f"{region} and one letter (which exist is not known offline: `python -m cli preflight` checks it)"
            )
            out.append(
                f"availabilityZone: {raw('availabilityZone')} is not allowed; expected a zone of region {region}: "
                f"{listed}, or empty to pick one that offers the worker type"
            )
    if ok("aiGuaranteedGpus", "workerCount") and not -1 <= v["ai_guaranteed_gpus"] < v["worker_count"]:
        out.append(
            f"aiGuaranteedGpus: {raw('aiGuaranteedGpus')} is not allowed; expected -1 (half) or an integer from 0 to "
            f"workerCount - 1 ({v['worker_count'] - 1}): one GPU per worker, and HPC's share needs at least one"
        )
    shares = (
        GpuShares.split(
            v["worker_count"],
            v["ai_guaranteed_gpus"],
            v["ai_borrows_hpc_gpus"],
            v["ai_preempts_lower_priority"],
            v["hpc_borrows_ai_gpus"],
        )
        if ok("aiGuaranteedGpus", "workerCount")
        else None
    )
    if shares and ok("aiBorrowsHpcGpus") and shares.ai_guaranteed_gpus == 0 and not v["ai_borrows_hpc_gpus"]:
        out.append(
            f"aiBorrowsHpcGpus: {raw('aiBorrowsHpcGpus')} is not allowed with an AI share of 0 GPUs: Kueue would "
            "admit no Kubernetes GPU work at all; expected true, or aiGuaranteedGpus of 1 or more"
        )
    if shares and ok("kedaMinReplicas", "kedaMaxReplicas", "hpcBorrowsAiGpus"):
        hpc_max = shares.hpc_max_gpus
        max_replicas = v["keda_max_replicas"] or hpc_max
        if not 0 <= v["keda_max_replicas"] <= hpc_max:
            out.append(
                f"kedaMaxReplicas: {raw('kedaMaxReplicas')} is not allowed; expected 0 (= the GPUs slurmd may hold) "
                f"or an integer from 1 to {hpc_max} (workerCount, or HPC's share when hpcBorrowsAiGpus is false): "
                "each slurmd pod holds one worker's GPU"
            )
        elif not 1 <= v["keda_min_replicas"] <= max_replicas:
            out.append(
                f"kedaMinReplicas: {raw('kedaMinReplicas')} is not allowed; expected an integer from 1 to "
                f"maxReplicaCount ({max_replicas}); KEDA scales to 0 through idleReplicaCount, which must be below it"
            )
    if ok("kedaCooldownSeconds", "kedaPollingSeconds", "slurmMetricsIntervalSeconds"):
        cooldown, polling = v["keda_cooldown_seconds"], v["keda_polling_seconds"]
        out += _warmth_checks(cooldown, polling, v["slurm_metrics_interval_seconds"], raw)
    if ok("budgetMonthlyUsd", "budgetEmail") and bool(v["budget_monthly_usd"]) != bool(v["budget_email"]):
        if v["budget_monthly_usd"]:
            out.append(
                f"budgetEmail: missing with budgetMonthlyUsd {raw('budgetMonthlyUsd')}; expected the e-mail address "
                "the budget alarm goes to"
            )
        else:
            out.append(
                f"budgetEmail: {raw('budgetEmail')} is not allowed without a budget; expected budgetMonthlyUsd "
                "above 0 too, or budgetEmail empty"
            )
    return out


def _warmth_checks(cooldown: int, polling: int, step: int, raw: Callable[[str], str]) -> list[str]:
    """kedaCooldownSeconds is the window of the demand-aware query's subquery
    (components/slurmd_scaling.py, `max_over_time(...[<cooldown + step>s:<step>s])`, the step being
    slurmMetricsIntervalSeconds): shorter than one step, no warmth shorter than a scrape is seen;
    shorter than KEDA's pollingInterval, KEDA may not read the query inside the window at all."""
    floor = max(step, polling)
    if cooldown >= floor:
        return []
    return [
        f"kedaCooldownSeconds: {raw('kedaCooldownSeconds')} is shorter than "
        + (
            f"the {step} s scrape interval the query steps by (slurmMetricsIntervalSeconds): it sees nothing shorter"
            if cooldown < step
            else f"kedaPollingSeconds ({polling}): KEDA would not read the query within the window"
        )
        + f", so slurmd would not be kept warm; expected at least {floor} (the scrape interval {step} s and "
        f"kedaPollingSeconds {polling}), or a shorter kedaPollingSeconds or slurmMetricsIntervalSeconds"
    ]


def _admin_cidr_checks(cidr: str, shown: str, allow_open_ingress: bool, offline: bool) -> list[str]:
    """allowOpenIngress widens what is allowed (wider than /16, up to 0.0.0.0/0); it never skips
    the test that the range is one the internet connects from."""
    network = ipaddress.IPv4Network(cidr)  # adminCidr's own rule accepts IPv4 only
    if any(network.subnet_of(d) for d in DOCUMENTATION_NETWORKS):
        if offline:
            return []
        return [
            f"adminCidr: {shown} is a documentation example address nobody connects from; expected your "
            'own, e.g. pulumi config set adminCidr "$(curl -s https://checkip.amazonaws.com)/32"'
        ]
    if any(network.subnet_of(n) for n in NOT_INTERNET_NETWORKS):
        return [
            f"adminCidr: {shown} is not an internet address range (private, shared, loopback, multicast or reserved), "
            "and SSH and the API server are reached at the control node's public address; expected the "
            "address you connect from, e.g. the output of curl -s https://checkip.amazonaws.com, as a.b.c.d/32"
            + (" (allowOpenIngress widens the range allowed, not the kind)" if allow_open_ingress else "")
        ]
    if network.prefixlen < ADMIN_MIN_PREFIX and not allow_open_ingress:
        return [
            f"adminCidr: {shown} opens SSH and the API server to {network.num_addresses:,} addresses "
            f"(wider than /{ADMIN_MIN_PREFIX}); expected your own address range, or set allowOpenIngress true "
            "to accept that"
        ]
    return []

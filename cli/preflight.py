"""`python -m cli preflight`: can this AWS account build this stack? Read-only calls only.

What the stack needs (instances by type and market, Elastic IPs, VPCs, the key pair, the AMI
lookup) is read from the real program run under mocks, so preflight and `pulumi up` cannot
disagree. Exit status: 0 ready, 1 a blocking problem, 2 bad settings, no credentials or no
connection to AWS.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cli import as_typed, checklist, typed_command
from cli.checklist import FAIL, OK, UNKNOWN, WARN, Check
from core.names import AMP_WORKSPACE_TYPE_TOKEN, IAM_ROLE_TYPE_TOKEN, INSTANCE_TYPE_TOKEN
from core.settings import PROJECT, Settings, SettingsError, redacted
from stacks import offline
from stacks.infrastructure import ZoneError, choose_zone

EXIT_BAD_INPUT = checklist.EXIT_BAD_INPUT

GET_AMI = "aws:ec2/getAmi:getAmi"
# The administrator's writer boundary as the repository ships it (docs/security-and-day2.md)
WRITER_BOUNDARY_FILE = Path(__file__).resolve().parents[1] / "iam" / "writer-boundary.json"


@dataclass(frozen=True)
class Quota:
    service: str
    code: str
    name: str


# Quota codes: VPCs per Region as getmoto/moto@5.2.5:moto/servicequotas/resources/default_quotas/vpc.py
# ships it; EC2-VPC Elastic IPs as named in the AWS managed policies moto ships
# (moto/iam/aws_managed_policies.py); the vCPU quotas by name from the EC2 User Guide's
# "On-Demand Instance quotas" and "Spot Instance quotas", their codes as public tooling and
# Service Quotas listings give them. A wrong code reads as "unknown", never as a pass.
ON_DEMAND_VCPUS = {
    "G and VT": Quota("ec2", "L-DB2E81BA", "Running On-Demand G and VT instances"),
    "P": Quota("ec2", "L-417A185B", "Running On-Demand P instances"),
    "Standard": Quota("ec2", "L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
}
SPOT_VCPUS = {  # spot workers only: settings accept only G and P families for them
    "G and VT": Quota("ec2", "L-3819A6DF", "All G and VT Spot Instance Requests"),
    "P": Quota("ec2", "L-7212CCBC", "All P Spot Instance Requests"),
}
ELASTIC_IPS = Quota("ec2", "L-0263D0A3", "EC2-VPC Elastic IPs")
VPCS = Quota("vpc", "L-F678F1CE", "VPCs per Region")

# Which vCPU quota an instance family counts against (AWS EC2 User Guide, "On-Demand Instance quotas").
_BUCKETS = (("G and VT", r"(g|gr|vt)\d"), ("P", r"p\d"), ("Standard", r"[acdhimrtz]\d"))
# Instances in these states hold vCPUs against the quotas.
_RUNNING_STATES = ["pending", "running"]


def bucket(instance_type: str) -> str | None:
    family = instance_type.split(".", 1)[0]
    return next((name for name, rx in _BUCKETS if re.fullmatch(rx + r"[a-z0-9-]*", family)), None)


@dataclass(frozen=True)
class Needs:
    """What `pulumi up` will create, read from the recorded program."""

    instances: tuple[tuple[str, bool], ...]  # (instance type, spot) per node
    elastic_ips: int
    vpcs: int
    key_pairs: tuple[str, ...]  # Pulumi names; the physical name adds a random suffix
    ami_lookup: dict[str, Any] | None  # the program's getAmi arguments; None when amiId is pinned
    stack: str = field(default="dev")
    workspaces: tuple[str, ...] = ()  # the AMP workspaces' aliases (managedPrometheus); none when false
    boundaries: tuple[str, ...] = ()  # the policy names the program's roles take as boundary; none when false


def needs(rec: offline.Recording) -> Needs:
    return Needs(
        instances=tuple(
            (r.inputs["instanceType"], (r.inputs.get("instanceMarketOptions") or {}).get("marketType") == "spot")
            for r in rec.of_type(INSTANCE_TYPE_TOKEN)
        ),
        elastic_ips=len(rec.of_type("aws:ec2/eip:Eip")),
        vpcs=len(rec.of_type("aws:ec2/vpc:Vpc")),
        key_pairs=tuple(r.name for r in rec.of_type("aws:ec2/keyPair:KeyPair")),
        ami_lookup=None if rec.settings.ami_id else rec.invoke_args.get(GET_AMI),
        stack=rec.settings.stack,
        workspaces=tuple(r.inputs["alias"] for r in rec.of_type(AMP_WORKSPACE_TYPE_TOKEN)),
        boundaries=tuple(
            r.inputs["permissionsBoundary"].rpartition(":policy/")[2] for r in rec.of_type(IAM_ROLE_TYPE_TOKEN)
        ),
    )


# ---------------------------------------------------------------------- AWS calls


class Unreachable(Exception):
    """No credentials, rejected credentials, a configuration botocore cannot use, or no connection:
    one line, exit 2 (URL credentials and secret-looking words hidden)."""

    def __init__(self, line: str):
        super().__init__(redacted(line))


# Every AWS call waits at most CONNECT_SECONDS to connect and READ_SECONDS for the answer, and is
# made at most ATTEMPTS times, whatever AWS_MAX_ATTEMPTS or the config file say (botocore 1.44:
# an explicit Config wins over both; its defaults are 60 s each and 3 to 5 attempts). botocore's
# standard retry mode waits rand(0, 1) x 2^(attempt - 1) s between attempts
# (botocore/retries/standard.py ExponentialBackoff): under 1 s for the one retry.
CONNECT_SECONDS = 5
READ_SECONDS = 15
ATTEMPTS = 2


def call_bound() -> float:
    """The longest one AWS call waits on an endpoint that never answers."""
    return ATTEMPTS * (CONNECT_SECONDS + READ_SECONDS) + (ATTEMPTS - 1) * 1


def client_config() -> Any:
    from botocore.config import Config

    return Config(
        connect_timeout=CONNECT_SECONDS,
        read_timeout=READ_SECONDS,
        # total_max_attempts counts the first try; botocore reads max_attempts as retries after it
        retries={"total_max_attempts": ATTEMPTS, "mode": "standard"},
    )


LONGEST_WAIT = (
    f"Longest wait: {call_bound():g} s per AWS call (connect {CONNECT_SECONDS} s + read {READ_SECONDS} s, "
    f"{ATTEMPTS} attempts, under 1 s between); an endpoint that does not answer ends preflight at its "
    "first call, exit 2."
)


def aws_session() -> Any:
    """boto3's session as the environment configures it, or Unreachable naming what is wrong."""
    import boto3
    from botocore.exceptions import BotoCoreError

    try:
        return boto3.Session()
    except BotoCoreError as error:  # a profile that does not exist, a config file it cannot parse
        raise Unreachable(f"aws configuration: {error}") from None


def _error_code(error: Exception) -> str:
    return getattr(error, "response", {}).get("Error", {}).get("Code", type(error).__name__)


def _denied(error: Exception) -> bool:
    return _error_code(error) in ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException")


def _pages(client: Any, operation: str, key: str, **kwargs: Any) -> list[dict]:
    return [item for page in client.get_paginator(operation).paginate(**kwargs) for item in page[key]]


def _quota_value(quotas: Any, q: Quota) -> float | None:
    """The applied quota; None when it cannot be read (moto, a denied call, a new quota code)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return float(quotas.get_service_quota(ServiceCode=q.service, QuotaCode=q.code)["Quota"]["Value"])
    except (ClientError, BotoCoreError, KeyError, ValueError):
        return None


def _request(q: Quota, value: float, region: str) -> str:
    return (
        f"aws service-quotas request-service-quota-increase --service-code {q.service} "
        f"--quota-code {q.code} --desired-value {math.ceil(value)} --region {region}"
    )


def _headroom(name: str, q: Quota, need: float, used: float, value: float | None, region: str) -> Check:
    unit = "vCPUs" if "instances" in q.name or "Requests" in q.name else ""
    what = f"{q.name} ({q.code}): need {need:g}{' ' + unit if unit else ''}, in use {used:g}"
    if value is None:
        return Check(name, UNKNOWN, f"{what}, quota unreadable; check it in the Service Quotas console")
    if used + need <= value:
        return Check(name, OK, f"{what}, quota {value:g}")
    return Check(
        name, FAIL, f"{what}, quota {value:g}: short by {used + need - value:g}", _request(q, used + need, region)
    )


class Preflight:
    """The checks, in order; each AWS error becomes a line, never a traceback."""

    def __init__(self, s: Settings, need: Needs, session: Any):
        self.s, self.need, self.session = s, need, session
        self.checks: list[Check] = []
        self._clients: dict[str, Any] = {}
        self.ec2 = self._client("ec2")
        self.account = ""  # the caller's, from the identity check

    def _client(self, service: str) -> Any:
        """A client with the bounded waits, made once per service (making one loads its model),
        or Unreachable for a configuration botocore refuses (a key id without its secret, an
        endpoint URL that is not a URL, an unknown profile)."""
        from botocore.exceptions import BotoCoreError

        if service not in self._clients:
            try:
                self._clients[service] = self.session.client(service, region_name=self.s.region, config=client_config())
            except (BotoCoreError, ValueError) as error:
                raise Unreachable(f"aws configuration: {error}") from None
        return self._clients[service]

    def run(self) -> list[Check]:
        self._identity()
        steps = (self._region, self._zone, self._ami, self._vcpus, self._addresses, self._vpcs, self._key_pair)
        for step in (*steps, self._managed_prometheus, self._writer_boundary):
            self._guarded(step)
        return self.checks

    def _guarded(self, step: Callable[[], None]) -> None:
        from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

        try:
            step()
        except EndpointConnectionError as error:
            raise Unreachable(f"network: cannot reach AWS ({error})") from None
        except ClientError as error:
            name = step.__name__.strip("_").replace("_", " ")
            op = error.operation_name
            if _denied(error):
                self.checks.append(Check(name, FAIL, f"not permitted to call {op}: see iam/testbed-policy.json"))
            else:
                self.checks.append(Check(name, FAIL, f"{op} failed: {_error_code(error)}"))
        except BotoCoreError as error:
            raise Unreachable(f"aws: {error}") from None
        except (KeyError, TypeError) as error:  # an answer botocore cannot parse: not AWS's API
            raise Unreachable(
                f"network: AWS answered {step.__name__.strip('_')} with what is not its API ({error})"
            ) from None

    def _identity(self) -> None:
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionError,
            HTTPClientError,
            NoCredentialsError,
        )

        sts = self._client("sts")
        try:
            who = sts.get_caller_identity()
        except NoCredentialsError:
            raise Unreachable(
                "credentials: none found; set AWS_PROFILE or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            ) from None
        except ClientError as error:
            raise Unreachable(f"credentials: refused by AWS ({_error_code(error)})") from None
        except (ConnectionError, HTTPClientError) as error:  # refused, timed out, dropped
            raise Unreachable(f"network: cannot reach AWS ({error}); waited at most {call_bound():g} s") from None
        except (KeyError, ValueError, TypeError) as error:  # an answer botocore cannot parse: not AWS's API
            raise Unreachable(
                f"network: {sts.meta.endpoint_url} answered what is not AWS's API (no {error} in it): a proxy, a "
                "login page, or another service at that address?"
            ) from None
        except BotoCoreError as error:  # credentials botocore cannot use: a key id without its secret
            raise Unreachable(f"aws configuration: {error}") from None
        self.account = who["Account"]
        self.checks.append(Check("credentials", OK, f"account {who['Account']} as {who['Arn']}"))

    def _region(self) -> None:
        regions = {r["RegionName"]: r for r in self.ec2.describe_regions(AllRegions=True)["Regions"]}
        region = regions.get(self.s.region)
        if region is None:
            self.checks.append(Check("region", FAIL, f"{self.s.region} is not a region of this account's partition"))
        elif region.get("OptInStatus") == "not-opted-in":
            self.checks.append(
                Check(
                    "region",
                    FAIL,
                    f"{self.s.region} is not enabled for this account",
                    f"aws account enable-region --region-name {self.s.region}",
                )
            )
        else:
            self.checks.append(Check("region", OK, f"{self.s.region} ({region.get('OptInStatus', 'enabled')})"))

    def _zone(self) -> None:
        types = sorted({t for t, _ in self.need.instances})
        offers = _pages(
            self.ec2,
            "describe_instance_type_offerings",
            "InstanceTypeOfferings",
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": types}],
        )
        zones_of = {t: sorted({o["Location"] for o in offers if o["InstanceType"] == t}) for t in types}
        try:
            zone = choose_zone(self.s, zones_of.get(self.s.worker_instance_type, []))
        except ZoneError as error:
            self.checks.append(Check("zone", FAIL, str(error)))
            return
        how = "configured" if self.s.availability_zone else "first zone offering the worker type"
        missing = [t for t in types if zone not in zones_of[t]]
        if missing:
            # Every node shares the one subnet, so every type must be offered in its zone.
            self.checks.append(
                Check("zone", FAIL, f"{zone} ({how}) does not offer {', '.join(missing)}; every node shares its subnet")
            )
        else:
            self.checks.append(Check("zone", OK, f"{zone} ({how}) offers {', '.join(types)}"))

    def _ami(self) -> None:
        if self.need.ami_lookup is None:  # amiId pinned
            images = self.ec2.describe_images(ImageIds=[self.s.ami_id])["Images"]
            usable = [i for i in images if i.get("State") == "available" and i.get("Architecture") == "x86_64"]
            if usable:
                self.checks.append(Check("ami", OK, f"pinned {self.s.ami_id} ({usable[0].get('Name', '')})"))
            else:
                self.checks.append(Check("ami", FAIL, f"pinned {self.s.ami_id} is not an available x86_64 image here"))
            return
        lookup = self.need.ami_lookup
        filters = [{"Name": f["name"], "Values": list(f["values"])} for f in lookup.get("filters", [])]
        images = self.ec2.describe_images(Owners=list(lookup["owners"]), Filters=filters)["Images"]
        wanted = ", ".join(f"{f['Name']}={'|'.join(f['Values'])}" for f in filters)
        if not images:
            self.checks.append(
                Check("ami", FAIL, f"no image of owner {','.join(lookup['owners'])} matches {wanted}; pin amiId")
            )
            return
        newest = max(images, key=lambda i: i.get("CreationDate", ""))
        self.checks.append(Check("ami", OK, f"lookup finds {newest['ImageId']} ({newest.get('Name', '')})"))

    def _vcpus(self) -> None:
        running = [
            i
            for r in _pages(
                self.ec2,
                "describe_instances",
                "Reservations",
                Filters=[{"Name": "instance-state-name", "Values": _RUNNING_STATES}],
            )
            for i in r["Instances"]
        ]
        types = sorted({t for t, _ in self.need.instances} | {i["InstanceType"] for i in running})
        vcpus = {
            t["InstanceType"]: t["VCpuInfo"]["DefaultVCpus"]
            for t in _pages(self.ec2, "describe_instance_types", "InstanceTypes", InstanceTypes=types)
        }
        demand: dict[Quota, float] = {}
        usage: dict[Quota, float] = {}
        for instance_type, spot in self.need.instances:
            q = self._quota_of(instance_type, spot)
            if q is not None:
                demand[q] = demand.get(q, 0) + vcpus.get(instance_type, math.nan)
        for i in running:
            q = self._quota_of(i["InstanceType"], i.get("InstanceLifecycle") == "spot", report=False)
            if q is not None:
                usage[q] = usage.get(q, 0) + vcpus.get(i["InstanceType"], 0)
        quotas = self._client("service-quotas")
        for q, need in demand.items():
            name = "spot vCPUs" if q in SPOT_VCPUS.values() else "on-demand vCPUs"
            used = usage.get(q, 0)
            self.checks.append(_headroom(name, q, need, used, _quota_value(quotas, q), self.s.region))

    def _quota_of(self, instance_type: str, spot: bool, report: bool = True) -> Quota | None:
        table = SPOT_VCPUS if spot else ON_DEMAND_VCPUS
        q = table.get(bucket(instance_type) or "")
        if q is None and report:
            market = "spot" if spot else "on-demand"
            self.checks.append(
                Check("vCPUs", UNKNOWN, f"no {market} vCPU quota known for {instance_type}; check Service Quotas")
            )
        return q

    def _addresses(self) -> None:
        used = len(self.ec2.describe_addresses()["Addresses"])
        quotas = self._client("service-quotas")
        value = _quota_value(quotas, ELASTIC_IPS)
        self.checks.append(_headroom("elastic IPs", ELASTIC_IPS, self.need.elastic_ips, used, value, self.s.region))

    def _vpcs(self) -> None:
        used = len(_pages(self.ec2, "describe_vpcs", "Vpcs"))
        quotas = self._client("service-quotas")
        self.checks.append(_headroom("VPCs", VPCS, self.need.vpcs, used, _quota_value(quotas, VPCS), self.s.region))

    def _key_pair(self) -> None:
        for name in self.need.key_pairs:
            # Pulumi auto-names the key pair (name + random suffix), so no existing one can
            # clash; one carrying this stack's tags is a deployed stack or a leftover of one.
            mine = self.ec2.describe_key_pairs(
                Filters=[
                    {"Name": "key-name", "Values": [f"{name}-*"]},
                    {"Name": "tag:testbed:project", "Values": [PROJECT]},
                    {"Name": "tag:testbed:stack", "Values": [self.need.stack]},
                ]
            )["KeyPairs"]
            if mine:
                found = ", ".join(sorted(k["KeyName"] for k in mine))
                self.checks.append(
                    Check(
                        "key pair",
                        WARN,
                        f"{found} of stack {self.need.stack} exists: a deployed stack or a leftover; "
                        "`pulumi stack --show-ids` tells which",
                    )
                )
            else:
                self.checks.append(Check("key pair", OK, f"{name}-<random suffix> is free"))

    def _managed_prometheus(self) -> None:
        """The workspace's service answers in the region; workspaces kept from earlier runs of this
        stack are named (managedPrometheusKeep leaves them, and their stored samples, behind)."""
        from botocore.exceptions import EndpointConnectionError

        for alias in self.need.workspaces:
            aps = self._client("amp")
            try:
                found = _pages(aps, "list_workspaces", "workspaces", alias=alias)
            except EndpointConnectionError:
                # EC2 answered just before, so the network is up: the service has no endpoint here
                self.checks.append(
                    Check(
                        "managed prometheus",
                        FAIL,
                        f"Amazon Managed Service for Prometheus does not answer in {self.s.region}: not offered "
                        "there; choose a region that offers it, or set managedPrometheus false",
                    )
                )
                return
            kept = sorted(w["workspaceId"] for w in found if w.get("alias") == alias)
            if kept:
                self.checks.append(
                    Check(
                        "managed prometheus",
                        OK,
                        f"{len(kept)} workspace(s) {alias} in the region ({', '.join(kept)}): the deployed stack's, "
                        "or kept from earlier runs, whose samples stay queryable and cost storage until deleted "
                        "(aws amp delete-workspace --workspace-id ID); a new deployment creates another",
                    )
                )
            else:
                self.checks.append(
                    Check(
                        "managed prometheus", OK, f"answers in {self.s.region}; `pulumi up` creates workspace {alias}"
                    )
                )

    def _writer_boundary(self) -> None:
        """The administrator created the writer role's boundary in this account, as the repository
        ships it: without it `pulumi up` stops at CreateRole; with other content it allows what the
        attack table says it refuses (docs/security-and-day2.md)."""
        for name in self.need.boundaries:
            arn = f"arn:aws:iam::{self.account}:policy/{name}"
            create = (
                f"aws iam create-policy --policy-name {name} "
                "--policy-document file://iam/writer-boundary.json   # an administrator, once per account"
            )
            iam = self._client("iam")
            try:
                version = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
            except iam.exceptions.NoSuchEntityException:
                self.checks.append(Check("writer boundary", FAIL, f"{arn} does not exist", create))
                continue
            # botocore decodes the URL-encoded document into a dict (botocore/handlers.py json_decode_policies)
            document = iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"]
            if document != json.loads(WRITER_BOUNDARY_FILE.read_text()):
                update = (
                    f"aws iam create-policy-version --policy-arn {arn} --set-as-default "
                    "--policy-document file://iam/writer-boundary.json   # an administrator"
                )
                self.checks.append(
                    Check("writer boundary", FAIL, f"{arn} ({version}) differs from iam/writer-boundary.json", update)
                )
                continue
            self.checks.append(Check("writer boundary", OK, f"{arn} ({version}) is iam/writer-boundary.json"))


def verdict(checks: list[Check]) -> tuple[int, str]:
    return checklist.verdict(checks, good="ready")


def parser() -> argparse.ArgumentParser:
    p = checklist.OneLineParser(prog=f"{typed_command()} preflight", description=as_typed(__doc__), epilog=LONGEST_WAIT)
    offline.add_stack_arguments(p)
    return p


def main(argv: list[str], session: Any = None) -> int:
    args = parser().parse_args(argv)
    try:
        config, s = offline.load_stack(args.stack, args.config, deployment=True)  # refuses the example adminCidr
    except SettingsError as error:
        for problem in error.problems:
            print(problem, file=sys.stderr)
        return EXIT_BAD_INPUT
    rec = offline.run(config, stack=args.stack)
    try:
        checks = Preflight(s, needs(rec), session or aws_session()).run()
    except Unreachable as error:
        print(error, file=sys.stderr)
        return EXIT_BAD_INPUT
    for c in checks:
        print("\n".join(c.lines()))
    code, text = verdict(checks)
    print(text)
    return code

"""`python -m cli preflight` against moto's in-process AWS (no network): each check passing
and failing. moto has no EC2 quotas, so tests set the ones they need on its Service Quotas
backend; a quota they do not set reads as unknown, as an unreadable one does on AWS."""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import UTC, datetime

import boto3
import pytest
from botocore.exceptions import ClientError

from cli import preflight
from components import ec2 as ec2_component
from core.names import WRITER_BOUNDARY_POLICY
from core.settings import load
from tests.conftest import config, run_program

REGION = "us-east-1"
ENOUGH = {
    ("ec2", "L-DB2E81BA"): 16,
    ("ec2", "L-1216C47A"): 32,
    ("ec2", "L-0263D0A3"): 5,
    ("ec2", "L-3819A6DF"): 16,
}
# One worker runs the module, so one imports moto (a second of CPU, there at first use) and
# loads the AWS service models (aws_env), where every worker that ran a test of it did; the
# IAM tests (tests/stacks/test_iam_*.py) share it, for moto, parliament and cloudsplaining.
pytestmark = pytest.mark.xdist_group("aws-tools")


class SharedClients:
    """The module's boto3 session, handing out one client per service, region and config for the
    whole module: botocore builds each client's class afresh from the service model (~15 ms for
    EC2's 860 operations, and more at its first call), which was most of a preflight run against
    moto. A client keeps no account state (moto's is global and reset per test), so one made in
    an earlier test answers from this test's account. It has no `events`: a client copies the
    session's handlers when made, so a test that adds handlers or changes a client uses
    `aws_env`'s session, whose clients are new each time."""

    def __init__(self, session: boto3.Session):
        self._session = session
        self._clients: dict[tuple[str, str | None, str], object] = {}

    def client(self, service: str, region_name: str | None = None, config=None):
        key = (service, region_name, repr(sorted(vars(config).items())) if config else "")
        if key not in self._clients:
            self._clients[key] = self._session.client(service, region_name=region_name, config=config)
        return self._clients[key]


@pytest.fixture(scope="module")
def aws_env():
    """Fake credentials and no default AMIs (loading them is slow); one boto3 session for the
    module, and one botocore data loader for every session made in it: a loader caches the
    service models it parses, and moto makes sessions of its own, each parsing EC2's 570 kB model
    and the endpoints again (~0.3 s in all: three as its EC2 backend is imported, moto 5.2.5
    moto/ec2/models/availability_zones_and_regions.py, one for its backends' regions,
    moto/core/base_backend.py), as does the no-credentials test. A loader holds only botocore's
    data files: credentials, region and endpoint stay each session's."""
    import botocore.loaders
    import botocore.session

    loader = botocore.loaders.create_loader()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": REGION,
            "MOTO_EC2_LOAD_DEFAULT_AMIS": "false",
        }.items():
            mp.setenv(key, value)
        # botocore/session.py (1.44) makes each session's loader with create_loader(data_path)
        mp.setattr(
            botocore.session,
            "create_loader",
            lambda data_path=None: loader if data_path is None else botocore.loaders.create_loader(data_path),
        )
        import moto  # noqa: F401  before the session: moto hooks botocore's handlers as it is imported

        yield boto3.Session()


@pytest.fixture
def recorded(default_run):
    return preflight.needs(default_run)


@pytest.fixture(scope="module")
def shared_clients(aws_env):
    return SharedClients(aws_env)


@pytest.fixture
def aws(shared_clients, monkeypatch):
    """A fresh emulated account per test, with the quotas in `quotas` readable, and the module's
    clients."""
    import moto
    from moto.servicequotas.models import ServiceQuotasBackend

    quotas: dict[tuple[str, str], float] = dict(ENOUGH)
    original = ServiceQuotasBackend.get_service_quota

    def get_service_quota(self, service_code, quota_code):
        if (service_code, quota_code) in quotas:
            return {
                "ServiceCode": service_code,
                "QuotaCode": quota_code,
                "Value": float(quotas[service_code, quota_code]),
            }
        return original(self, service_code, quota_code)

    monkeypatch.setattr(ServiceQuotasBackend, "get_service_quota", get_service_quota)
    with moto.mock_aws():
        yield shared_clients, quotas


def ubuntu_image(name_suffix: str = "20261120", image_id: str = "ami-0123456789abcdef0") -> None:
    from moto.ec2.models import ec2_backends
    from moto.ec2.models.amis import Ami

    backend = ec2_backends["123456789012"][REGION]
    backend.amis[image_id] = Ami(
        backend,
        ami_id=image_id,
        name=ec2_component.UBUNTU_2404_AMD64.replace("*", name_suffix),
        owner_id=ec2_component.UBUNTU_OWNER,
        architecture="x86_64",
        virtualization_type="hvm",
        creation_date=datetime(2026, 11, 20, tzinfo=UTC),
        public=True,
    )


def admin_boundary(session, document: dict | None = None) -> str:
    """The writer boundary as the README's administrator step creates it (or with other content)."""
    text = json.dumps(document) if document else preflight.WRITER_BOUNDARY_FILE.read_text()
    iam = session.client("iam", region_name=REGION)
    return iam.create_policy(PolicyName=WRITER_BOUNDARY_POLICY, PolicyDocument=text)["Policy"]["Arn"]


def run(session, need, **settings) -> dict[str, preflight.Check]:
    """The checks by name; vCPU checks by name and quota."""
    checks = preflight.Preflight(load(config(**settings), offline=True), need, session).run()
    return {f"{c.name} {c.detail.split(' (')[0]}" if "vCPUs" in c.name else c.name: c for c in checks}


def test_needs_come_from_the_program(recorded, spot_run):
    assert sorted(recorded.instances) == [("g4dn.xlarge", False)] * 4 + [("t3.medium", False)]
    assert (recorded.elastic_ips, recorded.vpcs, recorded.key_pairs) == (1, 1, ("testbed-ssh-keypair",))
    # the lookup preflight repeats is the one components/ec2.py makes
    assert recorded.ami_lookup["owners"] == [ec2_component.UBUNTU_OWNER]
    assert {"name": "name", "values": [ec2_component.UBUNTU_2404_AMD64]} in recorded.ami_lookup["filters"]
    spot = preflight.needs(spot_run)
    assert sorted(spot.instances) == [("g4dn.xlarge", True)] * 4 + [("t3.medium", False)]


def test_a_ready_account(aws, recorded):
    session, _ = aws
    ubuntu_image()
    admin_boundary(session)
    checks = run(session, recorded)
    assert {c.status for c in checks.values()} == {preflight.OK}, [c.lines() for c in checks.values()]
    assert "account 123456789012" in checks["credentials"].detail
    assert checks["zone"].detail.startswith("us-east-1a (first zone offering the worker type)")
    assert "ami-0123456789abcdef0" in checks["ami"].detail
    g = checks["on-demand vCPUs Running On-Demand G and VT instances"]
    assert "need 16 vCPUs, in use 0, quota 16" in g.detail
    assert "need 2 vCPUs" in checks["on-demand vCPUs Running On-Demand Standard"].detail
    assert preflight.verdict(list(checks.values())) == (0, "verdict: ready")


def test_short_gpu_quota_prints_the_request_counting_what_already_runs(aws, recorded):
    session, quotas = aws
    ubuntu_image()
    quotas["ec2", "L-DB2E81BA"] = 0
    session.client("ec2", region_name=REGION).run_instances(
        ImageId="ami-0123456789abcdef0", MinCount=1, MaxCount=1, InstanceType="g4dn.xlarge"
    )
    checks = run(session, recorded)
    g = checks["on-demand vCPUs Running On-Demand G and VT instances"]
    assert g.status == preflight.FAIL and "need 16 vCPUs, in use 4, quota 0: short by 20" in g.detail
    assert g.remedy == (
        "aws service-quotas request-service-quota-increase --service-code ec2 "
        "--quota-code L-DB2E81BA --desired-value 20 --region us-east-1"
    )
    code, text = preflight.verdict(list(checks.values()))
    assert code == 1 and "on-demand vCPUs" in text


def test_spot_workers_count_against_the_spot_quota(aws, recorded, spot_run):
    session, quotas = aws
    ubuntu_image()
    quotas["ec2", "L-3819A6DF"] = 8
    checks = run(session, preflight.needs(spot_run))
    spot = checks["spot vCPUs All G and VT Spot Instance Requests"]
    assert spot.status == preflight.FAIL and "L-3819A6DF" in spot.remedy and "--desired-value 16" in spot.remedy
    assert not any("G and VT instances" in name for name in checks)  # no on-demand GPU need


def test_unreadable_quota_is_unknown_not_a_crash(aws, recorded):
    session, quotas = aws
    ubuntu_image()
    admin_boundary(session)
    del quotas["ec2", "L-0263D0A3"]
    checks = run(session, recorded)
    assert checks["elastic IPs"].status == preflight.UNKNOWN and "unreadable" in checks["elastic IPs"].detail
    assert preflight.verdict(list(checks.values())) == (0, "verdict: ready, 1 check(s) to confirm by hand")


def test_elastic_ips_and_vpcs_in_use_leave_no_room(aws, recorded):
    session, _ = aws
    ubuntu_image()
    client = session.client("ec2", region_name=REGION)
    for _ in range(5):
        client.allocate_address(Domain="vpc")
    for i in range(4):  # with the default VPC: 5 of moto's 5
        client.create_vpc(CidrBlock=f"10.{i}.0.0/16")
    checks = run(session, recorded)
    assert checks["elastic IPs"].status == preflight.FAIL and "in use 5, quota 5" in checks["elastic IPs"].detail
    assert "--quota-code L-0263D0A3 --desired-value 6" in checks["elastic IPs"].remedy
    assert checks["VPCs"].status == preflight.FAIL and "--service-code vpc --quota-code L-F678F1CE" in (
        checks["VPCs"].remedy
    )


def test_zone_that_does_not_offer_a_type(aws, recorded):
    session, _ = aws
    checks = run(session, recorded, availabilityZone="us-east-1e")  # moto: no g4dn in 1e
    assert checks["zone"].status == preflight.FAIL
    assert checks["zone"].detail.startswith('availabilityZone: "us-east-1e" does not offer g4dn.xlarge')
    control_elsewhere = dataclasses.replace(recorded, instances=(("g4dn.xlarge", False), ("p3.2xlarge", False)))
    checks = run(session, control_elsewhere)
    assert checks["zone"].status == preflight.FAIL and "does not offer p3.2xlarge" in checks["zone"].detail


def test_region_not_enabled(aws, recorded):
    session, _ = aws
    checks = run(session, recorded, region="ap-east-1")
    assert checks["region"].status == preflight.FAIL
    assert checks["region"].remedy == "aws account enable-region --region-name ap-east-1"


def test_ami_lookup_and_pin(aws, recorded):
    session, _ = aws
    checks = run(session, recorded)
    assert checks["ami"].status == preflight.FAIL and "pin amiId" in checks["ami"].detail
    ubuntu_image()
    pinned = dataclasses.replace(recorded, ami_lookup=None)
    assert run(session, pinned, amiId="ami-0123456789abcdef0")["ami"].status == preflight.OK
    missing = run(session, pinned, amiId="ami-0fedcba9876543210")["ami"]
    assert missing.status == preflight.FAIL and "InvalidAMIID" in missing.detail


def test_key_pair_of_this_stack_is_reported(aws, recorded):
    session, _ = aws
    ubuntu_image()
    tags = [{"Key": "testbed:project", "Value": "gpu-testbed"}]
    ec2 = session.client("ec2", region_name=REGION)
    # ED25519 as the stack's (components/ssh_access.py): moto makes one in microseconds, an RSA one in ~40 ms
    for name, stack in (("testbed-ssh-keypair-1a2b3c4", "dev"), ("testbed-ssh-keypair-9z8y7x6", "prod")):
        stack_tags = [*tags[:1], {"Key": "testbed:stack", "Value": stack}]
        ec2.create_key_pair(
            KeyName=name, KeyType="ed25519", TagSpecifications=[{"ResourceType": "key-pair", "Tags": stack_tags}]
        )
    check = run(session, recorded)["key pair"]
    assert check.status == preflight.WARN and "testbed-ssh-keypair-1a2b3c4 of stack dev exists" in check.detail
    assert "9z8y7x6" not in check.detail  # another stack's key pair is not this one's


def test_a_denied_call_names_the_policy(aws, aws_env, recorded):
    session = aws_env  # clients of its own: it changes one
    ubuntu_image()

    class Denying:
        def client(self, name, **kwargs):
            client = session.client(name, **kwargs)
            if name == "ec2":

                def denied(**_):
                    raise ClientError({"Error": {"Code": "UnauthorizedOperation"}}, "DescribeAddresses")

                client.describe_addresses = denied
            return client

    check = run(Denying(), recorded)["addresses"]
    assert check.status == preflight.FAIL
    assert check.detail == "not permitted to call DescribeAddresses: see iam/testbed-policy.json"


def test_no_credentials_and_no_network_are_one_line(aws_env, recorded, monkeypatch, tmp_path):
    s = load(config(), offline=True)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(preflight.Unreachable, match=r"^credentials: none found"):
        preflight.Preflight(s, recorded, boto3.Session()).run()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens on discard
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(preflight.Unreachable, match=r"^network: cannot reach AWS"):
        preflight.Preflight(s, recorded, boto3.Session()).run()


def test_cli_bad_settings_exit_2_before_any_call(capsys):
    from cli import __main__ as cli

    # Pulumi.dev.yaml ships a documentation adminCidr: fine for plan, refused before a deployment
    assert cli.main(["preflight"]) == 2
    assert "adminCidr" in capsys.readouterr().err
    assert cli.main(["preflight", "--config", "adminCidr=1.2.3.4/32", "--config", "workerCount=0"]) == 2
    assert capsys.readouterr().err.startswith('workerCount: "0" is not allowed')
    for tool in ("preflight", "doctor", "e2e"):  # bad arguments: one line, exit 2
        with pytest.raises(SystemExit) as exited:
            cli.main([tool, "--no-such-flag"])
        assert exited.value.code == 2
        prog = f"python -m cli {tool}"
        assert capsys.readouterr().err == f"{prog}: unrecognized arguments: --no-such-flag; see {prog} --help\n"


def test_cli_prints_one_line_per_check_and_the_verdict(aws, default_run, capsys, monkeypatch):
    session, quotas = aws
    monkeypatch.setattr(preflight.offline, "run", lambda config, stack: default_run)  # the same program, recorded once
    ubuntu_image()
    admin_boundary(session)
    quotas["ec2", "L-DB2E81BA"] = 0
    assert preflight.main(["--config", "adminCidr=1.2.3.4/32"], session=session) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("ok      credentials: account 123456789012")
    assert lines[-1] == "verdict: 1 problem(s): on-demand vCPUs"
    assert any(line.strip().startswith("-> aws service-quotas request-service-quota-increase") for line in lines)


def test_every_call_preflight_makes_is_in_the_policy_and_read_only(aws, aws_env, recorded):
    from tests.stacks.test_iam import ACTIONS, granted

    session = aws_env  # clients of its own: they see `note`
    ubuntu_image()
    admin_boundary(session)
    calls: set[str] = set()

    def note(model, **_):
        calls.add(f"{model.service_model.signing_name}:{model.name}")

    session.events.register("before-call", note)
    try:
        run(session, recorded)
        run(session, dataclasses.replace(recorded, ami_lookup=None), amiId="ami-0123456789abcdef0")
    finally:
        session.events.unregister("before-call", note)
    assert calls == set(ACTIONS["tools"]["preflight"]) and calls <= granted()
    assert all(re.fullmatch(r"[a-z0-9]+:(Describe|Get|List)[A-Za-z]+", c) for c in calls), sorted(calls)


def test_managed_prometheus_answers_and_names_the_workspaces_kept_from_earlier_runs(aws, aws_env, recorded):
    session = aws_env  # clients of its own: they answer as AWS does, below
    ubuntu_image()

    def by_prefix(parsed, **_):
        # AWS's ListWorkspaces filters the alias by prefix (moto 5.2.5 by equality): a longer alias
        # comes back too, as on AWS, and must not count as this stack's
        parsed["workspaces"] = [*parsed.get("workspaces", []), {"alias": f"{alias}-other", "workspaceId": "ws-other"}]

    (alias,) = recorded.workspaces  # the alias the program gives its workspace
    assert alias == "gpu-testbed-dev"
    session.events.register("after-call.amp.ListWorkspaces", by_prefix)
    try:
        assert (
            run(session, recorded)["managed prometheus"].detail
            == "answers in us-east-1; `pulumi up` creates workspace gpu-testbed-dev"
        )
        amp = session.client("amp", region_name=REGION)
        kept = amp.create_workspace(alias=alias)["workspaceId"]
        check = run(session, recorded)["managed prometheus"]
    finally:
        session.events.unregister("after-call.amp.ListWorkspaces", by_prefix)
    assert check.status == preflight.OK
    assert check.detail.startswith(f"1 workspace(s) gpu-testbed-dev in the region ({kept}): the deployed stack's, ")


def test_managed_prometheus_not_offered_in_the_region_fails_with_the_way_out(aws, aws_env, recorded):
    from botocore.exceptions import EndpointConnectionError

    session = aws_env  # clients of its own: they see `no_endpoint`
    ubuntu_image()

    def no_endpoint(request, **_):
        raise EndpointConnectionError(endpoint_url=request.url)

    session.events.register("before-send.amp", no_endpoint)
    try:
        checks = run(session, recorded)
    finally:
        session.events.unregister("before-send.amp", no_endpoint)
    check = checks["managed prometheus"]
    assert check.status == preflight.FAIL and check.detail.endswith("or set managedPrometheus false")
    assert checks["credentials"].status == preflight.OK  # one line, not "cannot reach AWS"


def test_managed_prometheus_false_asks_nothing_of_amp(aws):
    session, _ = aws
    ubuntu_image()
    need = preflight.needs(run_program(managedPrometheus=False))
    assert need.workspaces == ()
    assert "managed prometheus" not in run(session, need, managedPrometheus=False)


def test_the_writer_boundary_the_program_names_is_checked_in_the_callers_account(aws, recorded):
    """Missing: `pulumi up` would stop at CreateRole, so preflight fails with the administrator's
    command. Present with other content (an older or hand-edited boundary): fails with the
    command that makes iam/writer-boundary.json its default version. As shipped: ok."""
    session, _ = aws
    ubuntu_image()
    (name,) = recorded.boundaries  # the policy the program's writer role takes as its boundary
    assert name == WRITER_BOUNDARY_POLICY
    missing = run(session, recorded)["writer boundary"]
    arn = f"arn:aws:iam::123456789012:policy/{name}"  # moto's account, as the identity check read it
    assert missing.status == preflight.FAIL and missing.detail == f"{arn} does not exist"
    assert missing.remedy.startswith(
        f"aws iam create-policy --policy-name {name} --policy-document file://iam/writer-boundary.json"
    )
    shipped = json.loads(preflight.WRITER_BOUNDARY_FILE.read_text())
    (allow,) = shipped["Statement"]
    wider = {**shipped, "Statement": [{**allow, "Condition": {}}]}  # remote-write into every workspace
    assert admin_boundary(session, wider) == arn
    check = run(session, recorded)["writer boundary"]
    assert check.status == preflight.FAIL and check.detail == f"{arn} (v1) differs from iam/writer-boundary.json"
    assert check.remedy.startswith(f"aws iam create-policy-version --policy-arn {arn} --set-as-default ")
    iam = session.client("iam", region_name=REGION)
    iam.create_policy_version(PolicyArn=arn, PolicyDocument=json.dumps(shipped), SetAsDefault=True)
    check = run(session, recorded)["writer boundary"]
    assert (check.status, check.detail) == (preflight.OK, f"{arn} (v2) is iam/writer-boundary.json")


def test_managed_prometheus_false_needs_no_writer_boundary(aws):
    session, _ = aws
    ubuntu_image()
    need = preflight.needs(run_program(managedPrometheus=False))
    assert need.boundaries == ()
    assert "writer boundary" not in run(session, need, managedPrometheus=False)

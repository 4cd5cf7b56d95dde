"""Security invariants over every resource the whole program registers."""

import json

import pytest

from cli import artifacts
from stacks.offline import is_secret, reveal
from tests import tokens
from tests.conftest import by_type, run_program

ANYWHERE = {"0.0.0.0/0", "::/0"}


def secret_values(rec) -> dict[str, str]:
    """The values that must never appear in the clear, as the mock engine produced them."""
    keys = {r.name: r.outputs for r in by_type(rec, tokens.PRIVATE_KEY)}
    token = next(r for r in by_type(rec, tokens.RANDOM_PASSWORD) if "token" in r.name)
    grafana = next(r for r in by_type(rec, tokens.RANDOM_PASSWORD) if "grafana" in r.name)
    return {
        "cluster CA key": keys["testbed-identity-ca-key"]["privateKeyPem"],
        "admin client key": keys["testbed-identity-admin-key"]["privateKeyPem"],
        "operator client key": keys["testbed-identity-operator-key"]["privateKeyPem"],
        "ssh private key": keys["testbed-ssh-key"]["privateKeyOpenssh"],
        "bootstrap token secret": token.outputs["result"],
        "grafana password": grafana.outputs["result"],
    }


# spot workers too (spot_run's settings: one recording); the ingress rules do not depend on the
# worker count, which this case varied before
@pytest.mark.parametrize("settings", [{}, {"spotWorkers": True}])
def test_no_ingress_from_anywhere_unless_opted_in(settings):
    rec = run_program(**settings)
    (group,) = by_type(rec, tokens.SECURITY_GROUP)
    assert group.inputs["ingress"]
    for rule in group.inputs["ingress"]:
        sources = set(rule.get("cidrBlocks", [])) | set(rule.get("ipv6CidrBlocks", []))
        assert not sources & ANYWHERE, rule
    # Rules live inline in the one group only: a separate rule resource (a new AWS type) fails here.
    assert {r.type for r in rec.resources if r.type.startswith("aws:")} == tokens.AWS_TYPES


def test_every_instance_imdsv2_hop_limit_1_and_every_volume_encrypted(default_run):
    for node in by_type(default_run, tokens.INSTANCE):
        options = node.inputs["metadataOptions"]
        assert options["httpTokens"] == "required" and options["httpPutResponseHopLimit"] == 1
        assert node.inputs["rootBlockDevice"]["encrypted"] is True
        assert "ebsBlockDevices" not in node.inputs  # the root volume is the only disk
    # and no separate EBS volume escapes these settings: every AWS type registered is a known one
    assert {r.type for r in default_run.resources if r.type.startswith("aws:")} == tokens.AWS_TYPES


def test_every_aws_resource_uses_the_region_pinned_provider(default_run):
    (provider,) = by_type(default_run, tokens.AWS_PROVIDER)
    assert provider.inputs["region"] == default_run.settings.region
    for r in default_run.resources:
        if r.type.startswith("aws:"):
            assert r.provider.startswith(provider.urn + "::"), r.name
    # lookups too: an AMI id or a zone from another region would be wrong here
    assert {token for token, _ in default_run.invokes} == {
        tokens.GET_AMI,
        tokens.GET_INSTANCE_TYPE_OFFERINGS,
        tokens.GET_CALLER_IDENTITY,  # the account of the writer role's boundary
    }
    assert all(ref.startswith(provider.urn + "::") for _, ref in default_run.invokes), default_run.invokes


def test_secrets_are_pulumi_secrets_and_never_in_the_clear(default_run, capsys):
    assert {"kubeconfig", "sshPrivateKey", "grafanaAdminPassword"} <= default_run.secret_outputs
    from cli import __main__ as cli

    assert cli.main(["plan", "--json"]) == 0
    plan = capsys.readouterr().out
    plain_outputs = json.dumps({k: v for k, v in default_run.outputs.items() if k not in default_run.secret_outputs})
    command_lines = " ".join(
        reveal(c.inputs.get("create", "")) + reveal(c.inputs.get("delete", ""))
        for c in by_type(default_run, tokens.COMMAND)
    )
    for what, value in secret_values(default_run).items():
        assert value and value not in plan, f"{what} in plan output"
        assert value not in plain_outputs, f"{what} in a plain stack output"
        assert value not in command_lines, f"{what} on a remote command line (it would be logged)"


def test_inputs_carrying_secrets_are_marked_secret(default_run):
    for node in by_type(default_run, tokens.INSTANCE):
        assert is_secret(node.inputs["userData"])
    for c in by_type(default_run, tokens.COMMAND):
        assert is_secret(c.inputs["connection"])
    stack = next(r for r in by_type(default_run, tokens.RELEASE) if r.inputs["name"] == "monitoring")
    assert is_secret(stack.inputs["values"])


def test_nothing_blocks_pulumi_destroy(default_run):
    """Objects created outside Pulumi's knowledge are handled: the slurmctld PVC (from the
    StatefulSet) outlives the release, so the PV does not wait on its finalizer; the Training
    Operator's objects are deleted by the same step that applied them. Without a cloud
    controller, no Service creates AWS load balancers, and none is of type LoadBalancer."""
    (pv,) = by_type(default_run, tokens.PERSISTENT_VOLUME)
    assert pv.inputs["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    step = default_run.named("testbed-training-operator-install")
    assert "delete" in step.inputs["delete"]
    (provider,) = by_type(default_run, tokens.KUBERNETES_PROVIDER)
    assert provider.inputs["deleteUnreachable"] == "true"  # provider config travels as strings


def test_render_writes_no_load_balancer_or_node_port(tmp_path, default_run):
    artifacts.render(default_run, tmp_path)
    for path in (tmp_path / "manifests").glob("*.yaml"):
        text = path.read_text()
        assert "LoadBalancer" not in text and "NodePort" not in text

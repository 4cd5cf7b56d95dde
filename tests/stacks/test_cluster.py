import base64
from pathlib import Path

import pulumi_command as command
import pulumi_tls
import pytest

from components import cluster_identity, remote_script
from core import host_layout, trusted_yaml
from stacks.offline import is_secret, reveal
from tests import tokens
from tests.conftest import by_type, step_args, step_secrets


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(w.capitalize() for w in rest)


def test_provider_waits_for_the_readiness_gate(default_run):
    (provider,) = by_type(default_run, tokens.KUBERNETES_PROVIDER)
    (gate,) = [c for c in by_type(default_run, tokens.COMMAND) if c.name == "testbed-readiness-wait"]
    assert gate.urn in provider.depends_on


def test_gate_runs_the_readiness_script_on_the_control_node_as_ubuntu(default_run):
    (gate,) = [c for c in by_type(default_run, tokens.COMMAND) if c.name == "testbed-readiness-wait"]
    (eip,) = by_type(default_run, tokens.EIP)
    connection = reveal(gate.inputs["connection"])
    assert connection["host"] == eip.outputs["publicIp"]
    assert connection["user"] == host_layout.SSH_USER and connection["dialErrorLimit"] == -1
    assert is_secret(gate.inputs["connection"])  # it carries the private key
    from components import bootstrap

    assert remote_script.script_of(reveal(gate.inputs["stdin"])) == bootstrap.script("wait-cluster-ready.sh")
    args = step_args(default_run, gate.name)
    assert int(args["TIMEOUT_SECONDS"]) >= 30 * 60 and args["REGION"] == default_run.settings.region
    assert args["BOOTSTRAP_LOG"] == host_layout.BOOTSTRAP_LOG and args["KUBECONFIG"] == host_layout.ADMIN_KUBECONFIG
    # it reads the workers' bootstrap status over SSH from the control node, with the stack's key
    assert step_secrets(default_run, gate.name) == {"SSH_PRIVATE_KEY": connection["privateKey"]}
    assert connection["privateKey"] == default_run.outputs["sshPrivateKey"]


def test_kubeconfig_reaches_the_elastic_ip_with_the_cluster_ca_and_an_admin_client_cert(default_run):
    """The `kubeconfig` output is the operator's: its own certificate, not the provider's."""
    kubeconfig = trusted_yaml.load(default_run.outputs["kubeconfig"])
    (eip,) = by_type(default_run, tokens.EIP)
    (ca_cert,) = by_type(default_run, tokens.SELF_SIGNED_CERT)
    operator_cert = default_run.named("testbed-identity-operator-cert")
    cluster = kubeconfig["clusters"][0]["cluster"]
    assert cluster["server"] == f"https://{eip.outputs['publicIp']}:{host_layout.API_SERVER_PORT}"
    assert base64.b64decode(cluster["certificate-authority-data"]).decode() == ca_cert.outputs["certPem"]
    user = kubeconfig["users"][0]["user"]
    assert base64.b64decode(user["client-certificate-data"]).decode() == operator_cert.outputs["certPem"]
    assert kubeconfig["current-context"] == kubeconfig["contexts"][0]["name"]


def test_the_operators_certificate_is_short_lived_and_the_providers_is_not(default_run):
    """The operator's lasts roleCredentialHours and `pulumi up` renews it after half; the
    provider's lasts a year and nothing renews it, because a renewed certificate is unknown at
    preview and pulumi-kubernetes replaces a provider whose kubeconfig is unknown, and with it
    every object it manages (components/cluster_identity.py program_kubeconfig). So the provider's
    kubeconfig holds the program's certificate and key, never the operator's."""
    hours = default_run.settings.role_credential_hours
    operator = default_run.named("testbed-identity-operator-cert")
    assert operator.inputs["validityPeriodHours"] == hours < 24
    assert 0 < operator.inputs["earlyRenewalHours"] < hours
    operator_csr = default_run.named("testbed-identity-operator-csr")
    assert reveal(operator_csr.inputs["subject"]) == {
        "commonName": cluster_identity.OPERATOR_USER,
        "organization": cluster_identity.ADMIN_GROUP,  # cluster-admin, as kubeadm binds it
    }
    program = default_run.named("testbed-identity-admin-cert")
    assert "earlyRenewalHours" not in program.inputs and program.inputs["validityPeriodHours"] == 365 * 24
    (provider,) = by_type(default_run, tokens.KUBERNETES_PROVIDER)
    given = trusted_yaml.load(reveal(provider.inputs["kubeconfig"]))["users"][0]["user"]
    assert base64.b64decode(given["client-certificate-data"]).decode() == program.outputs["certPem"]
    keys = {k.name: k.outputs["privateKeyPem"] for k in by_type(default_run, tokens.PRIVATE_KEY)}
    assert base64.b64decode(given["client-key-data"]).decode() == keys["testbed-identity-admin-key"]
    output = trusted_yaml.load(default_run.outputs["kubeconfig"])["users"][0]["user"]
    assert base64.b64decode(output["client-key-data"]).decode() == keys["testbed-identity-operator-key"]
    assert keys["testbed-identity-operator-key"] != keys["testbed-identity-admin-key"]


def test_admin_certificate_is_a_revocable_cluster_admin_signed_by_the_cluster_ca(default_run):
    csr = default_run.named("testbed-identity-admin-csr")
    assert reveal(csr.inputs["subject"])["organization"] == cluster_identity.ADMIN_GROUP
    admin_cert = default_run.named("testbed-identity-admin-cert")
    (ca_cert,) = by_type(default_run, tokens.SELF_SIGNED_CERT)
    assert reveal(admin_cert.inputs["caCertPem"]) == ca_cert.outputs["certPem"]
    assert "client_auth" in admin_cert.inputs["allowedUses"]


def test_secrets_stay_secret(default_run):
    assert {"kubeconfig", "sshPrivateKey"} <= default_run.secret_outputs
    for node in by_type(default_run, tokens.INSTANCE):
        assert is_secret(node.inputs["userData"])  # holds a bootstrap token
    (provider,) = by_type(default_run, tokens.KUBERNETES_PROVIDER)
    assert is_secret(provider.inputs["kubeconfig"])


def test_ssh_command_uses_the_public_ip_and_the_generated_key(default_run):
    assert default_run.outputs["sshCommand"].endswith(
        f"ssh -i testbed.pem ubuntu@{default_run.outputs['controlPlanePublicIp']}"
    )
    assert default_run.outputs["sshPrivateKey"].startswith("-----BEGIN")


def test_gate_dials_only_after_the_elastic_ip_points_at_the_control_node(default_run):
    (association,) = by_type(default_run, tokens.EIP_ASSOCIATION)
    assert association.urn in default_run.named("testbed-readiness-wait").depends_on


def minutes(duration: str) -> int:
    assert duration.endswith("m"), duration
    return int(duration[:-1])


def test_gate_step_outlasts_the_scripts_own_deadline_so_the_diagnosis_is_printed(default_run):
    gate = default_run.named("testbed-readiness-wait")
    script_seconds = int(step_args(default_run, gate.name)["TIMEOUT_SECONDS"])
    assert minutes(gate.custom_timeouts["create"]) * 60 > script_seconds


def test_no_remote_step_can_hold_destroy_forever(default_run):
    for step in by_type(default_run, tokens.COMMAND):
        assert minutes(step.custom_timeouts["delete"]) <= 15, step.name


def test_everything_in_the_cluster_is_deleted_with_the_control_node(default_run):
    """`pulumi destroy` never calls the Kubernetes or SSH provider for a cluster that is going away."""
    (control,) = [r for r in by_type(default_run, tokens.INSTANCE) if r.name == "testbed-control-instance"]
    in_cluster = [r for r in default_run.resources if r.type.startswith("kubernetes:") or r.type == tokens.COMMAND]
    assert len(in_cluster) > 15  # the releases, PV, ConfigMap, ScaledObject and every remote step
    for r in in_cluster:
        assert r.options.get("deletedWith") == control.urn, r.name
    others = [r for r in default_run.resources if r not in in_cluster]
    assert not [r.name for r in others if "deletedWith" in r.options]


def test_a_step_that_runs_on_delete_dials_with_a_bounded_budget(default_run):
    gate = default_run.named("testbed-readiness-wait")
    assert reveal(gate.inputs["connection"])["dialErrorLimit"] == -1  # a fresh instance is waited for
    with_delete = [s for s in by_type(default_run, tokens.COMMAND) if "delete" in s.inputs]
    assert with_delete
    for step in with_delete:
        connection = reveal(step.inputs["connection"])
        budget = connection["dialErrorLimit"] * connection["perDialTimeout"]
        assert 0 < budget <= 10 * 60, step.name


def test_remote_script_refuses_a_delete_step_that_would_dial_forever():
    step = remote_script.RemoteStep("training-operator.sh", {}, delete_args={})
    forever = command.remote.ConnectionArgs(host="h", dial_error_limit=-1)
    with pytest.raises(ValueError, match="bounded dial_error_limit"):
        remote_script.run("x", step, forever, parent=None)  # type: ignore[arg-type]


def test_the_cluster_ca_is_a_ca_kubeadm_can_sign_with(default_run):
    """kubeadm init keeps a delivered CA and signs every control-plane certificate with it."""
    keys = {k.name: k for k in by_type(default_run, tokens.PRIVATE_KEY)}
    (ca,) = by_type(default_run, tokens.SELF_SIGNED_CERT)
    assert ca.inputs["isCaCertificate"] is True
    assert ca.inputs["allowedUses"] == ["cert_signing", "crl_signing", "digital_signature", "key_encipherment"]
    assert reveal(ca.inputs["subject"]) == {"commonName": "kubernetes"}  # kubeadm's own CA subject
    assert ca.inputs["validityPeriodHours"] == 10 * 365 * 24
    assert reveal(ca.inputs["privateKeyPem"]) == keys["testbed-identity-ca-key"].outputs["privateKeyPem"]
    assert (keys["testbed-identity-ca-key"].inputs["algorithm"], keys["testbed-identity-ca-key"].inputs["rsaBits"]) == (
        "RSA",
        2048,
    )


def test_the_admin_certificate_is_a_client_certificate_from_the_admin_key(default_run):
    keys = {k.name: k for k in by_type(default_run, tokens.PRIVATE_KEY)}
    admin_key = keys["testbed-identity-admin-key"]
    csr = default_run.named("testbed-identity-admin-csr")
    admin_cert = default_run.named("testbed-identity-admin-cert")
    # kubeadm >= 1.29 binds this group to cluster-admin (its admin.conf uses the same O=)
    assert reveal(csr.inputs["subject"]) == {"commonName": "testbed-admin", "organization": "kubeadm:cluster-admins"}
    # every field is one the provider's schema has (under mocks an unknown key echoes back unseen)
    fields = {_camel(k) for k in pulumi_tls.CertRequestSubjectArgsDict.__annotations__}
    assert set(reveal(csr.inputs["subject"])) <= fields
    assert reveal(csr.inputs["privateKeyPem"]) == admin_key.outputs["privateKeyPem"]
    assert (admin_key.inputs["algorithm"], admin_key.inputs["rsaBits"]) == ("RSA", 2048)
    assert reveal(admin_cert.inputs["certRequestPem"]) == csr.outputs["certRequestPem"]
    assert reveal(admin_cert.inputs["caPrivateKeyPem"]) == keys["testbed-identity-ca-key"].outputs["privateKeyPem"]
    assert admin_cert.inputs["allowedUses"] == ["digital_signature", "key_encipherment", "client_auth"]
    assert admin_cert.inputs["validityPeriodHours"] == 365 * 24


def test_the_bootstrap_token_is_drawn_from_the_alphabet_kubeadm_accepts(default_run):
    """The mock returns lowercase alphanumerics whatever it is asked, so the request is checked:
    kubeadm's BootstrapTokenPattern is \\A([a-z0-9]{6})\\.([a-z0-9]{16})\\z
    (kubernetes/kubernetes staging/src/k8s.io/cluster-bootstrap/token/api/consts.go)."""
    # kubeadm init's token, and one per worker (join-token.sh registers each)
    owners = ["identity", *(f"worker-{i}" for i in range(len(default_run.settings.worker_private_ips)))]
    token_ids = by_type(default_run, tokens.RANDOM_STRING)
    token_secrets = [p for p in by_type(default_run, tokens.RANDOM_PASSWORD) if "token" in p.name]
    assert sorted(p.name for p in token_ids) == sorted(f"testbed-{o}-token-id" for o in owners)
    assert sorted(p.name for p in token_secrets) == sorted(f"testbed-{o}-token-secret" for o in owners)
    for part in (*token_ids, *token_secrets):
        length = 6 if part in token_ids else 16
        asked = {k: part.inputs.get(k) for k in ("length", "upper", "lower", "numeric", "special")}
        assert asked == {"length": length, "upper": False, "lower": True, "numeric": True, "special": False}, part.name


def test_the_kubeconfig_loads_in_the_kubernetes_client_with_every_credential(default_run):
    """What `kubectl` and the validation runner do with it: every field a client needs is there."""
    from kubernetes import client
    from kubernetes import config as kube_config

    loaded = client.Configuration()
    kube_config.load_kube_config_from_dict(
        trusted_yaml.load(default_run.outputs["kubeconfig"]), client_configuration=loaded, persist_config=False
    )
    keys = {k.name: k for k in by_type(default_run, tokens.PRIVATE_KEY)}
    (eip,) = by_type(default_run, tokens.EIP)
    (ca_cert,) = by_type(default_run, tokens.SELF_SIGNED_CERT)
    operator_cert = default_run.named("testbed-identity-operator-cert")
    assert loaded.host == f"https://{eip.outputs['publicIp']}:6443"
    assert loaded.verify_ssl is True
    # the loader decodes each *-data field into a file of its own
    read = {"ca": loaded.ssl_ca_cert, "cert": loaded.cert_file, "key": loaded.key_file}
    read = {what: Path(path).read_text() for what, path in read.items()}
    assert read == {
        "ca": ca_cert.outputs["certPem"],
        "cert": operator_cert.outputs["certPem"],
        "key": keys["testbed-identity-operator-key"].outputs["privateKeyPem"],
    }


def test_kubeconfig_names_agree():
    text = cluster_identity.render_kubeconfig("c", "https://192.0.2.1:6443", "CA", "CERT", "KEY")
    assert text.startswith("apiVersion: v1\nkind: Config\nclusters:\n")  # in kubectl's order, for a reader
    doc = trusted_yaml.load(text)
    assert (doc["apiVersion"], doc["kind"], doc["current-context"]) == ("v1", "Config", "c")
    assert doc["contexts"] == [{"name": "c", "context": {"cluster": "c", "user": "testbed-admin"}}]
    assert [c["name"] for c in doc["clusters"]] == ["c"] and [u["name"] for u in doc["users"]] == ["testbed-admin"]
    decoded = {k: base64.b64decode(v).decode() for k, v in doc["users"][0]["user"].items()}
    assert decoded == {"client-certificate-data": "CERT", "client-key-data": "KEY"}
    assert doc["clusters"][0]["cluster"] == {
        "server": "https://192.0.2.1:6443",
        "certificate-authority-data": base64.b64encode(b"CA").decode(),
    }

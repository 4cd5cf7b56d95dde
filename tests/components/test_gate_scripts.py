"""The gate scripts run against a stub kubectl (and cloud-init) on PATH: they pass only on
the evidence they claim to check, and fail with a message that says what is missing."""

import datetime
import json
import os
import stat
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from components import bootstrap, cert_manager, keda, remote_script, training_operator, webhook_gate
from components import readiness_gate as readiness
from stacks import cluster

STUB_KUBECTL = r"""#!/usr/bin/env bash
# Behaviour from files in $STUB: health_exit, dry_run_failures (count down), nodes.
echo "kubectl $*" >>"$STUB/calls"
case "$*" in
  *"get pods"*) echo cert-manager-webhook-abc ;;
  *"get --raw /api/"*) exit "$(cat "$STUB/health_exit")" ;;
  *"create --dry-run=server"*)
    cat >"$STUB/last_manifest"
    left=$(cat "$STUB/dry_run_failures")
    if [ "$left" -gt 0 ]; then echo $((left - 1)) >"$STUB/dry_run_failures"; echo "failed calling webhook" >&2; exit 1; fi
    echo clusterissuer.cert-manager.io/testbed-webhook-probe ;;
  *"get nodes -o jsonpath"*) cat "$STUB/nodes" ;;
  *"create secret generic"*)
    for a in "$@"; do case $a in --from-env-file=*) cat "${a#--from-env-file=}" >"$STUB/token_data" ;; esac; done
    echo "kind: Secret" ;;
  *"apply -f -"*) cat >>"$STUB/applied" ;;
  *"wait --for=condition=Available"*) exit "$(cat "$STUB/wait_exit")" ;;
  *"apply --server-side"*)
    dir=${!#}
    [ ! -f "$dir/kustomization.yaml" ] || cp "$dir/kustomization.yaml" "$STUB/last_kustomization"
    exit "$(cat "$STUB/apply_exit")" ;;
  *) ;;
esac
"""
STUB_CLOUD_INIT = """#!/usr/bin/env bash
exit "$(cat "$STUB/cloud_init_exit")"
"""
STUB_SLEEP = "#!/usr/bin/env bash\nexit 0\n"


@pytest.fixture
def stub(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("kubectl", STUB_KUBECTL), ("cloud-init", STUB_CLOUD_INIT), ("sleep", STUB_SLEEP)):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    state = {
        "health_exit": "0",
        "dry_run_failures": "0",
        "nodes": "",
        "cloud_init_exit": "0",
        "wait_exit": "0",
        "apply_exit": "0",
    }
    for name, value in state.items():
        (tmp_path / name).write_text(value)
    return tmp_path


def run(stub: Path, step: remote_script.RemoteStep, **overrides: str) -> subprocess.CompletedProcess:
    """Run a step's script as the control node would: its arguments as environment values, its
    secrets on stdin ahead of it, the library from this checkout, the stubs first on PATH."""
    environment = {k: str(v) for k, v in step.environment(step.args).items()}
    environment |= {
        "TESTBED_LIB": str(bootstrap.SCRIPTS_DIR / bootstrap.LIBRARY),
        "KUBECONFIG": str(stub / "kubeconfig"),
    }
    env = {**os.environ, **environment, **overrides, "PATH": f"{stub / 'bin'}:{os.environ['PATH']}", "STUB": str(stub)}
    return subprocess.run(
        ["bash", "-s"],
        input=remote_script.stdin_text(step.script, {k: str(v) for k, v in step.secrets.items()}),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def cert_manager_gate(timeout: int) -> remote_script.RemoteStep:
    step = webhook_gate.gate_step(cert_manager.webhook_probe(), cert_manager.webhook_health())
    return replace(step, args={**step.args, "TIMEOUT_SECONDS": str(timeout)})


def readiness_gate(timeout: int, region: str, *nodes: str) -> remote_script.RemoteStep:
    args = {"TIMEOUT_SECONDS": str(timeout), "REGION": region, "NODES": " ".join(nodes), "BOOTSTRAP_LOG": "/dev/null"}
    return remote_script.RemoteStep(readiness.READINESS_SCRIPT, args)


def test_webhook_gate_passes_on_an_empty_200_healthz_and_an_admitted_dry_run(stub):
    (stub / "dry_run_failures").write_text("2")  # the webhook needs a moment after Ready
    result = run(stub, cert_manager_gate(600))
    assert result.returncode == 0, result.stderr
    assert "webhook gate passed" in result.stdout
    assert json.loads((stub / "last_manifest").read_text()) == cert_manager.webhook_probe()
    calls = (stub / "calls").read_text()
    assert "get --raw /api/v1/namespaces/cert-manager/pods/cert-manager-webhook-abc:6080/proxy/healthz" in calls
    assert calls.count("create --dry-run=server") == 3


def test_webhook_gate_fails_when_healthz_never_answers(stub):
    (stub / "health_exit").write_text("1")
    result = run(stub, cert_manager_gate(0))
    assert result.returncode == 1
    assert "FAILED: webhook gate after 0s" in result.stderr and "did not answer 200" in result.stderr
    assert "create --dry-run" not in (stub / "calls").read_text()


def test_webhook_gate_fails_when_the_dry_run_is_never_admitted(stub):
    (stub / "dry_run_failures").write_text("99")
    result = run(stub, cert_manager_gate(0))
    assert result.returncode == 1 and "failed calling webhook" in result.stderr


def test_readiness_gate_passes_when_every_node_is_ready_and_cloud_init_degraded_counts(stub):
    (stub / "cloud_init_exit").write_text("2")
    (stub / "nodes").write_text("10.0.0.10 True\n10.0.0.20 True\n")
    result = run(stub, readiness_gate(600, "us-east-1", "10.0.0.10=i-0c", "10.0.0.20=i-0w"))
    assert result.returncode == 0, result.stderr
    assert "all 2 nodes Ready" in result.stdout


def test_readiness_gate_names_the_missing_node_and_how_to_read_its_log(stub):
    (stub / "nodes").write_text("10.0.0.10 True\n10.0.0.20 False\n")
    result = run(stub, readiness_gate(0, "eu-west-1", "10.0.0.10=i-0c", "10.0.0.20=i-0w", "10.0.0.21=i-0x"))
    assert result.returncode == 1
    assert "not Ready after 0s: 10.0.0.20 10.0.0.21" in result.stderr
    assert "aws ec2 get-console-output --region eu-west-1 --instance-id i-0w" in result.stderr
    assert "instance i-0c" not in result.stderr


def test_readiness_gate_fails_when_the_control_node_bootstrap_failed(stub):
    (stub / "cloud_init_exit").write_text("1")
    result = run(stub, readiness_gate(600, "us-east-1", "10.0.0.10=i-0c"))
    assert result.returncode == 1 and "cloud-init on the control node ended with status 1" in result.stderr


def test_metrics_api_wait_passes_once_the_apiservice_is_available_and_names_it_when_not(stub):
    step = keda.metrics_api_step()
    assert run(stub, step).returncode == 0
    assert (
        "wait --for=condition=Available --timeout=30s apiservice/v1beta1.external.metrics.k8s.io"
        in (stub / "calls").read_text()
    )
    (stub / "wait_exit").write_text("1")
    result = run(stub, replace(step, args={**step.args, "TIMEOUT_SECONDS": "0"}))
    assert result.returncode == 1
    assert "FAILED: apiservice/v1beta1.external.metrics.k8s.io not Available after 0s" in result.stderr


def test_training_operator_applies_the_pinned_overlay_and_waits_for_its_webhook(stub):
    step = training_operator.install_step("v1.8.1")
    (stub / "dry_run_failures").write_text("1")
    result = run(stub, step)
    assert result.returncode == 0, result.stderr
    calls = (stub / "calls").read_text()
    assert "apply --server-side --force-conflicts -k " in calls
    applied = yaml.safe_load((stub / "last_kustomization").read_text())
    assert applied["resources"] == [training_operator.overlay("v1.8.1")]
    (patch,) = applied["patches"]
    assert patch["target"] == {"kind": "Deployment", "name": "training-operator"}
    (op,) = yaml.safe_load(patch["patch"])
    assert op["path"] == "/spec/template/spec/containers/0/args"
    assert op["value"] == [f"--pytorch-init-container-max-tries={training_operator.INIT_CONTAINER_MAX_TRIES}"]
    assert "-n kubeflow rollout status deployment/training-operator --timeout=600s" in calls
    assert json.loads((stub / "last_manifest").read_text()) == training_operator.webhook_probe()


def test_training_operator_apply_gives_up_with_the_overlay_named(stub):
    (stub / "apply_exit").write_text("1")
    result = run(stub, training_operator.install_step("v1.8.1"))
    assert result.returncode == 1
    assert "FAILED: apply of github.com/kubeflow/training-operator.git" in result.stderr
    assert (stub / "calls").read_text().count("apply --server-side") == 5


def test_training_operator_delete_is_best_effort(stub):
    step = training_operator.install_step("v1.8.1")
    (stub / "apply_exit").write_text("1")
    result = run(stub, replace(step, args=step.delete_args))
    assert result.returncode == 0, result.stderr
    assert (
        f"delete -k {training_operator.overlay('v1.8.1')} --ignore-not-found --wait=false"
        in (stub / "calls").read_text()
    )


def test_a_step_without_its_arguments_stops_naming_the_missing_one(stub):
    step = keda.metrics_api_step()
    result = run(stub, replace(step, args={k: v for k, v in step.args.items() if k != "RESOURCE"}))
    assert result.returncode == 1 and "parameter RESOURCE is not set" in result.stderr


TOKEN = "abcdef.0123456789abcdef"


def test_join_token_is_registered_short_lived_never_as_an_argument_and_deleted_once_ready(stub):
    (stub / "kubeconfig").write_text("admin")
    (stub / "nodes").write_text("10.0.0.20 True\n")
    result = run(stub, cluster.join_token_step("10.0.0.20", TOKEN, "eu-west-1", "i-0w"))
    assert result.returncode == 0, result.stderr
    data = dict(line.split("=", 1) for line in (stub / "token_data").read_text().splitlines())
    assert data["token-id"] == "abcdef" and data["token-secret"] == "0123456789abcdef"
    assert data["usage-bootstrap-authentication"] == data["usage-bootstrap-signing"] == "true"
    assert data["auth-extra-groups"] == "system:bootstrappers:kubeadm:default-node-token"
    expires = datetime.datetime.fromisoformat(data["expiration"].replace("Z", "+00:00"))
    hours = (expires - datetime.datetime.now(datetime.UTC)).total_seconds() / 3600
    assert 1 < hours <= bootstrap.JOIN_TOKEN_TTL_SECONDS / 3600
    calls = (stub / "calls").read_text()
    assert "0123456789abcdef" not in calls + result.stdout + result.stderr
    assert "create secret generic bootstrap-token-abcdef --type=bootstrap.kubernetes.io/token" in calls
    assert calls.rstrip().endswith("kubectl -n kube-system delete secret bootstrap-token-abcdef --ignore-not-found")


def test_join_token_step_names_the_node_that_never_became_ready_and_keeps_the_token_to_expire(stub):
    (stub / "kubeconfig").write_text("admin")
    (stub / "nodes").write_text("10.0.0.20 False\n")  # the replaced worker's old Node, NotReady
    step = cluster.join_token_step("10.0.0.20", TOKEN, "eu-west-1", "i-0w")
    result = run(stub, replace(step, args={**step.args, "TIMEOUT_SECONDS": "0"}))
    assert result.returncode == 1
    assert "node 10.0.0.20 did not become Ready within 0s; its join token expires at" in result.stderr
    assert "aws ec2 get-console-output --region eu-west-1 --instance-id i-0w" in result.stderr
    assert "delete secret" not in (stub / "calls").read_text()


def test_ca_key_is_written_root_only_from_stdin(stub):
    key = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMG\n-----END PRIVATE KEY-----\n"
    result = run(stub, cluster.ca_key_step(key), TESTBED_ROOT=str(stub / "root"))
    assert result.returncode == 0, result.stderr
    written = stub / "root" / bootstrap.CA_KEY_FILE.lstrip("/")
    assert written.read_text() == key
    assert written.stat().st_mode & 0o777 == 0o600 and written.parent.stat().st_mode & 0o077 == 0
    assert key not in result.stdout + result.stderr


def test_readiness_gate_failure_quotes_the_bootstrap_log_without_tokens_or_keys(stub):
    log = stub / "bootstrap.log"
    log.write_text(
        f"kubeadm join --token {TOKEN}\n-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\nboom\n"
    )
    step = readiness_gate(0, "us-east-1", "10.0.0.20=i-0w")
    result = run(stub, replace(step, args={**step.args, "BOOTSTRAP_LOG": str(log)}))
    assert result.returncode == 1
    assert "kubeadm join --token [token]" in result.stderr and "[private key]" in result.stderr
    assert TOKEN not in result.stderr and "MIIE" not in result.stderr and "boom" in result.stderr

"""The gate scripts run against a stub kubectl (and cloud-init) on PATH: they pass only on
the evidence they claim to check, and fail with a message that says what is missing."""

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from components import bootstrap, cert_manager

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
    state = {"health_exit": "0", "dry_run_failures": "0", "nodes": "", "cloud_init_exit": "0"}
    for name, value in state.items():
        (tmp_path / name).write_text(value)
    return tmp_path


def run(stub: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{stub / 'bin'}:{os.environ['PATH']}", "STUB": str(stub)}
    return subprocess.run(
        ["bash", "-s", "--", *args], input=bootstrap.script(script), capture_output=True, text=True, env=env, timeout=60
    )


def cert_manager_gate_args(timeout: int) -> list[str]:
    health = cert_manager.webhook_health()
    return [
        str(timeout),
        json.dumps(cert_manager.webhook_probe()),
        health.namespace,
        health.label_selector,
        str(health.port),
        health.path,
    ]


def test_webhook_gate_passes_on_an_empty_200_healthz_and_an_admitted_dry_run(stub):
    (stub / "dry_run_failures").write_text("2")  # the webhook needs a moment after Ready
    result = run(stub, "wait-webhook.sh", *cert_manager_gate_args(600))
    assert result.returncode == 0, result.stderr
    assert "webhook gate passed" in result.stdout
    assert json.loads((stub / "last_manifest").read_text()) == cert_manager.webhook_probe()
    calls = (stub / "calls").read_text()
    assert "get --raw /api/v1/namespaces/cert-manager/pods/cert-manager-webhook-abc:6080/proxy/healthz" in calls
    assert calls.count("create --dry-run=server") == 3


def test_webhook_gate_fails_when_healthz_never_answers(stub):
    (stub / "health_exit").write_text("1")
    result = run(stub, "wait-webhook.sh", *cert_manager_gate_args(0))
    assert result.returncode == 1
    assert "webhook gate FAILED" in result.stderr and "did not answer 200" in result.stderr
    assert "create --dry-run" not in (stub / "calls").read_text()


def test_webhook_gate_fails_when_the_dry_run_is_never_admitted(stub):
    (stub / "dry_run_failures").write_text("99")
    result = run(stub, "wait-webhook.sh", *cert_manager_gate_args(0))
    assert result.returncode == 1 and "failed calling webhook" in result.stderr


def test_readiness_gate_passes_when_every_node_is_ready_and_cloud_init_degraded_counts(stub):
    (stub / "cloud_init_exit").write_text("2")
    (stub / "nodes").write_text("10.0.0.10 True\n10.0.0.20 True\n")
    result = run(stub, "wait-cluster-ready.sh", "600", "us-east-1", "10.0.0.10=i-0c", "10.0.0.20=i-0w")
    assert result.returncode == 0, result.stderr
    assert "all 2 nodes Ready" in result.stdout


def test_readiness_gate_names_the_missing_node_and_how_to_read_its_log(stub):
    (stub / "nodes").write_text("10.0.0.10 True\n10.0.0.20 False\n")
    result = run(stub, "wait-cluster-ready.sh", "0", "eu-west-1", "10.0.0.10=i-0c", "10.0.0.20=i-0w", "10.0.0.21=i-0x")
    assert result.returncode == 1
    assert "not Ready after 0s: 10.0.0.20 10.0.0.21" in result.stderr
    assert "aws ec2 get-console-output --region eu-west-1 --instance-id i-0w" in result.stderr
    assert "instance i-0c" not in result.stderr


def test_readiness_gate_fails_when_the_control_node_bootstrap_failed(stub):
    (stub / "cloud_init_exit").write_text("1")
    result = run(stub, "wait-cluster-ready.sh", "600", "us-east-1", "10.0.0.10=i-0c")
    assert result.returncode == 1 and "cloud-init on the control node ended with status 1" in result.stderr

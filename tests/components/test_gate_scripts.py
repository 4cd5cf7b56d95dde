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

from components import bootstrap, cert_manager, keda, remote_script, training_operator, webhook_gate
from components import readiness_gate as readiness
from core import host_layout, trusted_yaml
from stacks import cluster
from tests.components.test_bootstrap_idempotent import Sandbox, worker_user_data

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
# Each `cloud-init status` is one poll of the gate: after $STUB/control_fails_after of them the
# control node's bootstrap records the failure in $STUB/control_failed.
STUB_CLOUD_INIT = """#!/usr/bin/env bash
echo "cloud-init $*" >>"$STUB/calls"
if [ -f "$STUB/control_fails_after" ] && [ "$(grep -c '^cloud-init status$' "$STUB/calls")" -gt "$(cat "$STUB/control_fails_after")" ]; then
  cp "$STUB/control_failed" "$TESTBED_ROOT/var/log/testbed-bootstrap.status"
fi
exit "$(cat "$STUB/cloud_init_exit")"
"""
# ssh from the control node to a worker: its bootstrap status and log from $STUB/nodes.d/IP/
# (status; after fail_after reads, failed; log); no such directory: the worker does not answer.
# The key must be the stack's, in a root-only file.
STUB_SSH = r"""#!/usr/bin/env bash
echo "ssh $*" >>"$STUB/ssh_calls"
key=
while [ $# -gt 2 ]; do
  if [ "$1" = -i ]; then key=$2; fi
  shift
done
[ "$(stat -c %a "$key")" = 600 ] && cmp -s "$key" "$STUB/expected_key" || { echo "stub ssh: wrong key" >&2; exit 254; }
dir=$STUB/nodes.d/${1#*@}
[ -d "$dir" ] || { echo "ssh: connect to host ${1#*@} port 22: Connection timed out" >&2; exit 255; }
case $2 in
  "sudo cat /var/log/testbed-bootstrap.status")
    reads=$(($(cat "$dir/reads" 2>/dev/null || echo 0) + 1))
    echo "$reads" >"$dir/reads"
    if [ -f "$dir/fail_after" ] && [ "$reads" -gt "$(cat "$dir/fail_after")" ]; then cat "$dir/failed"; else cat "$dir/status"; fi ;;
  "sudo tail -n 20 /var/log/testbed-bootstrap.log") tail -n 20 "$dir/log" ;;
  *) echo "stub ssh: unexpected command $2" >&2; exit 2 ;;
esac
"""
# sleep returns at once and logs the pause. Past $STUB/max_sleeps pauses it stops its caller: a
# gate that would poll on to its deadline ends there instead of spinning until the run's timeout.
STUB_SLEEP = r"""#!/usr/bin/env bash
echo "sleep $*" >>"$STUB/sleeps"
if [ -f "$STUB/max_sleeps" ] && [ "$(wc -l <"$STUB/sleeps")" -gt "$(cat "$STUB/max_sleeps")" ]; then
  kill -TERM "$PPID"
fi
"""


@pytest.fixture
def stub(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (
        ("kubectl", STUB_KUBECTL),
        ("cloud-init", STUB_CLOUD_INIT),
        ("sleep", STUB_SLEEP),
        ("ssh", STUB_SSH),
    ):
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
    (tmp_path / "expected_key").write_text(SSH_KEY + "\n")
    (tmp_path / "calls").touch()
    (tmp_path / "sleeps").touch()
    (tmp_path / "root" / "var" / "log").mkdir(parents=True)
    (tmp_path / "tmp").mkdir()
    return tmp_path


def run(stub: Path, step: remote_script.RemoteStep, **overrides: str) -> subprocess.CompletedProcess:
    """Run a step's script as the control node would: its arguments as environment values, its
    secrets on stdin ahead of it, the library from this checkout, the stubs first on PATH."""
    environment = {k: str(v) for k, v in step.environment(step.args).items()}
    environment |= {
        "TESTBED_LIB": str(bootstrap.SCRIPTS_DIR / bootstrap.LIBRARY),
        "KUBECONFIG": str(stub / "kubeconfig"),
    }
    env = {
        **os.environ,
        **environment,
        "TESTBED_ROOT": str(stub / "root"),  # the control node's files
        "TMPDIR": str(stub / "tmp"),  # where the step keeps the SSH key
        **overrides,
        "PATH": f"{stub / 'bin'}:{os.environ['PATH']}",
        "STUB": str(stub),
    }
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


SSH_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----"
PUBLIC_IP = "203.0.113.10"
CONTROL_IP = "10.0.0.10"
WATCH = readiness.BootstrapWatch(PUBLIC_IP, CONTROL_IP, SSH_KEY)


def readiness_gate(timeout: int, region: str, *nodes: str) -> remote_script.RemoteStep:
    """The gate over nodes given as "IP=INSTANCE_ID", the control node at CONTROL_IP."""
    ips, ids = zip(*(n.split("=") for n in nodes), strict=True)
    return readiness.readiness_step(WATCH, region, ips, ids, timeout)


def worker(stub: Path, ip: str, status: str | None = None, log: str = "", fails_after: int | None = None) -> Path:
    """A worker that answers SSH; its bootstrap status (None: none yet), and a failure after that many reads."""
    d = stub / "nodes.d" / ip
    d.mkdir(parents=True)
    if status is not None:
        (d / "status").write_text(status)
    (d / "log").write_text(log)
    if fails_after is not None:
        (d / "fail_after").write_text(str(fails_after))
        (d / "failed").write_text(FAILED_AT_JOIN)
    return d


def control_status(stub: Path, status: str) -> None:
    (stub / "root" / host_layout.BOOTSTRAP_STATUS.lstrip("/")).write_text(status)


def recorded(state: str, script: str, step: str, exit_status: str = "", message: str = "") -> str:
    """A bootstrap status as testbed-lib.sh `record` writes it, running as SCRIPT at STEP."""
    lib = bootstrap.SCRIPTS_DIR / bootstrap.LIBRARY
    return subprocess.run(
        [
            "bash",
            "-c",
            f'. "{lib}"; STATUS_FILE=/dev/stdout STEP="$1" record "$2" "$3" "$4"',
            script,
            step,
            state,
            *(exit_status, message),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


SUCCEEDED = recorded("succeeded", "gpu-worker.sh", "images for the first slurmd pod and the example jobs")
RUNNING = recorded("running", "gpu-worker.sh", "NVIDIA 580-server driver")
FAILED_AT_JOIN = recorded(
    "failed",
    "gpu-worker.sh",
    "kubeadm join 10.0.0.10:6443 (retried until the control plane answers)",
    "1",
    "kubeadm join did not succeed",
)
TOKEN = "abcdef.0123456789abcdef"
# A bootstrap log whose last lines hold a token and a private key.
LOG = "".join(f"line {i}\n" for i in range(25)) + (
    f"kubeadm join --token {TOKEN}\n-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\nboom\n"
)


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
    applied = trusted_yaml.load((stub / "last_kustomization").read_text())
    assert applied["resources"] == [training_operator.overlay("v1.8.1")]
    (patch,) = applied["patches"]
    assert patch["target"] == {"kind": "Deployment", "name": "training-operator"}
    (op,) = trusted_yaml.load(patch["patch"])
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


def test_join_token_is_registered_short_lived_never_as_an_argument_and_deleted_once_ready(stub):
    (stub / "kubeconfig").write_text("admin")
    (stub / "nodes").write_text("10.0.0.20 True\n")
    worker(stub, "10.0.0.20", RUNNING)
    result = run(stub, cluster.join_token_step("10.0.0.20", TOKEN, "eu-west-1", "i-0w", WATCH))
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
    worker(stub, "10.0.0.20", RUNNING)
    step = cluster.join_token_step("10.0.0.20", TOKEN, "eu-west-1", "i-0w", WATCH)
    result = run(stub, replace(step, args={**step.args, "TIMEOUT_SECONDS": "0"}))
    assert result.returncode == 1
    assert "node 10.0.0.20 did not become Ready within 0s; its join token expires at" in result.stderr
    assert "aws ec2 get-console-output --region eu-west-1 --instance-id i-0w" in result.stderr
    assert "delete secret" not in (stub / "calls").read_text()


def test_ca_key_is_written_root_only_from_stdin(stub):
    key = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMG\n-----END PRIVATE KEY-----\n"
    result = run(stub, cluster.ca_key_step(key))
    assert result.returncode == 0, result.stderr
    written = stub / "root" / bootstrap.CA_KEY_FILE.lstrip("/")
    assert written.read_text() == key
    assert written.stat().st_mode & 0o777 == 0o600 and written.parent.stat().st_mode & 0o077 == 0
    assert key not in result.stdout + result.stderr


# ---------------------------------------------------------------- the readiness gate


def reads(stub: Path, ip: str) -> int:
    return int((stub / "nodes.d" / ip / "reads").read_text())


def assert_key_handled_privately(stub: Path, result: subprocess.CompletedProcess) -> None:
    """The key reached ssh only as a root-only file (the stub checks), which is gone after the step."""
    assert SSH_KEY.splitlines()[1] not in result.stdout + result.stderr + (stub / "ssh_calls").read_text()
    assert list((stub / "tmp").iterdir()) == []


def test_readiness_gate_passes_once_every_node_is_ready_with_its_bootstrap_done(stub):
    (stub / "cloud_init_exit").write_text("2")  # finished with recoverable errors: counts as done
    (stub / "nodes").write_text("10.0.0.10 True\n10.0.0.20 True\n10.0.0.21 True\n")
    control_status(stub, recorded("succeeded", "control-plane.sh", "admin kubeconfig for ubuntu"))
    worker(stub, "10.0.0.20", SUCCEEDED)
    worker(stub, "10.0.0.21")  # bootstrapped before nodes recorded a status: Ready is enough
    result = run(stub, readiness_gate(600, "us-east-1", "10.0.0.10=i-0c", "10.0.0.20=i-0w", "10.0.0.21=i-0x"))
    assert result.returncode == 0, result.stderr
    assert "all 3 nodes Ready, their bootstrap done" in result.stdout
    calls = (stub / "ssh_calls").read_text().splitlines()
    assert len(calls) == 2 and not [c for c in calls if "10.0.0.10" in c]  # the control node's own file is local
    for call, ip in zip(sorted(calls), ("10.0.0.20", "10.0.0.21"), strict=True):
        assert call.startswith("ssh -F /dev/null -i ") and " -o BatchMode=yes " in call
        assert call.endswith(f" ubuntu@{ip} sudo cat {host_layout.BOOTSTRAP_STATUS}")
    assert_key_handled_privately(stub, result)


def test_readiness_gate_waits_for_a_ready_worker_whose_bootstrap_still_runs(stub):
    """Ready is not done: the worker still pulls the first jobs' images after it joined."""
    (stub / "nodes").write_text("10.0.0.10 True\n10.0.0.20 True\n")
    control_status(stub, recorded("succeeded", "control-plane.sh", "admin kubeconfig for ubuntu"))
    worker(stub, "10.0.0.20", recorded("running", "gpu-worker.sh", "images for the first slurmd pod"))
    result = run(stub, readiness_gate(0, "us-east-1", "10.0.0.10=i-0c", "10.0.0.20=i-0w"))
    assert result.returncode == 1
    assert (
        'worker 10.0.0.20 (instance i-0w) is Ready; its bootstrap is still at gpu-worker.sh step "images'
        in result.stderr
    )
    assert "FAILED: readiness gate: not ready after 0s: 10.0.0.20" in result.stderr


def test_a_worker_whose_bootstrap_fails_stops_the_gate_at_once_with_step_log_tail_and_ssh_command(stub):
    (stub / "nodes").write_text("10.0.0.10 True\n")
    control_status(stub, recorded("succeeded", "control-plane.sh", "admin kubeconfig for ubuntu"))
    worker(stub, "10.0.0.20", RUNNING, log=LOG, fails_after=3)
    worker(stub, "10.0.0.21", RUNNING)  # still running: no reason to stop
    (stub / "max_sleeps").write_text("10")  # a gate that waits on for its 600 s deadline is stopped
    result = run(stub, readiness_gate(600, "us-east-1", "10.0.0.10=i-0c", "10.0.0.20=i-0w", "10.0.0.21=i-0x"))
    # the fourth poll, not the deadline: three pauses between them, none after
    assert reads(stub, "10.0.0.20") == 4 and (stub / "sleeps").read_text().splitlines() == ["sleep 10"] * 3
    assert result.returncode == 1
    step = "kubeadm join 10.0.0.10:6443 (retried until the control plane answers)"
    assert f'--- worker 10.0.0.20: bootstrap FAILED at gpu-worker.sh step "{step}" (exit 1, ' in result.stderr
    assert "): kubeadm join did not succeed\n" in result.stderr
    tail = result.stderr.split(f"--- last 20 lines of {host_layout.BOOTSTRAP_LOG} on worker 10.0.0.20")[1]
    tail = tail.split("--- reach it:")[0].splitlines()[1:]
    assert tail == [*(f"line {i}" for i in range(10, 25)), "kubeadm join --token [token]", "[private key]", "boom"]
    assert TOKEN not in result.stderr and "MIIE" not in result.stderr
    assert f"--- reach it: ssh -J ubuntu@{PUBLIC_IP} ubuntu@10.0.0.20\n" in result.stderr
    assert result.stderr.rstrip().endswith(
        f'FAILED: readiness gate: worker 10.0.0.20 failed its bootstrap at gpu-worker.sh step "{step}"'
    )
    assert "10.0.0.21" not in result.stderr
    assert_key_handled_privately(stub, result)


def test_a_control_node_whose_bootstrap_fails_stops_the_gate_at_once(stub):
    control_status(stub, recorded("running", "control-plane.sh", "kubeadm init"))
    (stub / "control_fails_after").write_text("2")
    (stub / "control_failed").write_text(
        recorded("failed", "control-plane.sh", "kubeadm init", "1", "control-plane.sh line 31: kubeadm init (exit 1)")
    )
    (stub / "root" / host_layout.BOOTSTRAP_LOG.lstrip("/")).write_text(LOG)
    worker(stub, "10.0.0.20", RUNNING)
    result = run(stub, readiness_gate(600, "us-east-1", "10.0.0.10=i-0c", "10.0.0.20=i-0w"))
    assert result.returncode == 1
    assert (stub / "calls").read_text().count("cloud-init status\n") == 3
    assert (
        '--- control node 10.0.0.10: bootstrap FAILED at control-plane.sh step "kubeadm init" (exit 1' in result.stderr
    )
    assert "kubeadm join --token [token]" in result.stderr and TOKEN not in result.stderr
    assert f"--- reach it: ssh ubuntu@{PUBLIC_IP}\n" in result.stderr
    assert (
        'FAILED: readiness gate: control node 10.0.0.10 failed its bootstrap at control-plane.sh step "kubeadm init"'
        in result.stderr
    )


def test_at_the_deadline_each_late_node_says_what_is_known_and_how_to_reach_it(stub):
    (stub / "nodes").write_text("10.0.0.10 True\n10.0.0.22 False\n10.0.0.23 False\n")
    control_status(stub, recorded("succeeded", "control-plane.sh", "admin kubeconfig for ubuntu"))
    # 10.0.0.20 does not answer SSH
    worker(stub, "10.0.0.21")
    worker(stub, "10.0.0.22", RUNNING)
    worker(stub, "10.0.0.23", SUCCEEDED)
    nodes = ("10.0.0.10=i-0c", "10.0.0.20=i-0a", "10.0.0.21=i-0b", "10.0.0.22=i-0d", "10.0.0.23=i-0e")
    result = run(stub, readiness_gate(0, "eu-west-1", *nodes))
    assert result.returncode == 1
    said = {line.split(" (instance")[0]: line for line in result.stderr.splitlines() if line.startswith("worker ")}
    assert said.keys() == {f"worker 10.0.0.2{i}" for i in range(4)}
    assert "is not Ready; it does not answer SSH from the control node." in said["worker 10.0.0.20"]
    assert "it has no bootstrap status: its bootstrap never started." in said["worker 10.0.0.21"]
    assert (
        'its bootstrap is still at gpu-worker.sh step "NVIDIA 580-server driver" (since 20' in said["worker 10.0.0.22"]
    )
    assert (
        "its bootstrap is done (20" in said["worker 10.0.0.23"] and "journalctl -u kubelet" in said["worker 10.0.0.23"]
    )
    for ip, instance in (("10.0.0.20", "i-0a"), ("10.0.0.23", "i-0e")):
        line = said[f"worker {ip}"]
        assert f"Reach it: ssh -J ubuntu@{PUBLIC_IP} ubuntu@{ip};" in line
        assert f"aws ec2 get-console-output --region eu-west-1 --instance-id {instance} --latest" in line
    assert "FAILED: readiness gate: not ready after 0s: 10.0.0.20 10.0.0.21 10.0.0.22 10.0.0.23" in result.stderr
    assert "instance i-0c" not in result.stderr


def test_readiness_gate_fails_when_cloud_init_failed_on_the_control_node(stub):
    (stub / "cloud_init_exit").write_text("1")
    result = run(stub, readiness_gate(600, "us-east-1", "10.0.0.10=i-0c"))
    assert result.returncode == 1 and "cloud-init on the control node ended with status 1" in result.stderr


def test_the_gate_reports_what_a_real_worker_bootstrap_recorded_when_kubeadm_join_failed(stub, tmp_path):
    """End to end: gpu-worker.sh fails in the sandbox; the gate reads what it recorded."""
    box = Sandbox(tmp_path / "worker", worker_user_data())
    box.fail("kubeadm join")
    assert box.run().returncode != 0
    status = box.read(host_layout.BOOTSTRAP_STATUS)
    worker(stub, "10.0.0.20", status, log=box.read(host_layout.BOOTSTRAP_LOG))
    control_status(stub, recorded("succeeded", "control-plane.sh", "admin kubeconfig for ubuntu"))
    result = run(stub, readiness_gate(600, "us-east-1", "10.0.0.10=i-0c", "10.0.0.20=i-0w"))
    assert result.returncode == 1
    step = 'gpu-worker.sh step "kubeadm join 10.0.0.10:6443 (retried until the control plane answers)"'
    assert f"FAILED: readiness gate: worker 10.0.0.20 failed its bootstrap at {step}" in result.stderr
    assert "kubeadm join did not succeed" in result.stderr and "gave up after 20 attempts: join" in result.stderr


# ---------------------------------------------------------------- the per-worker join-token wait


def test_join_token_step_stops_at_once_when_its_worker_fails_and_leaves_the_token_to_expire(stub):
    (stub / "kubeconfig").write_text("admin")
    (stub / "nodes").write_text("10.0.0.20 False\n")
    control_status(stub, recorded("succeeded", "control-plane.sh", "admin kubeconfig for ubuntu"))
    worker(stub, "10.0.0.20", RUNNING, log=LOG, fails_after=2)
    result = run(stub, cluster.join_token_step("10.0.0.20", TOKEN, "eu-west-1", "i-0w", WATCH))  # 45 min deadline
    assert result.returncode == 1 and reads(stub, "10.0.0.20") == 3
    assert (
        "FAILED: join token for 10.0.0.20: worker 10.0.0.20 failed its bootstrap at gpu-worker.sh step "
        '"kubeadm join 10.0.0.10:6443' in result.stderr
    )
    assert f"--- reach it: ssh -J ubuntu@{PUBLIC_IP} ubuntu@10.0.0.20\n" in result.stderr
    assert "kubeadm join --token [token]" in result.stderr and "0123456789abcdef" not in result.stderr
    assert "delete secret" not in (stub / "calls").read_text()
    assert_key_handled_privately(stub, result)


def test_join_token_step_stops_at_once_when_the_control_node_fails_before_the_api_answers(stub):
    control_status(stub, recorded("failed", "control-plane.sh", "kubeadm init", "1", "kubeadm init (exit 1)"))
    worker(stub, "10.0.0.20", RUNNING)
    result = run(stub, cluster.join_token_step("10.0.0.20", TOKEN, "eu-west-1", "i-0w", WATCH))
    assert result.returncode == 1
    assert (
        'FAILED: join token for 10.0.0.20: control node 10.0.0.10 failed its bootstrap at control-plane.sh step "kubeadm init"'
        in result.stderr
    )
    assert f"--- reach it: ssh ubuntu@{PUBLIC_IP}\n" in result.stderr
    assert "create secret" not in (stub / "calls").read_text()

"""The worker's joined step runs against a stub kubectl: it passes only once the worker's node is
registered, its kubelet heard from since the step started, Ready and, where the device plugin
runs, allocating its GPU; its failure names the worker and quotes no token."""

import os
import stat
import subprocess
from pathlib import Path

import pytest

from components import bootstrap, gpu_worker, remote_script

# Each answer is read from $STUB/<kind>.<n> for the n-th call of that kind (the last one repeats),
# so a test can play a node that appears, a lease that is renewed, a plugin that starts.
STUB_KUBECTL = r"""#!/usr/bin/env bash
echo "kubectl $*" >>"$STUB/calls"
answer() {
  local n=$(( $(cat "$STUB/$1.count" 2>/dev/null || echo 0) + 1 ))
  echo "$n" >"$STUB/$1.count"
  while [ "$n" -gt 1 ] && [ ! -f "$STUB/$1.$n" ]; do n=$((n - 1)); done
  cat "$STUB/$1.$n" 2>/dev/null || true
}
case "$*" in
  *"get --raw=/readyz"*) exit 0 ;;
  *"get nodes -o jsonpath"*) answer nodes ;;
  *"get lease"*) answer lease ;;
  *"get daemonsets"*) answer daemonsets ;;
  *"get node "*) answer conditions ;;
esac
"""
WORKER, IP, INSTANCE = "testbed-worker-1", "10.0.1.11", "i-0new"
TOKEN = "abcdef.0123456789abcdef"


@pytest.fixture
def stub(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("kubectl", STUB_KUBECTL), ("sleep", "#!/usr/bin/env bash\nexit 0\n")):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "kubeconfig").write_text("admin")
    return tmp_path


def answers(stub: Path, kind: str, *texts: str) -> None:
    for n, text in enumerate(texts, start=1):
        (stub / f"{kind}.{n}").write_text(text)


def run(stub: Path, timeout: int) -> subprocess.CompletedProcess:
    """The step as the control node runs it: arguments as environment values, this checkout's library."""
    step = gpu_worker.joined_step(WORKER, IP, INSTANCE, "g4dn.xlarge", "eu-west-1")
    environment = {k: str(v) for k, v in step.environment(step.args).items()} | {
        "TIMEOUT_SECONDS": str(timeout),
        "TESTBED_LIB": str(bootstrap.SCRIPTS_DIR / bootstrap.LIBRARY),
        "KUBECONFIG": str(stub / "kubeconfig"),
    }
    env = {**os.environ, **environment, "PATH": f"{stub / 'bin'}:{os.environ['PATH']}", "STUB": str(stub)}
    return subprocess.run(
        ["bash", "-s"], input=remote_script.stdin_text(step.script, {}), capture_output=True, text=True, env=env
    )


def node(ready: str = "True", gpus: str = "") -> str:
    """One line of the stub's node list: the worker's node and another one."""
    return f"ip-10-0-1-11 {IP} {ready} {gpus}\nip-10-0-1-12 10.0.1.12 True 1\n"


def test_a_new_worker_passes_once_its_node_appears_ready_in_a_cluster_without_the_device_plugin(stub):
    answers(stub, "nodes", "", "", node("False"), node())  # not registered at the start: a first boot
    answers(stub, "lease", "2026-01-01T00:00:10.000001Z", "2026-01-01T00:00:20.000002Z")
    result = run(stub, 600)
    assert result.returncode == 0, result.stderr
    assert f"worker {WORKER} ({IP}, instance {INSTANCE}) joined as node ip-10-0-1-11" in result.stdout
    assert "get daemonsets" in (stub / "calls").read_text()  # it asked whether to wait for the GPU


def test_the_old_nodes_last_status_does_not_count_until_a_kubelet_renews_its_lease(stub):
    # the replaced instance's Node: still Ready with its GPU, its lease never renewed again
    answers(stub, "nodes", node(gpus="1"))
    answers(stub, "lease", "2026-01-01T00:00:10.000001Z")
    result = run(stub, 0)
    assert result.returncode == 1
    assert (
        f"FAILED: worker {WORKER} ({IP}, instance {INSTANCE}) did not rejoin within 0s: node ip-10-0-1-11: "
        "no kubelet has renewed its lease since this step started"
    ) in result.stderr
    assert "workers after it were not replaced, run pulumi up again" in result.stderr
    assert f"aws ec2 get-console-output --region eu-west-1 --instance-id {INSTANCE}" in result.stderr
    # once the new kubelet renews it, the same status passes
    answers(stub, "lease", "2026-01-01T00:00:10.000001Z", "2026-01-01T00:00:10.000001Z", "2026-01-01T00:09:00.5Z")
    (stub / "lease.count").unlink()
    assert run(stub, 600).returncode == 0


def test_where_the_device_plugin_runs_the_gpu_must_be_allocatable(stub):
    answers(stub, "daemonsets", "daemonset.apps/nvidia-device-plugin\n")
    answers(stub, "lease", "", "2026-01-01T00:00:10.000001Z", "2026-01-01T00:00:20.000002Z")
    answers(stub, "nodes", node(gpus="0"))
    result = run(stub, 0)
    assert result.returncode == 1
    assert (
        "node ip-10-0-1-11 is Ready but has 0 allocatable nvidia.com/gpu, 1 expected "
        "(the device plugin runs in namespace nvidia-device-plugin)"
    ) in result.stderr
    answers(stub, "nodes", node(gpus="0"), node(gpus="0"), node(gpus="1"))
    for count in stub.glob("*.count"):
        count.unlink()
    result = run(stub, 600)
    assert result.returncode == 0, result.stderr


def test_a_node_that_is_not_ready_is_named_with_its_conditions_and_no_token(stub):
    answers(stub, "nodes", node("False"))
    answers(stub, "lease", "", "2026-01-01T00:00:10.000001Z")
    answers(stub, "conditions", f"Ready=False KubeletNotReady: bootstrap with {TOKEN} failed\n")
    result = run(stub, 0)
    assert result.returncode == 1
    assert "did not rejoin within 0s: node ip-10-0-1-11 is not Ready (Ready=False)" in result.stderr
    assert "Ready=False KubeletNotReady: bootstrap with [token] failed" in result.stderr
    assert TOKEN not in result.stderr + result.stdout


def test_a_worker_that_never_registers_is_named(stub):
    answers(stub, "nodes", "ip-10-0-1-12 10.0.1.12 True 1\n")
    result = run(stub, 0)
    assert result.returncode == 1
    assert f"did not rejoin within 0s: no node with InternalIP {IP} is registered" in result.stderr

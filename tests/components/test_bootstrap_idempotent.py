"""The node bootstrap scripts, run for real against stub system commands, twice.

Each test builds a sandbox: the files cloud-init writes (taken from the rendered user-data)
under a root directory the scripts reach through TESTBED_ROOT, and stub commands (bash runs
them for the commands it does not find on PATH: stub_handler) that log their calls and emulate
just enough state (kubeadm init writes admin.conf, the driver install makes nvidia-smi work,
mount makes mountpoint true). Only a few real tools (bash, grep, cat, ...) are on PATH, so a
system command without a stub fails the run instead of touching the host; the tools that write
files (sed, install, touch, chmod) are stubs that refuse paths outside the sandbox.

Idempotency is the scripts' own: a second run must not init or join again, fetch keys again
or duplicate a repository, export or fstab line, and must leave every file as the first run
left it. A failing step must stop the run with a FAILED line that names it.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from components import bootstrap
from core import host_layout, settings, trusted_yaml
from stacks.offline import placeholder_host_key, placeholder_key_pem
from tests.conftest import config

S = settings.load(config(), offline=True)
# one worker runs the module, so the runs its tests share (`clean_runs`, `shared_run`) are made once
pytestmark = pytest.mark.xdist_group("bootstrap-sandbox")
PAUSE = "registry.k8s.io/pause:3.10.1"
KERNEL = "6.8.0-1015-aws"
ALWAYS = 1_000_000
PREPULL = ("ghcr.io/slinkyproject/slurmd:25.11.6-ubuntu24.04", "alpine:3.10")
NODE_SCRIPTS = ("testbed-lib.sh", "node-common.sh", "control-plane.sh", "gpu-worker.sh")
K8S_LIST = "/etc/apt/sources.list.d/kubernetes.list"
TOOLKIT_LIST = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
DCGM_LIST = "/etc/apt/sources.list.d/cuda-dcgm.list"
CUDA_REPO = "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64"
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
# What the driver install leaves installed (nvidia-graphics-drivers-<branch>-server binaries).
DRIVER_PACKAGES = " ".join(
    f"{name}-{S.nvidia_driver_branch}-server{suffix}"
    for name, suffix in (("nvidia-headless", "-open"), ("nvidia-utils", ""), ("libnvidia-compute", ""))
)
FSTAB = "LABEL=cloudimg-rootfs\t/\text4\tdiscard,commit=30,errors=remount-ro\t0 1\n/swapfile none swap sw 0 0\n"

# What `containerd --version` and `containerd config default` print, per major version.
CONTAINERD = {
    "1.7": (
        "containerd github.com/containerd/containerd 1.7.28 b98a3aace656320842a23f4a392a33f46af97866",
        """version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.8"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
""",
        f'    sandbox_image = "{PAUSE}"',
    ),
    "2.x": (
        "containerd github.com/containerd/containerd/v2 v2.1.4 75cb2b7193e4e490e9fbdc236c0e811ccaba3376",
        """version = 3

[plugins]
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = 'registry.k8s.io/pause:3.10'
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      SystemdCgroup = false
""",
        f"    sandbox = '{PAUSE}'",
    ),
}

# What every stub may use (stub_handler): `called`, which each stub (STUBS) runs first, logs
# the call and fails it if a rule in $STUB_FAILS says so ("N PREFIX": the first N calls
# starting with PREFIX fail); `guard` refuses a path outside the sandbox.
STUB_FUNCTIONS = r"""called() {
  local call="$stub $*" times prefix seen line
  printf '%s\n' "$call" >>"$STUB_CALLS"
  [ -f "$STUB_FAILS" ] || return 0
  while read -r times prefix; do
    case $call in "$prefix"*) ;; *) continue ;; esac
    seen=0
    while IFS= read -r line; do
      case $line in "$prefix"*) seen=$((seen + 1)) ;; esac
    done <"$STUB_CALLS"
    if [ "$seen" -le "$times" ]; then
      echo "stub: $call fails (injected)" >&2
      exit 1
    fi
  done <"$STUB_FAILS"
}
guard() {
  local p
  for p in "$@"; do
    case $p in
      /dev/null | "$TESTBED_ROOT"/*) ;;
      /*) echo "stub: $p is outside the sandbox $TESTBED_ROOT" >&2; exit 97 ;;
    esac
  done
}
option() {  # option FLAG ARGS...: the value after FLAG
  local flag=$1
  shift
  while [ $# -gt 1 ]; do
    if [ "$1" = "$flag" ]; then printf '%s' "$2"; return; fi
    shift
  done
}
"""

STUBS = {
    # Commands whose effect the tests read from the calls log only.
    **{
        name: ""
        for name in ("apt-mark", "modprobe", "sysctl", "swapoff", "systemctl", "exportfs", "nvidia-ctk", "sleep")
    },
    "apt-get": """case " $* " in *" nvidia-headless-"*) : >"$STUB_STATE/driver-installed" ;; esac
case " $* " in *" containerd "*) : >"$STUB_STATE/containerd-installed" ;; esac
""",
    # `dpkg-query -W -f FORMAT PATTERN`: what the apt-get stub installed, as dpkg reports it.
    "dpkg-query": f"""case "${{*: -1}}" in
  containerd) [ -f "$STUB_STATE/containerd-installed" ] && echo "installed containerd" ;;
  *-server\\*) [ -f "$STUB_STATE/driver-installed" ] && printf 'installed %s\\n' {DRIVER_PACKAGES} ;;
esac || {{ echo "dpkg-query: no packages found matching ${{*: -1}}" >&2; exit 1; }}
""",
    "uname": f"""[ "${{1:-}}" = -r ] && echo {KERNEL}
""",
    # crictl: an image is present once pulled (state per image, so a second run pulls nothing).
    "crictl": """image=${!#}
mark=${image//:/_}
mark=${mark//"/"/_}
mark="$STUB_STATE/image-$mark"
case " $* " in
  *" inspecti "*) [ -f "$mark" ] ;;
  *" pull "*) : >"$mark" ;;
  *) exit 2 ;;
esac
""",
    "curl": """out=$(option -o "$@")
guard "$out"
echo "key downloaded by the curl stub" >"$out"
""",
    "gpg": """out=$(option -o "$@")
guard "$out"
echo "keyring written by the gpg stub" >"$out"
""",
    "containerd": """case "$*" in
  --version) cat "$STUB_STATE/containerd-version" ;;
  "config default") cat "$STUB_STATE/containerd-default.toml" ;;
  *) exit 2 ;;
esac
""",
    "kubeadm": f"""kube=$TESTBED_ROOT/etc/kubernetes
case "$1" in
  config) printf '%s\\n' registry.k8s.io/kube-apiserver:v{S.kubernetes_version} \\
            registry.k8s.io/coredns/coredns:v1.12.1 {PAUSE} registry.k8s.io/etcd:3.6.4-0 ;;
  init | join)
    config=$(option --config "$@")
    [ -f "$config" ] || {{ echo "stub kubeadm: no config at $config" >&2; exit 2; }}
    mkdir -p "$kube"
    if [ "$1" = init ]; then echo admin >"$kube/admin.conf"; else echo kubelet >"$kube/kubelet.conf"; fi ;;
  reset) rm -f "$kube/kubelet.conf" ;;
  *) exit 2 ;;
esac
""",
    # kubectl reads KUBECONFIG from its environment: exported, not only set (see stub_handler)
    "kubectl": """case "$*" in
  get\\ --raw=/readyz) [[ -f ${KUBECONFIG:-} && ${KUBECONFIG@a} = *x* ]] || { echo "stub kubectl: no kubeconfig" >&2; exit 1; } ;;
esac
""",
    # dcgmi diag: a passing level-1 report, or the injected failure (STUB_FAILS) with its exit status.
    "dcgmi": """echo "| Deployment | Pass |"
""",
    "nvidia-smi": """[ -f "$STUB_STATE/driver-installed" ] || { echo "NVIDIA-SMI has failed: no driver" >&2; exit 9; }
echo "GPU 0: NVIDIA A10G (UUID: GPU-00000000-0000-0000-0000-000000000000)"
""",
    "mountpoint": """[ -f "$STUB_STATE/mounted" ]
""",
    "mount": """guard "$@"
: >"$STUB_STATE/mounted"
""",
    # Real file tools, confined to the sandbox; install drops -o/-g (chown needs root).
    "install": """args=()
while [ $# -gt 0 ]; do
  case $1 in -o | -g) shift 2 ;; *) args+=("$1"); shift ;; esac
done
guard "${args[@]}"
exec {install} "${args[@]}"
""",
    "sed": """guard "${@: -1}"
exec {sed} "$@"
""",
    "touch": """guard "$@"
exec {touch} "$@"
""",
    "chmod": """guard "${@: -1}"
exec {chmod} "$@"
""",
}
# where cloud-init's ssh module leaves the host key, and the serial console (control-plane.sh)
HOST_KEY_FILE = "/etc/ssh/ssh_host_ed25519_key.pub"
CONSOLE = "/dev/console"
REAL_TOOLS = ("bash", "env", "cat", "cut", "dirname", "grep", "mkdir", "rm", "tee")
CONFINED_TOOLS = ("install", "sed", "touch", "chmod")  # stubs that run the real tool on sandbox paths


def stub_handler(stubs: dict[str, str]) -> dict[str, str]:
    """The stubs as one bash function, command_not_found_handle, in the environment entry
    `export -f` writes (bash 5.2 variables.c: BASH_FUNC_<name>%%), which every shell the run starts
    inherits. Bash runs it for a command that is neither a function nor on PATH, in a forked
    child, with the command's words; its exit status is the command's (bash(1), COMMAND
    EXECUTION). So a stub is a command to the scripts, as a program on PATH is (its exit status,
    $BASH_COMMAND and the line the scripts' ERR trap reports), for a fork instead of a new bash,
    and starts as a program does, without the scripts' errexit, pipefail and ERR trap. Unlike a
    program it sees the scripts' unexported variables: a stub reads only its own STUB_*, and
    TESTBED_ROOT and KUBECONFIG, which the kubectl stub checks is exported. A command without a
    stub fails as bash fails it: not found, exit 127; so does a stubbed one that env, xargs,
    timeout, sudo or exec would start (the scripts start none so), as bash does not look it up."""
    cases = "".join(f"{name})\n{code}\n;;\n" for name, code in stubs.items())
    missing = """*) echo "$stub: command not found (no stub)" >&2; exit 127 ;;\n"""
    start = f"set +eE +o pipefail\ntrap - ERR\nset -u\nstub=$1\nshift\n{STUB_FUNCTIONS}"
    return {"BASH_FUNC_command_not_found_handle%%": f"() {{\n{start}case $stub in\n{cases}{missing}esac\n}}"}


def redirect_targets_outside_root(text: str) -> list[str]:
    """Literal absolute paths a script redirects into: each must be /dev/null ("${ROOT}/..." otherwise)."""
    return [t for t in re.findall(r"\d?>>?\s*[\"']?(/[^\s;|&)\"']*)", text) if t != "/dev/null"]


@functools.cache  # rendered once: the user data is the same for every test
def control_user_data() -> str:
    return bootstrap.control_plane_user_data(
        bootstrap.ControlPlaneBootstrap(
            kubernetes_version=S.kubernetes_version,
            kubernetes_minor=S.kubernetes_minor,
            flannel_version=S.flannel_version,
            private_ip=S.control_private_ip,
            public_ip="198.51.100.7",
            share_export_cidr=S.subnet_cidr,
            bootstrap_token="abcdef.0123456789abcdef",
            ca_cert_pem="-----BEGIN CERTIFICATE-----\nstub\n-----END CERTIFICATE-----\n",
        )
    )


@functools.cache
def worker_user_data() -> str:
    _, public_pem, _ = placeholder_key_pem("idempotency-ca")
    return bootstrap.gpu_worker_user_data(
        bootstrap.WorkerBootstrap(
            kubernetes_version=S.kubernetes_version,
            kubernetes_minor=S.kubernetes_minor,
            nvidia_driver_branch=S.nvidia_driver_branch,
            nvidia_container_toolkit_version=S.nvidia_container_toolkit_version,
            control_plane_ip=S.control_private_ip,
            bootstrap_token="abcdef.0123456789abcdef",
            ca_cert_hash=bootstrap.discovery_token_ca_cert_hash(public_pem),
            prepull_images=PREPULL,
        )
    )


@functools.cache  # parsed once for each user data; only read
def cloud_config(user_data: str) -> dict:
    return trusted_yaml.load(user_data)


USER_DATA = {"control": control_user_data, "worker": worker_user_data}


@dataclass
class Run:
    returncode: int
    output: str
    calls: list[str]

    def failed_lines(self) -> list[str]:
        return [line for line in self.output.splitlines() if "testbed: FAILED:" in line]


def count(calls: list[str], prefix: str) -> int:
    return sum(c.startswith(prefix) for c in calls)


class Sandbox:
    def __init__(self, base: Path, user_data: str, containerd: str = "2.x"):
        self.base, self.root = base, base / "root"
        self.tools, self.state = base / "tools", base / "state"
        self.calls_log, self.fails = base / "calls.log", base / "fails"
        for d in (self.tools, self.state):
            d.mkdir(parents=True)
        self.calls_log.touch()
        self._stubs()
        # The image: what Ubuntu and its packages provide before the scripts run.
        for d in (
            "etc/modules-load.d",
            "etc/sysctl.d",
            "etc/apt/sources.list.d",
            "etc/apt/preferences.d",
            "usr/share/keyrings",
            "tmp",
            "home/ubuntu",
            "var/log",
            "dev",
        ):
            (self.root / d).mkdir(parents=True)
        self.write("/etc/fstab", FSTAB)
        # cloud-init's ssh module generates the host keys before runcmd; the serial console
        self.write(HOST_KEY_FILE, f"{placeholder_host_key('idempotency')} root@control\n")
        self.write(CONSOLE, "")
        version, default_config, _ = CONTAINERD[containerd]
        (self.state / "containerd-version").write_text(version + "\n")
        (self.state / "containerd-default.toml").write_text(default_config)
        # What cloud-init writes, then the command it runs, pointed at the sandbox.
        doc = cloud_config(user_data)
        for f in doc["write_files"]:
            self.write(f["path"], bootstrap.file_text(f)).chmod(int(f["permissions"], 8))
        bash_c = doc["runcmd"][0]
        assert bash_c[:2] == ["bash", "-c"] and bootstrap.NODE_SCRIPT_DIR in bash_c[2]
        self.command = [
            self.tools / "bash",
            "-c",
            bash_c[2]
            .replace(bootstrap.NODE_SCRIPT_DIR, f"{self.root}{bootstrap.NODE_SCRIPT_DIR}")
            .replace(host_layout.BOOTSTRAP_LOG, f"{self.root}{host_layout.BOOTSTRAP_LOG}"),
        ]
        # What deliver-ca-key.sh hands the control node over SSH before kubeadm init.
        if "control-plane.sh" in bash_c[2]:
            self.write(bootstrap.CA_KEY_FILE, placeholder_key_pem("idempotency-ca")[0]).chmod(0o600)
        # Confinement relies on this: a literal path redirect would write to the host.
        for name in NODE_SCRIPTS:
            assert not redirect_targets_outside_root(bootstrap.script(name)), name

    def _stubs(self) -> None:
        """The real tools on PATH; the stubs, which stub_handler hands the run."""
        real = {name: shutil.which(name) for name in (*REAL_TOOLS, *CONFINED_TOOLS)}
        assert all(real.values()), real
        for name in REAL_TOOLS:
            (self.tools / name).symlink_to(real[name])
        # name -> the stub's code; a test may replace one
        self.stubs = {
            name: 'called "$@"\n' + (body.replace("{" + name + "}", real[name]) if name in CONFINED_TOOLS else body)
            for name, body in STUBS.items()
        }

    def path(self, host_path: str) -> Path:
        return self.root / host_path.lstrip("/")

    def write(self, host_path: str, content: str) -> Path:
        p = self.path(host_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
        return p

    def read(self, host_path: str) -> str:
        return self.path(host_path).read_text()

    def leave_out_parameter(self, name: str) -> None:
        """bootstrap.env without NAME, which it has."""
        env = self.read(bootstrap.ENV_FILE)
        assert f"\n{name}=" in "\n" + env
        self.write(
            bootstrap.ENV_FILE, "".join(line for line in env.splitlines(True) if not line.startswith(f"{name}="))
        )

    def fail(self, prefix: str, times: int = ALWAYS) -> None:
        with self.fails.open("a") as f:
            f.write(f"{times} {prefix}\n")

    def snapshot(self) -> dict[str, bytes]:
        """Every file under the root but the bootstrap log, which each run appends to, and the
        bootstrap status, which each run rewrites with its time, by design."""
        moving = (self.path(host_layout.BOOTSTRAP_LOG), self.path(host_layout.BOOTSTRAP_STATUS))
        return {
            str(p.relative_to(self.root)): p.read_bytes()
            for p in sorted(self.root.rglob("*"))
            if p.is_file() and p not in moving
        }

    def log_setup(self) -> list[str]:
        """The calls that make the bootstrap log root-only before anything writes to it."""
        log = self.path(host_layout.BOOTSTRAP_LOG)
        return [f"touch {log}", f"chmod 0600 {log}"]

    def run(self) -> Run:
        before = len(self.calls_log.read_text().splitlines())
        env = {
            "PATH": str(self.tools),
            "TESTBED_ROOT": str(self.root),
            "HOME": str(self.base),
            "LC_ALL": "C",
            "STUB_CALLS": str(self.calls_log),
            "STUB_FAILS": str(self.fails),
            "STUB_STATE": str(self.state),
            **stub_handler(self.stubs),
        }
        try:
            done = subprocess.run(self.command, env=env, cwd=self.base, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:  # a clean run takes about a second: this is a hang, not slowness
            pytest.fail("the node scripts hung for 60 s: a real sleep or wait outside the stubs?")
        calls = self.calls_log.read_text().splitlines()[before:]
        return Run(done.returncode, done.stdout + done.stderr, calls)


def succeeded(run: Run) -> Run:
    assert run.returncode == 0, run.output
    assert not run.failed_lines(), run.output
    return run


def lines(text: str) -> list[str]:
    return text.splitlines()


def recorded_status(box: Sandbox) -> dict[str, str]:
    path = box.path(host_layout.BOOTSTRAP_STATUS)
    assert path.stat().st_mode & 0o777 == 0o600  # root-only, like the log beside it
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


@dataclass
class TwoRuns:
    """Two clean runs on one fresh sandbox: the first, what it left, the second."""

    box: Sandbox  # as the second run left it
    first: Run
    after_first: dict[str, bytes]  # snapshot()
    first_status: dict[str, str]  # recorded_status()
    second: Run


@pytest.fixture(scope="module")
def clean_runs(tmp_path_factory) -> Callable[..., TwoRuns]:
    """A role's two clean runs for a containerd version (2.x unless named), made once and shared
    by the tests that only read them: tests must not change the sandbox. Its files are the first
    run's but for the bootstrap log and status (the second-run tests assert it)."""
    made: dict[tuple[str, str], TwoRuns] = {}

    def runs(role: str, containerd: str = "2.x") -> TwoRuns:
        if (role, containerd) not in made:
            box = Sandbox(tmp_path_factory.mktemp(f"clean-{role}"), USER_DATA[role](), containerd)
            first = succeeded(box.run())
            after_first, first_status = box.snapshot(), recorded_status(box)
            made[role, containerd] = TwoRuns(box, first, after_first, first_status, succeeded(box.run()))
        return made[role, containerd]

    return runs


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory) -> Callable[..., tuple[Sandbox, Run]]:
    """A run on a fresh sandbox for the user data in which every command starting with `failing`
    fails, or bootstrap.env lacks the parameter `missing`: made once for each, shared by the tests
    that only read it (the run, the files): tests must not change the sandbox."""
    made: dict[tuple[Callable[[], str], str, str], tuple[Sandbox, Run]] = {}

    def run(user_data: Callable[[], str], *, failing: str = "", missing: str = "") -> tuple[Sandbox, Run]:
        if (user_data, failing, missing) not in made:
            box = Sandbox(tmp_path_factory.mktemp("shared"), user_data())
            if failing:
                box.fail(failing)
            if missing:
                box.leave_out_parameter(missing)
            made[user_data, failing, missing] = box, box.run()
        return made[user_data, failing, missing]

    return run


@pytest.mark.parametrize("containerd", sorted(CONTAINERD))
def test_control_node_second_run_does_not_initialise_again(clean_runs, containerd):
    runs = clean_runs("control", containerd)
    box, first, second = runs.box, runs.first, runs.second

    assert count(first.calls, "kubeadm init ") == 1 and count(second.calls, "kubeadm init") == 0
    assert "kubeadm init already done" in second.output
    assert count(first.calls, "curl ") == 1 and count(first.calls, "gpg ") == 1
    assert count(second.calls, "curl ") == 0 and count(second.calls, "gpg ") == 0  # keyring kept
    assert lines(box.read(K8S_LIST)) == [
        f"deb [signed-by=/etc/apt/keyrings/kubernetes-apt-keyring.gpg] "
        f"https://pkgs.k8s.io/core:/stable:/v{S.kubernetes_minor}/deb/ /"
    ]
    assert lines(box.read("/etc/exports.d/testbed.exports")) == [
        f"{host_layout.SHARE_DIR} {S.subnet_cidr}(rw,sync,no_subtree_check,root_squash)"
    ]
    assert box.path(host_layout.SLURM_STATE_DIR).is_dir()
    uid = host_layout.SLURM_UID
    assert f"install -d -m 0750 -o {uid} -g {uid} {box.path(host_layout.SLURM_STATE_DIR)}" in second.calls
    assert box.path(host_layout.SHARE_DIR).is_dir()
    assert box.read("/home/ubuntu/.kube/config") == "admin\n"
    assert lines(box.read("/etc/fstab")) == [FSTAB.splitlines()[0], "#/swapfile none swap sw 0 0"]
    containerd_config = box.read(CONTAINERD_CONFIG)
    assert "SystemdCgroup = true" in containerd_config and "SystemdCgroup = false" not in containerd_config
    assert CONTAINERD[containerd][2] in lines(containerd_config)
    assert box.snapshot() == runs.after_first


@pytest.mark.parametrize("containerd", sorted(CONTAINERD))
def test_gpu_worker_second_run_does_not_join_again(clean_runs, containerd):
    runs = clean_runs("worker", containerd)
    box, first, second = runs.box, runs.first, runs.second

    assert count(first.calls, "kubeadm join ") == 1 and count(second.calls, "kubeadm join") == 0
    assert "already joined" in second.output
    assert count(first.calls, "kubeadm reset") == 0
    driver = f"nvidia-headless-{S.nvidia_driver_branch}-server-open"
    installs = [[c for c in run.calls if c.startswith("apt-get") and driver in c] for run in (first, second)]
    assert len(installs[0]) == 1 and not installs[1]
    assert (
        f"apt-get -o DPkg::Lock::Timeout=600 -y install linux-headers-{KERNEL} {driver}"
        f" nvidia-utils-{S.nvidia_driver_branch}-server" in first.calls
    )
    assert count(first.calls, "modprobe nvidia") == 1 and count(second.calls, "modprobe nvidia") == 0
    assert count(first.calls, "curl ") == 3 and count(second.calls, "curl ") == 0  # the three keyrings kept
    assert lines(box.read(TOOLKIT_LIST)) == [
        "deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] "
        "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /"
    ]
    assert len(lines(box.read(K8S_LIST))) == 1
    # DCGM from NVIDIA's CUDA repository, its other packages never preferred over Ubuntu's; the
    # diagnostic runs once, before the join, with the host engine up only around it
    assert lines(box.read(DCGM_LIST)) == [
        f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {CUDA_REPO}/ /"
    ]
    assert "Pin-Priority: 100" in lines(box.read("/etc/apt/preferences.d/cuda-dcgm.pref"))
    dcgm = [f"datacenter-gpu-manager-4-{p}=1:4.4.2-1" for p in ("core", "proprietary", "cuda13", "proprietary-cuda13")]
    assert f"apt-get -o DPkg::Lock::Timeout=600 -y install {' '.join(dcgm)}" in first.calls
    diag = ["systemctl start nvidia-dcgm", "dcgmi diag -r 1", "systemctl stop nvidia-dcgm"]
    assert [c for c in first.calls if c in diag] == diag and not [c for c in second.calls if c in diag]
    assert first.calls.index("dcgmi diag -r 1") < first.calls.index(
        next(c for c in first.calls if c.startswith("kubeadm join"))
    )
    nfs = [line for line in lines(box.read("/etc/fstab")) if " nfs4 " in line]
    assert nfs == [
        f"{S.control_private_ip}:{host_layout.SHARE_DIR} {host_layout.SHARE_DIR} nfs4 "
        "rw,_netdev,nofail,timeo=600,retrans=5 0 0"
    ]
    assert count(first.calls, "mount ") == 1 and count(second.calls, "mount ") == 0
    pulls = [f"crictl --runtime-endpoint {bootstrap.CRI_SOCKET} pull {image}" for image in PREPULL]
    assert [c for c in first.calls if " pull " in c] == pulls  # after the join, each image once
    assert first.calls.index(pulls[0]) > first.calls.index(next(c for c in first.calls if c.startswith("kubeadm join")))
    assert not any(" pull " in c for c in second.calls) and "already present" in second.output
    # Both runs reconfigure containerd the same way: default config, then nvidia-ctk.
    for run in (first, second):
        ctk = run.calls.index("nvidia-ctk runtime configure --runtime=containerd --set-as-default")
        assert run.calls.index("containerd config default") < ctk
    assert box.snapshot() == runs.after_first


@pytest.mark.parametrize(
    "user_data, failing, named, not_run",
    [
        (control_user_data, "kubeadm init", "kubeadm init --config", ("kubectl", "install -d -m 0700")),
        (control_user_data, "modprobe br_netfilter", "modprobe br_netfilter", ("sysctl", "apt-get", "exportfs")),
        (
            control_user_data,
            "apt-get -o DPkg::Lock::Timeout=600 -y install nfs-kernel-server",
            "apt-get install nfs-kernel-server",
            ("install -d -m 1777", "exportfs", "kubeadm init"),
        ),
        (control_user_data, "kubectl apply", "cannot apply Flannel", ("install -d -m 0700",)),
        (worker_user_data, "modprobe nvidia", "nvidia kernel module does not load", ("nvidia-ctk", "kubeadm join")),
        (worker_user_data, "nvidia-ctk runtime", "nvidia-ctk runtime configure", ("mount", "kubeadm join")),
        (worker_user_data, "kubeadm join", "kubeadm join did not succeed", ()),
        (
            worker_user_data,
            "dcgmi diag",
            "dcgmi diag -r 1 failed (exit 1): stub: dcgmi diag -r 1 fails (injected)",
            ("kubeadm join", "crictl"),
        ),
        (
            worker_user_data,
            "systemctl start nvidia-dcgm",
            "the DCGM host engine (nvidia-dcgm) does not start",
            ("dcgmi", "kubeadm join"),
        ),
    ],
    ids=[
        "kubeadm-init",
        "modprobe-br_netfilter",
        "apt-nfs-server",
        "flannel",
        "modprobe-nvidia",
        "nvidia-ctk",
        "kubeadm-join",
        "gpu-diagnostic",
        "dcgm-host-engine",
    ],
)
def test_a_failing_step_stops_the_bootstrap_with_a_message_naming_it(shared_run, user_data, failing, named, not_run):
    _, run = shared_run(user_data, failing=failing)
    assert run.returncode != 0, run.output
    failed = run.failed_lines()
    assert failed and named in failed[-1], run.output
    last_failure = max(i for i, c in enumerate(run.calls) if c.startswith(failing))
    after = run.calls[last_failure + 1 :]
    assert not [c for c in after if c.startswith(not_run)], after
    assert not any(line.endswith(("control-plane done", "gpu-worker done")) for line in lines(run.output))


def test_a_retried_step_that_never_succeeds_is_retried_the_stated_number_of_times(shared_run):
    _, run = shared_run(worker_user_data, failing="kubeadm join")
    assert run.returncode != 0
    assert count(run.calls, "kubeadm join") == 20 and count(run.calls, "kubeadm reset -f") == 20
    assert "gave up after 20 attempts: join" in run.output


@pytest.mark.parametrize(
    "user_data, missing, script",
    [
        (control_user_data, "KUBERNETES_MINOR", "node-common.sh"),
        (control_user_data, "SLURM_UID", "control-plane.sh"),
        (control_user_data, "CA_KEY_WAIT_SECONDS", "control-plane.sh"),
        (control_user_data, "TOOLS_UID", "control-plane.sh"),
        (worker_user_data, "CONTROL_PLANE_IP", "gpu-worker.sh"),
        (worker_user_data, "CRI_SOCKET", "gpu-worker.sh"),
    ],
)
def test_a_missing_parameter_stops_the_script_before_it_changes_anything(shared_run, user_data, missing, script):
    box, run = shared_run(user_data, missing=missing)
    assert run.returncode != 0
    assert f"FAILED: parameter {missing} is not set in {box.path(bootstrap.ENV_FILE)}" in run.output
    if script == "node-common.sh":
        assert run.calls == box.log_setup()
    else:  # node-common needs no such parameter and ran in full; the role script ran nothing
        assert "node-common done" in run.output
        assert run.calls[-1] == f"install -d -m 0755 {box.path(host_layout.SHARE_DIR)}"


def test_a_missing_parameter_file_stops_the_script(tmp_path):
    box = Sandbox(tmp_path, control_user_data())
    box.path(bootstrap.ENV_FILE).unlink()
    run = box.run()
    assert run.returncode != 0 and run.calls == box.log_setup()
    assert f"FAILED: parameter file {box.path(bootstrap.ENV_FILE)} is missing" in run.output


def test_the_bootstrap_log_is_root_only_from_its_first_line(clean_runs):
    runs = clean_runs("worker")
    box = runs.box
    assert runs.first.calls[:2] == runs.second.calls[:2] == box.log_setup()
    assert box.path(host_layout.BOOTSTRAP_LOG).stat().st_mode & 0o777 == 0o600


def test_kubeadm_init_waits_for_the_ca_key_and_names_it_when_it_never_comes(tmp_path):
    """Without the delivered CA key kubeadm would mint a CA of its own, and no worker could verify
    the API server by its hash: init never runs. The wait is the script's own CA_KEY_WAIT_SECONDS, 0 here."""
    box = Sandbox(tmp_path, control_user_data())
    box.path(bootstrap.CA_KEY_FILE).unlink()
    env = box.read(bootstrap.ENV_FILE)
    box.write(
        bootstrap.ENV_FILE,
        env.replace(f"CA_KEY_WAIT_SECONDS={bootstrap.CA_KEY_WAIT_SECONDS}\n", "CA_KEY_WAIT_SECONDS=0\n"),
    )
    run = box.run()
    assert run.returncode != 0
    assert f"FAILED: the cluster CA key did not arrive at {bootstrap.CA_KEY_FILE} within 0s" in run.output
    assert count(run.calls, "kubeadm init") == 0
    assert recorded_status(box)["step"] == f"waiting up to 0s for the cluster CA key at {bootstrap.CA_KEY_FILE}"


def test_a_containerd_config_without_the_keys_to_set_stops_node_common(tmp_path):
    box = Sandbox(tmp_path, control_user_data(), "2.x")
    (box.state / "containerd-default.toml").write_text("version = 3\n")
    run = box.run()
    assert run.returncode != 0
    assert "FAILED: containerd 2.x config has no SystemdCgroup key to set" in run.output
    assert count(run.calls, "systemctl restart containerd") == 0


def test_kubeadm_join_is_retried_after_a_reset_until_it_succeeds_without_sleeping(tmp_path):
    """Every pause of the run is a `sleep` the sandbox stubs (logged, never slept): the two failed
    joins cost two `sleep 30` calls and no real time."""
    box = Sandbox(tmp_path, worker_user_data())
    box.fail("kubeadm join", times=2)
    first = succeeded(box.run())
    kubeadm = [c.split()[1] for c in first.calls if c.startswith(("kubeadm join", "kubeadm reset"))]
    assert kubeadm == ["join", "reset", "join", "reset", "join"]
    assert "kubeadm reset -f" in first.calls
    join_at = first.calls.index(next(c for c in first.calls if c.startswith("kubeadm join")))
    sleeps = [i for i, c in enumerate(first.calls) if c.split()[0] == "sleep"]
    assert [first.calls[i] for i in sleeps] == ["sleep 30", "sleep 30"] and sleeps[0] > join_at
    assert box.read("/etc/kubernetes/kubelet.conf") == "kubelet\n"
    second = succeeded(box.run())
    assert count(second.calls, "kubeadm ") == 1  # only `config images list`, from node-common


def test_the_stubbed_commands_cover_every_command_the_node_scripts_run(clean_runs):
    """A command without a stub is 'not found' in the sandbox: a clean run proves none is missing."""
    for run in (clean_runs(role).first for role in USER_DATA):
        assert "command not found" not in run.output
        assert {c.split()[0] for c in run.calls} <= set(STUBS)


def test_redirect_check_catches_a_literal_host_path():
    assert redirect_targets_outside_root("echo x >/etc/exports.d/a\necho y >> /etc/fstab\nfoo 2>/dev/null\n") == [
        "/etc/exports.d/a",
        "/etc/fstab",
    ]
    assert redirect_targets_outside_root('echo x >"/etc/fstab"\n') == ["/etc/fstab"]
    assert redirect_targets_outside_root('echo x >"${ROOT}/etc/fstab"\n') == []


def test_without_a_sandbox_root_the_scripts_use_the_real_paths():
    lib = bootstrap.SCRIPTS_DIR / "testbed-lib.sh"
    result = subprocess.run(
        ["bash", "-c", f'unset TESTBED_ROOT TESTBED_ENV; . "{lib}"; printf "%s|%s" "$ROOT" "$TESTBED_ENV"'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout == f"|{bootstrap.ENV_FILE}"


def in_order(calls: list[str], *required: str) -> list[str]:
    """The required commands that do not appear in this order: each is the command's words,
    all of which one call must contain (a call may say more, e.g. hold more packages)."""
    missing, at = [], 0
    for words in required:
        wanted = words.split()
        found = next(
            (
                i
                for i in range(at, len(calls))
                if calls[i].split()[:1] == wanted[:1] and set(wanted) <= set(calls[i].split())
            ),
            None,
        )
        if found is None:
            missing.append(words)
        else:
            at = found + 1
    return missing


# What kubelet and kubeadm need of every node, in the order the steps depend on each other.
NODE_COMMON_STEPS = (
    "modprobe overlay",
    "modprobe br_netfilter",
    "sysctl --system",  # after the sysctl file is written
    "swapoff -a",  # kubelet refuses to start with swap on
    "apt-get update",
    "apt-get install apt-transport-https ca-certificates curl gpg",
    "curl -o",  # the pkgs.k8s.io signing key, dearmored into the keyring apt trusts
    "gpg --dearmor",
    "apt-get update",  # reads the repository just added, or the pinned versions are not found
    "apt-mark unhold kubelet kubeadm kubectl",  # a rerun may move held packages to the pinned version
    f"apt-get install --allow-change-held-packages kubelet={S.kubernetes_version}-1.1 "
    f"kubeadm={S.kubernetes_version}-1.1 kubectl={S.kubernetes_version}-1.1 nfs-common",
    "apt-get install containerd",  # once, on a node that has none
    "apt-mark hold kubelet kubeadm kubectl containerd",  # an unattended upgrade must not move them
    "containerd config default",
    "systemctl enable containerd",
    "systemctl restart containerd",  # loads the config with SystemdCgroup and the pause image
    "systemctl enable kubelet",
)


@pytest.mark.parametrize("role", ["control", "worker"])
def test_node_common_runs_every_step_kubelet_needs_in_order(clean_runs, role):
    runs = clean_runs(role)
    box, run = runs.box, runs.first
    assert in_order(run.calls, *NODE_COMMON_STEPS) == []
    assert box.read("/etc/modules-load.d/testbed-k8s.conf") == "overlay\nbr_netfilter\n"
    assert box.read("/etc/sysctl.d/99-testbed-k8s.conf") == (
        "net.bridge.bridge-nf-call-iptables = 1\nnet.bridge.bridge-nf-call-ip6tables = 1\nnet.ipv4.ip_forward = 1\n"
    )
    key = f"https://pkgs.k8s.io/core:/stable:/v{S.kubernetes_minor}/deb/Release.key"
    assert [c for c in run.calls if c.startswith("curl ") and key in c], run.calls


def test_control_plane_steps_in_order(clean_runs):
    run = clean_runs("control").first
    flannel = f"https://raw.githubusercontent.com/flannel-io/flannel/{S.flannel_version}/Documentation/kube-flannel.yml"
    assert (
        in_order(
            run.calls,
            "apt-get install nfs-kernel-server",
            "systemctl enable --now nfs-server",
            "exportfs -ra",
            "kubeadm init --config --upload-certs=false",
            "kubectl get --raw=/readyz",
            f"kubectl apply -f {flannel}",
        )
        == []
    )


def test_gpu_worker_steps_in_order(clean_runs):
    run = clean_runs("worker").first
    toolkit = f"{S.nvidia_container_toolkit_version}-1"
    cuda = bootstrap.DRIVER_CUDA_MAJOR[S.nvidia_driver_branch]
    dcgm = [f"datacenter-gpu-manager-4-{p}" for p in ("core", "proprietary", f"cuda{cuda}", f"proprietary-cuda{cuda}")]
    assert (
        in_order(
            run.calls,
            f"apt-get install nvidia-headless-{S.nvidia_driver_branch}-server-open",
            "modprobe nvidia",
            "nvidia-smi -L",
            "curl https://nvidia.github.io/libnvidia-container/gpgkey",
            "gpg --dearmor",
            "apt-get update",  # reads the toolkit repository just added
            f"apt-get install nvidia-container-toolkit={toolkit} nvidia-container-toolkit-base={toolkit} "
            f"libnvidia-container-tools={toolkit} libnvidia-container1={toolkit}",
            "nvidia-ctk runtime configure --runtime=containerd --set-as-default",
            "systemctl restart containerd",  # after nvidia-ctk: the nvidia runtime is containerd's default
            "mount",
            f"curl {CUDA_REPO}/3bf863cc.pub",
            "gpg --dearmor",  # the CUDA repository's keyring, which its apt source names
            "apt-get update",  # reads the DCGM repository just added
            "apt-get install " + " ".join(f"{package}=1:{bootstrap.DCGM_VERSION}-1" for package in dcgm),
            "apt-mark hold " + " ".join(dcgm),  # as the driver: unattended-upgrades must not move it
            "systemctl start nvidia-dcgm",
            "dcgmi diag -r 1",
            "kubeadm join --config",
        )
        == []
    )


def test_a_driver_that_installs_but_sees_no_gpu_stops_the_worker(shared_run):
    _, run = shared_run(worker_user_data, failing="nvidia-smi")
    assert run.returncode != 0
    assert run.failed_lines() and "nvidia-smi sees no GPU" in run.failed_lines()[-1], run.output
    assert count(run.calls, "modprobe nvidia") == 1  # the driver was installed and loaded
    assert not [c for c in run.calls if c.startswith(("nvidia-ctk", "kubeadm join"))]


def test_in_order_finds_missing_and_misordered_steps():
    calls = ["a 1", "b 2 3", "c"]
    assert in_order(calls, "a", "b 3", "c") == []
    assert in_order(calls, "b", "a") == ["a"]
    assert in_order(calls, "a 2") == ["a 2"]


@pytest.mark.parametrize(
    "breaks, message",
    [
        ("version", "cannot read the containerd version from: containerd (unknown build)"),
        ("images", "kubeadm did not name a pause image"),
        ("sandbox", "containerd 2.x config has no sandbox image key to set"),
    ],
)
def test_node_common_stops_before_restarting_containerd_on_what_it_cannot_read(tmp_path, breaks, message):
    box = Sandbox(tmp_path, control_user_data(), "2.x")
    if breaks == "version":
        (box.state / "containerd-version").write_text("containerd (unknown build)\n")
    elif breaks == "images":
        box.fail("kubeadm config images list")
    else:  # a default config with the cgroup key but no sandbox key
        default = (box.state / "containerd-default.toml").read_text()
        (box.state / "containerd-default.toml").write_text(
            "".join(line for line in default.splitlines(keepends=True) if "sandbox" not in line)
        )
    run = box.run()
    assert run.returncode != 0
    assert run.failed_lines() and message in run.failed_lines()[-1], run.output
    assert count(run.calls, "systemctl restart containerd") == 0


def test_the_control_node_exports_a_share_with_one_directory_per_owner_and_none_world_writable(tmp_path):
    box = Sandbox(tmp_path, control_user_data())
    box.path(host_layout.SHARE_DIR).mkdir(parents=True)
    box.path(host_layout.SHARE_DIR).chmod(0o1777)  # as an earlier bootstrap left it
    run = succeeded(box.run())
    assert box.path(host_layout.SHARE_DIR).stat().st_mode & 0o7777 == 0o755
    for path, uid in (
        (host_layout.SHARE_SLURM_DIR, host_layout.SLURM_UID),
        (host_layout.SHARE_TOOLS_DIR, host_layout.SHARE_TOOLS_UID),
    ):
        assert box.path(path).stat().st_mode & 0o7777 == 0o755
        assert f"install -d -m 0755 -o {uid} -g {uid} {box.path(path)}" in run.calls  # the stub drops -o/-g


@pytest.mark.parametrize(
    "user_data, failing, script, step",
    [
        (
            control_user_data,
            "modprobe br_netfilter",
            "node-common.sh",
            "kernel modules and sysctls for the pod network",
        ),
        (control_user_data, "gpg", "node-common.sh", f"Kubernetes v{S.kubernetes_version} packages"),
        (control_user_data, "kubeadm init", "control-plane.sh", "kubeadm init"),
        (control_user_data, "kubectl apply", "control-plane.sh", f"Flannel {S.flannel_version}"),
        (
            control_user_data,
            "containerd --version",
            "node-common.sh",
            "containerd: systemd cgroups and the pause image kubeadm expects",
        ),
        (worker_user_data, "modprobe nvidia", "gpu-worker.sh", f"NVIDIA {S.nvidia_driver_branch}-server driver"),
        (
            worker_user_data,
            "nvidia-ctk runtime",
            "gpu-worker.sh",
            f"nvidia-container-toolkit {S.nvidia_container_toolkit_version}",
        ),
        (
            worker_user_data,
            "dpkg-query -W -f ${db:Status-Status} ${Package}\\n *-",  # no driver package to hold
            "gpu-worker.sh",
            f"holding the NVIDIA {S.nvidia_driver_branch}-server driver and the toolkit",
        ),
        (
            worker_user_data,
            "kubeadm join",
            "gpu-worker.sh",
            f"kubeadm join {S.control_private_ip}:6443 (retried until the control plane answers)",
        ),
        (worker_user_data, "crictl", "gpu-worker.sh", "images for the first slurmd pod and the example jobs"),
        # what the early failure report quotes for a worker whose GPU fails the diagnostic
        (worker_user_data, "dcgmi diag", "gpu-worker.sh", "GPU diagnostic (DCGM 4.4.2 dcgmi diag -r 1)"),
    ],
    ids=[
        "modprobe-br_netfilter",
        "k8s-keyring",
        "kubeadm-init",
        "flannel",
        "containerd-version",
        "modprobe-nvidia",
        "nvidia-ctk",
        "driver-hold",
        "kubeadm-join",
        "image-pull",
        "gpu-diagnostic",
    ],
)
def test_a_failing_step_records_its_script_step_and_message_root_only(shared_run, user_data, failing, script, step):
    box, run = shared_run(user_data, failing=failing)
    assert run.returncode != 0
    status = recorded_status(box)
    assert (status["state"], status["script"], status["step"], status["exit"]) == ("failed", script, step, "1")
    assert f"testbed: FAILED: {status['message']}" == run.failed_lines()[-1].split(" ", 1)[1]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", status["time"])


@pytest.mark.parametrize(
    "user_data, failing, step",
    [
        (control_user_data, "exportfs", "NFS server exporting "),
        (control_user_data, "install -d -m 0750", "Slurm state directory "),
        (control_user_data, "kubectl get --raw", "the API server answers"),
        (worker_user_data, "mount /", "shared directory "),
    ],
    ids=["nfs-export", "slurm-state-dir", "api-server", "share-mount"],
)
def test_every_step_of_the_scripts_is_the_one_recorded_when_its_command_fails(shared_run, user_data, failing, step):
    box, run = shared_run(user_data, failing=failing)
    assert run.returncode != 0
    assert recorded_status(box)["step"].startswith(step)


def test_a_failing_command_records_its_own_exit_status(tmp_path):
    box = Sandbox(tmp_path, control_user_data())
    box.stubs["swapoff"] = (
        "(exit 7)\n"  # fails as a program does, by its last command: the scripts' ERR trap is not its
    )
    assert box.run().returncode != 0
    status = recorded_status(box)
    assert (status["step"], status["exit"]) == ("swap off (kubelet refuses to start with swap)", "7")
    assert status["message"].startswith("node-common.sh line ") and status["message"].endswith(": swapoff -a (exit 7)")


@pytest.mark.parametrize("role", ["control", "worker"])
def test_a_bootstrap_that_succeeds_records_it_on_every_run(clean_runs, role):
    runs = clean_runs(role)
    script, last_step = (
        ("control-plane.sh", "admin kubeconfig for ubuntu")
        if role == "control"
        else ("gpu-worker.sh", "images for the first slurmd pod and the example jobs")
    )
    for status in (runs.first_status, recorded_status(runs.box)):
        assert (status["state"], status["script"], status["step"], status["exit"]) == (
            "succeeded",
            script,
            last_step,
            "",
        )


@pytest.mark.parametrize("parameter, script", [("KUBERNETES_MINOR", "node-common.sh"), ("CRI_SOCKET", "gpu-worker.sh")])
def test_a_missing_parameter_stops_its_script_at_the_start_and_is_recorded(shared_run, parameter, script):
    """A bootstrap that stops before its script's first step still says where: that script, at its start."""
    box, run = shared_run(worker_user_data, missing=parameter)
    assert run.returncode != 0
    status = recorded_status(box)
    assert (status["state"], status["script"], status["step"]) == ("failed", script, "start")
    assert f"parameter {parameter} is not set" in status["message"]

"""Real Slurm and a real Prometheus for the tests, started as slurm-operator v1.0.0 starts them.

The engines come from Debian unstable in a debootstrapped root (tools/engine-root.sh): slurmctld,
slurmd and the client 26.05, the first Debian Slurm with metrics/openmetrics and job_submit/lua,
and Prometheus 3, the major version kube-prometheus-stack 80.9.2 deploys. Each host is a network
namespace on a bridge of its own; each process runs chrooted into the root in a private mount
namespace, so the binds below vanish with it and the root is never changed.

* slurmctld boots from the files `render` writes (components/slurm_config.py), adapted only as
  ADAPTATIONS says, with the operator's keys (slurm.key, jwt_hs256.key) made up per run.
* slurmd runs as the NodeSet's pods run it (SlinkyProject/slurm-operator@v1.0.0:internal/builder/
  worker_app.go): a dynamic node, `slurmd -Z --conf-server <controller>:6817 --conf '<Features, Gres>'`,
  hostname = node name; stopping it runs the pod's preStop first (state=down, then delete).
* Prometheus scrapes slurmctld's /metrics/partitions as the operator's ServiceMonitor does.
"""

from __future__ import annotations

import fcntl
import http.server
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from components import slinky, slurm_config
from core.names import SLURMCTLD_PORT, Names, SlurmNames
from core.settings import Settings

REPO = Path(__file__).resolve().parents[2]
ROOT_ENV = "TESTBED_ENGINE_ROOT"
DEFAULT_ROOT = REPO / ".engines" / "sid"
BUILD = "tools/engine-root.sh"  # as root; .ci/run runs it
STAMP = ".testbed-engine-root"
SLURM_UID_IN_ROOT = "slurm"  # Debian's slurm user; the Slinky images' is 401

# Everything the harness changes in the rendered files and the nodes, and why. Nothing else differs.
# (find, replace, reason); None: nothing found (an addition) or nothing put back (a removal).
ADAPTATIONS = {
    "fake_gpus.conf": (
        None,
        "tesla_t4|{cpus}|0-{last_cpu}|(null)|/dev/nvidia0|GPU-00000000-0000-0000-0000-000000000000|nvidia_gpu_env",
        "no NVIDIA driver here: each slurmd is given the GPU a g4dn's driver reports, through Slurm's own "
        "fake_gpus.conf (read beside the cached slurm.conf before AutoDetect's plugin; SchedMD/slurm@"
        "slurm-26-05-0-1:src/interfaces/gpu.c gpu_g_get_system_gpu_list, @slurm-25-11-6-1:src/plugins/gres/"
        "gpu/gres_gpu.c). Its type is the one gpu/nvidia derives from the driver's `Model: Tesla T4` "
        "(gpu_nvidia.c _set_basic_info, gpu_common_underscorify_tolower): tesla_t4, not the node's `tesla`, "
        "so gres.conf's AutoDetect=nvidia and its type matching run unchanged",
    ),
    "cgroup.conf": (
        None,
        "CgroupPlugin=disabled",
        "no cgroup delegation in the sandbox. The operator then renders its cgroup-less slurm.conf "
        "(controller_config.go buildSlurmConf), which also drops SlurmctldParameters=enable_stepmgr, "
        "PrologFlags=Contain, ProctrackType=proctrack/cgroup and TaskPlugin=task/cgroup: no extern step at "
        "allocation and no step manager, which the testbed's srun, salloc and the preStop's node deletion "
        "(a node with an extern step) go through. Batch jobs, scheduling, limits, metrics and job_submit.lua "
        "do not; those paths are for a live cluster (docs/real-engines.md)",
    ),
    "slurm.conf": (
        None,
        "ProctrackType=proctrack/linuxproc",
        "Slurm's default process tracking is proctrack/cgroup, which needs cgroups",
    ),
    "slurm.conf AuthAltTypes": (
        "AuthAltTypes=auth/jwt",
        None,
        "Debian's Slurm is built without libjwt (no auth_jwt.so); only slurmrestd uses JWT. Both "
        "AuthAltParameters lines stay: slurmctld itself reads the value in effect (proc_req.c "
        "disable_token_creation, before it asks for auth/jwt), and with no auth/jwt loaded nothing reads "
        "its jwt_key",
    ),
    "job_submit.lua": (
        "local NODE_CPUS = ..., local NODE_MEMORY_MB = ...",
        "this host's CPUs and RealMemory (`slurmd -C` in the root)",
        "the node here is the host, not the worker type: the script's node shape must be the node's, so "
        "that a job it accepts can run here (components/slinky.py job_submit_parameters for the stack's)",
    ),
}


def host_shape(root: Path) -> tuple[int, int]:
    """(CPUs, RealMemory MiB) as slurmd reports this host (`slurmd -C`)."""
    out = subprocess.run(["chroot", str(root), "slurmd", "-C"], capture_output=True, text=True, timeout=30).stdout
    found = dict(re.findall(r"\b(CPUs|RealMemory)=(\d+)", out))
    return int(found["CPUs"]), int(found["RealMemory"])


class EngineMissing(RuntimeError):
    pass


def engine_root(need_root_user: bool = True) -> Path:
    """The root, checked; EngineMissing (with the one command that builds it) when absent."""
    root = Path(os.environ.get(ROOT_ENV) or DEFAULT_ROOT)
    if not (root / STAMP).is_file():
        raise EngineMissing(f"no real-engine root at {root}: build it with `sudo {BUILD} {root}` (about a minute)")
    if need_root_user and os.geteuid() != 0:
        raise EngineMissing("the real-engine tests need root (chroot, network namespaces)")
    return root


def promtool() -> str:
    """Prometheus 3's promtool from the root (the major version kube-prometheus-stack 80.9.2 deploys);
    a skip without the root, a failure under CI=true."""
    import pytest

    try:
        root = engine_root(need_root_user=False)
    except EngineMissing as missing:
        if os.environ.get("CI") == "true":
            pytest.fail(str(missing))
        pytest.skip(str(missing))
    return str(root / "usr" / "bin" / "promtool")


def series_selector(labels: dict[str, str]) -> str:
    """A series as promtool's input_series names it: `name{k="v",...}`, labels sorted."""
    pairs = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{labels['__name__']}{{{pairs}}}"


def promtool_test(tmp_path: Path, groups: list[dict]) -> None:
    """Run promtool 3's `test rules` on unit-test groups (input_series, promql_expr_test, no rules);
    an assertion with promtool's output when a group's expectation fails."""
    import subprocess as run

    (tmp_path / "rules.yaml").write_text("groups: []\n")
    test_file = tmp_path / "promtool_test.yaml"
    test_file.write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "30s", "tests": groups}))
    done = run.run([promtool(), "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def render_for_harness(values: dict, n: SlurmNames, shape: tuple[int, int] = (4, 14745)) -> dict[str, str]:
    """The program's /etc/slurm files as `render` writes them (components/slurm_config.py), with
    ADAPTATIONS applied, and only those; `shape` is the node's (CPUs, RealMemory MiB)."""
    cgroup = ADAPTATIONS["cgroup.conf"][1] + "\n"
    # The operator's own branch for a cgroup.conf that disables cgroups (controller_config.go).
    files = slurm_config.slurm_files({**values, "configFiles": {**values["configFiles"], "cgroup.conf": cgroup}}, n)
    lines = [line for line in files["slurm.conf"].splitlines() if not line.startswith("AuthAltTypes=")]
    files["slurm.conf"] = "\n".join([*lines, ADAPTATIONS["slurm.conf"][1]]) + "\n"
    if "job_submit.lua" in files:
        script = files["job_submit.lua"]
        for key, value in (("NODE_CPUS", shape[0]), ("NODE_MEMORY_MB", shape[1])):
            script, found = re.subn(rf"^local {key} = \d+$", f"local {key} = {value}", script, count=1, flags=re.M)
            assert found == 1, f"job_submit.lua has no `local {key} = N` line: review ADAPTATIONS"
        files["job_submit.lua"] = script
    return files


def fake_gpus_conf(cpus: int) -> str:
    """The fake_gpus.conf line of ADAPTATIONS for a node of `cpus` CPUs."""
    return ADAPTATIONS["fake_gpus.conf"][1].format(cpus=cpus, last_cpu=cpus - 1) + "\n"


@dataclass
class Host:
    name: str
    netns: str
    ip: str
    process: subprocess.Popen | None = None


@dataclass
class Engines:
    """One Slurm cluster (slurmctld, dynamic slurmd nodes) and one Prometheus, on their own bridge."""

    root: Path
    work: Path
    files: dict[str, str]  # /etc/slurm, adapted
    names: SlurmNames
    slurmd_conf: str  # slurmd's --conf, as the operator builds it
    index: int = 0  # the xdist worker: its own bridge and subnet
    shape: tuple[int, int] = (4, 14745)  # the host's (CPUs, RealMemory MiB), as slurmd reports them
    hosts: dict[str, Host] = field(default_factory=dict)
    prometheus: subprocess.Popen | None = None

    # ---------------------------------------------------------------- network

    @property
    def bridge(self) -> str:
        return f"tbbr{self.index}"

    def _ip(self, k: int) -> str:
        return f"10.77.{self.index}.{k}"

    @property
    def bridge_ip(self) -> str:
        return self._ip(254)

    def _sh(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=check)

    def _netns(self, name: str, ip: str) -> str:
        netns, veth = f"tb{self.index}-{name}", f"tbv{self.index}-{len(self.hosts)}"
        self._sh("ip", "netns", "del", netns, check=False)
        self._sh("ip", "link", "del", veth, check=False)
        self._sh("ip", "netns", "add", netns)
        self._sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        self._sh("ip", "link", "set", veth, "master", self.bridge, "up")
        for cmd in (
            ["addr", "add", f"{ip}/24", "dev", "eth0"],
            ["link", "set", "eth0", "up"],
            ["link", "set", "lo", "up"],
        ):
            self._sh("ip", "netns", "exec", netns, "ip", *cmd)
        return netns

    def _hosts_file(self) -> None:
        ctld = self.hosts["slurmctld"]
        lines = ["127.0.0.1 localhost", f"{ctld.ip} {self.names.controller_service}.{self.names.namespace} {ctld.name}"]
        lines += [f"{h.ip} {h.name}" for key, h in self.hosts.items() if key != "slurmctld"]
        (self.work / "hosts").write_text("\n".join(lines) + "\n")

    # ---------------------------------------------------------------- processes

    def _script(self, hostname: str | None, binds: dict[str, Path]) -> str:
        root = self.root
        lines = ["set -e"]
        if hostname:
            lines.append(f"hostname {hostname}")
        lines.append(f"mount -t proc proc {root}/proc")
        binds = {"/etc/hosts": self.work / "hosts", **binds}
        lines += [f"mount --bind {src} {root}{dst}" for dst, src in binds.items()]
        lines.append(f'exec chroot {root} "$@"')
        return "\n".join(lines)

    def _command(self, netns: str, hostname: str | None, binds: dict[str, Path], argv: list[str]) -> list[str]:
        unshare = ["unshare", "--mount", "--propagation", "private"] + (["--uts"] if hostname else [])
        return ["ip", "netns", "exec", netns, *unshare, "sh", "-c", self._script(hostname, binds), "sh", *argv]

    def _spawn(self, host: Host, binds: dict[str, Path], argv: list[str], log: Path) -> subprocess.Popen:
        with log.open("ab") as out:
            return subprocess.Popen(
                self._command(host.netns, host.name, binds, argv), stdout=out, stderr=subprocess.STDOUT
            )

    def _run_dir(self, host: str) -> Path:
        """A private /run: slurmctld and slurmd each kill the daemon whose pid file they find there."""
        path = self.work / "run" / host
        path.mkdir(parents=True, exist_ok=True)
        return path

    def client(self, *argv: str, stdin: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
        """A Slurm client command (sbatch, scontrol, ...) where HPC users run them: in the controller."""
        ctld = self.hosts["slurmctld"]
        binds = {"/etc/slurm": self.work / "etc", "/run": self._run_dir("ctld")}  # the slurmctld container's
        cmd = self._command(ctld.netns, None, binds, list(argv))
        return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)

    def sbatch(self, *args: str, command: str = "sleep 600") -> str:
        """`sbatch --parsable ARGS --wrap COMMAND`, accepted: the job id."""
        done = self.client("sbatch", "--parsable", *args, "--wrap", command)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def show_job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job -o`: the fields the tests read (JobState, Reason, TimeLimit, RunTime)."""
        out = self.client("scontrol", "show", "job", "-o", job_id).stdout
        return dict(re.findall(r"\b(JobState|Reason|TimeLimit|RunTime)=(\S+)", out))

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self.stop()
        self._sh("ip", "link", "add", self.bridge, "type", "bridge")
        self._sh("ip", "addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge)
        self._sh("ip", "link", "set", self.bridge, "up")
        etc, state, log = self.work / "etc", self.work / "state", self.work / "log"
        for d in (etc, state / self.names.cluster_name, log):
            d.mkdir(parents=True, exist_ok=True)
        for name, text in self.files.items():
            (etc / name).write_text(text)
            if name.endswith(".sh"):  # EpilogSlurmctld scripts: slurmctld runs only an executable file
                (etc / name).chmod(0o755)
        # The operator's Secrets: auth/slurm's key (and the JWT key the image's slurmrestd uses).
        (etc / "slurm.key").write_bytes(secrets.token_bytes(64))
        (etc / "jwt_hs256.key").write_bytes(secrets.token_bytes(32))
        uid = int(self._sh("chroot", str(self.root), "id", "-u", SLURM_UID_IN_ROOT).stdout)
        for path in (etc, state, log, *etc.iterdir(), *state.iterdir()):
            os.chown(path, uid, uid)
        for key in ("slurm.key", "jwt_hs256.key"):
            (etc / key).chmod(0o600)
        ctld = Host(self.names.controller_pod, self._netns("ctld", self._ip(1)), self._ip(1))
        self.hosts["slurmctld"] = ctld
        self._hosts_file()
        binds = {"/etc/slurm": etc, "/var/spool/slurmctld": state, "/var/log/slurm": log, "/run": self._run_dir("ctld")}
        ctld.process = self._spawn(ctld, binds, ["slurmctld", "-D"], self.work / "slurmctld.out")
        self.wait_for(
            lambda: self.client("scontrol", "ping").returncode == 0, 30, "slurmctld to answer", log / "slurmctld.log"
        )

    def start_node(self, name: str) -> None:
        """A slurmd pod starts: a dynamic node registers with the NodeSet's --conf."""
        ip = self._ip(10 + len(self.hosts))
        host = Host(name, self._netns(name, ip), ip)
        self.hosts[name] = host
        self._hosts_file()
        d = self.work / "nodes" / name
        for sub in ("etc", "spool", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        shutil.copy(self.work / "etc" / "slurm.key", d / "etc" / "slurm.key")
        (d / "etc" / "slurm.key").chmod(0o600)
        # Configless slurmd reads extra files beside its cached slurm.conf (read_config.c
        # get_extra_conf_path): SlurmdSpoolDir/conf-cache.
        cache = d / "spool" / "conf-cache"
        cache.mkdir(parents=True, exist_ok=True)
        (cache / "fake_gpus.conf").write_text(fake_gpus_conf(self.shape[0]))
        binds = {
            "/etc/slurm": d / "etc",
            "/var/spool/slurmd": d / "spool",
            "/var/log/slurm": d / "log",
            "/run": self._run_dir(name),
        }
        ctld = f"{self.names.controller_service}.{self.names.namespace}:{SLURMCTLD_PORT}"
        argv = ["slurmd", "-D", "-Z", "--conf-server", ctld, "--conf", self.slurmd_conf]
        host.process = self._spawn(host, binds, argv, d / "slurmd.out")
        self.wait_for(lambda: name in self.node_states(), 30, f"{name} to register", d / "log" / "slurmd.log")

    def stop_node(self, name: str) -> None:
        """The slurmd pod goes: its preStop, then SIGTERM (worker_app.go PreStop)."""
        host = self.hosts.pop(name)
        self.client("scontrol", "update", f"nodename={name}", "state=down", "reason=Pod is terminating")
        self.client("scontrol", "delete", f"nodename={name}")
        self._end(host.process)
        self._sh("ip", "netns", "del", host.netns, check=False)
        self._hosts_file()

    def start_prometheus(
        self,
        interval_seconds: int,
        rule_files: dict[str, str] | None = None,
        more_targets: dict[str, str] | None = None,
    ) -> None:
        """Prometheus 3 scraping /metrics/partitions as the operator's ServiceMonitor does, loading
        `rule_files` (name: text) and scraping `more_targets` (job: host:port, /metrics) too."""
        prom = self.work / "prometheus"
        (prom / "data").mkdir(parents=True, exist_ok=True)
        for name, text in (rule_files or {}).items():
            (prom / name).write_text(text)
        config = {
            "global": {"scrape_interval": f"{interval_seconds}s", "evaluation_interval": f"{interval_seconds}s"},
            "rule_files": [f"/srv/prometheus/{name}" for name in rule_files or {}],
            "scrape_configs": [
                {
                    "job_name": "slurm",
                    "metrics_path": "/metrics/partitions",
                    "static_configs": [
                        {"targets": [f"{self.names.controller_service}.{self.names.namespace}:{SLURMCTLD_PORT}"]}
                    ],
                },
                *(
                    {"job_name": job, "static_configs": [{"targets": [where]}]}
                    for job, where in (more_targets or {}).items()
                ),
            ],
        }
        (prom / "prometheus.yml").write_text(yaml.safe_dump(config))
        argv = [
            "prometheus",
            "--config.file=/srv/prometheus/prometheus.yml",
            "--storage.tsdb.path=/srv/prometheus/data",
            "--web.listen-address=0.0.0.0:9090",
        ]
        ctld = self.hosts["slurmctld"]
        with (self.work / "prometheus.out").open("ab") as out:
            self.prometheus = subprocess.Popen(
                self._command(ctld.netns, None, {"/srv/prometheus": prom}, argv), stdout=out, stderr=subprocess.STDOUT
            )
        self.wait_for(lambda: self._prom_ready(), 30, "Prometheus to be ready")

    def stop(self) -> None:
        self._end(self.prometheus)
        self.prometheus = None
        for host in reversed(list(self.hosts.values())):
            self._end(host.process)
            self._sh("ip", "netns", "del", host.netns, check=False)
        self.hosts.clear()
        # Also what a failed start left: every namespace of this bridge, then the bridge.
        listed = self._sh("ip", "netns", "list", check=False).stdout.split("\n")
        for netns in (line.split()[0] for line in listed if line.startswith(f"tb{self.index}-")):
            self._sh("ip", "netns", "del", netns, check=False)
        self._sh("ip", "link", "del", self.bridge, check=False)

    @staticmethod
    def _end(process: subprocess.Popen | None) -> None:
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    @staticmethod
    def wait_for(done, seconds: float, what: str, log: Path | None = None) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if done():
                return
            time.sleep(0.2)
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log and log.exists() else ""
        raise TimeoutError(f"waited {seconds:g} s for {what}" + (f"; {log}:\n{tail}" if tail else ""))

    # ---------------------------------------------------------------- reading the engines

    def node_states(self) -> dict[str, str]:
        """Slurm node name -> state as sinfo prints it (IDLE, MIXED, DRAINED, DOWN+DRAIN, ...)."""
        done = self.client("sinfo", "-h", "-N", "-o", "%N %T")
        return dict(line.split() for line in done.stdout.splitlines() if line.strip())

    def partition_metrics(self, partition: str) -> dict[str, float]:
        """slurmctld's /metrics/partitions for one partition, read directly (what Prometheus scrapes)."""
        ctld = self.hosts["slurmctld"]
        url = f"http://{ctld.ip}:{SLURMCTLD_PORT}/metrics/partitions"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read().decode()
        out = {}
        for line in body.splitlines():
            if line.startswith("#") or f'partition="{partition}"' not in line:
                continue
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0]] = float(value)
        return out

    def _prom_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.hosts['slurmctld'].ip}:9090/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def prom_api(self, path: str, **params: str) -> dict:
        url = f"http://{self.hosts['slurmctld'].ip}:9090/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())

    def query(self, promql: str) -> dict[frozenset, float]:
        """An instant query at Prometheus' now: labels (without __name__) -> value."""
        data = self.prom_api("query", query=promql)["data"]
        if data["resultType"] == "scalar":
            return {frozenset(): float(data["result"][1])}
        return {
            frozenset((k, v) for k, v in r["metric"].items() if k != "__name__"): float(r["value"][1])
            for r in data["result"]
        }

    def wait_scrapes(self, count: int, interval_seconds: int) -> None:
        """Until Prometheus holds `count` more scrapes of slurmctld than now."""

        def scrapes() -> int:
            got = self.query('count_over_time(up{job="slurm"}[1h])')
            return int(next(iter(got.values()), 0))

        want = scrapes() + count
        self.wait_for(lambda: scrapes() >= want, (count + 2) * interval_seconds + 10, f"{count} scrapes")


@contextmanager
def engines(work: Path, values: dict, names: SlurmNames, index: int = 0) -> Iterator[Engines]:
    """Started Slurm (no nodes yet) for the chart values; every process and namespace stopped after."""
    root = engine_root()
    shape = host_shape(root)
    e = Engines(
        root,
        work,
        render_for_harness(values, names, shape),
        names,
        slurm_config.slurmd_conf_arg(values, names.nodeset),
        index,
        shape,
    )
    # Another test run on this machine (a second checkout, CI beside a developer) uses the same
    # bridge and namespace names for the same worker index: take turns instead of tearing each
    # other's cluster down.
    with open(f"/tmp/testbed-engines-{index}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            e.start()
            yield e
        finally:
            e.stop()


class MetricsHandler(http.server.BaseHTTPRequestHandler):
    """Serves its server's `body()` as a Prometheus text exposition: a scrape target's stand-in."""

    def do_GET(self):
        body = self.server.body().encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def stack_slurm_values(s: Settings, names: Names) -> dict:
    """The stack's slurm chart values as the hand-off engine tests run them: MaxNodes at the
    scaler's ceiling and the stack's scrape interval, no MaxTime (the limit rows set their own)."""
    return slinky.slurm_values(
        s.slinky_version,
        s.slurm_image_tag,
        names.slurm,
        max_nodes=names.slurmd_max_replicas,
        metrics_interval_seconds=names.metrics_interval_seconds,
    )

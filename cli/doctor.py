"""`python -m cli doctor`: is the deployed testbed healthy? One line per check.

Every name comes from the names contract (core/names.py) and every address from the
settings, so the doctor looks where the program built. For a node that is missing, NotReady
or without its GPU, the tail of its bootstrap log is fetched over SSH (workers through the
control node), secrets redacted. Exit status: 0 healthy, 1 a check failed, 2 bad input or no
cluster.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from cli import as_typed, checklist, doctor_platform, typed_command
from cli.checklist import FAIL, OK, Check
from components import readiness_gate, slinky
from components.fair_share_loop import JSON_PATCH
from core import host_layout, names, user_files
from core.names import GPU_RESOURCE
from core.settings import Settings, SettingsError, escaped
from stacks import offline

LOG_LINES = 40
SSH_CONNECT_TIMEOUT = 10
EXEC_TIMEOUT_SECONDS = 30  # a command in a pod, e.g. sinfo in slurmctld

# Namespaces of the platform's releases: every pod in them must be Ready (or Succeeded).
PLATFORM_NAMESPACES = (
    names.CERT_MANAGER_NAMESPACE,
    names.DEVICE_PLUGIN_NAMESPACE,
    names.MONITORING_NAMESPACE,
    names.SLINKY_OPERATOR_NAMESPACE,
    names.SLURM_NAMESPACE,  # slurmctld, slurmrestd, the runnable-jobs exporter (components/runnable_exporter.py)
    names.KEDA_NAMESPACE,
    names.TRAINING_NAMESPACE,
    names.FAIR_SHARE_NAMESPACE,  # the fair-share controller (components/fair_share_controller.py)
)


class BadInput(Exception):
    """Reported as one line, exit 2."""


class Kube(Protocol):
    """The few reads the doctor makes; objects come back as plain dicts (API field names)."""

    def nodes(self) -> list[dict]: ...

    def pods(self, namespace: str) -> list[dict]: ...

    def dry_run(self, obj: dict) -> None: ...

    def dry_run_patch_as(self, user: str, path: str, operations: list[dict], field_manager: str) -> None: ...

    def exec(self, namespace: str, pod: str, container: str, command: list[str]) -> tuple[int, str]: ...

    def get(self, group: str, version: str, namespace: str, plural: str, name: str) -> dict: ...

    def get_cluster(self, group: str, version: str, plural: str, name: str) -> dict: ...

    def hpa(self, namespace: str, name: str) -> dict: ...

    def prometheus(self, query: str) -> list[dict]: ...


# ---------------------------------------------------------------------- redaction and SSH

_TOKEN = re.compile(r"\b[a-z0-9]{6}\.[a-z0-9]{16}\b")  # kubeadm bootstrap token
_PEM_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]+-----")
_PEM_END = re.compile(r"-----END [A-Z0-9 ]+-----")


def redact(text: str) -> str:
    """Bootstrap tokens and PEM blocks out, also a block the tail cut in half."""
    out: list[str] = []
    inside = False
    for line in text.splitlines():
        if _PEM_BEGIN.search(line):
            inside = True
        elif _PEM_END.search(line):
            if not inside:  # the tail began inside a block: everything before was part of it
                out = ["[redacted PEM block]"]
            else:
                out.append("[redacted PEM block]")
            inside = False
            continue
        if not inside:
            out.append(_TOKEN.sub("[redacted token]", line))
    if inside:
        out.append("[redacted PEM block]")
    return "\n".join(out)


def write_key(workdir: Path, private_key: str) -> Path:
    """The stack's private key as a file only this user can read from its first byte (ssh refuses
    a key others can read), inside `workdir`, a TemporaryDirectory that main() removes on every
    way out: a return, an error, Ctrl-C, and SIGTERM, which cli/guard.py raises as KeyboardInterrupt."""
    key = workdir / "id_testbed"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(private_key if private_key.endswith("\n") else private_key + "\n")
    return key


class Ssh:
    """`ssh` with the stack's key: the control node directly, workers through it (-J)."""

    def __init__(self, control_public_ip: str, private_key: str, workdir: Path):
        key = write_key(workdir, private_key)
        # A config file, not -i: the -J hop reads the same file, and so the same key.
        self.config = workdir / "ssh_config"
        self.config.write_text(
            "Host *\n"
            f"  User {host_layout.SSH_USER}\n"
            f"  IdentityFile {key}\n"
            "  IdentitiesOnly yes\n"
            "  BatchMode yes\n"
            f"  ConnectTimeout {SSH_CONNECT_TIMEOUT}\n"
            "  StrictHostKeyChecking accept-new\n"
            f"  UserKnownHostsFile {workdir / 'known_hosts'}\n"
        )
        self.control = control_public_ip

    def command(self, private_ip: str, is_control: bool) -> list[str]:
        """The command the readiness gate tells you to reach the node with, this key's config added."""
        remote = f"sudo tail -n {LOG_LINES} {host_layout.BOOTSTRAP_LOG}"
        ssh, *reach = readiness_gate.ssh_command(self.control, None if is_control else private_ip)
        return [ssh, "-F", str(self.config), *reach, remote]

    def log_tail(self, private_ip: str, is_control: bool) -> str:
        try:
            done = subprocess.run(
                self.command(private_ip, is_control), capture_output=True, text=True, timeout=3 * SSH_CONNECT_TIMEOUT
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"(no log: ssh failed: {error.__class__.__name__})"
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            return f"(no log: ssh exited {done.returncode}: {redact(last)})"
        return redact(done.stdout)


# ---------------------------------------------------------------------- checks


def _ready(obj: dict) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in obj.get("status", {}).get("conditions") or []
    )


def _internal_ip(node: dict) -> str | None:
    return next((a["address"] for a in node["status"].get("addresses", []) if a["type"] == "InternalIP"), None)


class Doctor:
    def __init__(self, s: Settings, kube: Kube, logs: Callable[[str, bool], str] | None):
        self.s, self.kube, self.logs = s, kube, logs
        self.n = names.Names.from_settings(s)
        self.checks: list[Check] = []

    def run(self) -> list[Check]:
        for name, step in (
            ("node", self.nodes),
            ("pods", self.pods),
            ("webhook", self.webhooks),
            ("sinfo", self.sinfo),
            ("slurm-tokens", self.token_creation),
            ("kueue", lambda: self.checks.extend(doctor_platform.kueue_checks(self.n, self.kube, self.s.stack))),
            ("scaledobject", lambda: self.checks.extend(doctor_platform.keda_checks(self.n, self.kube, self.s.stack))),
            ("prometheus", self.prometheus),
            (
                "admission",
                lambda: self.checks.extend(doctor_platform.admission_checks(self.n, self.kube, self.s.stack)),
            ),
        ):
            self._guarded(name, step)
        return self.checks

    def _guarded(self, name: str, step: Callable[[], None]) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            step()
        except ApiException as error:  # e.g. 404: the object the check reads is not there
            self.checks.append(Check(name, FAIL, f"API error {error.status} {(error.reason or '').strip()}"))

    def _evidence(self, ip: str, is_control: bool) -> str:
        if self.logs is None:
            return "(no log: the stack's controlPlanePublicIp/sshPrivateKey outputs are not readable)"
        return f"tail of {host_layout.BOOTSTRAP_LOG} on {ip}:\n" + self.logs(ip, is_control)

    def nodes(self) -> None:
        by_ip = {_internal_ip(n): n for n in self.kube.nodes()}
        expected = [(self.s.control_private_ip, True), *((ip, False) for ip in self.s.worker_private_ips)]
        for ip, is_control in expected:
            role = "control node" if is_control else "worker"
            node = by_ip.get(ip)
            if node is None:
                problem = f"{role} {ip} has not joined the cluster"
            elif not _ready(node):
                problem = f"{role} {ip} ({node['metadata']['name']}) is NotReady"
            elif not is_control and (gpus := node["status"].get("allocatable", {}).get(GPU_RESOURCE)) != str(
                names.GPUS_PER_WORKER
            ):
                problem = f"worker {ip} ({node['metadata']['name']}) offers {GPU_RESOURCE}={gpus or 0}, expected {names.GPUS_PER_WORKER}"
            else:
                extra = "" if is_control else f", {GPU_RESOURCE}={names.GPUS_PER_WORKER}"
                self.checks.append(Check("node", OK, f"{role} {ip} ({node['metadata']['name']}) Ready{extra}"))
                continue
            self.checks.append(Check("node", FAIL, problem, evidence=self._evidence(ip, is_control)))

    def pods(self) -> None:
        for namespace in PLATFORM_NAMESPACES:
            pods = self.kube.pods(namespace)
            running = [p for p in pods if p.get("status", {}).get("phase") != "Succeeded"]
            waiting = sorted(p["metadata"]["name"] for p in running if not _ready(p))
            if not running:
                self.checks.append(Check("pods", FAIL, f"namespace {namespace}: no pods"))
            elif waiting:
                shown = ", ".join(waiting[:5]) + (f" and {len(waiting) - 5} more" if len(waiting) > 5 else "")
                self.checks.append(
                    Check("pods", FAIL, f"namespace {namespace}: {len(waiting)} of {len(running)} not Ready: {shown}")
                )
            else:
                self.checks.append(Check("pods", OK, f"namespace {namespace}: {len(running)} Ready"))

    def webhooks(self) -> None:
        from kubernetes.client.exceptions import ApiException

        from components import cert_manager, slinky, training_operator

        for what, probe in (
            ("cert-manager", cert_manager.webhook_probe()),
            ("Slinky operator", slinky.operator_webhook_probe(self.n.slurm)),
            ("Training Operator", training_operator.webhook_probe()),
        ):
            try:
                self.kube.dry_run(probe)
            except ApiException as error:
                reason = (error.reason or "").strip()
                self.checks.append(
                    Check("webhook", FAIL, f"{what}: a dry-run {probe['kind']} was refused ({error.status} {reason})")
                )
            else:
                self.checks.append(Check("webhook", OK, f"{what} admits a dry-run {probe['kind']}"))

    def sinfo(self) -> None:
        slurm = self.n.slurm
        code, out = self.kube.exec(
            slurm.namespace,
            slurm.controller_pod,
            names.SLURMCTLD_CONTAINER,
            ["sinfo", "--noheader", "-o", "%P %a %D %t"],
        )
        if code != 0:
            self.checks.append(
                Check(
                    "sinfo", FAIL, f"sinfo in {slurm.controller_pod} exited {code}: {escaped(out.strip(), limit=200)}"
                )
            )
            return
        partitions = {line.split()[0].rstrip("*") for line in out.splitlines() if line.strip()}
        missing = [p for p in slurm.partitions if p not in partitions]
        if missing:
            self.checks.append(Check("sinfo", FAIL, f"partitions {', '.join(missing)} missing from sinfo"))
        else:
            self.checks.append(Check("sinfo", OK, f"slurmctld answers; partitions {', '.join(slurm.partitions)}"))

    def token_creation(self) -> None:
        """The AuthAltParameters slurmctld runs with carry disable_token_creation: the program's
        line in controller.extraConfMap won over the operator's (components/slinky.py
        _auth_alt_parameters), which only the running slurmctld can say."""
        slurm = self.n.slurm
        command = ["scontrol", "show", "config"]
        code, out = self.kube.exec(slurm.namespace, slurm.controller_pod, names.SLURMCTLD_CONTAINER, command)
        if code != 0:
            detail = f"scontrol show config in {slurm.controller_pod} exited {code}: {escaped(out.strip(), limit=200)}"
            self.checks.append(Check("slurm-tokens", FAIL, detail))
            return
        found = re.search(r"^AuthAltParameters\s*=\s*(\S*)", out, flags=re.M)
        value = found[1] if found else ""
        if slinky.DISABLE_TOKEN_CREATION in value.split(","):
            self.checks.append(
                Check("slurm-tokens", OK, f"only root and SlurmUser mint JWTs (AuthAltParameters={value})")
            )
            return
        detail = f"AuthAltParameters={escaped(value, limit=200)}: any Slurm user, or any JWT's holder, may mint itself a token"
        fix = f"pulumi up --refresh --stack {self.s.stack}  (then see docs/security-and-day2.md if it stays)"
        self.checks.append(Check("slurm-tokens", FAIL, detail, remedy=fix))

    def prometheus(self) -> None:
        # The queries the deployed ScaledObject runs (components/keda.py: the default policy, the
        # stack's cooldown as the warmth window). slurmctld
        # emits every metric for every partition, zeros included, so an empty result means
        # Prometheus lacks a target (SchedMD/slurm@slurm-25-11-0-1:
        # src/plugins/metrics/openmetrics/openmetrics.c), and KEDA's trigger errors; lend-and-reclaim
        # and fair-share read that as 0 and say it in their slurm_metrics trigger (0: lost).
        from components import keda, slurmd_scaling

        empty, values = [], []
        for trigger in keda.triggers(self.n):
            name, query = trigger["name"], trigger["metadata"]["query"]
            result = self.kube.prometheus(query)
            if result:
                values.append(f"{name}={result[0]['value'][1]}")
            if not result or (name == slurmd_scaling.SLURM_METRICS and float(result[0]["value"][1]) == 0):
                empty.append(name)
        if empty:
            self.checks.append(
                Check(
                    "prometheus",
                    FAIL,
                    f"no series for {', '.join(empty)}: slurmctld's metrics are missing in Prometheus (its "
                    "target is down, or slurmctld runs without MetricsType=metrics/openmetrics and serves "
                    "/metrics/partitions empty); slurmd scaling cannot see Slurm's demand (alert "
                    "SlurmMetricsMissing; docs/handoff.md 'One input lost')",
                )
            )
        else:
            self.checks.append(Check("prometheus", OK, f"scrapes slurmctld: {', '.join(values)}"))


# ---------------------------------------------------------------------- the real cluster


class KubeApi:
    """`Kube` over the kubernetes client."""

    def __init__(self, api_client: Any, n: names.Names):
        from kubernetes import client

        from validation.cluster import KubeCluster

        self.api, self.n = api_client, n
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.autoscaling = client.AutoscalingV2Api(api_client)
        self.cluster = KubeCluster(api_client, n.slurm, exec_timeout=EXEC_TIMEOUT_SECONDS)

    def _plain(self, obj: Any) -> Any:
        return self.api.sanitize_for_serialization(obj)

    def nodes(self) -> list[dict]:
        return self._plain(self.core.list_node().items)

    def pods(self, namespace: str) -> list[dict]:
        return self._plain(self.core.list_namespaced_pod(namespace).items)

    def dry_run(self, obj: dict) -> None:
        group, version = obj["apiVersion"].split("/")
        plural = obj["kind"].lower() + "s"
        namespace = obj["metadata"].get("namespace")
        if namespace:
            self.custom.create_namespaced_custom_object(group, version, namespace, plural, obj, dry_run="All")
        else:
            self.custom.create_cluster_custom_object(group, version, plural, obj, dry_run="All")

    def dry_run_patch_as(self, user: str, path: str, operations: list[dict], field_manager: str) -> None:
        """A server-side dry run of a JSON patch at `path`, impersonating `user` by a header on this
        request alone (the admin's client keeps its own identity for every other call)."""
        self.api.call_api(
            path,
            "PATCH",
            query_params=[("dryRun", "All"), ("fieldManager", field_manager)],
            header_params={"Content-Type": JSON_PATCH, "Accept": "application/json", "Impersonate-User": user},
            body=operations,
            auth_settings=["BearerToken"],
            response_type="object",
        )

    def exec(self, namespace: str, pod: str, container: str, command: list[str]) -> tuple[int, str]:
        """Through validation's exec, the one reading of the kubernetes client's exec stream; a
        command that could not run (no connection, no exit status, no end in time) exits 1 with why."""
        from validation.cluster import ClusterError

        try:
            code, out, err = self.cluster.exec_in_pod(namespace, pod, container, command)
        except ClusterError as error:
            return 1, str(error)
        return code, out + err

    def get(self, group: str, version: str, namespace: str, plural: str, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(group, version, namespace, plural, name)

    def get_cluster(self, group: str, version: str, plural: str, name: str) -> dict:
        return self.custom.get_cluster_custom_object(group, version, plural, name)

    def hpa(self, namespace: str, name: str) -> dict:
        return self._plain(self.autoscaling.read_namespaced_horizontal_pod_autoscaler(name, namespace))

    def prometheus(self, query: str) -> list[dict]:
        """An instant query through the API server's service proxy."""
        path = (
            f"/api/v1/namespaces/{names.MONITORING_NAMESPACE}/services/"
            f"{self.n.prometheus_service}:{names.PROMETHEUS_PORT}/proxy/api/v1/query"
        )
        data, _, _ = self.api.call_api(
            path,
            "GET",
            query_params=[("query", query)],
            auth_settings=["BearerToken"],
            response_type="object",
            _return_http_data_only=False,
        )
        return data.get("data", {}).get("result", [])


# ---------------------------------------------------------------------- CLI


def read_outputs(stack: str) -> dict | str:
    """The stack's outputs with secrets (the SSH key), or why they cannot be read."""
    return offline.read_stack_outputs(stack, show_secrets=True)


def parser() -> argparse.ArgumentParser:
    p = checklist.OneLineParser(prog=f"{typed_command()} doctor", description=as_typed(__doc__), epilog=_longest_wait())
    offline.add_stack_arguments(p)
    p.add_argument("--kubeconfig", type=Path, help="default: $KUBECONFIG, else the stack's kubeconfig output")
    return p


def _longest_wait() -> str:
    from validation import cluster

    return (
        f"Longest wait: {cluster.describe_bound()}; a cluster that does not answer ends the doctor at its "
        f"first call, exit 2. An exec in a pod: {EXEC_TIMEOUT_SECONDS} s; ssh to a node: "
        f"{3 * SSH_CONNECT_TIMEOUT} s."
    )


def _kubeconfig(given: Path | None, outputs: dict | str) -> dict:
    try:
        config = user_files.read_kubeconfig(given)
    except user_files.UserFileError as error:
        raise BadInput(error.problem) from None
    if config is not None:
        return config
    if isinstance(outputs, dict) and isinstance(outputs.get("kubeconfig"), str):
        text = outputs["kubeconfig"]
    else:
        raise BadInput(
            f"--kubeconfig and $KUBECONFIG not given and the stack's kubeconfig output is unreadable ({outputs})"
        )
    try:
        config = user_files.parse_yaml(text, typed=True)
    except user_files.UserFileError:
        config = None
    if not isinstance(config, dict) or not config.get("clusters"):
        raise BadInput("kubeconfig: not a kubeconfig (no clusters)")
    return config


def main(argv: list[str], kube: Kube | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        s = offline.stack_settings(args.stack, args.config)
    except SettingsError as error:
        for problem in error.problems:
            print(problem, file=sys.stderr)
        return checklist.EXIT_BAD_INPUT
    outputs = read_outputs(args.stack)
    try:
        if kube is None:
            kube = _client(_kubeconfig(args.kubeconfig, outputs), names.Names.from_settings(s))
        with tempfile.TemporaryDirectory(prefix="testbed-doctor-") as workdir:
            logs = None
            if isinstance(outputs, dict) and outputs.get("controlPlanePublicIp") and outputs.get("sshPrivateKey"):
                logs = Ssh(outputs["controlPlanePublicIp"], outputs["sshPrivateKey"], Path(workdir)).log_tail
            checks = _run(Doctor(s, kube, logs))
    except BadInput as error:
        print(error, file=sys.stderr)
        return checklist.EXIT_BAD_INPUT
    for c in checks:
        print("\n".join(c.lines()))
    code, text = checklist.verdict(checks, good="healthy")
    print(text)
    return code


def _client(kubeconfig: dict, n: names.Names) -> KubeApi:
    """The cluster through validation's bounded client (each call: validation.cluster.describe_bound);
    a kubeconfig it cannot use is bad input, an exec: plugin in it named on stderr before it runs."""
    from validation.cluster import KubeconfigError, api_client

    try:
        return KubeApi(api_client(kubeconfig), n)
    except KubeconfigError as error:
        raise BadInput(str(error)) from None


def _run(doctor: Doctor) -> list[Check]:
    """Run the checks; an API server that cannot be reached at all, or that answers what the API
    does not (an HTML page), is bad input, not a finding: one line naming it."""
    from urllib3.exceptions import HTTPError

    from validation.cluster import shown_server, unanswered

    try:
        return doctor.run()
    except (HTTPError, OSError) as error:
        api = getattr(doctor.kube, "api", None)
        where = shown_server(api.configuration.host) if api is not None else "the API server"
        raise BadInput(f"cluster: {where}: {unanswered(error)}") from None

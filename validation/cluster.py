"""Everything the runner asks of the cluster, behind one small interface.

`Cluster` is what the runner needs; `KubeCluster` does it with the kubernetes client,
through the same doors users use: sbatch by exec into slurmctld, Kubernetes jobs through
the API. Tests pass a fake that simulates a tiny cluster instead.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any, Protocol
from urllib.parse import urlsplit

from urllib3.exceptions import HTTPError

from core import host_layout
from core.names import (
    GPU_RESOURCE,
    JOBS_NAMESPACE,
    NODESET_GROUP,
    NODESET_PLURAL,
    NODESET_VERSION,
    SLURMCTLD_CONTAINER,
    SLURMD_HOSTNAME_LABEL,
    SlurmNames,
    label_selector,
)
from core.settings import escaped, redacted
from validation import probe
from validation.probe import parse_processes
from validation.scenarios import SLURM, SLURM_OUTPUT_DIR, sbatch_command
from validation.timeline import (
    KUBERNETES,
    SLURMD,
    DcgmHolding,
    GpuPod,
    GpuProcess,
    SlurmJob,
    batch_job_phase,
    pytorchjob_phase,
)

# Reads the GPU(s) the device plugin gave this container, from inside it. With the testbed's
# volume-mounts strategy and UUID ids (components/device_plugin.py) kubelet mounts /dev/null at
# <root>/<GPU UUID> for each allocated GPU, so the names are the allocation itself; nvidia-smi
# would not do: slurmd pods are privileged and see every GPU device of their host.
UUID_QUERY = ["ls", "-1", host_layout.DEVICE_LIST_ROOT]

# squeue with every state slurmctld still remembers (finished jobs stay MinJobAge, 300 s).
SQUEUE = ["squeue", "--noheader", "--states=all", "--format=%i|%j|%T|%N"]


class Cluster(Protocol):
    def submit_slurm(self, name: str, script: str) -> str:
        """sbatch the script under this job name; returns the Slurm job id."""

    def cancel_slurm(self, job_ids: list[str]) -> None: ...

    def slurm_jobs(self) -> list[SlurmJob]: ...

    def create(self, obj: dict) -> None: ...

    def delete(self, obj: dict) -> None: ...

    def kube_job_phase(self, obj: dict) -> str:
        """The normalised phase of a PyTorchJob or Job we created."""

    def nodeset(self) -> tuple[int, int]:
        """(.spec.replicas, .status.readyReplicas) of the slurmd NodeSet."""

    def gpu_pods(self) -> list[GpuPod]:
        """Every pod that requests GPUs, without UUIDs."""

    def read_gpu_uuids(self, pod: GpuPod) -> tuple[str, ...]:
        """The UUIDs of the GPUs a running pod holds, read inside it; () if not readable yet."""

    def start_probe(self) -> None:
        """Deploy the process probe (validation/probe.py) on the GPU nodes."""

    def stop_probe(self) -> None: ...

    def gpu_processes(self) -> tuple[list[GpuProcess], bool]:
        """Every process on every GPU now, with its pod; and whether every GPU node answered."""

    def dcgm_holdings(self, t0_epoch: float, duration: float, step: float) -> list[DcgmHolding]:
        """dcgm-exporter's pod label per GPU over the run, from Prometheus (times since t0)."""

    def job_output(self, kind: str, name: str, ref: str) -> str:
        """What a finished job wrote: a Slurm job's --output file (ClusterError unless it has the digest
        recorded when the job ended: check_output_digest), a PyTorchJob's Master log."""

    def check_reachable(self) -> None:
        """Raise ClusterError unless the API server answers and the NodeSet exists."""


def check_output_digest(path: str, output: str, recorded: str | None) -> None:
    """Raise ClusterError unless `output` (read from `path`) has the sha256 that slurmctld's
    EpilogSlurmctld recorded when the job ended (components/scripts/output-digest.sh): the share's
    owner or a later job may have rewritten it since, and then it is no evidence."""
    if recorded is None or not recorded.strip():
        raise ClusterError(f"{path}: no output digest recorded when the job ended; its output is not evidence")
    actual = hashlib.sha256(output.encode()).hexdigest()
    if actual != recorded.strip():
        raise ClusterError(
            f"{path}: sha256 {actual[:16]} differs from the digest recorded when the job ended "
            f"({escaped(recorded.strip(), 16)}): the output was rewritten; it is not evidence"
        )


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a clock that never jumps: durations."""

    def epoch(self) -> float:
        """Seconds since the epoch now: for queries in the cluster's own time (Prometheus)."""

    def sleep(self, seconds: float) -> None: ...


class WallClock:
    def now(self) -> float:
        return time.monotonic()

    def epoch(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class ClusterError(Exception):
    """The cluster did not answer as it should this time: the runner retries the sample."""


# ------------------------------------------------------------------ pure parsing


def exit_code(status_frame: str, where: str) -> int:
    """The exit code in an exec's status frame (a metav1.Status on channel 3), or ClusterError.

    Success is 0; NonZeroExitCode carries the code as its cause's message; anything else
    (InternalError, no frame at all because the stream closed early) is no exit code."""
    try:
        status = json.loads(status_frame) if status_frame else None
    except ValueError:
        status = None
    if not isinstance(status, dict):
        raise ClusterError(f"{where}: the stream closed without an exit status")
    if status.get("status") == "Success":
        return 0
    causes = (status.get("details") or {}).get("causes") or []
    if status.get("reason") == "NonZeroExitCode":
        for cause in causes:
            if cause.get("reason") == "ExitCode" and str(cause.get("message", "")).isdigit():
                return int(cause["message"])
    message = status.get("message") or "; ".join(str(c.get("message", "")) for c in causes) or str(status)
    raise ClusterError(f"{where}: {status.get('reason') or 'Failure'}: {message[:300]}")


# dcgm-exporter labels each GPU's metrics with the pod kubelet's PodResources API says holds
# it (DCGM_EXPORTER_KUBERNETES; kept as `pod`/`namespace` by honorLabels on its ServiceMonitor).
DCGM_HOLDER_QUERY = 'max by (UUID, namespace, pod) (DCGM_FI_DEV_GPU_UTIL{pod!=""})'


def parse_dcgm(answer: dict, t0_epoch: float, step: float) -> list[DcgmHolding]:
    """A Prometheus query_range matrix as holdings: one per unbroken run of one pod on one GPU
    (a gap of more than two steps ends it: slurmd pods come back under the same name)."""
    if answer.get("status") != "success":
        raise ValueError(answer.get("error") or "status is not success")
    found = []
    for series in answer["data"]["result"]:
        labels = series["metric"]
        times = sorted(float(t) - t0_epoch for t, _ in series["values"])
        pod = f"{labels.get('namespace', '')}/{labels['pod']}"
        start = prev = times[0]
        for t in times[1:]:
            if t - prev > 2 * step:
                found.append(DcgmHolding(labels["UUID"], pod, round(start, 3), round(prev, 3)))
                start = t
            prev = t
        found.append(DcgmHolding(labels["UUID"], pod, round(start, 3), round(prev, 3)))
    return sorted(found, key=lambda h: (h.uuid, h.start, h.pod))


def api_error(error) -> str:
    """One line for an ApiException: status, reason and the Status message if there is one."""
    detail = ""
    try:
        detail = json.loads(error.body or "{}").get("message", "")
    except (ValueError, AttributeError):
        detail = ""
    words = [str(error.status) if error.status else "", str(error.reason or "").strip(), detail]
    return " ".join(w for w in words if w)[:300] or "no answer"


def expand_hostlist(hostlist: str) -> tuple[str, ...]:
    """Slurm's compressed node list, e.g. 'slinky-[0-1,3],other-2' -> each name."""
    names: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", hostlist):
        if plain:
            names.append(plain)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            width = len(low)
            for n in range(int(low), int(high or low) + 1):
                names.append(f"{prefix}{n:0{width}d}")
    return tuple(names)


def parse_squeue(text: str) -> list[SlurmJob]:
    jobs = []
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 4:
            continue
        job_id, name, state, nodes = fields
        # Pending jobs show a reason, not nodes, in %N's place on some versions.
        jobs.append(SlurmJob(job_id, name, state, expand_hostlist(nodes) if state != "PENDING" else ()))
    return jobs


def parse_uuids(text: str) -> tuple[str, ...]:
    return tuple(line.strip() for line in text.splitlines() if line.strip().startswith("GPU-"))


def _gpus(container: dict) -> int:
    limits = (container.get("resources") or {}).get("limits") or {}
    return int(limits.get(GPU_RESOURCE, 0) or 0)


def pod_gpu_count(pod_spec: dict) -> int:
    """A pod's effective nvidia.com/gpu: the larger of its largest init container and the sum
    of its containers (Kubernetes' rule for extended resources, kubernetes/kubernetes
    pkg/api/v1/resource/helpers.go PodRequests); sidecar init containers are not special here."""
    init = max((_gpus(c) for c in pod_spec.get("initContainers") or []), default=0)
    return max(init, sum(_gpus(c) for c in pod_spec.get("containers") or []))


def pod_gpu_container(pod_spec: dict) -> str | None:
    """The container to read the GPU from: a main one that asked for GPUs, else the first main one
    (the pod holds its init containers' GPUs for its whole life)."""
    containers = pod_spec.get("containers") or []
    for container in containers:
        if _gpus(container) > 0:
            return container["name"]
    return containers[0]["name"] if containers and pod_gpu_count(pod_spec) else None


# Every slurmd pod carries it, whichever NodeSet made it (internal/builder/labels/labels.go).
SLURMD_APP_LABEL = ("app.kubernetes.io/name", "slurmd")


def classify_pod(pod: dict, names: SlurmNames) -> GpuPod | None:
    """A pod (API dict, camelCase) as a GpuPod, or None if it asks for no GPU."""
    gpus = pod_gpu_count(pod["spec"])
    if not gpus:
        return None
    container = pod_gpu_container(pod["spec"]) or ""
    status = pod.get("status") or {}
    scheduled = any(
        c.get("type") == "PodScheduled" and str(c.get("status")) == "True" for c in status.get("conditions") or []
    )
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    slurmd_key, slurmd_value = SLURMD_APP_LABEL
    if meta["namespace"] == names.namespace and labels.get(slurmd_key) == slurmd_value:
        holder, owner = SLURMD, labels.get(SLURMD_HOSTNAME_LABEL) or pod["spec"].get("hostname") or meta["name"]
    else:
        holder = KUBERNETES
        owner = (
            labels.get("training.kubeflow.org/job-name")
            or labels.get("batch.kubernetes.io/job-name")
            or labels.get("job-name")
            or meta["name"]
        )
    return GpuPod(
        namespace=meta["namespace"],
        name=meta["name"],
        uid=meta["uid"],
        node=pod["spec"].get("nodeName") or "",
        phase=status.get("phase") or "Pending",
        holder=holder,
        owner=owner,
        container=container,
        scheduled=scheduled or bool(pod["spec"].get("nodeName")),
        gpus=gpus,
    )


# ------------------------------------------------------------------ the real cluster


class KubeCluster:
    """The live testbed, reached with the kubernetes client."""

    def __init__(
        self,
        api_client,
        names: SlurmNames,
        exec_timeout: float = 60.0,
        prometheus: tuple[str, str, int] | None = None,  # namespace, Service, port
    ) -> None:
        from kubernetes import client

        self.api = api_client
        self.prometheus = prometheus
        self.apps = client.AppsV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.names = names
        self.exec_timeout = exec_timeout

    @classmethod
    def from_kubeconfig(
        cls,
        kubeconfig: dict,
        names: SlurmNames,
        prometheus: tuple[str, str, int] | None = None,
        notice: Callable[[str], None] | None = None,
    ) -> KubeCluster:
        return cls(api_client(kubeconfig, notice), names, prometheus=prometheus)

    def exec_in_pod(self, namespace: str, pod: str, container: str, command: list[str]) -> tuple[int, str, str]:
        """Run `command` in a container: (exit code, stdout, stderr) once it ended, or ClusterError.

        kubernetes 34.1.0 (stream/ws_client.py): `websocket_call` turns any failure to connect,
        KeyboardInterrupt included, into ApiException(status=0), so a Ctrl-C there is raised
        again as itself. `WSClient.returncode` raises ValueError on a status frame whose cause
        is not an exit code (InternalError) and TypeError on a stream closed without one, so
        the status channel is read here instead.
        """
        from kubernetes.client.exceptions import ApiException
        from kubernetes.stream import stream
        from kubernetes.stream.ws_client import ERROR_CHANNEL
        from websocket import WebSocketException

        where = f"exec {command[0]} in {namespace}/{pod}"
        try:
            ws = stream(
                self.core.connect_get_namespaced_pod_exec,
                pod,
                namespace,
                container=container,
                command=command,
                stdin=False,
                stdout=True,
                stderr=True,
                tty=False,
                _preload_content=False,
            )
        except ApiException as error:
            if isinstance(error.__context__, KeyboardInterrupt):
                raise KeyboardInterrupt from None
            raise ClusterError(f"{where}: {api_error(error)}") from None
        try:
            ws.run_forever(timeout=self.exec_timeout)
            if ws.is_open():
                raise ClusterError(f"{where}: no end after {self.exec_timeout:g} s")
            # timeout=0: the stream is closed; take what it buffered, never wait.
            out, err = ws.read_stdout(timeout=0), ws.read_stderr(timeout=0)
            status = ws.read_channel(ERROR_CHANNEL, timeout=0)
        except (OSError, WebSocketException) as error:  # e.g. the connection lost mid-stream
            raise ClusterError(f"{where}: {error or type(error).__name__}") from None
        finally:
            ws.close()
        return exit_code(status, where), out, err

    def _slurmctld(self, command: list[str]) -> str:
        n = self.names
        code, out, err = self.exec_in_pod(n.namespace, n.controller_pod, SLURMCTLD_CONTAINER, command)
        if code != 0:
            raise ClusterError(f"{' '.join(command[:2])} in {n.controller_pod} exited {code}: {err.strip()[:300]}")
        return out

    def submit_slurm(self, name: str, script: str) -> str:
        # The script goes in as sbatch's stdin, as with `kubectl exec -i ... sbatch < file`;
        # a shell pipes it in because the client cannot half-close an exec's stdin.
        piped = ["sh", "-c", 'printf "%s" "$0" | ' + " ".join(sbatch_command(name)), script]
        return self._slurmctld(piped).strip().split(";")[0]

    def cancel_slurm(self, job_ids: list[str]) -> None:
        if job_ids:
            self._slurmctld(["scancel", *job_ids])

    def slurm_jobs(self) -> list[SlurmJob]:
        return parse_squeue(self._slurmctld(SQUEUE))

    def create(self, obj: dict) -> None:
        namespace, name = obj["metadata"].get("namespace", JOBS_NAMESPACE), obj["metadata"]["name"]
        with answering(f"create {obj['kind']} {namespace}/{name}", ok=(409,)):  # 409: an earlier try made it
            if obj["kind"] == "PyTorchJob":
                self.custom.create_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", obj)
            else:
                self.batch.create_namespaced_job(namespace, obj)

    def delete(self, obj: dict) -> None:
        namespace, name = obj["metadata"].get("namespace", JOBS_NAMESPACE), obj["metadata"]["name"]
        with answering(f"delete {obj['kind']} {namespace}/{name}", ok=(404,)):
            if obj["kind"] == "PyTorchJob":
                self.custom.delete_namespaced_custom_object(
                    "kubeflow.org", "v1", namespace, "pytorchjobs", name, propagation_policy="Foreground"
                )
            else:
                self.batch.delete_namespaced_job(name, namespace, propagation_policy="Foreground")

    def job_output(self, kind: str, name: str, ref: str) -> str:
        if kind == SLURM:  # slurmctld mounts the share the example scripts write --output to
            path = f"{SLURM_OUTPUT_DIR}/{name}-{ref}.out"
            output = self._slurmctld(["cat", path])
            try:
                recorded: str | None = self._slurmctld(["cat", f"{host_layout.OUTPUT_DIGEST_DIR}/{ref}.sha256"])
            except ClusterError:
                recorded = None
            check_output_digest(path, output, recorded)
            return output
        if kind != "PyTorchJob":
            raise ClusterError(f"no output is read for a {kind}")
        pod = f"{name}-master-0"  # the Training Operator's pod name for the Master replica
        with answering(f"read the log of pod {JOBS_NAMESPACE}/{pod}"):
            return self.core.read_namespaced_pod_log(pod, JOBS_NAMESPACE, container="pytorch")

    def kube_job_phase(self, obj: dict) -> str:
        namespace, name = obj["metadata"].get("namespace", JOBS_NAMESPACE), obj["metadata"]["name"]
        with answering(f"read {obj['kind']} {namespace}/{name}"):
            if obj["kind"] == "PyTorchJob":
                found = self.custom.get_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", name)
                return pytorchjob_phase((found.get("status") or {}).get("conditions") or [])
            found = self.batch.read_namespaced_job_status(name, namespace)
            return batch_job_phase(self.api.sanitize_for_serialization(found.status) or {})

    def nodeset(self) -> tuple[int, int]:
        n = self.names
        with answering(f"read NodeSet {n.namespace}/{n.nodeset_resource}"):
            found = self.custom.get_namespaced_custom_object(
                NODESET_GROUP, NODESET_VERSION, n.namespace, NODESET_PLURAL, n.nodeset_resource
            )
        if found.get("kind") != "NodeSet":  # a custom object comes back as any JSON object
            raise ClusterError(
                f"read NodeSet {n.namespace}/{n.nodeset_resource}: answered an object of kind "
                f"{escaped(str(found.get('kind')), 40)}; expected the Kubernetes API's NodeSet"
            )
        # No .spec.replicas means 0 (the 1.0.0 CRD has no default).
        return int(found.get("spec", {}).get("replicas") or 0), int(found.get("status", {}).get("readyReplicas") or 0)

    def check_reachable(self) -> None:
        try:
            self.nodeset()
        except ClusterError as error:
            raise ClusterError(f"{shown_server(self.api.configuration.host)}: {error}") from None

    def gpu_pods(self) -> list[GpuPod]:
        with answering("list pods"):
            pods = self.api.sanitize_for_serialization(self.core.list_pod_for_all_namespaces()).get("items", [])
        return [p for p in (classify_pod(pod, self.names) for pod in pods) if p is not None]

    def read_gpu_uuids(self, pod: GpuPod) -> tuple[str, ...]:
        try:
            code, out, _ = self.exec_in_pod(pod.namespace, pod.name, pod.container, UUID_QUERY)
        except ClusterError:
            return ()  # not exec-able yet, or already gone: try again next sample
        return parse_uuids(out) if code == 0 else ()

    def start_probe(self) -> None:
        obj = probe.daemonset()
        with answering(f"create DaemonSet {probe.NAMESPACE}/{probe.NAME}", ok=(409,)):  # left by a run cut short
            self.apps.create_namespaced_daemon_set(probe.NAMESPACE, obj)

    def stop_probe(self) -> None:
        with answering(f"delete DaemonSet {probe.NAMESPACE}/{probe.NAME}", ok=(404,)):
            self.apps.delete_namespaced_daemon_set(probe.NAME, probe.NAMESPACE)

    def gpu_processes(self) -> tuple[list[GpuProcess], bool]:
        key, value = host_layout.GPU_NODE_LABEL
        with answering("list GPU nodes"):
            nodes = [n.metadata.name for n in self.core.list_node(label_selector=f"{key}={value}").items]
        with answering(f"list {probe.NAME} pods"):
            pods = self.core.list_namespaced_pod(probe.NAMESPACE, label_selector=label_selector(probe.LABELS)).items
        running = {p.spec.node_name: p.metadata.name for p in pods if p.status and p.status.phase == "Running"}
        found: list[GpuProcess] = []
        complete = bool(nodes)
        for node in nodes:
            try:
                code, out, _ = self.exec_in_pod(probe.NAMESPACE, running[node], probe.CONTAINER, probe.QUERY)
            except (KeyError, ClusterError):  # no probe running there yet, or it did not answer
                complete = False
                continue
            complete = complete and code == 0
            found += parse_processes(out, node) if code == 0 else []
        return found, complete

    def dcgm_holdings(self, t0_epoch: float, duration: float, step: float) -> list[DcgmHolding]:
        if self.prometheus is None:
            return []
        namespace, service, port = self.prometheus
        params = [
            ("query", DCGM_HOLDER_QUERY),
            ("start", f"{t0_epoch:.3f}"),
            ("end", f"{t0_epoch + duration:.3f}"),
            ("step", f"{step:g}"),
        ]
        with answering(f"query Prometheus {namespace}/{service}"):
            response = self.api.call_api(
                f"/api/v1/namespaces/{namespace}/services/{service}:{port}/proxy/api/v1/query_range",
                "GET",
                query_params=params,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
            )
        try:
            return parse_dcgm(json.loads(response.data), t0_epoch, step)
        except (ValueError, KeyError, TypeError) as error:
            raise ClusterError(f"query Prometheus {namespace}/{service}: no query_range answer ({error})") from None


@contextmanager
def answering(what: str, ok: tuple[int, ...] = ()):
    """API calls: an error status (but those in `ok`) or a dead connection is a ClusterError."""
    from kubernetes.client.exceptions import ApiException

    try:
        yield
    except ApiException as error:
        if error.status not in ok:
            raise ClusterError(f"{what}: {api_error(error)}") from None
    except (HTTPError, OSError) as error:
        raise ClusterError(f"{what}: {unanswered(error)}") from None


# ------------------------------------------------------------------ the client: bounded waits

# Every call to the API server waits at most CONNECT_SECONDS to connect and READ_SECONDS for
# the answer, and is tried again RETRIES time(s) (a dropped connection, a server restarting):
# kubernetes 34.1.0 (client/rest.py) passes `_request_timeout` to urllib3 as Timeout(connect,
# read) and Configuration.retries to its PoolManager; without them urllib3 waits forever and
# retries 3 times. The exec websocket connects and reads under websocket-client's default
# timeout, which is unset (None: forever) unless set here.
CONNECT_SECONDS = 5.0
READ_SECONDS = 15.0
RETRIES = 1


def call_bound() -> float:
    """The longest one API call waits on a server that never answers: every try, each to the end
    of its connect and read timeouts (no backoff between tries)."""
    return (1 + RETRIES) * (CONNECT_SECONDS + READ_SECONDS)


def describe_bound() -> str:
    return (
        f"{call_bound():g} s per call to the API server (connect {CONNECT_SECONDS:g} s + read "
        f"{READ_SECONDS:g} s, tried {1 + RETRIES} times)"
    )


class KubeconfigError(Exception):
    """A kubeconfig the kubernetes client cannot use: one line, exit 2."""


class NotKubernetes(HTTPError):
    """The endpoint answered, but not as the Kubernetes API does (an HTML page from a proxy, an
    empty body, JSON of another shape). An HTTPError, as a connection that fails is: both say the
    cluster cannot be used, and both are caught where a dead connection is."""


def shown_server(url: str) -> str:
    """A server URL as a problem line shows it: a user name, password or token in it hidden
    (https://user:token@host/, ?token=...), the rest escaped."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(a server URL that cannot be parsed)"
    userinfo = "(hidden)@" if parts.username or parts.password else ""
    query = "?(hidden)" if parts.query else ""
    host = f"[{host}]" if ":" in host else host
    return escaped(f"{parts.scheme}://{userinfo}{host}{port}{parts.path}{query}", 120)


def _context_user(kubeconfig: dict) -> tuple[str, dict] | None:
    """The user entry of the kubeconfig's current context, if it can be found."""
    current = kubeconfig.get("current-context")
    contexts = kubeconfig.get("contexts")
    users = kubeconfig.get("users")
    if not isinstance(contexts, list) or not isinstance(users, list):
        return None
    context = next((c for c in contexts if isinstance(c, dict) and c.get("name") == current), None)
    user_name = ((context or {}).get("context") or {}).get("user") if isinstance(context, dict) else None
    user = next((u for u in users if isinstance(u, dict) and u.get("name") == user_name), None)
    if not isinstance(user, dict) or not isinstance(user.get("user"), dict):
        return None
    return str(user_name), user["user"]


def exec_plugin_notice(kubeconfig: dict) -> str | None:
    """One line naming the credential plugin the kubeconfig's user runs (`exec:`), if it has one:
    the kubernetes client runs it while it loads the kubeconfig (config/exec_provider.py)."""
    found = _context_user(kubeconfig)
    plugin = found[1].get("exec") if found else None
    if not isinstance(plugin, dict):
        return None
    args = plugin.get("args")
    command = " ".join(str(part) for part in [plugin.get("command", ""), *(args if isinstance(args, list) else [])])
    return (
        f"kubeconfig: user {escaped(found[0], 60) if found else ''} gets its credentials by running "
        f"`{redacted(command, 160)}` (an exec: plugin); running it now"
    )


def _problem_text(error: BaseException) -> str:
    return redacted(str(error).replace("\n", " "), 200) or type(error).__name__


def api_client(kubeconfig: dict, notice: Callable[[str], None] | None = None) -> Any:
    """A kubernetes ApiClient for the kubeconfig's current context whose every call is bounded
    (`call_bound`) and whose answers are the API's JSON, or KubeconfigError, one line. An exec:
    plugin is named through `notice` (stderr by default) before it runs."""
    import urllib3
    import websocket
    from kubernetes import client, config

    if not isinstance(kubeconfig.get("clusters"), list) or not all(isinstance(c, dict) for c in kubeconfig["clusters"]):
        raise KubeconfigError("kubeconfig: clusters is not a list of clusters; expected clusters: [{name, cluster}]")
    current = kubeconfig.get("current-context")
    if not isinstance(current, str) or not current:
        raise KubeconfigError(
            "kubeconfig: current-context is missing or empty; expected the name of one of its contexts "
            "(kubectl config use-context NAME)"
        )
    line = exec_plugin_notice(kubeconfig)
    if line:
        (notice or (lambda text: print(text, file=sys.stderr, flush=True)))(line)
    configuration = client.Configuration()
    try:
        config.load_kube_config_from_dict(kubeconfig, client_configuration=configuration, persist_config=False)
    except Exception as error:  # ConfigException, and what a malformed entry raises inside the loader
        raise KubeconfigError(f"kubeconfig: the kubernetes client refuses it ({_problem_text(error)})") from None
    configuration.retries = urllib3.Retry(total=RETRIES, connect=RETRIES, read=RETRIES, backoff_factor=0)
    websocket.setdefaulttimeout(CONNECT_SECONDS + READ_SECONDS)
    return _bounded_client_class()(configuration)


@functools.cache
def _bounded_client_class() -> type:
    from kubernetes import client

    class Bounded(client.ApiClient):
        """Every request with the timeouts above, every JSON answer checked for its shape."""

        def request(self, method, url, *args, _request_timeout=None, **kwargs):
            timeout = _request_timeout or (CONNECT_SECONDS, READ_SECONDS)
            return super().request(method, url, *args, _request_timeout=timeout, **kwargs)

        def deserialize(self, response, response_type):
            if response_type in ("str", "file", None):  # a pod's log is text
                return super().deserialize(response, response_type)
            try:
                data = json.loads(response.data)
            except (ValueError, TypeError):
                data = None
            kind = re.fullmatch(r"V[0-9]+(?:alpha[0-9]+|beta[0-9]+)?([A-Z]\w*)", str(response_type))
            if isinstance(data, dict) and (kind is None or data.get("kind") == kind[1]):
                try:
                    return super().deserialize(response, response_type)
                except (ValueError, TypeError, KeyError, AttributeError):
                    pass
            raise NotKubernetes(not_kubernetes(self.configuration.host, response))

    return Bounded


def not_kubernetes(host: str, response: Any) -> str:
    """One line: the endpoint, and what came back in the place of the API's JSON."""
    body = response.data if isinstance(response.data, str) else bytes(response.data or b"").decode("utf-8", "replace")
    kind = (response.urllib3_response.headers.get("Content-Type") or "no content type").split(";")[0]
    what = f"{len(body)} bytes of {kind}: {redacted(' '.join(body.split()), 80)}" if body.strip() else "an empty body"
    return (
        f"{shown_server(host)} answered {response.status} with {what}; expected the Kubernetes API's JSON "
        "(a proxy, a login page or another service at that address?)"
    )


def unanswered(error: BaseException) -> str:
    """What an API call that failed without an API error got: the odd answer, or why none came."""
    if isinstance(error, NotKubernetes):
        return str(error)
    cause = getattr(error, "reason", None) or error  # MaxRetryError carries the last try's error
    return f"no answer ({type(cause).__name__}) after waiting at most {describe_bound()}"

"""The real exec path (`KubeCluster.exec_in_pod`) through the kubernetes 34.1.0 client and
websocket-client, against a local fake of the API server's exec endpoint on 127.0.0.1.

The fake speaks just enough RFC 6455 and the v4.channel.k8s.io protocol: one binary frame
per message, the first byte the channel (1 stdout, 2 stderr, 3 the metav1.Status that ends
the command). Each test scripts what the server sends, including the failures FACTS §13
lists for this client: an InternalError status, a stream closed without a status, and a
Ctrl-C while the client connects (which `websocket_call` turns into ApiException(status=0)).
"""

from __future__ import annotations

import base64
import hashlib
import json
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes import client
from kubernetes.stream.ws_client import WSClient

from core.names import slurm_names
from validation.cluster import ClusterError, KubeCluster

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 section 1.3
SUCCESS = {"metadata": {}, "status": "Success"}
NON_ZERO = {
    "metadata": {},
    "status": "Failure",
    "message": "command terminated with non-zero exit code: error executing command [false], exit code 3",
    "reason": "NonZeroExitCode",
    "details": {"causes": [{"reason": "ExitCode", "message": "3"}]},
}
INTERNAL = {
    "metadata": {},
    "status": "Failure",
    "message": 'Internal error occurred: error executing command in container: exec: "nvidia-smi": not found',
    "reason": "InternalError",
    "details": {"causes": [{"message": 'error executing command in container: exec: "nvidia-smi": not found'}]},
    "code": 500,
}


def frame(opcode: int, payload: bytes) -> bytes:
    """A server frame: FIN set, unmasked (RFC 6455 5.2)."""
    n = len(payload)
    if n < 126:
        header = struct.pack("!BB", 0x80 | opcode, n)
    elif n < 1 << 16:
        header = struct.pack("!BBH", 0x80 | opcode, 126, n)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 127, n)
    return header + payload


class FakeExecServer:
    """One connection at a time; `script` is what to do once the upgrade is done."""

    def __init__(self, script: list[tuple], handshake_delay_until: threading.Event | None = None):
        self.script = script
        self.handshake_delay_until = handshake_delay_until
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests: list[dict] = []
        self.connected = threading.Event()  # the client is waiting on us
        self.release = threading.Event()  # ends a "hang"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(4096)
            line, *headers = request.decode().split("\r\n")
            fields = {k.lower(): v for k, v in (h.split(": ", 1) for h in headers if ": " in h)}
            url = urlparse(line.split()[1])
            self.requests.append({"path": url.path, "query": parse_qs(url.query), "headers": fields})
            if self.handshake_delay_until is not None:
                self.connected.set()
                self.handshake_delay_until.wait(CTRL_C_BUDGET)
                return
            accept = base64.b64encode(hashlib.sha1((fields["sec-websocket-key"] + GUID).encode()).digest()).decode()
            conn.sendall(
                (
                    "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    f"Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Protocol: v4.channel.k8s.io\r\n\r\n"
                ).encode()
            )
            self.connected.set()
            for step in self.script:
                if step[0] == "send":
                    _, channel, data = step
                    conn.sendall(frame(0x2, bytes([channel]) + data.encode()))
                elif step[0] == "close":  # a clean close frame, status 1000
                    conn.sendall(frame(0x8, struct.pack("!H", 1000)))
                elif step[0] == "drop":  # the TCP connection goes away, no close frame
                    conn.shutdown(socket.SHUT_RDWR)
                    return
                elif step[0] == "hang":  # never end the command; answer the client's close
                    break
            # Until the client closes: answer its close frame with ours (RFC 6455 5.5.1), then hang up.
            # A client that never closes is dropped after CTRL_C_BUDGET, so it fails instead of hanging.
            conn.settimeout(0.05)
            give_up = time.monotonic() + CTRL_C_BUDGET
            while not self.release.is_set() and time.monotonic() < give_up:
                try:
                    data = conn.recv(4096)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                if data[0] & 0x0F == 0x8:
                    conn.sendall(frame(0x8, struct.pack("!H", 1000)))
                    return

    def cluster(self, exec_timeout: float = 5.0) -> KubeCluster:
        configuration = client.Configuration(host=f"http://127.0.0.1:{self.port}")
        return KubeCluster(client.ApiClient(configuration), slurm_names("slinky"), exec_timeout=exec_timeout)

    def stop(self) -> None:
        self.release.set()
        if self.handshake_delay_until is not None:
            self.handshake_delay_until.set()
        self.thread.join(5)
        self.listener.close()


@pytest.fixture
def serve():
    servers: list[FakeExecServer] = []

    def start(script, **kwargs) -> FakeExecServer:
        servers.append(FakeExecServer(script, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def status(body: dict) -> tuple:
    return ("send", 3, json.dumps(body))


def run_exec(server: FakeExecServer, exec_timeout: float = 5.0):
    return server.cluster(exec_timeout).exec_in_pod("default", "ddp-master-0", "pytorch", ["nvidia-smi", "-L"])


def test_a_normal_exit_returns_code_0_and_the_output(serve):
    server = serve([("send", 1, "GPU 0: Tesla T4\n"), ("send", 2, "warn\n"), status(SUCCESS), ("close",)])
    assert run_exec(server) == (0, "GPU 0: Tesla T4\n", "warn\n")
    (request,) = server.requests
    assert request["path"] == "/api/v1/namespaces/default/pods/ddp-master-0/exec"
    assert request["query"]["command"] == ["nvidia-smi", "-L"] and request["query"]["container"] == ["pytorch"]
    assert request["headers"]["sec-websocket-protocol"] == "v4.channel.k8s.io"


def test_a_non_zero_exit_returns_its_code(serve):
    server = serve([("send", 2, "no\n"), status(NON_ZERO), ("close",)])
    assert run_exec(server) == (3, "", "no\n")


def test_an_internal_error_status_is_a_cluster_error_not_a_value_error(serve):
    server = serve([status(INTERNAL), ("close",)])
    with pytest.raises(ClusterError, match=r"exec nvidia-smi in default/ddp-master-0: InternalError: .*not found"):
        run_exec(server)


@pytest.mark.parametrize("ending", ["close", "drop"])
def test_a_stream_closed_without_a_status_is_a_cluster_error_not_a_type_error(serve, ending):
    server = serve([("send", 1, "GPU 0: Tes"), (ending,)])
    with pytest.raises(ClusterError, match="exec nvidia-smi in default/ddp-master-0: "):
        run_exec(server)


def test_a_command_that_outlives_the_exec_timeout_is_a_cluster_error(serve, monkeypatch):
    """The exec waits for the command once, for exec_timeout and no longer."""
    waits: list[float | None] = []
    run_forever = WSClient.run_forever

    def recorded(ws: WSClient, timeout: float | None = None) -> None:
        waits.append(timeout)
        run_forever(ws, timeout=timeout)

    monkeypatch.setattr(WSClient, "run_forever", recorded)
    server = serve([("hang",)])
    with pytest.raises(ClusterError, match=r"no end after 0\.05 s"):
        run_exec(server, exec_timeout=0.05)
    assert waits == [0.05]


def test_an_unreachable_api_server_is_a_cluster_error():
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    cluster = KubeCluster(
        client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")), slurm_names("slinky")
    )
    with pytest.raises(ClusterError, match="exec sh in slurm/slurm-controller-0"):
        cluster.exec_in_pod("slurm", "slurm-controller-0", "slurmctld", ["sh", "-c", "true"])


# Generous, for a loaded machine: the Ctrl-C must come before the exec's own timeout or the fake
# server's end of its handshake delay or of a hang; a broken interrupt path still fails, only later.
CTRL_C_BUDGET = 60.0

# `python -m cli validate` as a user runs it, in a child process the test Ctrl-Cs (never pytest
# itself): Python's own SIGINT handler (a child of a background job inherits SIGINT ignored, and
# Python then installs none), and a line on stdout once the client waits in the exec's read loop.
CTRL_C_CHILD = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from kubernetes import client
from kubernetes.stream.ws_client import WSClient
from core.names import slurm_names
from validation.cluster import KubeCluster

run_forever = WSClient.run_forever

def waiting(ws, timeout=None):
    print("reading", flush=True)
    run_forever(ws, timeout=timeout)

WSClient.run_forever = waiting
configuration = client.Configuration(host=f"http://127.0.0.1:{sys.argv[1]}")
cluster = KubeCluster(client.ApiClient(configuration), slurm_names("slinky"), exec_timeout=float(sys.argv[2]))
cluster.exec_in_pod("default", "ddp-master-0", "pytorch", ["nvidia-smi", "-L"])
"""


def ctrl_c_exec(server: FakeExecServer, when: Callable[[subprocess.Popen], object]) -> subprocess.CompletedProcess:
    """Run the exec in a child against `server`, Ctrl-C it once `when(child)` returns, and wait."""
    child = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_CHILD, str(server.port), str(CTRL_C_BUDGET)],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        when(child)
        child.send_signal(signal.SIGINT)
        stdout, stderr = child.communicate(timeout=CTRL_C_BUDGET)
    finally:
        child.kill()
    return subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)


def died_of_ctrl_c(done: subprocess.CompletedProcess) -> bool:
    """KeyboardInterrupt reached the top: Python ends by SIGINT itself (docs: signal, 3.8+)."""
    last = done.stderr.strip().splitlines()[-1:]
    return done.returncode == -signal.SIGINT and last == ["KeyboardInterrupt"]


def test_ctrl_c_while_the_command_runs_stops_the_exec(serve):
    server = serve([("hang",)])
    done = ctrl_c_exec(server, when=lambda child: child.stdout.readline())  # in the read loop
    assert died_of_ctrl_c(done), done.stderr[-2000:]


def test_ctrl_c_while_connecting_is_not_swallowed_as_an_api_error(serve):
    """websocket_call catches KeyboardInterrupt and raises ApiException(status=0) instead."""
    server = serve([], handshake_delay_until=threading.Event())
    done = ctrl_c_exec(server, when=lambda child: server.connected.wait(CTRL_C_BUDGET))  # sent its upgrade
    assert died_of_ctrl_c(done), done.stderr[-2000:]

"""Clusters that never answer, or answer what the Kubernetes API does not: `doctor` and `validate`
end with one line and exit 2, within the wait they state. The servers run on 127.0.0.1, started
and stopped here; the waits are asserted by counting what the client asks for (the timeout of
each try and the number of tries), never by timing.

Before issue 31 each row hung (the silent server: no timeout, urllib3's 3 retries) or crashed
(the others: `'str' object has no attribute 'items'`, a model's ValueError)."""

from __future__ import annotations

import socket
import threading

import pytest
import urllib3

from cli import doctor, validate
from tests.conftest import write_kubeconfig
from validation import cluster


class Server:
    """A TCP server on 127.0.0.1 that reads each request and answers `reply` (bytes), or never
    answers when `reply` is None (the connection stays open until the test stops it)."""

    def __init__(self, reply: bytes | None):
        self.reply = reply
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.requests: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # stopped
            self.held.append(conn)
            try:
                self.requests.append(conn.recv(65536))
                if self.reply is not None:
                    conn.sendall(self.reply)
                    conn.close()
            except OSError:
                pass

    def stop(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def http(status: str, content_type: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


SILENT = None
HTML = http("200 OK", "text/html", b"<html><body>Please log in to the portal</body></html>")
EMPTY = http("200 OK", "application/json", b"")
WRONG_JSON = http("200 OK", "application/json", b"[1, 2, 3]")
OTHER_JSON = http("200 OK", "application/json", b'{"kind": "Status", "items": "not a list"}')

# (reply, what the one line must say)
ROWS = [
    (SILENT, "after waiting at most"),
    (HTML, "answered 200 with 53 bytes of text/html: <html><body>Please log in to the portal</body></html>"),
    (EMPTY, "answered 200 with an empty body; expected the Kubernetes API's JSON"),
    (WRONG_JSON, "answered 200 with 9 bytes of application/json: [1, 2, 3]"),
    (OTHER_JSON, "answered "),
]


# The timeouts the tests give the clients: long enough for a server thread here to answer, or to
# record a request, on a loaded machine. A silent server makes the client wait out the read timeout
# on every try, so where the tries are counted on the client's side (each try's timeouts) the silent
# rows give a shorter one; the AWS rows count the requests that reached the server, which needs the
# server's thread to have read the last one before the test stops it: they keep READ_SECONDS.
CONNECT_SECONDS = 0.5
READ_SECONDS = 0.29  # not a round value a hard-coded timeout could share by chance
SILENT_READ_SECONDS = 0.02


@pytest.fixture
def short_waits(monkeypatch):
    """Timeouts short enough for a test; what each try asked for is recorded."""
    monkeypatch.setattr(cluster, "CONNECT_SECONDS", CONNECT_SECONDS)
    monkeypatch.setattr(cluster, "READ_SECONDS", READ_SECONDS)
    asked: list[urllib3.Timeout] = []
    make_request = urllib3.connectionpool.HTTPConnectionPool._make_request

    def recording(pool, conn, method, url, *args, timeout=None, **kwargs):
        asked.append(timeout)
        return make_request(pool, conn, method, url, *args, timeout=timeout, **kwargs)

    monkeypatch.setattr(urllib3.connectionpool.HTTPConnectionPool, "_make_request", recording)
    return asked


def _server(reply):
    server = Server(reply)
    return server, f"http://127.0.0.1:{server.port}"


def _doctor(kubeconfig, monkeypatch) -> int:
    monkeypatch.setattr(doctor, "read_outputs", lambda stack: "not deployed in the tests")
    return doctor.main(["--kubeconfig", str(kubeconfig)])


def _validate(kubeconfig, monkeypatch) -> int:
    return validate.main(["--scenario", "heavy-mixed", "--kubeconfig", str(kubeconfig)])


@pytest.mark.parametrize("command", [_doctor, _validate], ids=["doctor", "validate"])
@pytest.mark.parametrize("reply, fragment", ROWS, ids=["silent", "html", "empty", "json-list", "json-other"])
def test_a_cluster_that_does_not_answer_as_kubernetes_is_one_line_and_exit_2(
    reply, fragment, command, tmp_path, monkeypatch, capsys, short_waits
):
    if reply is SILENT:
        monkeypatch.setattr(cluster, "READ_SECONDS", SILENT_READ_SECONDS)
    server, url = _server(reply)
    try:
        code = command(write_kubeconfig(tmp_path / "kubeconfig", url), monkeypatch)
    finally:
        server.stop()
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and f"http://127.0.0.1:{server.port}" in err and fragment in err, err
    assert "Traceback" not in err
    if reply is SILENT:
        # one call, every try asked to wait connect + read, and no more tries than stated
        assert len(short_waits) == 1 + cluster.RETRIES
        assert all((t.connect_timeout, t.read_timeout) == (CONNECT_SECONDS, SILENT_READ_SECONDS) for t in short_waits)
        assert sum(t.connect_timeout + t.read_timeout for t in short_waits) == cluster.call_bound()


def test_the_stated_wait_is_what_the_client_is_configured_with():
    """The bound the commands print is the one their client carries: each call's timeouts and the
    retries of its pool, and the exec websocket's default timeout."""
    import websocket

    api = cluster.api_client(_kubeconfig("https://198.51.100.7:6443"))
    retries = api.configuration.retries
    assert (retries.total, retries.connect, retries.read, retries.backoff_factor) == (cluster.RETRIES,) * 3 + (0,)
    assert websocket.getdefaulttimeout() == cluster.CONNECT_SECONDS + cluster.READ_SECONDS
    assert cluster.call_bound() == 40.0
    assert "40 s per call" in cluster.describe_bound()
    seen = {}

    def request(method, url, **kwargs):
        seen.update(kwargs)
        raise urllib3.exceptions.HTTPError("stop")

    api.rest_client.request = request
    with pytest.raises(urllib3.exceptions.HTTPError):
        api.call_api("/api/v1/nodes", "GET", response_type="object")
    assert seen["_request_timeout"] == (cluster.CONNECT_SECONDS, cluster.READ_SECONDS)


def _kubeconfig(server: str, **extra) -> dict:
    return {
        "clusters": [{"name": "t", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "x"}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}],
        "current-context": "t",
        **extra,
    }


SECRET = "s3cr3tT0kenValue"


@pytest.mark.parametrize(
    "server",
    [f"http://admin:{SECRET}@127.0.0.1:{{port}}", f"http://127.0.0.1:{{port}}/?token={SECRET}"],
    ids=["userinfo", "query"],
)
def test_a_token_in_the_server_url_is_never_echoed(server, tmp_path, monkeypatch, capsys, short_waits):
    srv, _ = _server(HTML)
    try:
        code = _doctor(write_kubeconfig(tmp_path / "k", server.format(port=srv.port)), monkeypatch)
    finally:
        srv.stop()
    err = capsys.readouterr().err
    assert code == 2 and SECRET not in err and "(hidden)" in err and err.count("\n") == 1, err


# kubeconfigs doctor crashed on before (validate caught them): one line each
BROKEN_KUBECONFIGS = [
    ({"current-context": None}, "current-context is missing or empty"),
    ({"clusters": "a-scalar"}, "clusters is not a list of clusters"),
    ({"current-context": "elsewhere"}, "the kubernetes client refuses it"),
]


@pytest.mark.parametrize("command", [_doctor, _validate], ids=["doctor", "validate"])
@pytest.mark.parametrize("change, fragment", BROKEN_KUBECONFIGS, ids=["no-context", "scalar", "odd-context"])
def test_a_kubeconfig_the_client_cannot_use_is_one_line(change, fragment, command, tmp_path, monkeypatch, capsys):
    import yaml

    config = {k: v for k, v in {**_kubeconfig("https://198.51.100.7:6443"), **change}.items() if v is not None}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    code = command(path, monkeypatch)
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and "Traceback" not in err, err
    assert err.count("\n") == 1, err


def test_an_exec_plugin_is_named_before_it_runs(tmp_path, monkeypatch, capsys):
    """The kubernetes client runs a user's exec: command while loading the kubeconfig; the line
    naming it comes first (the plugin here records whether the line was already out)."""
    marker = tmp_path / "ran"
    said = []
    plugin = {
        "command": "sh",
        "args": ["-c", f"touch {marker}; exit 1"],
        "apiVersion": "client.authentication.k8s.io/v1",
    }
    config = _kubeconfig("https://198.51.100.7:6443", users=[{"name": "u", "user": {"exec": plugin}}])
    cluster.api_client(config, notice=lambda line: said.append((line, marker.exists())))
    assert marker.exists()
    ((line, ran_before),) = said
    assert not ran_before
    assert line.startswith("kubeconfig: user u gets its credentials by running `sh -c touch ") and "exec:" in line


# ---------------------------------------------------------------------- preflight: AWS endpoints

AWS_PASSWORD = "hunter2Secret"


@pytest.fixture
def aws_env(monkeypatch, tmp_path, default_run):
    """No AWS settings but those a row gives; preflight's program run recorded once."""
    from cli import preflight

    for key in [k for k in __import__("os").environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setattr(preflight.offline, "run", lambda config, stack: default_run)
    return tmp_path


KEYS = {
    "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
}
# (environment, what the one line says); before issue 31 each was a traceback
AWS_CONFIG_ROWS = [
    ({"AWS_PROFILE": "nope"}, "aws configuration: The config profile (nope) could not be found"),
    ({"AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE"}, "missing: AWS_SECRET_ACCESS_KEY"),
    ({**KEYS, "AWS_ENDPOINT_URL": "not a url"}, "aws configuration: Invalid endpoint: not a url"),
    ({**KEYS, "AWS_CONFIG_FILE": "{tmp}/bad-config"}, "aws configuration: Unable to parse config file"),
]


@pytest.mark.parametrize("env, fragment", AWS_CONFIG_ROWS, ids=["profile", "key-id-alone", "endpoint", "config-file"])
def test_a_configuration_botocore_refuses_is_one_line(env, fragment, aws_env, monkeypatch, capsys):
    from cli import preflight

    (aws_env / "bad-config").write_text("[default\nregion = us-east-1\n")
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(tmp=aws_env))
    assert preflight.main(["--config", "adminCidr=81.2.69.0/28"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and fragment in err and "Traceback" not in err, err


@pytest.mark.parametrize("reply", [SILENT, HTML], ids=["silent", "html"])
def test_an_aws_endpoint_that_does_not_answer_is_one_line_within_the_stated_wait(reply, aws_env, monkeypatch, capsys):
    """The endpoint's password is never echoed; the wait is counted: the attempts that reached the
    server and the timeouts every client is made with."""
    from cli import preflight

    monkeypatch.setattr(preflight, "CONNECT_SECONDS", CONNECT_SECONDS)
    monkeypatch.setattr(preflight, "READ_SECONDS", READ_SECONDS)
    made = []
    real = preflight.client_config
    monkeypatch.setattr(preflight, "client_config", lambda: made.append(real()) or made[-1])
    server, _ = _server(reply)
    for key, value in KEYS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://admin:{AWS_PASSWORD}@127.0.0.1:{server.port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "9")  # the explicit Config wins
    try:
        code = preflight.main(["--config", "adminCidr=81.2.69.0/28"])
    finally:
        server.stop()
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert AWS_PASSWORD not in err and "(hidden)@127.0.0.1" in err
    assert all(
        (c.connect_timeout, c.read_timeout, c.retries)
        == (CONNECT_SECONDS, READ_SECONDS, {"total_max_attempts": 2, "mode": "standard"})
        for c in made
    )
    if reply is SILENT:
        assert err.startswith("network: cannot reach AWS") and len(server.requests) == preflight.ATTEMPTS
    assert preflight.call_bound() == 41 or preflight.CONNECT_SECONDS != 5

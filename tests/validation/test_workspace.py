"""A finished run's GPU owners read back from the AMP workspace, after the cluster is gone:
the signed query, the window, the stack's label, and the report from a saved timeline."""

from __future__ import annotations

import io
import json
import urllib.error
from dataclasses import replace
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from botocore.credentials import Credentials

from cli import validate as cli
from components import monitoring
from validation import workspace
from validation.checks import check_dcgm
from validation.cluster import ClusterError
from validation.timeline import Timeline

FIXTURES = Path(__file__).parent / "fixtures"
ENDPOINT = "https://aps-workspaces.eu-west-1.amazonaws.com/workspaces/ws-0f1e2d3c-0000-4000-8000-000000000001/"
CREDENTIALS = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")


class Answering:
    """urlopen's stand-in: records the request, answers with `answer` (a dict, or an exception)."""

    def __init__(self, answer):
        self.answer, self.requests = answer, []

    def __call__(self, request, timeout):
        self.requests.append(request)
        if isinstance(self.answer, Exception):
            raise self.answer
        return io.BytesIO(json.dumps(self.answer).encode())


def matrix_from(timeline: Timeline, t0: float) -> dict:
    """What the workspace would answer for the run's own dcgm record: one series per holding."""
    return {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {
                    "metric": {"UUID": h.uuid, "namespace": h.pod.split("/")[0], "pod": h.pod.split("/")[1]},
                    "values": [[t0 + t, "1"] for t in range(int(h.start), int(h.end) + 1, int(timeline.interval))],
                }
                for h in timeline.dcgm
            ],
        },
    }


def test_the_query_is_signed_for_aps_in_the_region_and_asks_for_the_stacks_series_in_the_window():
    opener = Answering({"status": "success", "data": {"resultType": "matrix", "result": []}})
    assert workspace.dcgm_holdings(ENDPOINT, "eu-west-1", "lab", (1000.0, 1440.0), 10.0, CREDENTIALS, opener) == []
    (request,) = opener.requests
    url = urlsplit(request.full_url)
    assert f"{url.scheme}://{url.netloc}{url.path}" == ENDPOINT + "api/v1/query_range"
    params = {k: v[0] for k, v in parse_qs(url.query).items()}
    assert params == {
        "query": 'max by (UUID, namespace, pod) (DCGM_FI_DEV_GPU_UTIL{pod!="", testbed_stack="lab"})',
        "start": "1000.000",
        "end": "1440.000",
        "step": "10",
    }
    headers = {k.lower(): v for k, v in request.header_items()}
    assert headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/eu-west-1/aps/aws4_request, SignedHeaders=" in headers["authorization"]
    assert "x-amz-date" in headers


def test_the_label_queried_is_the_one_prometheus_writes(default_run):
    from tests.stacks.test_evidence import prometheus_spec

    ((label, stack),) = prometheus_spec(default_run)["externalLabels"].items()
    assert label == monitoring.STACK_LABEL and f'{label}="{stack}"' in workspace.holder_query(stack)


def test_a_saved_run_gets_its_gpu_owners_back_from_the_workspace(tmp_path, monkeypatch):
    saved = Timeline.load(FIXTURES / "handoff-timeline.json")
    t0, end = cli.run_window(saved)
    assert (t0, end) == (1767262500.0, 1767262500.0 + saved.samples[-1].end)  # 2026-01-01T10:15:00Z
    assert cli.run_window(replace(saved, waited_for_idle=30.0))[0] == t0 + 30  # t = 0 once the cluster was idle
    opener = Answering(matrix_from(saved, t0))
    monkeypatch.setattr("urllib.request.urlopen", opener)
    emptied = Timeline.load(FIXTURES / "handoff-timeline.json")
    emptied.dcgm = []  # what a run that could not read its cluster's Prometheus saved
    emptied.save(tmp_path / "saved.json")
    monkeypatch.setattr("boto3.Session.get_credentials", lambda self: CREDENTIALS)
    argv = ["--scenario", "handoff", "--from-timeline", str(tmp_path / "saved.json"), "--out", str(tmp_path / "o")]
    assert cli.main([*argv, "--dcgm-from-workspace", ENDPOINT]) == 0
    rebuilt = Timeline.load(tmp_path / "o" / "timeline.json")
    assert [(h.uuid, h.pod) for h in rebuilt.dcgm] == [
        (h.uuid, h.pod) for h in sorted(saved.dcgm, key=lambda h: (h.uuid, h.start, h.pod))
    ]
    assert check_dcgm(rebuilt).passed
    assert not check_dcgm(emptied).passed  # without the workspace the record is missing


def test_a_refused_or_unreachable_workspace_is_one_line():
    denied = urllib.error.HTTPError(ENDPOINT, 403, "Forbidden", {}, None)  # type: ignore[arg-type]
    with pytest.raises(ClusterError, match=r"^query the workspace https://aps-workspaces\.[^ ]*: HTTP 403 Forbidden$"):
        workspace.dcgm_holdings(ENDPOINT, "eu-west-1", "dev", (0.0, 1.0), 5.0, CREDENTIALS, Answering(denied))
    with pytest.raises(ClusterError, match="no query_range answer"):
        workspace.dcgm_holdings(ENDPOINT, "eu-west-1", "dev", (0.0, 1.0), 5.0, CREDENTIALS, Answering({"x": 1}))


@pytest.mark.parametrize(
    "extra, problem",
    [
        (
            ["--dry-run", "--dcgm-from-workspace", ENDPOINT],
            "validate: --dcgm-from-workspace: only with --from-timeline (it re-reads a saved run's GPU owners)",
        ),
        (
            ["--from-timeline", str(FIXTURES / "handoff-timeline.json"), "--dcgm-from-workspace", "ws-123"],
            'validate: --dcgm-from-workspace: "ws-123" is not allowed; expected the workspace\'s prometheus_endpoint, '
            "https://aps-workspaces.REGION.amazonaws.com/workspaces/ws-.../",
        ),
    ],
)
def test_bad_workspace_arguments_exit_2_with_one_line(extra, problem, capsys, tmp_path):
    assert cli.main(["--scenario", "handoff", "--out", str(tmp_path), *extra]) == 2
    assert capsys.readouterr().err.splitlines() == [problem]


def test_a_workspace_that_never_answers_is_one_try_bounded_by_its_timeout(monkeypatch):
    """A socket on 127.0.0.1 that accepts and never answers (no TLS handshake): one try, with the
    stated timeout asked for, counted, not timed (a short one: the try waits it out)."""
    import urllib.request

    from tests.cli.test_unanswering_endpoints import SILENT, Server

    monkeypatch.setattr(workspace, "WAIT_SECONDS", 0.02)
    asked = []

    def urlopen(request, timeout):
        asked.append(timeout)
        return urllib.request.urlopen(request, timeout=timeout)

    server = Server(SILENT)
    try:
        with pytest.raises(
            ClusterError, match=r"^query the workspace https://127\.0\.0\.1:\d+/: no answer within 0\.02 s"
        ):
            workspace.dcgm_holdings(
                f"https://127.0.0.1:{server.port}/", "eu-west-1", "dev", (0.0, 1.0), 5.0, CREDENTIALS, urlopen
            )
    finally:
        server.stop()
    assert asked == [0.02] and len(server.requests) <= 1


def test_a_workspace_answering_html_is_one_line_naming_what_came_back():
    class Page(io.BytesIO):
        def __enter__(self):
            return self

    html = Page(b"<html><body>Sign in</body></html>")
    with pytest.raises(ClusterError, match=r"the answer is not Prometheus' JSON: <html><body>Sign in</body></html>"):
        workspace.dcgm_holdings(ENDPOINT, "eu-west-1", "dev", (0.0, 1.0), 5.0, CREDENTIALS, lambda r, timeout: html)


def test_an_aws_configuration_botocore_refuses_is_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    argv = ["--scenario", "handoff", "--from-timeline", str(FIXTURES / "handoff-timeline.json")]
    assert cli.main([*argv, "--out", str(tmp_path / "o"), "--dcgm-from-workspace", ENDPOINT]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "validate: --dcgm-from-workspace: aws configuration: The config profile (no-such-profile) could not be found"
    ]

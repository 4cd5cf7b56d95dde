"""The GPU owners of a finished run, read back from the stack's AMP workspace after the cluster
(and its Prometheus) is gone: `validate --from-timeline FILE --dcgm-from-workspace URL`.

The same query as the in-cluster record (validation/cluster.py DCGM_HOLDER_QUERY), narrowed to
the stack's external label (components/monitoring.py STACK_LABEL), over the run's window, signed
with SigV4 for service `aps` (the workspace's query API: `<prometheus_endpoint>api/v1/query_range`,
AWS "Amazon Managed Service for Prometheus User Guide", "Query your Prometheus metrics"; the
caller needs aps:QueryMetrics on the workspace)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from components.monitoring import STACK_LABEL
from core.settings import redacted
from validation.cluster import CONNECT_SECONDS, READ_SECONDS, ClusterError, parse_dcgm, shown_server
from validation.timeline import DcgmHolding

QUERY_RANGE_PATH = "api/v1/query_range"
# One try, each socket operation (connect, every read) at most this long: urllib's one timeout.
WAIT_SECONDS = CONNECT_SECONDS + READ_SECONDS
Opener = Callable[..., Any]  # urllib.request.urlopen (None), or a stand-in in tests


def holder_query(stack: str) -> str:
    """Who held each GPU, as dcgm-exporter labelled it, for this stack's series only."""
    return f'max by (UUID, namespace, pod) (DCGM_FI_DEV_GPU_UTIL{{pod!="", {STACK_LABEL}="{stack}"}})'


def signed_query_range(
    endpoint: str,
    region: str,
    credentials: Any,
    params: dict[str, str],
    opener: Opener | None = None,
) -> dict:
    """GET `<endpoint>api/v1/query_range` signed with SigV4 (botocore, service aps); the JSON answer."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    url = f"{endpoint.rstrip('/')}/{QUERY_RANGE_PATH}?{urlencode(params)}"
    signed = AWSRequest(method="GET", url=url)
    SigV4Auth(credentials, "aps", region).add_auth(signed)
    request = urllib.request.Request(url, headers=dict(signed.headers.items()), method="GET")
    where = f"query the workspace {shown_server(endpoint)}"
    body = b""
    try:
        with (opener or urllib.request.urlopen)(request, timeout=WAIT_SECONDS) as response:
            body = response.read(64 * 1024 * 1024)
            return json.loads(body)
    except urllib.error.HTTPError as error:
        raise ClusterError(f"{where}: HTTP {error.code} {redacted(str(error.reason), 100)}") from None
    except (urllib.error.URLError, OSError) as error:
        raise ClusterError(f"{where}: no answer within {WAIT_SECONDS:g} s ({redacted(str(error), 200)})") from None
    except ValueError:
        shown = redacted(" ".join(body.decode("utf-8", "replace").split()), 80) if body.strip() else "an empty body"
        raise ClusterError(f"{where}: the answer is not Prometheus' JSON: {shown}") from None


def dcgm_holdings(
    endpoint: str,
    region: str,
    stack: str,
    window: tuple[float, float],
    step: float,
    credentials: Any,
    opener: Opener | None = None,
) -> list[DcgmHolding]:
    """dcgm-exporter's pod per GPU over `window` (epoch seconds: the run's t = 0 and its end), as
    times since the run's t = 0."""
    t0_epoch, end_epoch = window
    params = {
        "query": holder_query(stack),
        "start": f"{t0_epoch:.3f}",
        "end": f"{end_epoch:.3f}",
        "step": f"{step:g}",
    }
    answer = signed_query_range(endpoint, region, credentials, params, opener)
    try:
        return parse_dcgm(answer, t0_epoch, step)
    except (ValueError, KeyError, TypeError) as error:
        raise ClusterError(f"query the workspace: no query_range answer ({error})") from None

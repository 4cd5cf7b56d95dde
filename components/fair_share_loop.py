"""The fair-share controller's process, as the cluster runs it: every period it reads Prometheus,
runs `fair_share.FairShare.step` (the code the twin runs) and patches the two ClusterQueues'
nominalQuota. Standard library only: the program ships this file and components/fair_share.py in
a ConfigMap to a stock Python image (components/fair_share_controller.py), with the config it
renders (`Config`). `python -m components.fair_share_loop CONFIG` runs it.

* Read: one instant query per input through Prometheus' HTTP API (`GET /api/v1/query`,
  prometheus/prometheus@v3.5.3: web/api/v1/api.go query; docs/querying/api.md). An empty result,
  more than one series, an error or no answer is a lost input (None), as the twin reads its
  Prometheus (twin/world.py `_fair_share`, twin/promql.py `scalar_result`).
* Patch: each ClusterQueue is read, then patched with a JSON patch whose `test` operations hold
  the GPU entry's name and the nominalQuota just read, so a concurrent change fails the patch
  (RFC 6902 section 4.6) and the next period decides again. The quota that goes down is patched
  first, so the cohort never holds more quota than GPUs. A lendingLimit follows
  `fair_share.lending_limit`: all of the quota where the program lets the queue lend, none from
  HPC's queue on HPC's turn (Kueue's webhook wants it at most the nominalQuota).
* The API server and the service account's token and CA are the pod's own, as client-go's
  rest.InClusterConfig finds them (kubernetes/client-go@v0.34.0: rest/config.go); the token is
  read again on every request, since the kubelet rotates the projected token.
* Any error is one log line; the loop goes on and tries again next period.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from components import fair_share

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2/clusterqueues"
JSON_PATCH = "application/json-patch+json"
FIELD_MANAGER = "fair-share-controller"
TIMEOUT_S = 10  # one request: well under a period
SHOWN_CHARS = 300  # of an error body in a log line


@dataclass(frozen=True)
class Config:
    """What the program renders into the ConfigMap (`fair_share_controller.controller_config`)."""

    prometheus_url: str
    queries: dict[str, str]  # slurmd_scaling.fair_share_queries: name -> PromQL
    cluster_queues: dict[str, str]  # side -> ClusterQueue name
    gpu_resource: str
    gpus_total: int
    guaranteed: dict[str, int]  # side -> GPUs
    lends: dict[str, bool]  # side -> whether the program lets its queue lend (all of its quota)
    slurmd_max_replicas: int  # KEDA's maxReplicaCount: the most GPUs HPC's slurmd pods hold
    turn_limit_s: float  # a turn not served within it ends (fair_share.FairShare.turn_limit_s)
    period_s: float  # fair_share.PERIOD_S, as the program renders it

    @classmethod
    def from_json(cls, text: str) -> Config:
        raw = json.loads(text)
        return cls(
            prometheus_url=raw["prometheusUrl"],
            queries=dict(raw["queries"]),
            cluster_queues=dict(raw["clusterQueues"]),
            gpu_resource=raw["gpuResource"],
            gpus_total=int(raw["gpusTotal"]),
            guaranteed={side: int(n) for side, n in raw["guaranteed"].items()},
            lends={side: bool(v) for side, v in raw["lends"].items()},
            slurmd_max_replicas=int(raw["slurmdMaxReplicas"]),
            turn_limit_s=float(raw["turnLimitSeconds"]),
            period_s=float(raw["periodSeconds"]),
        )


def _shown(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


class QueryFailed(Exception):
    pass


class Prometheus:
    def __init__(self, url: str, log: Callable[[str], None]):
        self.url = url.rstrip("/")
        self.log = log

    def value(self, query: str) -> float | None:
        """The one sample's value of an instant query; None when the result is empty or holds
        several series; QueryFailed when Prometheus gives no result."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
                body = json.load(answer)
        except (OSError, ValueError) as e:  # URLError, HTTPError and timeouts are OSErrors
            raise QueryFailed(str(e)) from None
        data = body.get("data") or {}
        if body.get("status") != "success" or data.get("resultType") != "vector":
            raise QueryFailed(json.dumps(body))
        samples = data.get("result") or []
        if len(samples) != 1:
            return None  # empty: the input is lost; several: not one reading
        return float(samples[0]["value"][1])

    def read(self, queries: dict[str, str]) -> dict[str, float | None]:
        """Every input, None where lost; one log line for the queries Prometheus gave no result."""
        values: dict[str, float | None] = {}
        failed: list[str] = []
        for name, query in queries.items():
            try:
                values[name] = self.value(query)
            except QueryFailed as e:
                values[name] = None
                failed.append(f"{name}: {e}")
        if failed:
            self.log(f"prometheus: {len(failed)} of {len(queries)} queries failed; {_shown(failed[0])}")
        return values


class Kubernetes:
    """The ClusterQueues through the API server, as the pod's service account."""

    def __init__(self, server: str, token_path: str, ca_path: str | None):
        self.server = server.rstrip("/")
        self.token_path = token_path
        self.tls = ssl.create_default_context(cafile=ca_path) if server.startswith("https:") else None

    @classmethod
    def in_cluster(cls) -> Kubernetes:
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", f"{SERVICE_ACCOUNT_DIR}/token", f"{SERVICE_ACCOUNT_DIR}/ca.crt")

    def _request(self, method: str, path: str, body: list | None = None) -> dict:
        with open(self.token_path) as f:
            token = f.read().strip()
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), JSON_PATCH
        request = urllib.request.Request(self.server + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=self.tls) as answer:
                return json.load(answer)
        except urllib.error.HTTPError as e:
            # The API server's Status message (a webhook's refusal, a failed test), never the token.
            raise RuntimeError(f"{method} {path}: {e.code} {_shown(e.read().decode(errors='replace'))}") from None

    def get(self, name: str) -> dict:
        return self._request("GET", f"{KUEUE_API}/{name}")

    def patch(self, name: str, operations: list[dict]) -> dict:
        # Named in the queue's managedFields, so `kubectl get -o yaml --show-managed-fields` says who moved it.
        return self._request("PATCH", f"{KUEUE_API}/{name}?fieldManager={FIELD_MANAGER}", operations)


def gpu_entry(queue: dict, resource: str) -> tuple[str, dict]:
    """The JSON pointer and the body of the queue's quota entry for `resource` (the first flavor's)."""
    for i, group in enumerate(queue["spec"]["resourceGroups"]):
        for j, flavor in enumerate(group["flavors"]):
            for k, entry in enumerate(flavor["resources"]):
                if entry["name"] == resource:
                    return f"/spec/resourceGroups/{i}/flavors/{j}/resources/{k}", entry
    raise ValueError(f"ClusterQueue {queue['metadata']['name']}: no quota for {resource}")


def whole(quantity: int | str) -> int:
    """A GPU quota as the API server returns it: an integer, or its decimal string."""
    if isinstance(quantity, int) or (isinstance(quantity, str) and quantity.isdecimal()):
        return int(quantity)
    raise ValueError(f"quota {quantity!r}: expected a whole number of GPUs")


def quota_patch(queue: dict, resource: str, nominal: int, lending: int) -> list[dict]:
    """The JSON patch that sets the queue's nominalQuota of `resource` and, where the queue has
    one, its lendingLimit, valid only against the quota it was computed from."""
    path, entry = gpu_entry(queue, resource)
    ops = [
        {"op": "test", "path": f"{path}/name", "value": resource},
        {"op": "test", "path": f"{path}/nominalQuota", "value": entry["nominalQuota"]},
        {"op": "replace", "path": f"{path}/nominalQuota", "value": nominal},
    ]
    if "lendingLimit" in entry:
        ops.append({"op": "replace", "path": f"{path}/lendingLimit", "value": lending})
    return ops


def live_quota(queue: dict, resource: str) -> tuple[int, int | None]:
    """A queue's nominalQuota and lendingLimit (None: it has none) of `resource`."""
    entry = gpu_entry(queue, resource)[1]
    lending = entry.get("lendingLimit")
    return whole(entry["nominalQuota"]), None if lending is None else whole(lending)


class Controller:
    def __init__(self, config: Config, prometheus: Prometheus, kube: Kubernetes, log: Callable[[str], None]):
        self.config = config
        self.prometheus = prometheus
        self.kube = kube
        self.log = log
        self.fair = fair_share.FairShare(
            config.gpus_total,
            dict(config.guaranteed),
            dict(config.lends),
            hpc_max=config.slurmd_max_replicas,
            turn_limit_s=config.turn_limit_s,
        )

    def period(self, now: float) -> fair_share.Quotas:
        """One period: read, step, patch what differs (the lowered quota first)."""
        quotas = self.fair.step(now, fair_share.reading(self.prometheus.read(self.config.queries)))
        queues = {side: self.kube.get(name) for side, name in self.config.cluster_queues.items()}
        live = {side: live_quota(q, self.config.gpu_resource) for side, q in queues.items()}
        wanted = {
            side: (
                quotas.nominal[side],
                fair_share.lending_limit(side, self.config.lends[side], quotas.nominal[side], quotas.turn),
            )
            for side in fair_share.SIDES
        }
        changed = [
            side
            for side in fair_share.SIDES
            if live[side][0] != wanted[side][0] or (live[side][1] is not None and live[side][1] != wanted[side][1])
        ]
        for side in sorted(changed, key=lambda s: quotas.nominal[s] - live[s][0]):
            name = self.config.cluster_queues[side]
            self.kube.patch(name, quota_patch(queues[side], self.config.gpu_resource, *wanted[side]))
        if changed:
            moves = ", ".join(
                f"{side} {live[side][0]} -> {quotas.nominal[side]} (lends {wanted[side][1]})" for side in changed
            )
            self.log(f"nominalQuota {moves}: {quotas.reason}")
        return quotas

    def run(
        self,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        periods: int | None = None,
    ) -> None:
        """Every period_s from the first, `periods` times (forever by default); an error is a log
        line. A period that overran starts the next at once, and the schedule goes on from there."""
        due, done = clock(), 0
        while periods is None or done < periods:
            try:
                self.period(clock())
            except Exception as e:  # any failure: say it, keep running, try again next period
                self.log(f"period failed: {_shown(str(e) or type(e).__name__)}")
            done += 1
            due = max(due + self.config.period_s, clock())
            sleep(max(0.0, due - clock()))


def _log(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str]) -> int:
    (config_path,) = argv
    with open(config_path) as f:
        config = Config.from_json(f.read())
    _log(f"fair-share controller: every {config.period_s:g} s, queues {config.cluster_queues}")
    Controller(config, Prometheus(config.prometheus_url, _log), Kubernetes.in_cluster(), _log).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The fair-share controller as the cluster runs it: its loop (components/fair_share_loop.py)
against an in-process Prometheus HTTP API and Kubernetes API (http.server, no sleeps: the clock
is injected), its ClusterQueue patches against Kueue 0.19.2's CRD schema and webhook rules, its
queries on a real Prometheus 3 (promtool), and its objects (components/fair_share_controller.py)."""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import jsonschema
import kubernetes_validate
import pytest

from components import fair_share, fair_share_controller, fair_share_loop, keda, kueue
from components import slurmd_scaling as scaling
from core.names import AI_CLUSTER_QUEUE, GPU_RESOURCE, HPC_CLUSTER_QUEUE, KUEUE_GROUP_VERSION, Names
from stacks import offline
from tests.components import cel_policy
from tests.engines import harness
from twin.prometheus import TSDB
from twin.promql import Evaluator, PromQLError, scalar_result

FIXTURE = Path(__file__).parent / "fixtures" / "kueue-v0.19.2-clusterqueue-v1beta2.schema.json"
TOKEN = "token-of-the-pod"
HPC, AI = fair_share.HPC, fair_share.AI


def names(*overrides: str) -> Names:
    return Names.from_settings(offline.stack_settings("dev", list(overrides)))


# ------------------------------------------------------------------ the fakes


class _Server:
    """An HTTP server on a free local port, answering with `handle(method, path, query, headers, body)`."""

    def __init__(self, handle):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, method: str) -> None:
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status, answer = handle(method, url.path, parse_qs(url.query), self.headers, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._answer("GET")

            def do_PATCH(self):
                self._answer("PATCH")

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # A short poll: shutdown() waits for serve_forever's next poll (0.5 s by default)
        self.thread = threading.Thread(target=outer.httpd.serve_forever, args=(0.01,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class FakePrometheus:
    """`/api/v1/query` as Prometheus 3 answers it (docs/querying/api.md): a vector, one sample per
    query whose value is set, none for a query set to None; `down` answers 503."""

    def __init__(self, values: dict[str, str], readings: dict[str, float | None]):
        self.by_query = {query: name for name, query in values.items()}
        self.readings = dict(readings)
        self.down = False
        self.asked: list[str] = []
        self.server = _Server(self.handle)

    def handle(self, method, path, query, headers, body):
        assert (method, path) == ("GET", "/api/v1/query")
        (promql,) = query["query"]
        self.asked.append(promql)
        if self.down:
            return 503, {"status": "error", "errorType": "unavailable", "error": "down"}
        value = self.readings[self.by_query[promql]]
        result = [] if value is None else [{"metric": {}, "value": [1700000000.0, f"{value:g}"]}]
        return 200, {"status": "success", "data": {"resultType": "vector", "result": result}}


def apply_json_patch(obj: dict, operations: list[dict]) -> dict:
    """RFC 6902 `test`, `replace`, `add` and `remove`, all or nothing, as the API server applies a
    JSON patch (keys unescaped: none of ours holds `~` or `/`)."""
    out = copy.deepcopy(obj)
    for op in operations:
        *parents, last = [p for p in op["path"].split("/")[1:]]
        node = out
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        key = (len(node) if last == "-" else int(last)) if isinstance(node, list) else last
        if op["op"] == "test":
            if node[key] != op["value"]:
                raise ValueError(f"test failed at {op['path']}")
        elif op["op"] == "replace":
            node[key] = op["value"]
        elif op["op"] == "add":
            node.insert(key, op["value"]) if isinstance(node, list) else node.__setitem__(key, op["value"])
        elif op["op"] == "remove":
            del node[key]
        else:
            raise ValueError(f"unexpected op {op['op']}")
    return out


# Kueue's webhook adds it to every ClusterQueue it admits (kubernetes-sigs/kueue@v0.19.2:
# pkg/webhooks/clusterqueue_webhook.go Default, on create only)
KUEUE_FINALIZER = "kueue.x-k8s.io/resource-in-use"


def _defaulted(schema: dict, node):
    """The CRD schema's defaults filled in, as the API server does on every write and read."""
    if isinstance(node, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in node and "default" in sub:
                node[key] = copy.deepcopy(sub["default"])
            if key in node:
                _defaulted(sub, node[key])
    elif isinstance(node, list) and "items" in schema:
        for item in node:
            _defaulted(schema["items"], item)
    return node


def served(queue: dict) -> dict:
    """A ClusterQueue the program creates, as the API server returns it: defaulted, Kueue's
    finalizer, and the server's own metadata."""
    out = _defaulted(_schema(), copy.deepcopy(queue))
    out["metadata"] |= {
        "uid": "0b5a3c1e-0000-4000-8000-" + out["metadata"]["name"].encode().hex().rjust(12, "0"),
        "resourceVersion": "1000",
        "generation": 1,
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "finalizers": [KUEUE_FINALIZER],
        "managedFields": [{"manager": "pulumi-kubernetes", "operation": "Apply", "apiVersion": KUEUE_GROUP_VERSION}],
    }
    return out


def written(old: dict, operations: list[dict]) -> dict:
    """The object admission sees for a JSON patch by the controller: the patch applied, then the
    server's bookkeeping: its field manager's entry, a new generation as spec changed."""
    new = apply_json_patch(old, operations)
    meta = new["metadata"]
    meta["managedFields"] = [
        *meta.get("managedFields", []),
        {"manager": fair_share_loop.FIELD_MANAGER, "operation": "Update", "apiVersion": KUEUE_GROUP_VERSION},
    ]
    if new["spec"] != old["spec"]:
        meta["generation"] = old["metadata"]["generation"] + 1
    return new


class FakeKubernetes:
    """The two ClusterQueues the program creates, behind a Kubernetes API that checks the bearer
    token, applies JSON patches and, like Kueue's webhook, refuses a queue it would refuse."""

    def __init__(self, queues: list[dict], policy: dict):
        self.queues = {q["metadata"]["name"]: served(q) for q in queues}
        self.policy = policy  # fair_share_controller.quota_policy, run for the token's user
        self.patches: list[tuple[str, list[dict]]] = []
        self.refuse_patches = False
        self.server = _Server(self.handle)

    def handle(self, method, path, query, headers, body):
        if headers["Authorization"] != f"Bearer {TOKEN}":
            return 401, {"kind": "Status", "code": 401}
        prefix = f"{fair_share_loop.KUEUE_API}/"
        assert path.startswith(prefix), path
        name = path.removeprefix(prefix)
        if method == "GET":
            return 200, self.queues[name]
        assert headers["Content-Type"] == fair_share_loop.JSON_PATCH
        assert query == {"fieldManager": [fair_share_loop.FIELD_MANAGER]}
        operations = json.loads(body)
        self.patches.append((name, operations))
        if self.refuse_patches:
            return 500, {"kind": "Status", "message": "Internal error occurred: failed calling webhook"}
        try:
            patched = written(self.queues[name], operations)
        except ValueError as e:
            return 422, {"kind": "Status", "message": str(e)}
        user = fair_share_controller.controller_user()  # whom the token authenticates
        denials = cel_policy.admit(self.policy, "UPDATE", patched, self.queues[name], user).denials
        problems = list(denials) + webhook_problems(patched) + schema_problems(patched)
        if problems:
            return 422, {"kind": "Status", "message": "; ".join(problems)}
        self.queues[name] = patched
        return 200, patched

    def nominal(self, name: str) -> tuple[int, int | None]:
        _, entry = fair_share_loop.gpu_entry(self.queues[name], GPU_RESOURCE)
        return entry["nominalQuota"], entry.get("lendingLimit")


# ------------------------------------------------------------------ Kueue 0.19.2's checks


def _schema() -> dict:
    return json.loads(FIXTURE.read_text())["schema"]


def _holds(result) -> bool:
    return isinstance(result, cel_policy.celtypes.BoolType) and bool(result)


def _cel_rules(schema: dict, node, where: str = "") -> list[str]:
    """Every x-kubernetes-validations rule of the schema that fails on `node`, evaluated in a real
    CEL engine (cel-python) at the node it is declared on, as the API server does."""
    failed = [
        f"{where or '/'}: {rule['rule']}"
        for rule in schema.get("x-kubernetes-validations", [])
        if not _holds(cel_policy.run_on(rule["rule"], self=node))
    ]
    if isinstance(node, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in node:
                failed += _cel_rules(sub, node[key], f"{where}/{key}")
    elif isinstance(node, list) and "items" in schema:
        for i, item in enumerate(node):
            failed += _cel_rules(schema["items"], item, f"{where}/{i}")
    return failed


def schema_problems(queue: dict) -> list[str]:
    """The CRD's structural schema (unknown fields refused, as `kubectl --validate=strict`) and its CEL rules."""
    schema = _schema()

    def strict(node):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                node.setdefault("additionalProperties", False)
            for value in node.values():
                strict(value)
        elif isinstance(node, list):
            for value in node:
                strict(value)

    strict(schema)
    schema["properties"]["metadata"] = {"type": "object"}
    errors = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(queue)]
    return errors + _cel_rules(schema, queue)


def webhook_problems(queue: dict) -> list[str]:
    """What Kueue's ClusterQueue webhook refuses on an update of the quotas
    (kubernetes-sigs/kueue@v0.19.2: pkg/webhooks/clusterqueue_webhook.go validateFlavorQuotas,
    validateResourceQuantity, validateLimit, validateLendingLimit)."""
    problems = []
    for group in queue["spec"]["resourceGroups"]:
        for flavor in group["flavors"]:
            for covered, entry in zip(group["coveredResources"], flavor["resources"], strict=False):
                nominal = fair_share_loop.whole(entry["nominalQuota"])
                if entry["name"] != covered:
                    problems.append("name must match the name in coveredResources")
                if nominal < 0:
                    problems.append("nominalQuota must be greater than or equal to 0")
                if "lendingLimit" in entry:
                    lending = fair_share_loop.whole(entry["lendingLimit"])
                    if not queue["spec"].get("cohortName"):
                        problems.append("lendingLimit must be nil when cohort is empty")
                    if lending < 0 or lending > nominal:
                        problems.append("lendingLimit must be less than or equal to the nominalQuota")
    return problems


def test_the_program_s_queues_pass_kueue_s_checks_and_a_bad_patch_does_not():
    for queue in kueue.cluster_queues(names().shares):
        assert schema_problems(queue) == [] and webhook_problems(queue) == [], queue["metadata"]["name"]
    (hpc, _) = kueue.cluster_queues(names().shares)
    path, _ = fair_share_loop.gpu_entry(hpc, GPU_RESOURCE)
    too_much = apply_json_patch(hpc, [{"op": "replace", "path": f"{path}/lendingLimit", "value": 3}])
    assert webhook_problems(too_much) == ["lendingLimit must be less than or equal to the nominalQuota"]
    misspelt = apply_json_patch(hpc, [{"op": "replace", "path": f"{path}/nominalQuota", "value": 2}])
    misspelt["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalquota"] = 2
    assert any("nominalquota" in p for p in schema_problems(misspelt))
    uneven = copy.deepcopy(hpc)
    uneven["spec"]["resourceGroups"][0]["flavors"][0]["resources"].append({"name": "cpu", "nominalQuota": 1})
    assert any("size(x.resources) == size(self.coveredResources)" in p for p in schema_problems(uneven))


@pytest.mark.parametrize("nominal", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("lends, turn", [(True, None), (True, fair_share.HPC), (False, None)])
def test_every_quota_the_rule_can_set_is_a_patch_kueue_accepts(nominal, lends, turn):
    for queue in kueue.cluster_queues(names().shares):
        lending = fair_share.lending_limit(fair_share.HPC, lends, nominal, turn)
        old = served(queue)
        patched = written(old, fair_share_loop.quota_patch(old, GPU_RESOURCE, nominal, lending))
        assert fair_share_loop.live_quota(patched, GPU_RESOURCE) == (nominal, lending)
        assert schema_problems(patched) == [] and webhook_problems(patched) == []
        assert cel_policy.admit(POLICY, "UPDATE", patched, old, CONTROLLER).allowed, "and the quota policy"


# ------------------------------------------------------------------ what its token may change

POLICY = fair_share_controller.quota_policy(names())
CONTROLLER = fair_share_controller.controller_user()
GPU_ENTRY = "/spec/resourceGroups/0/flavors/0/resources/0"
# What a holder of the controller's token (or of its code) could write, each refused, and a word
# the refusal names it by.
ATTACKS = {
    "hold-and-drain": ([{"op": "replace", "path": "/spec/stopPolicy", "value": "HoldAndDrain"}], "spec.stopPolicy"),
    "cohort": ([{"op": "replace", "path": "/spec/cohortName", "value": "elsewhere"}], "spec.cohortName"),
    "cohort-removed": ([{"op": "remove", "path": "/spec/cohortName"}], "spec.cohortName"),
    "preemption": (
        [{"op": "replace", "path": "/spec/preemption/reclaimWithinCohort", "value": "Any"}],
        "spec.preemption",
    ),
    "namespace-selector": (
        [{"op": "replace", "path": "/spec/namespaceSelector", "value": {}}],
        "spec.namespaceSelector",
    ),
    "queueing-strategy": (
        [{"op": "replace", "path": "/spec/queueingStrategy", "value": "BestEffortFIFO"}],
        "spec.queueingStrategy",
    ),
    "admission-checks": (
        [{"op": "add", "path": "/spec/admissionChecksStrategy", "value": {"admissionChecks": [{"name": "x"}]}}],
        "spec.admissionChecksStrategy",
    ),
    "fair-sharing": ([{"op": "add", "path": "/spec/fairSharing", "value": {"weight": "100"}}], "spec.fairSharing"),
    "flavor-renamed": ([{"op": "replace", "path": "/spec/resourceGroups/0/flavors/0/name", "value": "x"}], "layout"),
    "flavor-added": (
        [
            {
                "op": "add",
                "path": "/spec/resourceGroups/0/flavors/-",
                "value": {"name": "x", "resources": [{"name": GPU_RESOURCE, "nominalQuota": 4}]},
            }
        ],
        "layout",
    ),
    "group-added": (
        [
            {
                "op": "add",
                "path": "/spec/resourceGroups/-",
                "value": {
                    "coveredResources": ["cpu"],
                    "flavors": [{"name": "x", "resources": [{"name": "cpu", "nominalQuota": 64}]}],
                },
            }
        ],
        "layout",
    ),
    "resource-renamed": (
        [
            {"op": "replace", "path": "/spec/resourceGroups/0/coveredResources/0", "value": "cpu"},
            {"op": "replace", "path": f"{GPU_ENTRY}/name", "value": "cpu"},
        ],
        "layout",
    ),
    "borrowing-limit": ([{"op": "add", "path": f"{GPU_ENTRY}/borrowingLimit", "value": 0}], "borrowingLimit"),
    "lending-limit-dropped": ([{"op": "remove", "path": f"{GPU_ENTRY}/lendingLimit"}], "lendingLimit added or removed"),
    "quota-above-the-gpus": ([{"op": "replace", "path": f"{GPU_ENTRY}/nominalQuota", "value": 5}], "from 0 to 4"),
    "lending-above-the-gpus": ([{"op": "replace", "path": f"{GPU_ENTRY}/lendingLimit", "value": "1k"}], "from 0 to 4"),
    "fractional-quota": ([{"op": "replace", "path": f"{GPU_ENTRY}/nominalQuota", "value": "1500m"}], "whole number"),
    "negative-quota": ([{"op": "replace", "path": f"{GPU_ENTRY}/nominalQuota", "value": -1}], "from 0 to 4"),
    "label": ([{"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}], "metadata.labels"),
    "annotation": ([{"op": "add", "path": "/metadata/annotations", "value": {"x": "y"}}], "metadata.annotations"),
    "finalizer-removed": ([{"op": "remove", "path": "/metadata/finalizers"}], "metadata.finalizers"),
    "owner": (
        [
            {
                "op": "add",
                "path": "/metadata/ownerReferences",
                "value": [{"apiVersion": "v1", "kind": "Namespace", "name": "fair-share", "uid": "u"}],
            }
        ],
        "metadata.ownerReferences",
    ),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
# cel-python takes about 0.05 s a decision: the matrix on AI's queue, which the same expressions
# judge, runs with the slow sweeps (a plain `pytest` and CI), not in the fast set
@pytest.mark.parametrize("queue", [HPC_CLUSTER_QUEUE, pytest.param(AI_CLUSTER_QUEUE, marks=pytest.mark.slow)])
def test_the_controller_s_token_may_change_nothing_but_the_gpu_quotas(attack, queue):
    """Each attack, alone or riding on a quota change the rule could make, is refused with one line
    naming what changed and what is allowed; the admin's identical write is not the policy's."""
    operations, named = ATTACKS[attack]
    (old,) = [served(q) for q in kueue.cluster_queues(names().shares) if q["metadata"]["name"] == queue]
    if attack == "hold-and-drain":
        assert old["spec"]["stopPolicy"] == "None", "the CRD's default, so a replace"
    quota = fair_share_loop.quota_patch(old, GPU_RESOURCE, 1, 1)
    for ops in (operations, quota + operations):
        new = written(old, ops)
        decision = cel_policy.admit(POLICY, "UPDATE", new, old, CONTROLLER)
        assert decision.evaluated and len(decision.denials) == 1, decision.denials
        (message,) = decision.denials
        assert named in message and "\n" not in message, message
        assert message.startswith(f"the fair-share controller ({CONTROLLER}) may change only the nominalQuota and")
        assert not cel_policy.admit(POLICY, "UPDATE", new, old, "kubernetes-admin").evaluated
        assert not cel_policy.admit(POLICY, "UPDATE", new, old, "system:serviceaccount:kueue-system:kueue").evaluated


@pytest.mark.parametrize(
    "path, value, allowed",
    [
        (f"{GPU_ENTRY}/nominalQuota", 1, True),
        (f"{GPU_ENTRY}/borrowingLimit", 4, False),
        ("/spec/resourceGroups/1/flavors/0/resources/0/nominalQuota", 64, False),
        ("/spec/resourceGroups/1/flavors/0/resources/0/lendingLimit", 0, False),
    ],
)
def test_what_an_admin_set_beside_the_gpu_quotas_stays_as_set(path, value, allowed):
    """A queue an admin gave a GPU borrowingLimit and a CPU group: the controller's token moves the
    GPU quotas, not those values (a CPU entry's nominalQuota and lendingLimit included)."""
    queue = copy.deepcopy(kueue.cluster_queues(names().shares)[1])
    groups = queue["spec"]["resourceGroups"]
    groups[0]["flavors"][0]["resources"][0]["borrowingLimit"] = 1
    cpu = {"name": "cpu", "nominalQuota": 32, "lendingLimit": 8}
    groups.append({"coveredResources": ["cpu"], "flavors": [{"name": "cpu-worker", "resources": [cpu]}]})
    old = served(queue)
    assert schema_problems(old) == [] and webhook_problems(old) == []
    new = written(old, [{"op": "replace", "path": path, "value": value}])
    decision = cel_policy.admit(POLICY, "UPDATE", new, old, CONTROLLER)
    assert decision.allowed is allowed
    if not allowed:
        (message,) = decision.denials
        assert "it changed another field of spec.resourceGroups" in message


@pytest.mark.parametrize("operation", ["CREATE", "DELETE"])
def test_the_controller_s_token_may_neither_create_nor_delete_a_queue(operation):
    queue = served(kueue.cluster_queues(names().shares)[0])
    new, old = (queue, None) if operation == "CREATE" else (None, queue)
    (message,) = cel_policy.admit(POLICY, operation, new, old, CONTROLLER).denials
    assert (
        message
        == f"the fair-share controller ({CONTROLLER}) may not {operation} a ClusterQueue; it only patches quotas"
    )


def test_the_quota_bound_follows_the_worker_count():
    """0..gpusTotal of the stack: 6 GPUs with 6 workers, 7 refused; a quantity written as a string too."""
    policy = fair_share_controller.quota_policy(names("workerCount=6"))
    old = served(kueue.cluster_queues(names("workerCount=6").shares)[1])
    for value, allowed in ((6, True), ("6", True), (7, False), ("0", True)):
        new = written(old, [{"op": "replace", "path": f"{GPU_ENTRY}/nominalQuota", "value": value}])
        assert cel_policy.admit(policy, "UPDATE", new, old, CONTROLLER).allowed is allowed, value


def test_the_policy_binds_denying_for_the_controller_s_account_alone_and_passes_the_1_34_schemas():
    policy, binding = POLICY, fair_share_controller.quota_policy_binding()
    for obj in (policy, binding):
        kubernetes_validate.validate(obj, "1.34", strict=True)
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [fair_share_controller.KUEUE_GROUP] and rule["resources"] == ["clusterqueues"]
    # every version of the group the loop patches (fair_share_loop.KUEUE_API: /apis/<group>/<version>/...)
    assert rule["apiVersions"] == ["*"] and fair_share_loop.KUEUE_API.split("/")[2] == rule["apiGroups"][0]
    assert "UPDATE" in rule["operations"]  # a PATCH is admitted as an UPDATE
    # every denial 422 Invalid, what doctor's dry run reads as the policy's (cli/doctor_platform.py)
    assert {v.get("reason") for v in policy["spec"]["validations"]} == {"Invalid"}
    # the account the Deployment runs as
    deployment = fair_share_controller.deployment(names(), "python@sha256:" + "a" * 64)
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert f"system:serviceaccount:{deployment['metadata']['namespace']}:{account}" == CONTROLLER
    (condition,) = policy["spec"]["matchConditions"]
    assert CONTROLLER in condition["expression"]


# Every pair of the program's borrowing settings: with both on (the default) a swapped mapping
# from setting to queue in `lends` would agree with the program's queues all the same.
@pytest.mark.parametrize("ai_borrows", [True, False])
@pytest.mark.parametrize("hpc_borrows", [True, False])
def test_a_queue_lends_all_of_its_quota_as_the_program_lets_it_but_hpcs_nothing_on_hpcs_turn(ai_borrows, hpc_borrows):
    hpc, ai = fair_share.HPC, fair_share.AI
    assert fair_share.lending_limit(hpc, True, 3, turn=None) == 3
    assert fair_share.lending_limit(hpc, True, 3, turn=hpc) == 0, "HPC's turn's GPUs are for HPC"
    assert fair_share.lending_limit(ai, True, 3, turn=ai) == 3, "AI lends on its turn: its gangs wait for GPUs"
    assert fair_share.lending_limit(hpc, True, 3, turn=ai) == 3
    assert fair_share.lending_limit(hpc, False, 3, turn=None) == 0
    stack = names(f"aiBorrowsHpcGpus={str(ai_borrows).lower()}", f"hpcBorrowsAiGpus={str(hpc_borrows).lower()}")
    config = fair_share_controller.controller_config(stack)
    shares = stack.shares
    assert (shares.ai_borrows_hpc_gpus, shares.hpc_borrows_ai_gpus) == (ai_borrows, hpc_borrows)
    assert config["lends"] == {fair_share.HPC: shares.ai_borrows_hpc_gpus, fair_share.AI: shares.hpc_borrows_ai_gpus}
    for queue in kueue.cluster_queues(shares):  # as the program's queues lend
        side = {v: k for k, v in fair_share_controller.sides().items()}[queue["metadata"]["name"]]
        nominal, lending = fair_share_loop.live_quota(queue, GPU_RESOURCE)
        assert lending == fair_share.lending_limit(side, config["lends"][side], nominal, turn=None)


def test_the_controller_caps_hpc_s_claim_at_slurmd_s_max_replicas():
    """HPC's slurmd pods are at most KEDA's maxReplicaCount: a turn claiming more could never be
    served and would keep AI's quota under its share while HPC had work waiting."""
    n = names("kedaMaxReplicas=2")
    config = fair_share_loop.Config.from_json(json.dumps(fair_share_controller.controller_config(n)))
    cap = keda.scaled_object(n, 1, scaling.DEFAULT_POLICY)["spec"]["maxReplicaCount"]
    assert config.slurmd_max_replicas == cap == 2
    fair = fair_share_loop.Controller(config, None, None, print).fair
    hpc, ai = fair_share.HPC, fair_share.AI
    ai_only = fair_share.Reading({hpc: 0, ai: 4}, {hpc: 3, ai: 1})
    fair.step(0, ai_only)
    quotas = fair.step(30, ai_only)
    assert quotas.reason.startswith("hpc behind") and quotas.nominal == {hpc: 2, ai: 2}, quotas
    assert fair.turn is not None and fair.turn[:2] == (hpc, 2)


def ai_reading(usage: dict[str, int], pending: int, unschedulable: int) -> tuple[float | None, float | None]:
    """AI's used and waiting GPUs as the controller's queries read them (the twin's evaluator) from
    Kueue's usage per ClusterQueue, AI's pending GPUs and the AI pods kube-state-metrics reads
    PodScheduled False."""
    target = scaling.scaling_target(names())
    queries = scaling.fair_share_queries(target)
    db = TSDB()
    for queue, gpus in usage.items():
        labels = {"cluster_queue": queue, "resource": target.gpu_resource}
        db.add({"__name__": scaling.KUEUE_USAGE, **labels}, 600.0, float(gpus))
        if queue == AI_CLUSTER_QUEUE:
            db.add({"__name__": scaling.KUEUE_PENDING, **labels}, 600.0, float(pending))
    for i in range(unschedulable):
        db.add({"__name__": scaling.POD_UNSCHEDULABLE, "namespace": target.ai_namespace, "pod": f"p{i}"}, 600.0, 1.0)
    ev = Evaluator(db)
    return tuple(scalar_result(ev.instant(queries[name], 600)) for name in ("ai_used", "ai_waiting"))


def test_ai_s_unplaced_pods_count_as_waiting_only_where_kueue_admitted_more_than_the_gpus():
    """An admitted AI pod waits for a GPU only where Kueue admitted more GPUs than there are (AI's
    queue lending nothing while slurmd pods hold GPUs over HPC's lowered quota). Other pods with
    PodScheduled False (a bare Pod Kueue still gates, already in its pending GPUs; a pod an AI user
    made that fits no node) change nothing: counted, they kept AI's turn unserved for good."""
    hpc, ai = HPC_CLUSTER_QUEUE, AI_CLUSTER_QUEUE
    assert ai_reading({ai: 2, hpc: 2}, pending=1, unschedulable=3) == (2, 1), "no GPU admitted twice"
    assert ai_reading({ai: 4, hpc: 2}, pending=0, unschedulable=3) == (2, 2), "two pods wait for slurmd's GPUs"
    assert ai_reading({ai: 4, hpc: 2}, pending=0, unschedulable=1) == (3, 1)
    assert ai_reading({ai: 4, hpc: 2}, pending=0, unschedulable=0) == (4, 0)


# ------------------------------------------------------------------ the loop


@pytest.fixture
def cluster(tmp_path):
    n = names()
    config = fair_share_loop.Config.from_json(
        fair_share_controller.config_map_data(n)[fair_share_controller.CONFIG_KEY]
    )
    ai_only = {"hpc_used": 0, "hpc_runnable": 3, "ai_used": 4, "ai_waiting": 1}
    ai_only |= {f"hpc_widest_{p}": 3 for p in n.slurm.partitions} | {f"hpc_first_{p}": 1 for p in n.slurm.partitions}
    prom = FakePrometheus(config.queries, ai_only)
    kube = FakeKubernetes(kueue.cluster_queues(n.shares), fair_share_controller.quota_policy(n))
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    lines: list[str] = []
    config = dataclasses.replace(config, prometheus_url=prom.server.url)
    controller = fair_share_loop.Controller(
        config,
        fair_share_loop.Prometheus(config.prometheus_url, lines.append),
        fair_share_loop.Kubernetes(kube.server.url, str(token), None),
        lines.append,
    )
    yield controller, prom, kube, lines
    prom.server.close()
    kube.server.close()


class Clock:
    """A clock that only a sleep moves."""

    def __init__(self, start: float = 1000.0):
        self.now = start
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_loop_asks_prometheus_the_stack_s_queries_and_moves_the_quotas_toward_the_side_behind(cluster):
    controller, prom, kube, lines = cluster
    clock = Clock()
    controller.run(clock, clock.sleep, periods=2)
    queries = scaling.fair_share_queries(scaling.scaling_target(names()))
    assert sorted(prom.asked) == sorted(list(queries.values()) * 2), "each input once a period, as the twin reads"
    assert clock.slept == [fair_share.PERIOD_S] * 2 and controller.fair.last == 1000.0 + fair_share.PERIOD_S
    # HPC waits with none of the contended time: it gets what it holds and waits for, AI the rest,
    # AI's quota lowered first; HPC, on its turn, lends none of it (AI may borrow it otherwise).
    lends = controller.config.lends[fair_share.AI]
    assert kube.nominal(HPC_CLUSTER_QUEUE) == (3, 0) and kube.nominal(AI_CLUSTER_QUEUE) == (1, 1 if lends else 0)
    assert [name for name, _ in kube.patches] == [AI_CLUSTER_QUEUE, HPC_CLUSTER_QUEUE]
    (line,) = lines
    assert line.startswith("nominalQuota hpc 2 -> 3 (lends 0), ai 2 -> 1 (lends ")
    assert "hpc behind: 0 % of the contended GPU time" in line


def test_a_lost_input_sets_the_guaranteed_split_and_nothing_changes_while_it_holds(cluster):
    controller, prom, kube, lines = cluster
    clock = Clock()
    controller.run(clock, clock.sleep, periods=2)
    prom.readings["ai_used"] = None  # Kueue's series gone
    controller.run(clock, clock.sleep, periods=2)
    assert kube.nominal(HPC_CLUSTER_QUEUE) == (2, 2) and kube.nominal(AI_CLUSTER_QUEUE) == (2, 2)
    assert lines[-1].startswith("nominalQuota hpc 3 -> 2 (lends 2), ai 1 -> 2 (lends ")
    assert lines[-1].endswith(": input lost: used of ai")
    assert len(kube.patches) == 4, "the split once, then nothing to patch"


def test_a_restarted_controller_gives_back_what_hpc_s_turn_left_and_reserves_at_once(cluster):
    """The controller restarts as HPC's turn ends (HPC's queue at its share, lending 0): its first
    period, with no history, patches HPC's lendingLimit back; with a wide Slurm job first in line
    HPC, read as at its share, reserves at once (docs/handoff.md "In the cluster")."""
    controller, prom, kube, lines = cluster
    for name, (nominal, lending) in ((AI_CLUSTER_QUEUE, (2, 2)), (HPC_CLUSTER_QUEUE, (2, 0))):
        _, entry = fair_share_loop.gpu_entry(kube.queues[name], GPU_RESOURCE)
        entry["nominalQuota"], entry["lendingLimit"] = nominal, lending
    clock = Clock()
    controller.run(clock, clock.sleep, periods=1)
    assert kube.nominal(HPC_CLUSTER_QUEUE) == (2, 2) and lines == [
        "nominalQuota hpc 2 -> 2 (lends 2): the guaranteed split"
    ]
    widest = {f"hpc_first_{p}": 4 for p in names().slurm.partitions}
    prom.readings |= widest | {"hpc_used": 2, "ai_used": 2}
    restarted = fair_share_loop.Controller(controller.config, controller.prometheus, controller.kube, lines.append)
    restarted.run(clock, clock.sleep, periods=1)
    assert kube.nominal(HPC_CLUSTER_QUEUE) == (4, 0) and lines[-1].endswith("against 50 %"), lines[-1]
    assert "hpc reserves for a 4-node job first in line: 50 %" in lines[-1]


def test_errors_are_one_line_each_and_the_loop_goes_on(cluster):
    controller, prom, kube, lines = cluster
    clock = Clock()
    kube.refuse_patches = True  # Kueue's webhook down: the API server fails the patch
    controller.run(clock, clock.sleep, periods=2)
    assert lines[-1].startswith("period failed: PATCH ") and "failed calling webhook" in lines[-1]
    assert TOKEN not in "".join(lines)
    prom.down = True  # every input lost: the split, which the queues still hold
    controller.run(clock, clock.sleep, periods=1)
    asked = len(controller.config.queries)
    assert lines[-1].startswith(f"prometheus: {asked} of {asked} queries failed; ") and "Error 503" in lines[-1]
    assert sum(line.startswith("prometheus: ") for line in lines) == 1, "one line a period"
    prom.down, kube.refuse_patches = False, False
    controller.run(clock, clock.sleep, periods=1)
    assert kube.nominal(HPC_CLUSTER_QUEUE) == (3, 0), "the next period patches (HPC on its turn lends none)"
    assert clock.slept == [fair_share.PERIOD_S] * 4


def test_a_period_that_overruns_starts_the_next_at_once_without_catching_up(cluster):
    controller, _, _, _ = cluster
    clock = Clock()
    period = controller.period

    def slow(now):
        clock.now += 2.5 * fair_share.PERIOD_S if len(clock.slept) == 0 else 0
        return period(now)

    controller.period = slow
    controller.run(clock, clock.sleep, periods=3)
    assert clock.slept == [0.0, fair_share.PERIOD_S, fair_share.PERIOD_S]


def test_a_queue_changed_since_it_was_read_is_not_overwritten(cluster):
    _, _, kube, _ = cluster
    queue = kube.queues[AI_CLUSTER_QUEUE]
    stale = fair_share_loop.quota_patch(queue, GPU_RESOURCE, 1, 1)
    path, _ = fair_share_loop.gpu_entry(queue, GPU_RESOURCE)
    kube.queues[AI_CLUSTER_QUEUE] = apply_json_patch(
        queue, [{"op": "replace", "path": f"{path}/nominalQuota", "value": 3}]
    )
    with pytest.raises(ValueError, match="test failed"):
        apply_json_patch(kube.queues[AI_CLUSTER_QUEUE], stale)


def test_the_shipped_files_import_with_the_standard_library_alone(tmp_path):
    """As the pod runs them: the ConfigMap's files under components/ (no __init__.py) and a Python
    without site-packages."""
    data = fair_share_controller.config_map_data(names())
    for path in fair_share_controller.CODE:
        target = tmp_path / "components" / path.name
        target.parent.mkdir(exist_ok=True)
        target.write_text(data[path.name])
    code = "import components.fair_share_loop as m; print(m.fair_share.__file__)"
    done = subprocess.run(
        [sys.executable, "-S", "-E", "-s", "-c", "import sys; sys.path.insert(0, '.'); " + code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "components" / "fair_share.py")


# ------------------------------------------------------------------ the objects


def test_the_config_map_holds_the_repository_s_files_and_the_stack_s_split():
    n = names("workerCount=6", "aiGuaranteedGpus=2")
    data = fair_share_controller.config_map_data(n)
    for path in fair_share_controller.CODE:
        assert data[path.name] == path.read_text()
    config = fair_share_loop.Config.from_json(data[fair_share_controller.CONFIG_KEY])
    assert config.guaranteed == {HPC: 4, AI: 2} and config.gpus_total == 6
    assert config.queries == scaling.fair_share_queries(scaling.scaling_target(n))
    assert config.cluster_queues == {HPC: HPC_CLUSTER_QUEUE, AI: AI_CLUSTER_QUEUE}
    assert config.prometheus_url == n.prometheus_url


def test_the_objects_pass_kubernetes_strict_schemas_and_the_pod_meets_restricted():
    objs = fair_share_controller.objects(names(), "python:3.12.12-slim-bookworm@sha256:" + "a" * 64, "1.34")
    for obj in objs:
        kubernetes_validate.validate(obj, "1.34", strict=True)
    ns, *_, deployment = objs
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert (
        pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    )
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert not container["securityContext"]["allowPrivilegeEscalation"]
    assert container["securityContext"]["readOnlyRootFilesystem"]
    assert [v for v in pod["volumes"] if set(v) - {"name", "configMap"}] == [], "a ConfigMap only"
    mounted = {i["path"] for i in pod["volumes"][0]["configMap"]["items"]}
    assert mounted == {"components/fair_share.py", "components/fair_share_loop.py", "config.json"}
    assert container["command"][-1] == f"{fair_share_controller.APP_DIR}/config.json"


def test_a_changed_file_rolls_the_pod():
    image = "python:3.12.12-slim-bookworm@sha256:" + "a" * 64

    def digest(n: Names) -> str:
        spec = fair_share_controller.deployment(n, image)["spec"]["template"]["metadata"]
        return spec["annotations"][fair_share_controller.CODE_HASH_ANNOTATION]

    assert digest(names()) != digest(names("aiGuaranteedGpus=1"))


# ------------------------------------------------------------------ a real Prometheus


@pytest.mark.engine
def test_promtool_reads_the_controller_s_queries_as_the_twin_does(tmp_path):
    """Each query the controller sends, on Slurm's and Kueue's series as they are scraped, has the
    value the twin's evaluator gives it on Prometheus 3.5.3; with Kueue's series gone its AI
    queries are empty (a lost input), not 0. With the runnable-jobs exporter's series there HPC's
    waiting is the exporter's; without them (the other cases) slurmctld's pending minus held, not
    a lost input (docs/handoff.md "One input lost")."""
    target = scaling.scaling_target(names())
    queries = scaling.fair_share_queries(target)
    series = []
    for partition, (alloc, mixed, pending, hold, widest) in zip(
        target.partitions, [(1, 1, 3, 1, 2), (1, 1, 2, 0, 2)], strict=True
    ):
        for metric, value in (
            (scaling.NODES_ALLOC, alloc),
            (scaling.NODES_MIXED, mixed),
            (scaling.NODES_IDLE, 0),
            (scaling.NODES_DRAINED, 0),
            (scaling.PENDING_JOBS, pending),
            (scaling.HELD_JOBS, hold),
            (scaling.LARGEST_PENDING_JOB_NODES, widest),
        ):
            series.append(({"__name__": metric, "partition": partition, "job": "slurm"}, value))
    kueue_series = [
        ({"__name__": metric, "cluster_queue": target.ai_cluster_queue, "resource": target.gpu_resource}, value)
        for metric, value in ((scaling.KUEUE_USAGE, 2), (scaling.KUEUE_PENDING, 4))
    ]
    # The exporter (components/runnable_jobs.py): one 1-node job of the default partition runnable
    runnable_series = [
        ({"__name__": metric, "partition": partition, "job": "runnable"}, value)
        for partition, (jobs, widest) in zip(target.partitions, [(1, 1), (0, 0)], strict=True)
        for metric, value in ((scaling.RUNNABLE_JOBS, jobs), (scaling.RUNNABLE_MAX_JOB_NODES, widest))
    ]
    # AI's queue lending nothing: Kueue admitted 4 GPUs to AI while slurmd pods hold 2 under HPC's
    # queue, and 3 AI pods read PodScheduled False, of which at most those 2 wait for a GPU
    unplaced_series = [
        ({"__name__": scaling.KUEUE_USAGE, "cluster_queue": queue, "resource": target.gpu_resource}, gpus)
        for queue, gpus in ((target.ai_cluster_queue, 4), (HPC_CLUSTER_QUEUE, 2))
    ] + [
        (
            {
                "__name__": scaling.KUEUE_PENDING,
                "cluster_queue": target.ai_cluster_queue,
                "resource": target.gpu_resource,
            },
            4,
        )
    ]
    unplaced_series += [
        ({"__name__": scaling.POD_UNSCHEDULABLE, "namespace": target.ai_namespace, "pod": f"p{i}"}, 1) for i in range(3)
    ]
    groups = []
    for case, present in (
        ("kueue up", series + kueue_series),
        ("kueue gone", series),
        ("exporter up", series + kueue_series + runnable_series),
        ("ai pods unplaced", series + unplaced_series),
    ):
        db = TSDB()
        for labels, value in present:
            for i in range(21):
                db.add(labels, 30.0 * i, float(value))
        ev = Evaluator(db)
        ev.final_before = 601
        tests = []
        for name, query in queries.items():
            try:
                value = scalar_result(ev.instant(query, 600))
            except PromQLError:
                value = None
            if case != "kueue gone":
                assert value is not None, name
            samples = [] if value is None else [{"labels": "{}", "value": value}]
            tests.append({"expr": query, "eval_time": "600s", "exp_samples": samples})
        inputs = [{"series": harness.series_selector(labels), "values": f"{value}x20"} for labels, value in present]
        groups.append({"name": case, "interval": "30s", "input_series": inputs, "promql_expr_test": tests})
        values = {
            n: (None if not t["exp_samples"] else t["exp_samples"][0]["value"])
            for n, t in zip(queries, tests, strict=True)
        }
        reading = fair_share.reading(values)
        if case == "kueue up":  # no exporter: (3 - 1) + (2 - 0) pending not held, the widest 2 nodes
            assert reading.used == {HPC: 2, AI: 2} and reading.waiting[AI] == 4 and reading.waiting[HPC] == 4
        elif case == "exporter up":
            assert reading.used == {HPC: 2, AI: 2} and reading.waiting == {HPC: 1, AI: 4}
        elif case == "ai pods unplaced":
            assert reading.used[AI] == 2 and reading.waiting[AI] == 4 + 2
        else:
            assert reading.used[AI] is None and reading.waiting[AI] is None
    harness.promtool_test(tmp_path, groups)

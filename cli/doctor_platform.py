"""The doctor's checks of what admits and scales the work: Kueue, KEDA, the AI run-limit
policies and the fair-share controller's quota policy. Each failed check carries the one command that fixes it (or shows why).

Every name comes from the names contract and every expected value from the renderers the
program deploys (components/kueue.py, keda.py, ai_run_limit.py, fair_share_controller.py), so a check compares the
cluster with what this stack would create. `kube` is the doctor's `Kube` (cli/doctor.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cli.checklist import FAIL, OK, Check
from components import ai_run_limit, fair_share_controller, fair_share_loop, keda, kueue
from core import names
from core.settings import escaped

KUEUE_GROUP, KUEUE_VERSION = names.KUEUE_GROUP_VERSION.split("/")
POLICY_GROUP, POLICY_VERSION = ai_run_limit.API_VERSION.split("/")
POLICY_PLURALS = {  # the API's resource names (kubernetes@v1.34.0 admissionregistration/v1)
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
}


def _condition(obj: dict, kind: str) -> dict:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), {})


def _true(obj: dict, kind: str) -> bool:
    return _condition(obj, kind).get("status") == "True"


def _why(obj: dict, kind: str) -> str:
    c = _condition(obj, kind)
    if not c:
        return f"no {kind} condition"
    return f"{kind}={c.get('status')} {c.get('reason', '')}: {' '.join(str(c.get('message', '')).split())[:200]}"


def _read(read: Callable[..., dict], *args: str) -> dict | None:
    """read(*args), or None when the API server has no such object."""
    from kubernetes.client.exceptions import ApiException

    try:
        return read(*args)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def _redeploy(stack: str) -> str:
    """The fix for an object that is missing or differs from what the program creates."""
    return f"pulumi up --refresh --stack {stack}  (re-creates what the program deploys)"


def _pods_ready(check: str, kube: Any, namespace: str, what: str, selects: Callable[[dict], bool], fix: str) -> Check:
    pods = [p for p in kube.pods(namespace) if selects(p) and (p.get("status") or {}).get("phase") != "Succeeded"]
    waiting = sorted(p["metadata"]["name"] for p in pods if not _true(p, "Ready"))
    if not pods:
        return Check(check, FAIL, f"{what}: no pods in namespace {namespace}", remedy=fix)
    if waiting:
        return Check(check, FAIL, f"{what}: {len(waiting)} of {len(pods)} not Ready: {', '.join(waiting[:3])}", fix)
    return Check(check, OK, f"{what}: {len(pods)} Ready")


# ---------------------------------------------------------------------- Kueue


def kueue_checks(n: names.Names, kube: Any, stack: str) -> list[Check]:
    """Its controller (which serves the webhooks) Ready, a dry-run Workload admitted by the
    webhooks, each ClusterQueue Active with this stack's quota, each LocalQueue bound and Active."""
    from kubernetes.client.exceptions import ApiException

    deployment = names.kueue_controller_manager()
    restart = f"kubectl -n {names.KUEUE_NAMESPACE} rollout restart deployment/{deployment}"
    checks = [
        _pods_ready(
            "kueue",
            kube,
            names.KUEUE_NAMESPACE,
            f"Kueue controller and webhooks ({deployment})",
            lambda p: p["metadata"]["name"].startswith(f"{deployment}-"),
            restart,
        )
    ]
    probe = kueue.workload_probe()
    try:
        kube.dry_run(probe)
    except ApiException as error:
        reason = " ".join((error.reason or "").split())
        checks.append(
            Check("kueue", FAIL, f"a dry-run Workload was refused ({error.status} {reason[:200]})", remedy=restart)
        )
    else:
        checks.append(Check("kueue", OK, f"webhooks admit a dry-run Workload in queue {probe['spec']['queueName']}"))

    for expected in kueue.cluster_queues(n.shares):
        name = expected["metadata"]["name"]
        live = _read(kube.get_cluster, KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", name)
        quota = _quota(expected)
        if live is None:
            checks.append(Check("kueue", FAIL, f"ClusterQueue {name} is missing", remedy=_redeploy(stack)))
        elif _quota(live) != quota:
            checks.append(
                Check(
                    "kueue",
                    FAIL,
                    f"ClusterQueue {name} has quota {_shown(_quota(live))}, expected {_shown(quota)}",
                    remedy=_redeploy(stack),
                )
            )
        elif not _true(live, "Active"):
            fix = f"kubectl describe clusterqueue {name}  (the condition names what it lacks)"
            checks.append(Check("kueue", FAIL, f"ClusterQueue {name} is not Active: {_why(live, 'Active')}", fix))
        else:
            checks.append(Check("kueue", OK, f"ClusterQueue {name} Active, quota {_shown(quota)}"))

    for expected in kueue.objects(n.shares):
        if expected["kind"] != "LocalQueue":
            continue
        namespace, name = expected["metadata"]["namespace"], expected["metadata"]["name"]
        queue = expected["spec"]["clusterQueue"]
        live = _read(kube.get, KUEUE_GROUP, KUEUE_VERSION, namespace, "localqueues", name)
        where = f"LocalQueue {namespace}/{name}"
        if live is None:
            checks.append(Check("kueue", FAIL, f"{where} is missing", remedy=_redeploy(stack)))
        elif (bound := (live.get("spec") or {}).get("clusterQueue")) != queue:
            checks.append(
                Check("kueue", FAIL, f"{where} is bound to {bound!r}, expected {queue!r}", remedy=_redeploy(stack))
            )
        elif not _true(live, "Active"):
            fix = f"kubectl describe clusterqueue {queue}  (an inactive ClusterQueue leaves its LocalQueues inactive)"
            checks.append(Check("kueue", FAIL, f"{where} is not Active: {_why(live, 'Active')}", remedy=fix))
        else:
            checks.append(Check("kueue", OK, f"{where} bound to ClusterQueue {queue}, Active"))
    return checks


def _quota(queue: dict) -> dict[tuple[str, str], tuple[str, str]]:
    """(flavor, resource) -> (nominalQuota, lendingLimit), as strings: the API server returns
    quantities as strings, the renderer as integers."""
    return {
        (f["name"], r["name"]): (str(r.get("nominalQuota")), str(r.get("lendingLimit", "none")))
        for g in (queue.get("spec") or {}).get("resourceGroups") or []
        for f in g.get("flavors") or []
        for r in f.get("resources") or []
    }


def _shown(quota: dict[tuple[str, str], tuple[str, str]]) -> str:
    if not quota:
        return "none"
    return ", ".join(f"{res} {nominal} ({flavor}, lends {lend})" for (flavor, res), (nominal, lend) in quota.items())


# ---------------------------------------------------------------------- KEDA


def _app_label(app: str) -> Callable[[dict], bool]:
    return lambda pod: (pod["metadata"].get("labels") or {}).get("app") == app


def keda_checks(n: names.Names, kube: Any, stack: str) -> list[Check]:
    """The operator and metrics server Ready; the ScaledObject Ready, its Active condition
    reported and no trigger failing; its HPA reading the formula's one composite metric."""
    checks = [
        _pods_ready(
            "keda",
            kube,
            names.KEDA_NAMESPACE,
            f"KEDA {app}",
            _app_label(app),
            f"kubectl -n {names.KEDA_NAMESPACE} rollout restart deployment/{app}",
        )
        for app in (names.KEDA_OPERATOR_APP, names.KEDA_METRICS_SERVER_APP)
    ]
    slurm, name = n.slurm, n.scaled_object
    describe = f"kubectl -n {slurm.namespace} describe scaledobject {name}"
    obj = _read(kube.get, "keda.sh", "v1alpha1", slurm.namespace, "scaledobjects", name)
    if obj is None:
        return [*checks, Check("scaledobject", FAIL, f"{name} is missing", remedy=_redeploy(stack))]
    failing = {
        trigger: h.get("numberOfFailures", "?")
        for trigger, h in sorted(((obj.get("status") or {}).get("health") or {}).items())
        if h.get("status") == "Failing"
    }
    active = _condition(obj, "Active").get("status")
    if not _true(obj, "Ready"):
        checks.append(Check("scaledobject", FAIL, f"{name} not Ready: {_why(obj, 'Ready')}", remedy=describe))
    elif failing:
        shown = ", ".join(f"{t} ({k} failures)" for t, k in failing.items())
        logs = f"kubectl -n {names.KEDA_NAMESPACE} logs deployment/{names.KEDA_OPERATOR_APP} --tail=50"
        checks.append(Check("scaledobject", FAIL, f"{name}: triggers failing: {shown}", remedy=logs))
    elif active not in ("True", "False"):
        checks.append(
            Check("scaledobject", FAIL, f"{name} has not evaluated its triggers: {_why(obj, 'Active')}", describe)
        )
    else:
        state = "Active (Slurm wants GPUs)" if active == "True" else "not Active (Slurm idle: GPUs with Kubernetes)"
        checks.append(Check("scaledobject", OK, f"{name} Ready, {state}, no trigger failing"))
    checks.append(_hpa_check(n, kube, obj, stack))
    return checks


def _hpa_check(n: names.Names, kube: Any, obj: dict, stack: str) -> Check:
    """The deployed formula is this stack's, and its HPA reads only the composite metric it makes."""
    expected = keda.scaling_modifiers(n)
    live = ((obj.get("spec") or {}).get("advanced") or {}).get("scalingModifiers") or {}
    if live.get("formula") != expected["formula"]:
        return Check("hpa", FAIL, f"{n.scaled_object}'s formula is not this stack's", remedy=_redeploy(stack))
    hpa = _read(kube.hpa, n.slurm.namespace, n.keda_hpa)
    if hpa is None:
        fix = f"kubectl -n {n.slurm.namespace} describe scaledobject {n.scaled_object}  (KEDA creates the HPA)"
        return Check("hpa", FAIL, f"{n.keda_hpa} is missing", remedy=fix)
    metrics = [
        m.get("external", {}).get("metric", {}).get("name") for m in (hpa.get("spec") or {}).get("metrics") or []
    ]
    if metrics != [names.KEDA_COMPOSITE_METRIC]:
        return Check(
            "hpa",
            FAIL,
            f"{n.keda_hpa} reads {', '.join(map(str, metrics)) or 'no metric'}, expected only "
            f"{names.KEDA_COMPOSITE_METRIC} (the formula)",
            remedy=_redeploy(stack),
        )
    scaling = _condition(hpa, "ScalingActive")
    if scaling.get("status") == "False" and str(scaling.get("reason", "")).startswith("FailedGet"):
        fix = f"kubectl get {keda.EXTERNAL_METRICS_API}  (KEDA's metrics server must be Available)"
        return Check("hpa", FAIL, f"{n.keda_hpa} cannot read the formula: {_why(hpa, 'ScalingActive')}", remedy=fix)
    current = next(
        (
            m["external"].get("current", {}).get("averageValue", "?")
            for m in (hpa.get("status") or {}).get("currentMetrics") or []
            if m.get("type") == "External"
        ),
        "no value yet",
    )
    wants = (hpa.get("status") or {}).get("desiredReplicas", "?")
    return Check("hpa", OK, f"{n.keda_hpa} reads the formula: {names.KEDA_COMPOSITE_METRIC}={current}; wants {wants}")


# ---------------------------------------------------------------------- admission policies


def admission_checks(n: names.Names, kube: Any, stack: str) -> list[Check]:
    """Each run-limit policy with this stack's limits, the fair-share controller's quota policy
    with the program's rules, and each binding denying."""
    checks = []
    quota_only = (fair_share_controller.quota_policy(n), fair_share_controller.quota_policy_binding())
    for expected in [*ai_run_limit.stack_objects(n), *quota_only]:
        kind, name = expected["kind"], expected["metadata"]["name"]
        plural = POLICY_PLURALS[kind]
        live = _read(kube.get_cluster, POLICY_GROUP, POLICY_VERSION, plural, name)
        if live is None:
            checks.append(Check("admission", FAIL, f"{kind} {name} is missing", remedy=_redeploy(stack)))
            continue
        if kind == "ValidatingAdmissionPolicyBinding":
            problem, detail = _binding_problem(live, expected)
        elif name == fair_share_controller.QUOTA_POLICY:
            problem, detail = _quota_policy_problem(live, expected, n)
        else:
            problem, detail = _run_limit_problem(live, expected)
        if problem:
            checks.append(Check("admission", FAIL, f"{kind} {name}{problem}", remedy=_redeploy(stack)))
        else:
            checks.append(Check("admission", OK, f"{kind} {name} in place: {detail}"))
    return [*checks, *quota_policy_trials(kube, stack)]


# Only the API server runs the policy's CEL as it is deployed (cel-python runs it in the tests):
# an expression that errors there refuses (failurePolicy Fail), so every quota patch would fail.
# So the doctor sends two server-side dry runs as the controller (impersonated; the admin may):
# the loop's own patch, which must pass, and a stopPolicy change, which the policy must refuse.
# A denial is 422 Invalid (each validation states reason Invalid), its message naming the policy:
# "ValidatingAdmissionPolicy '<name>' with binding '<name>' denied request: ...". dryRun=All stores
# nothing; the controller's ClusterRole may get and patch this queue by name, so RBAC lets both in.
TRIAL_QUEUE = names.HPC_CLUSTER_QUEUE
FORBIDDEN_PATCH = [{"op": "replace", "path": "/spec/stopPolicy", "value": "HoldAndDrain"}]


def quota_policy_trials(kube: Any, stack: str) -> list[Check]:
    """The loop's patch of HPC's queue to its current GPU quota admitted, a stopPolicy patch refused
    by the quota policy: both dry runs as the controller's service account."""
    from kubernetes.client.exceptions import ApiException

    from validation.cluster import api_error

    user, policy = fair_share_controller.controller_user(), fair_share_controller.QUOTA_POLICY
    queue = _read(kube.get_cluster, KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", TRIAL_QUEUE)
    if queue is None:
        return [
            Check("admission", FAIL, f"cannot try {policy}: ClusterQueue {TRIAL_QUEUE} is missing", _redeploy(stack))
        ]
    try:
        nominal, lending = fair_share_loop.live_quota(queue, names.GPU_RESOURCE)
        own = fair_share_loop.quota_patch(queue, names.GPU_RESOURCE, nominal, nominal if lending is None else lending)
    except (KeyError, TypeError, ValueError) as error:  # the loop could not patch it either
        detail = f"cannot try {policy}: ClusterQueue {TRIAL_QUEUE}'s {names.GPU_RESOURCE} quota: {escaped(str(error))}"
        return [Check("admission", FAIL, detail, _redeploy(stack))]
    path = f"{fair_share_loop.KUEUE_API}/{TRIAL_QUEUE}"
    as_whom = f"as {user}, a dry-run"
    checks = []
    try:
        kube.dry_run_patch_as(user, path, own, fair_share_loop.FIELD_MANAGER)
    except ApiException as error:
        said = escaped(api_error(error), limit=300)
        fix = (
            f"kubectl get validatingadmissionpolicy {policy} -o yaml  (a rule that errors on the API server "
            f"refuses every patch: failurePolicy Fail); then {_redeploy(stack)}"
            if policy in said
            else f"kubectl auth can-i patch clusterqueues/{TRIAL_QUEUE} --as={user}  (its ClusterRole)"
        )
        checks.append(
            Check("admission", FAIL, f"{as_whom} of the controller's own quota patch was refused: {said}", fix)
        )
    else:
        shown = f"{names.GPU_RESOURCE} {nominal}" + ("" if lending is None else f", lends {lending}")
        checks.append(Check("admission", OK, f"{as_whom} of the controller's own quota patch ({shown}) is admitted"))
    try:
        kube.dry_run_patch_as(user, path, FORBIDDEN_PATCH, fair_share_loop.FIELD_MANAGER)
    except ApiException as error:
        said = escaped(api_error(error), limit=300)
        if error.status == 422 and policy in said:
            checks.append(Check("admission", OK, f"{as_whom} stopPolicy patch is refused by {policy}"))
        else:
            detail = f"{as_whom} stopPolicy patch was refused, but not by {policy}: {said}"
            checks.append(Check("admission", FAIL, detail, f"kubectl get validatingadmissionpolicybinding {policy}"))
    else:
        detail = f"{as_whom} stopPolicy patch of ClusterQueue {TRIAL_QUEUE} was admitted: {policy} does not hold"
        checks.append(Check("admission", FAIL, detail, _redeploy(stack)))
    return checks


# Each returns what is wrong (following the object's kind and name in a failed check), or "" and
# what is in place.


def _run_limit_problem(live: dict, expected: dict) -> tuple[str, str]:
    want = ai_run_limit.limits([expected])
    try:
        have = ai_run_limit.limits([live])
    except (KeyError, TypeError, ValueError):  # its variables are not the program's
        have = None
    if have != want:
        shown = f"{have.max_seconds} s and {have.gpus} GPUs" if have else "unreadable limits"
        return f" allows {shown}, expected {want.max_seconds} s and {want.gpus} GPUs", ""
    return "", f"at most {want.max_seconds} s, {want.gpus} GPUs"


def _quota_policy_problem(live: dict, expected: dict, n: names.Names) -> tuple[str, str]:
    """Its rules, whom it matches and its GPU bound, as the program renders them."""
    spec = live.get("spec") or {}
    differs = [
        k
        for k in ("matchConditions", "variables", "validations", "failurePolicy")
        if spec.get(k) != expected["spec"][k]
    ]
    # the API server fills in what the program leaves to defaults (empty selectors, a rule's scope)
    rules = (spec.get("matchConstraints") or {}).get("resourceRules") or []
    want_rules = expected["spec"]["matchConstraints"]["resourceRules"]
    if [{k: r.get(k) for k in want_rules[0]} for r in rules] != want_rules:
        differs.insert(0, "matchConstraints")
    if differs:
        return f" differs from the program's in {', '.join(differs)}", ""
    return "", f"{fair_share_controller.controller_user()} may change only GPU quotas, 0 to {n.shares.gpus_total}"


def _binding_problem(live: dict, expected: dict) -> tuple[str, str]:
    spec, want_spec = live.get("spec") or {}, expected["spec"]
    differs = [k for k in ("policyName", "validationActions") if spec.get(k) != want_spec[k]]
    if differs:
        return ": " + ", ".join(f"{k} {spec.get(k)!r} (expected {want_spec[k]!r})" for k in differs), ""
    return "", f"{', '.join(want_spec['validationActions'])} by {want_spec['policyName']}"

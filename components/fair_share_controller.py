"""The fair-share controller in the cluster: the code the twin runs (components/fair_share.py) and
its loop (components/fair_share_loop.py), shipped as they are in a ConfigMap to a stock Python
image, which runs them as one non-root pod on the control node.

What it may do is all it needs: get and patch the two ClusterQueues it moves, by name (a
ClusterRole with resourceNames; kubernetes/kubernetes@v1.34.0 staging/src/k8s.io/api/rbac/v1/
types.go PolicyRule), nothing else; it reads Prometheus over plain HTTP as every in-cluster
reader does (the Service the KEDA triggers read). Its namespace enforces Pod Security
`restricted` (kubernetes/pod-security-admission@v0.34.0: api/constants.go labels), which the pod
meets: non-root, no privilege escalation, every capability dropped, seccomp RuntimeDefault, a
read-only root and only a ConfigMap and its token mounted. It serves nothing, so no NetworkPolicy
guards a port; Flannel, the cluster's network, enforces none anyway (flannel-io/flannel@v0.27.4
README.md: "For network policy, other projects such as Calico can be used").

RBAC cannot narrow a `patch` to fields, so a ValidatingAdmissionPolicy (`quota_policy`) lets the
controller's account change nothing but the GPU entries' nominalQuota and lendingLimit values,
within 0..gpusTotal; it matches that account alone, so the admin's and Pulumi's writes (`pulumi
destroy` deleting the queues included) and Kueue's are never its business. Bound before the
Deployment is created; on destroy the Deployment goes first, then the binding, then the policy.

Kueue's ClusterQueue webhook accepts the patch: on an update it validates the new spec as on a
create (lendingLimit at most nominalQuota, no negative quota; the resource groups are mutable)
and keeps only concurrentAdmissionPolicy immutable (kubernetes-sigs/kueue@v0.19.2:
pkg/webhooks/clusterqueue_webhook.go ValidateClusterQueueUpdate, validateFlavorQuotas,
validateLendingLimit).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from components import ai_run_limit, fair_share, slurmd_scaling
from core import host_layout
from core.names import (
    ADMISSION_API_VERSION,
    AI_CLUSTER_QUEUE,
    CODE_HASH_ANNOTATION,
    FAIR_SHARE_CONTROLLER,
    FAIR_SHARE_NAMESPACE,
    GPU_RESOURCE,
    HPC_CLUSTER_QUEUE,
    KUEUE_GROUP_VERSION,
    Names,
)

HERE = Path(__file__).resolve().parent
# The modules the pod runs, as the repository holds them; the loop imports the rule as
# `components.fair_share`, so both sit under components/ in the mount (a namespace package).
CODE = (HERE / "fair_share.py", HERE / "fair_share_loop.py")
APP_DIR = "/opt/fair-share"
CONFIG_KEY = "config.json"
POD_SECURITY = "restricted"
RUN_AS = 65534  # nobody in the Debian-based python image
RESOURCES = {"requests": {"cpu": "10m", "memory": "48Mi"}, "limits": {"cpu": "200m", "memory": "96Mi"}}
KUEUE_GROUP = KUEUE_GROUP_VERSION.split("/")[0]


def sides() -> dict[str, str]:
    """Side -> the ClusterQueue whose nominalQuota is that side's share."""
    return {fair_share.HPC: HPC_CLUSTER_QUEUE, fair_share.AI: AI_CLUSTER_QUEUE}


def lends(n: Names) -> dict[str, bool]:
    """Whether each side's queue lends, as components/kueue.py sets its lendingLimit: HPC's if AI
    may borrow its idle share, AI's if HPC may (the controller's config, and the twin's)."""
    return {fair_share.HPC: n.shares.ai_borrows_hpc_gpus, fair_share.AI: n.shares.hpc_borrows_ai_gpus}


def no_starvation_bounds(n: Names) -> dict[str, int]:
    """fair_share.no_starvation_bounds for the stack's run limits and hand-off (as `plan` prints
    them): a Slurm job ends by its MaxTime plus a limit check and KillWait, an AI job by its
    max-exec-time."""
    handoff = slurmd_scaling.stack_reclaim_bounds(n).handoff_s
    slurm_run = slurmd_scaling.slurm_run_bound_s(n.slurm_job_max_minutes)
    return fair_share.no_starvation_bounds(slurm_run, 60 * n.ai_job_max_minutes, handoff)


def controller_config(n: Names) -> dict:
    """What the loop reads (fair_share_loop.Config.from_json): the stack's queries, queues and split."""
    target = slurmd_scaling.scaling_target(n)
    return {
        "prometheusUrl": n.prometheus_url,
        "queries": slurmd_scaling.fair_share_queries(target),
        "clusterQueues": sides(),
        "gpuResource": GPU_RESOURCE,
        "gpusTotal": n.shares.gpus_total,
        "guaranteed": {fair_share.HPC: n.shares.hpc_gpus, fair_share.AI: n.shares.ai_guaranteed_gpus},
        "lends": lends(n),
        "slurmdMaxReplicas": n.slurmd_max_replicas,  # as components/keda.py's maxReplicaCount
        "turnLimitSeconds": no_starvation_bounds(n)["turn_start_s"],  # a turn unserved past the bound ends
        "periodSeconds": fair_share.PERIOD_S,
    }


def config_map_data(n: Names) -> dict[str, str]:
    return {
        **{path.name: path.read_text() for path in CODE},
        CONFIG_KEY: json.dumps(controller_config(n), indent=2, sort_keys=True) + "\n",
    }


def _metadata(namespaced: bool = True) -> dict:
    labels = {"app.kubernetes.io/name": FAIR_SHARE_CONTROLLER}
    return {"name": FAIR_SHARE_CONTROLLER, "labels": labels} | (
        {"namespace": FAIR_SHARE_NAMESPACE} if namespaced else {}
    )


def namespace(kubernetes_minor: str) -> dict:
    version = f"v{kubernetes_minor}"
    labels = {
        f"pod-security.kubernetes.io/{mode}{suffix}": value
        for mode in ("enforce", "audit", "warn")
        for suffix, value in (("", POD_SECURITY), ("-version", version))
    }
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": FAIR_SHARE_NAMESPACE, "labels": labels}}


def service_account() -> dict:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _metadata()}


def cluster_role() -> dict:
    """get and patch on the two ClusterQueues, by name: nothing else."""
    rule = {
        "apiGroups": [KUEUE_GROUP],
        "resources": ["clusterqueues"],
        "resourceNames": sorted(sides().values()),
        "verbs": ["get", "patch"],
    }
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": _metadata(False),
        "rules": [rule],
    }


def cluster_role_binding() -> dict:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": _metadata(False),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": FAIR_SHARE_CONTROLLER},
        "subjects": [{"kind": "ServiceAccount", "name": FAIR_SHARE_CONTROLLER, "namespace": FAIR_SHARE_NAMESPACE}],
    }


def config_map(n: Names) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _metadata(), "data": config_map_data(n)}


def pod_security_context() -> dict:
    """`restricted`'s pod-level fields, as nobody of the stock Python image (the runnable-jobs
    exporter's pod too: components/runnable_exporter.py)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def on_the_control_node() -> dict:
    """A pod spec's nodeSelector and toleration for the control node (the runnable-jobs exporter's too)."""
    return {
        "nodeSelector": {host_layout.CONTROL_PLANE_NODE_LABEL: ""},
        "tolerations": [{"key": host_layout.CONTROL_PLANE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
    }


def deployment(n: Names, image: str) -> dict:
    data = config_map_data(n)
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    items = [{"key": path.name, "path": f"components/{path.name}"} for path in CODE]
    items.append({"key": CONFIG_KEY, "path": CONFIG_KEY})
    labels = {"app.kubernetes.io/name": FAIR_SHARE_CONTROLLER}
    container = {
        "name": "controller",
        "image": image,
        "command": ["python", "-m", "components.fair_share_loop", f"{APP_DIR}/{CONFIG_KEY}"],
        "workingDir": APP_DIR,
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}, {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "resources": RESOURCES,
        "volumeMounts": [{"name": "code", "mountPath": APP_DIR, "readOnly": True}],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    pod = {
        "serviceAccountName": FAIR_SHARE_CONTROLLER,
        "securityContext": pod_security_context(),
        # Beside Prometheus and slurmctld, off the GPU workers.
        **on_the_control_node(),
        "containers": [container],
        "volumes": [{"name": "code", "configMap": {"name": FAIR_SHARE_CONTROLLER, "items": items}}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(),
        "spec": {
            "replicas": 1,
            # Never two at once: each would patch the queues from its own usage.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels, "annotations": {CODE_HASH_ANNOTATION: digest}}, "spec": pod},
        },
    }


# ------------------------------------------------------------------ what its token may change

# What the loop patches (fair_share_loop.quota_patch): the GPU entry's nominalQuota and, where it
# has one, its lendingLimit. RBAC cannot narrow a `patch` to fields, so this policy does.
QUOTA_FIELDS = ("nominalQuota", "lendingLimit")
# The API server's own bookkeeping on a write, set after the patch and before validating
# admission: managedFields (the patch's fieldManager: kubernetes/kubernetes@v1.34.0 staging/src/
# k8s.io/apiserver/pkg/endpoints/handlers/patch.go), resourceVersion, and generation, bumped when
# anything but metadata changed (staging/src/k8s.io/apiextensions-apiserver/pkg/registry/
# customresource/strategy.go PrepareForUpdate, which also keeps the old status: a write to the
# main resource cannot change it).
SERVER_SET_METADATA = ("managedFields", "resourceVersion", "generation")
QUOTA_POLICY = f"testbed-{FAIR_SHARE_CONTROLLER}-quotas-only"
GPUS_VARIABLE = "gpus"


def controller_user() -> str:
    """The controller's username as the API server authenticates its token."""
    return f"system:serviceaccount:{FAIR_SHARE_NAMESPACE}:{FAIR_SHARE_CONTROLLER}"


def _cel_strings(items: Sequence[str]) -> str:
    return "[" + ", ".join(f"'{item}'" for item in items) + "]"


def _same(new: str, old: str, values_may_differ: Sequence[str] = (), ignored: Sequence[str] = ()) -> str:
    """CEL: maps `new` and `old` have the same keys, `ignored` aside, and equal values, those of
    `values_may_differ` and `ignored` aside. Every key counts, so a field Kueue adds later is
    covered too."""
    skip = f"k in {_cel_strings(ignored)} || " if ignored else ""
    free = f"k in {_cel_strings(values_may_differ)} || " if values_may_differ else ""
    return f"{new}.all(k, {skip}(k in {old} && ({free}{new}[k] == {old}[k]))) && {old}.all(k, {skip}k in {new})"


def _changed(new: str, old: str, values_may_differ: Sequence[str] = (), ignored: Sequence[str] = ()) -> str:
    """CEL: the keys `_same` finds changed, added or removed, as a list for a message."""
    skip = f"!(k in {_cel_strings(ignored)}) && " if ignored else ""
    free = f"!(k in {_cel_strings(values_may_differ)}) && " if values_may_differ else ""
    return (
        f"{new}.filter(k, {skip}(!(k in {old}) || ({free}{new}[k] != {old}[k]))) + {old}.filter(k, {skip}!(k in {new}))"
    )


# object and oldObject are dyn in a policy (kubernetes@v1.34.0 staging/src/k8s.io/apiserver/pkg/
# admission/plugin/cel/compile.go createEnvForOpts) and maps at run time; dyn() keeps the key
# iteration valid where the policy's type checker knows the CRD's schema (a warning otherwise).
NEW_META, OLD_META = "dyn(object.metadata)", "dyn(oldObject.metadata)"
NEW_SPEC, OLD_SPEC = "dyn(object.spec)", "dyn(oldObject.spec)"


def _layout(spec: str) -> str:
    """CEL: the resource groups in order: each one's coveredResources, and its flavors' names in
    order (the order Kueue tries them) with their resources' names."""
    return f"{spec}.resourceGroups.map(g, [g.coveredResources, g.flavors.map(f, [f.name, f.resources.map(r, r.name)])])"


def _entries_same() -> str:
    """CEL: every field of every group, flavor and quota entry as it was, paired by coveredResources,
    flavor name and resource name (`_layout` holds the order and the names), except the values of
    QUOTA_FIELDS in a GPU entry; the entries' keys all kept (a lendingLimit neither added nor dropped)."""
    entry = f"r.name == '{GPU_RESOURCE}' ? {_same('r', 'oldR', QUOTA_FIELDS)} : {_same('r', 'oldR')}"
    resources = f"f.resources.all(r, oldF.resources.all(oldR, oldR.name != r.name || ({entry})))"
    flavors = (
        f"g.flavors.all(f, oldG.flavors.all(oldF, oldF.name != f.name || "
        f"({_same('f', 'oldF', ('resources',))} && {resources})))"
    )
    return (
        f"{NEW_SPEC}.resourceGroups.all(g, {OLD_SPEC}.resourceGroups.all(oldG, "
        f"oldG.coveredResources != g.coveredResources || ({_same('g', 'oldG', ('flavors',))} && {flavors})))"
    )


def _within(value: str) -> str:
    q = f"quantity(string({value}))"
    return f"({q}.isInteger() && {q}.asApproximateFloat() >= 0.0 && {q}.asApproximateFloat() <= double(variables.{GPUS_VARIABLE}))"


def _on_update(expression: str) -> str:
    """A rule about an update (CREATE and DELETE are refused by the first rule; their object or
    oldObject is null)."""
    return f"request.operation != 'UPDATE' || ({expression})"


def quota_policy(n: Names) -> dict:
    """Refuses, for the controller's service account alone, any write to a ClusterQueue but a change
    of the GPU quotas' values, and a quota outside 0..gpusTotal."""
    who = f"the fair-share controller ({controller_user()})"
    only = f"{who} may change only the {' and '.join(QUOTA_FIELDS)} values of {GPU_RESOURCE} in a ClusterQueue"
    has_groups = f"has({NEW_SPEC}.resourceGroups)"
    quota_values = (
        f"{NEW_SPEC}.resourceGroups.all(g, g.flavors.all(f, f.resources.all(r, r.name != '{GPU_RESOURCE}' || "
        f"({_within('r.nominalQuota')} && (!has(r.lendingLimit) || {_within('r.lendingLimit')})))))"
    )
    gpus = n.shares.gpus_total
    validations = [
        {
            "expression": "request.operation == 'UPDATE'",
            "messageExpression": f"'{who} may not ' + request.operation + ' a ClusterQueue; it only patches quotas'",
            "message": f"{who} may only patch a ClusterQueue's quotas, never create or delete one",
        },
        {
            "expression": _on_update(_same(NEW_META, OLD_META, ignored=SERVER_SET_METADATA)),
            "messageExpression": f"'{only}; it changed metadata.' + "
            f"({_changed(NEW_META, OLD_META, ignored=SERVER_SET_METADATA)}).join(', metadata.')",
            "message": f"{only}; it changed the metadata (labels, annotations, finalizers, owners)",
        },
        {
            "expression": _on_update(_same(NEW_SPEC, OLD_SPEC, ("resourceGroups",))),
            "messageExpression": f"'{only}; it changed spec.' + "
            f"({_changed(NEW_SPEC, OLD_SPEC, ('resourceGroups',))}).join(', spec.')",
            "message": f"{only}; it changed a field of spec besides resourceGroups",
        },
        {
            "expression": _on_update(f"!{has_groups} || {_layout(NEW_SPEC)} == {_layout(OLD_SPEC)}"),
            "message": f"{only}; it changed spec.resourceGroups' layout: a group, its coveredResources, "
            "a flavor or a resource added, removed, renamed or reordered",
        },
        {
            "expression": _on_update(f"!{has_groups} || {_entries_same()}"),
            "message": f"{only}; it changed another field of spec.resourceGroups (a borrowingLimit, another "
            f"resource's quota, a lendingLimit added or removed)",
        },
        {
            "expression": _on_update(f"!{has_groups} || {quota_values}"),
            "message": f"{only}; a {GPU_RESOURCE} nominalQuota or lendingLimit must be a whole number from 0 to "
            f"{gpus} (the GPUs of workerCount)",
        },
    ]
    return {
        "apiVersion": ADMISSION_API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": QUOTA_POLICY, "labels": {"app.kubernetes.io/name": FAIR_SHARE_CONTROLLER}},
        "spec": {
            # An expression that errors refuses: a broken rule must not let a write through.
            "failurePolicy": "Fail",
            "matchConstraints": {
                # Every ClusterQueue, not only the two it moves: RBAC may grow, this need not.
                # Every version (v1beta1 and v1beta2 served at kubernetes-sigs/kueue@v0.19.2
                # config/components/crd/bases/kueue.x-k8s.io_clusterqueues.yaml): the rules
                # compare key by key, and a Kueue that stops serving one still matches.
                # Not clusterqueues/status: RBAC grants it none, and a status write keeps spec.
                "matchPolicy": "Equivalent",
                "resourceRules": [
                    {
                        "apiGroups": [KUEUE_GROUP],
                        "apiVersions": ["*"],
                        "resources": ["clusterqueues"],
                        "operations": ["CREATE", "UPDATE", "DELETE"],
                    }
                ],
            },
            # Only the controller's requests: the admin, Pulumi and Kueue are untouched.
            "matchConditions": [
                {
                    "name": "by-the-fair-share-controller",
                    "expression": f"request.userInfo.username == '{controller_user()}'",
                }
            ],
            "variables": [{"name": GPUS_VARIABLE, "expression": str(gpus)}],
            # Each denial 422 Invalid, stated rather than left to the default: doctor's dry run
            # (cli/doctor_platform.py quota_policy_trials) tells the policy's refusal by it.
            "validations": [{**v, "reason": "Invalid"} for v in validations],
        },
    }


def quota_policy_lines(policies: Sequence[dict]) -> list[str]:
    """What the controller's token may change, as `plan` prints it, read from the rendered
    policies (others ignored)."""
    (gpus,) = [
        int(v["expression"])
        for p in policies
        if p["metadata"]["name"] == QUOTA_POLICY
        for v in p["spec"]["variables"]
        if v["name"] == GPUS_VARIABLE
    ]
    return [
        f"its token may change only the queues' {GPU_RESOURCE} {' and '.join(QUOTA_FIELDS)}, from 0 to {gpus} "
        f"GPUs; {QUOTA_POLICY} refuses anything else (stopPolicy, cohort, preemption, flavors, labels...)"
    ]


def quota_policy_binding() -> dict:
    return {
        "apiVersion": ADMISSION_API_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": QUOTA_POLICY, "labels": {"app.kubernetes.io/name": FAIR_SHARE_CONTROLLER}},
        "spec": {"policyName": QUOTA_POLICY, "validationActions": ["Deny"]},
    }


def objects(n: Names, image: str, kubernetes_minor: str) -> list[dict]:
    """Every object, in the order they may be created."""
    return [
        namespace(kubernetes_minor),
        service_account(),
        cluster_role(),
        cluster_role_binding(),
        quota_policy(n),
        quota_policy_binding(),
        config_map(n),
        deployment(n, image),
    ]


@dataclass
class FairShareControllerArgs:
    names: Names
    image: str
    kubernetes_minor: str
    provider: k8s.Provider
    # Kueue's webhook gate and ClusterQueues (the queues it patches), and Prometheus (what it reads)
    after: Sequence[pulumi.Resource]


class FairShareController(pulumi.ComponentResource):
    """The namespace, the service account and its RBAC, the policy on what it may change, the code,
    then the Deployment."""

    def __init__(self, name: str, args: FairShareControllerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:platform:FairShareController", name, None, opts)
        ns, sa, role, binding, policy, policy_binding, code, deploy = objects(
            args.names, args.image, args.kubernetes_minor
        )
        child = pulumi.ResourceOptions(parent=self, provider=args.provider)

        def after(*resources: pulumi.Resource) -> pulumi.ResourceOptions:
            return pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=list(resources)))

        namespace_ = k8s.core.v1.Namespace(f"{name}-namespace", metadata=ns["metadata"], opts=child)
        account = k8s.core.v1.ServiceAccount(f"{name}-account", metadata=sa["metadata"], opts=after(namespace_))
        role_ = k8s.rbac.v1.ClusterRole(f"{name}-role", metadata=role["metadata"], rules=role["rules"], opts=child)
        binding_ = k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-binding",
            metadata=binding["metadata"],
            role_ref=binding["roleRef"],
            subjects=binding["subjects"],
            opts=after(role_, account),
        )
        code_ = k8s.core.v1.ConfigMap(
            f"{name}-code", metadata=code["metadata"], data=code["data"], opts=after(namespace_)
        )
        # What its token may change is bound before the pod runs (the binding after its policy).
        quotas_only = ai_run_limit.policy_and_binding(f"{name}-quotas-only", policy, policy_binding, child)
        self.deployment = k8s.apps.v1.Deployment(
            f"{name}-deployment",
            metadata=deploy["metadata"],
            spec=deploy["spec"],
            opts=after(binding_, code_, quotas_only, *args.after),
        )
        self.register_outputs({"deployment": f"{FAIR_SHARE_NAMESPACE}/{FAIR_SHARE_CONTROLLER}"})

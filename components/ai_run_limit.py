"""The AI run limit: every queued AI job declares how long it may run, and Kueue stops it then.

Lend and reclaim gives HPC a borrowed GPU back when the AI job on it ends, never by preemption,
so the longest HPC waits is the longest an AI job may run (`aiJobMaxMinutes`). Kueue enforces a
limit a job declares: the job label `kueue.x-k8s.io/max-exec-time-seconds` becomes the Workload's
spec.maximumExecutionTimeSeconds, and once the workload has been admitted that long (admitted time
summed over re-admissions) Kueue deactivates it: evicted, its job suspended and its pods deleted,
never requeued (kubernetes-sigs/kueue@v0.19.2: pkg/controller/jobframework/utils.go
MaximumExecutionTimeSecondsForObject, pkg/controller/core/workload_controller.go
reconcileMaxExecutionTime, pkg/workload/admissionchecks.go AccumulatedPastExecutionTimeSeconds).
A job without the label has no limit, and Kueue's own webhook only checks that a label it is
given is a positive integer (pkg/controller/jobframework/validation.go validateCreateForMaxExecTime).

So one ValidatingAdmissionPolicy per kind Kueue manages in the AI jobs' namespace (batch/v1 Job,
kubeflow.org/v1 PyTorchJob, and bare v1 Pods: kueue.FRAMEWORKS), each bound with
validationActions [Deny], refuses there GPU work that names no queue (it would run beside Kueue,
unlimited), a queued job that declares no limit or one above the setting, GPU counts that are
negative, fractional or a request unlike the limit, and work that could never run: a pod asking
for more than one GPU (each worker has one; init, sidecar and ephemeral containers counted) or
more GPUs in all than the workers have (Kueue would never admit it). An update that changes the
pods or GPUs is checked again. One policy per kind keeps every expression typed against one
schema and every rule one line.

The limits are CEL literals in each policy's `variables`, written from the settings here, so a
changed setting changes the policies; `limits` reads them back for `plan` and the twin.
Field names and semantics: kubernetes/kubernetes@v1.34.0 staging/src/k8s.io/api/
admissionregistration/v1/types.go; the CEL libraries a v1.34 policy may use (lists `sum`/`max`,
`quantity` with `isInteger`/`asApproximateFloat`, regex `matches`):
staging/src/k8s.io/apiserver/pkg/cel/environment/base.go. The tests run them in cel-python.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from core.names import (
    ADMISSION_API_VERSION,
    AI_LOCAL_QUEUE,
    GPU_RESOURCE,
    JOBS_NAMESPACE,
    MAX_EXEC_TIME_LABEL,
    NAMESPACE_NAME_LABEL,
    QUEUE_NAME_LABEL,
    Names,
)

API_VERSION = ADMISSION_API_VERSION
POLICY_PREFIX = "testbed-ai-run-limit"
MAX_SECONDS_VARIABLE = "maxSeconds"
WORKER_GPUS_VARIABLE = "workerGpus"
# Kueue reads the label as a 32-bit integer and ignores it above (utils.go strconv.ParseInt(v, 10,
# 32)); the policy takes at most this many significant digits, so CEL's int() never overflows and
# every value it accepts is one Kueue keeps. aiJobMaxMinutes' top, a week, is 604800 s: 6 digits.
LIMIT_DIGITS = 7


@dataclass(frozen=True)
class QueuedKind:
    """A kind Kueue manages in the jobs' namespace (kueue.FRAMEWORKS), as CEL over `root` (object or
    oldObject): `pod_sets(root)` is a list of [pods at once, GPUs per pod] pairs, as doubles;
    `specs(root)` the pod specs whose containers are checked, as (CEL list of pod specs); `counts`
    the pod counts, as a CEL list of ints."""

    group: str
    version: str
    resource: str
    kind: str
    pod_sets: Callable[[str], str]
    pod_specs: Callable[[str], str]
    counts: Callable[[str], str]
    subresources: tuple[str, ...] = ()


# A pod's three container lists, each with its own schema type (Container, EphemeralContainer),
# so each is mapped on its own: a typed CEL list cannot be joined across the two.
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


def _each_list(pod_spec: str, per_list: Callable[[str], str], empty: str) -> list[str]:
    return [
        per_list(f"{pod_spec}.{field}")
        if field == "containers"
        else f"(has({pod_spec}.{field}) ? {per_list(f'{pod_spec}.{field}')} : {empty})"
        for field in CONTAINER_LISTS
    ]


def _gpu(c: str, where: str) -> str:
    return f"{c}.resources.{where}['{GPU_RESOURCE}']"


def _has_gpu(c: str, where: str) -> str:
    return f"has({c}.resources) && has({c}.resources.{where}) && '{GPU_RESOURCE}' in {c}.resources.{where}"


def _quantity(c: str, where: str) -> str:
    """A GPU count as written: a quantity, a string in a built-in object, an integer or a string
    (x-kubernetes-int-or-string) in a custom resource; string() takes both, quantity() parses it."""
    return f"quantity(string({_gpu(c, where)}))"


def gpus_of_pod(pod_spec: str) -> str:
    """The GPUs one pod asks for: the sum of the nvidia.com/gpu limits of its containers, init
    containers (sidecars are init containers: restartPolicy Always) and ephemeral containers.
    A sum over-counts a GPU an init container hands on to the next container (Kubernetes' effective
    request is the larger of the two); a GPU belongs in the main container, and the sum never
    under-counts. Limits count every GPU: `gpu_counts_are_whole` makes requests equal them."""

    def per(cs: str) -> str:
        return f"{cs}.map(c, {_has_gpu('c', 'limits')} ? {_quantity('c', 'limits')}.asApproximateFloat() : 0.0).sum()"

    return "(" + " + ".join(_each_list(pod_spec, per, "0.0")) + ")"


def gpu_counts_are_whole(pod_spec: str) -> str:
    """Every GPU count in the pod is a whole number, not negative, and a request equals its limit.
    The API server checks this for a Pod and a Job's template (kubernetes@v1.34.0 pkg/apis/core/
    validation ValidateResourceRequirements), not inside a custom resource, and Kueue counts what
    the template says: a negative count in one replica would lower the job's total."""

    def whole(where: str) -> str:
        return (
            f"(!({_has_gpu('c', where)}) || ({_quantity('c', where)}.isInteger() && "
            f"{_quantity('c', where)}.asApproximateFloat() >= 0.0))"
        )

    same = (
        f"(!({_has_gpu('c', 'requests')}) || ({_has_gpu('c', 'limits')} && "
        f"{_quantity('c', 'requests')}.asApproximateFloat() == {_quantity('c', 'limits')}.asApproximateFloat()))"
    )

    def per(cs: str) -> str:
        return f"{cs}.all(c, {whole('limits')} && {whole('requests')} && {same})"

    return "(" + " && ".join(_each_list(pod_spec, per, "true")) + ")"


def _replica(root: str) -> str:
    return f"{root}.spec.pytorchReplicaSpecs[t]"


KINDS = (
    # Pods at once: parallelism (always set: batch/v1 defaults it to 1), or completions when
    # fewer, as Kueue counts them (pkg/controller/jobs/job/job_controller.go podsCount).
    QueuedKind(
        "batch",
        "v1",
        "jobs",
        "Job",
        lambda r: (
            f"[[double(has({r}.spec.completions) && {r}.spec.completions < {r}.spec.parallelism"
            f" ? {r}.spec.completions : {r}.spec.parallelism), {gpus_of_pod(f'{r}.spec.template.spec')}]]"
        ),
        lambda r: f"[{r}.spec.template.spec]",
        lambda r: f"[{r}.spec.parallelism] + (has({r}.spec.completions) ? [{r}.spec.completions] : [])",
    ),
    # One pod set per replica type, `replicas` pods each, 1 when unset, as Kueue counts them
    # (pkg/controller/jobs/kubeflow/kubeflowjob/kubeflowjob_controller.go podsCount).
    QueuedKind(
        "kubeflow.org",
        "v1",
        "pytorchjobs",
        "PyTorchJob",
        lambda r: (
            f"{r}.spec.pytorchReplicaSpecs.map(t, [double(has({_replica(r)}.replicas) ? {_replica(r)}.replicas : 1), "
            f"{gpus_of_pod(f'{_replica(r)}.template.spec')}])"
        ),
        lambda r: f"{r}.spec.pytorchReplicaSpecs.map(t, {_replica(r)}.template.spec)",
        lambda r: f"{r}.spec.pytorchReplicaSpecs.map(t, has({_replica(r)}.replicas) ? {_replica(r)}.replicas : 1)",
    ),
    # A bare Pod that names a queue is one workload of one pod (the `pod` integration,
    # pkg/controller/jobs/pod/pod_controller.go); ephemeral containers arrive through their own
    # subresource, so it is matched too.
    QueuedKind(
        "",
        "v1",
        "pods",
        "Pod",
        lambda r: f"[[1.0, {gpus_of_pod(f'{r}.spec')}]]",
        lambda r: f"[{r}.spec]",
        lambda r: "[1]",
        ("pods/ephemeralcontainers",),
    ),
)
# Pods a Job or PyTorchJob controls: their owner was checked when it was created or changed, and
# Kueue counts them in the owner's workload, not as pods of their own (pkg/controller/jobframework
# IsOwnerManagedByKueue).
OWNER_KINDS = (("batch/v1", "Job"), ("kubeflow.org/v1", "PyTorchJob"))
POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"  # pkg/controller/constants/constants.go PodGroupLabel


@dataclass(frozen=True)
class Limits:
    """What the policies allow, as rendered: the longest run declared, in seconds, and the most
    GPUs one job may ask for."""

    max_seconds: int
    gpus: int

    @property
    def max_minutes(self) -> int:
        return self.max_seconds // 60


@dataclass
class AiRunLimitArgs:
    max_minutes: int  # aiJobMaxMinutes
    gpus: int  # the most GPUs Kueue admits AI work onto (the workers', or AI's share when it may not borrow)
    provider: k8s.Provider
    after: Sequence[pulumi.Resource]  # Kueue ready: its probe and queues first


def _has(labels: str, key: str) -> str:
    return f"has({labels}) && '{key}' in {labels}"


def _owned_by_a_queued_job(root: str) -> str:
    owners = " || ".join(f"(o.apiVersion == '{api}' && o.kind == '{kind}')" for api, kind in OWNER_KINDS)
    return (
        f"has({root}.metadata.ownerReferences) && "
        f"{root}.metadata.ownerReferences.exists(o, has(o.controller) && o.controller && ({owners}))"
    )


def match_conditions(kind: QueuedKind) -> list[dict]:
    """Which matched requests the rules see: in the jobs' namespace, anything of the kind that names
    a queue or asks for a GPU (unqueued GPU work would bypass Kueue and the limit), on CREATE, or
    on an UPDATE that queues it, changes its declared limit, or changes its pods or GPUs. Kueue's
    own writes (unsuspend, node selectors, eviction) and the Training Operator's change none of
    these, so no rule can ever refuse them, even for a job created before the policy existed.
    Every access is guarded: a condition that errors would refuse the request (failurePolicy Fail)."""
    new, old = "object.metadata.labels", "oldObject.metadata.labels"
    limit_new, limit_old = _has(new, MAX_EXEC_TIME_LABEL), _has(old, MAX_EXEC_TIME_LABEL)
    pods_only = [{"name": "not-a-job-pod", "expression": f"!({_owned_by_a_queued_job('object')})"}]
    return [
        *(pods_only if kind.kind == "Pod" else []),
        {
            "name": "queued-or-asks-for-gpus",
            "expression": f"({_has(new, QUEUE_NAME_LABEL)}) || {kind.pod_sets('object')}.exists(p, p[1] != 0.0)",
        },
        {
            "name": "submitted-or-changed",
            "expression": f"request.operation == 'CREATE' || ({_has(new, QUEUE_NAME_LABEL)}) != ({_has(old, QUEUE_NAME_LABEL)}) || "
            f"({limit_old}) != ({limit_new}) || "
            f"({limit_new} && {limit_old} && {new}['{MAX_EXEC_TIME_LABEL}'] != {old}['{MAX_EXEC_TIME_LABEL}']) || "
            f"{kind.pod_sets('object')} != {kind.pod_sets('oldObject')}",
        },
    ]


def variables(kind: QueuedKind, limits: Limits) -> list[dict]:
    labels = "object.metadata.labels"
    value = f"{labels}['{MAX_EXEC_TIME_LABEL}']"
    return [
        {"name": MAX_SECONDS_VARIABLE, "expression": str(limits.max_seconds)},
        {"name": WORKER_GPUS_VARIABLE, "expression": str(limits.gpus)},
        # The declared limit, or -1 when it is not digits (at most LIMIT_DIGITS of them)
        {
            "name": "declared",
            "expression": f"has({labels}) && '{MAX_EXEC_TIME_LABEL}' in {labels} && "
            f"{value}.matches('^0*[0-9]{{1,{LIMIT_DIGITS}}}$') ? int({value}) : -1",
        },
        {"name": "podSets", "expression": kind.pod_sets("object")},
    ]


def validations(kind: QueuedKind, limits: Limits) -> list[dict]:
    """One rule each; its message names what is wrong, the value, the limit and the setting."""
    key, labels = MAX_EXEC_TIME_LABEL, "object.metadata.labels"
    allowed = f"an integer from 1 to {limits.max_seconds} seconds (setting aiJobMaxMinutes {limits.max_minutes})"
    per_pod = "variables.podSets.map(p, p[1])"
    total = "variables.podSets.map(p, p[0] * p[1]).sum()"
    has_limit = f"has({labels}) && '{key}' in {labels}"
    rules = [
        {
            "expression": _has(labels, QUEUE_NAME_LABEL),
            "message": f"the {kind.kind} asks for {GPU_RESOURCE} and names no queue; in namespace {JOBS_NAMESPACE} "
            f"GPU work must carry label {QUEUE_NAME_LABEL}: {AI_LOCAL_QUEUE}, so Kueue counts it and its run limit applies",
        },
        {
            "expression": has_limit,
            "message": f"label {key} is missing; a queued AI job must declare its longest run: expected {allowed}",
        },
        {
            "expression": f"!({has_limit}) || "
            f"(variables.declared >= 1 && variables.declared <= variables.{MAX_SECONDS_VARIABLE})",
            "messageExpression": f"'label {key}: \"' + {labels}['{key}'] + '\" is not allowed; expected {allowed}'",
            "message": f"label {key} is not allowed; expected {allowed}",
        },
        {
            "expression": f"({kind.counts('object')}).all(n, n >= 0)",
            "message": f"a count of pods (parallelism, completions, replicas) is negative in the {kind.kind}; expected 0 or more",
        },
        {
            "expression": f"{kind.pod_specs('object')}.all(s, {gpu_counts_are_whole('s')})",
            "message": f"a container's {GPU_RESOURCE} is negative, not a whole number, or its request differs from its "
            "limit; expected a whole number of GPUs, the request (if any) equal to the limit",
        },
        {
            "expression": f"{per_pod}.all(g, g <= 1.0)",
            "messageExpression": f"'a pod asks for ' + string({per_pod}.max()) + ' {GPU_RESOURCE}; expected at most "
            "1: each GPU worker has one, so the pod could never be scheduled'",
            "message": f"a pod asks for more than one {GPU_RESOURCE}; expected at most 1: each GPU worker has one",
        },
        {
            "expression": f"{total} <= double(variables.{WORKER_GPUS_VARIABLE})",
            "messageExpression": f"'the job asks for ' + string({total}) + ' {GPU_RESOURCE} in all; expected at "
            f"most {limits.gpus} (the most AI may hold: workerCount, or the AI share if aiBorrowsHpcGpus is false): Kueue could never admit it'",
            "message": f"the job asks for more than {limits.gpus} {GPU_RESOURCE} in all; expected at most "
            f"{limits.gpus} (the most AI may hold: workerCount, or the AI share if aiBorrowsHpcGpus is false): Kueue could never admit it",
        },
    ]
    if kind.kind == "Pod":
        rules.append(
            {
                "expression": f"!({_has(labels, POD_GROUP_LABEL)})",
                "message": f"label {POD_GROUP_LABEL}: pod groups are not offered in namespace {JOBS_NAMESPACE} "
                "(the rules cannot count a group's pods); expected a Job or a PyTorchJob",
            }
        )
    return rules


def policy_name(kind: QueuedKind) -> str:
    return f"{POLICY_PREFIX}-{kind.resource}"


def policy(kind: QueuedKind, limits: Limits) -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": policy_name(kind)},
        "spec": {
            # The policy runs inside the API server: there is no outage to ride out, only an
            # expression that errors, and letting such a job through would lift the bound.
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [kind.group],
                        "apiVersions": [kind.version],
                        # not */status: controllers write status there
                        "resources": [kind.resource, *kind.subresources],
                        "operations": ["CREATE", "UPDATE"],
                    }
                ],
                # Every object of the kind in the namespace: the conditions pick the queued and the GPU ones
                "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: JOBS_NAMESPACE}},
            },
            "matchConditions": match_conditions(kind),
            "variables": variables(kind, limits),
            "validations": validations(kind, limits),
        },
    }


def binding(kind: QueuedKind) -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy_name(kind)},
        "spec": {"policyName": policy_name(kind), "validationActions": ["Deny"]},
    }


def objects(max_minutes: int, gpus: int) -> list[dict]:
    """Each policy, then its binding, as the component creates them."""
    limits = Limits(max_minutes * 60, gpus)
    return [obj for kind in KINDS for obj in (policy(kind, limits), binding(kind))]


def stack_objects(n: Names) -> list[dict]:
    """The objects a stack's program creates: the limit is aiJobMaxMinutes, the GPUs the most AI
    may hold (the doctor compares the cluster's with these)."""
    return objects(n.ai_job_max_minutes, n.shares.ai_max_gpus)


def limits(objs: Sequence[dict]) -> Limits:
    """What the rendered run-limit policies allow (other policies ignored), read from their
    variables; they must all agree."""
    found = set()
    for obj in objs:
        if obj["kind"] == "ValidatingAdmissionPolicy" and obj["metadata"]["name"].startswith(POLICY_PREFIX):
            by_name = {v["name"]: v["expression"] for v in obj["spec"]["variables"]}
            found.add(Limits(int(by_name[MAX_SECONDS_VARIABLE]), int(by_name[WORKER_GPUS_VARIABLE])))
    (only,) = found
    return only


def policy_lines(limits: Limits) -> list[str]:
    """The run limit in words, as `plan` prints it beside the Kueue policy."""
    return [
        f"  run limit: every queued AI job declares {MAX_EXEC_TIME_LABEL}, at most {limits.max_seconds} s "
        f"(aiJobMaxMinutes {limits.max_minutes}); Kueue stops it once admitted that long, so HPC waits at most "
        f"{limits.max_minutes} min for a GPU AI borrowed",
        f"  refused at submit ({POLICY_PREFIX}-*, Jobs, PyTorchJobs and bare Pods): GPU work naming no queue, no such "
        f"label or one above the limit, negative or fractional GPUs, a pod asking for more than 1 GPU (init and "
        f"sidecar containers counted), a job asking for more than {limits.gpus} GPUs (what AI may hold: workerCount, "
        "or the AI share if aiBorrowsHpcGpus is false); updates of pods or GPUs checked again",
    ]


class AiRunLimit(pulumi.ComponentResource):
    """The policies and their bindings. After Kueue: its gate probe, a queued PyTorchJob, is
    dry-run before any rule exists, and it declares a limit for every run after that."""

    def __init__(self, name: str, args: AiRunLimitArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:platform:AiRunLimit", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=list(args.after))
        limits = Limits(args.max_minutes * 60, args.gpus)
        for kind in KINDS:
            policy_and_binding(f"{name}-{kind.resource}", policy(kind, limits), binding(kind), child)
        self.register_outputs({"maxSeconds": args.max_minutes * 60})


def policy_and_binding(
    name: str, rule: dict, bound: dict, opts: pulumi.ResourceOptions
) -> k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding:
    """A ValidatingAdmissionPolicy and its binding, the binding created after the policy: one bound
    to a policy not there yet binds nothing. The binding, for what must come after both."""
    created = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
        name, metadata=rule["metadata"], spec=rule["spec"], opts=opts
    )
    return k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
        f"{name}-binding",
        metadata=bound["metadata"],
        spec=bound["spec"],
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[created])),
    )

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

So one ValidatingAdmissionPolicy per queued kind (batch/v1 Job, kubeflow.org/v1 PyTorchJob), each
bound with validationActions [Deny], refuses in the AI jobs' namespace a queued job that declares
no limit or one above the setting, or that could never run: a pod asking for more than one GPU
(each worker has one) or more GPUs in all than the workers have (Kueue would never admit it).
One policy per kind keeps every expression typed against one schema and every rule one line.

The limits are CEL literals in each policy's `variables`, written from the settings here, so a
changed setting changes the policies; `limits` reads them back for `plan` and the twin.
Field names and semantics: kubernetes/kubernetes@v1.34.0 staging/src/k8s.io/api/
admissionregistration/v1/types.go; the CEL libraries a v1.34 policy may use (lists `sum`/`max`,
`quantity`, regex `matches`): staging/src/k8s.io/apiserver/pkg/cel/environment/base.go.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from core.names import (
    GPU_RESOURCE,
    JOBS_NAMESPACE,
    MAX_EXEC_TIME_LABEL,
    NAMESPACE_NAME_LABEL,
    QUEUE_NAME_LABEL,
    Names,
)

API_VERSION = "admissionregistration.k8s.io/v1"
POLICY_PREFIX = "testbed-ai-run-limit"
MAX_SECONDS_VARIABLE = "maxSeconds"
WORKER_GPUS_VARIABLE = "workerGpus"
# Kueue reads the label as a 32-bit integer and ignores it above (utils.go strconv.ParseInt(v, 10,
# 32)); the policy takes at most this many significant digits, so CEL's int() never overflows and
# every value it accepts is one Kueue keeps. aiJobMaxMinutes' top, a week, is 604800 s: 6 digits.
LIMIT_DIGITS = 7


@dataclass(frozen=True)
class QueuedKind:
    """A job kind Kueue queues, and its pod templates as CEL: `pod_sets` is a list of
    [pods at once, GPUs per pod] pairs, as doubles."""

    group: str
    version: str
    resource: str
    kind: str
    pod_sets: str


def _gpus_of_pod(pod_spec: str) -> str:
    """The GPUs one pod asks for: the sum of its containers' nvidia.com/gpu limits. An extended
    resource must have a limit, and a request equals it (kubernetes@v1.34.0 pkg/apis/core/
    validation ValidateResourceRequirements), so limits count every GPU. The value is a
    quantity: a string in a built-in object, an integer or a string (x-kubernetes-int-or-string)
    in a custom resource; string() takes both, and quantity() parses what the schemas accepted.
    Init containers are not counted (a GPU there is outside the examples and these rules)."""
    gpu = f"c.resources.limits['{GPU_RESOURCE}']"
    return (
        f"{pod_spec}.containers.map(c, has(c.resources) && has(c.resources.limits) && "
        f"'{GPU_RESOURCE}' in c.resources.limits ? quantity(string({gpu})).asApproximateFloat() : 0.0).sum()"
    )


_REPLICA = "object.spec.pytorchReplicaSpecs[t]"
KINDS = (
    # Pods at once: parallelism (always set: batch/v1 defaults it to 1), or completions when
    # fewer, as Kueue counts them (pkg/controller/jobs/job/job_controller.go podsCount).
    QueuedKind(
        "batch",
        "v1",
        "jobs",
        "Job",
        "[[double(has(object.spec.completions) && object.spec.completions < object.spec.parallelism"
        f" ? object.spec.completions : object.spec.parallelism), {_gpus_of_pod('object.spec.template.spec')}]]",
    ),
    # One pod set per replica type, `replicas` pods each, 1 when unset, as Kueue counts them
    # (pkg/controller/jobs/kubeflow/kubeflowjob/kubeflowjob_controller.go podsCount).
    QueuedKind(
        "kubeflow.org",
        "v1",
        "pytorchjobs",
        "PyTorchJob",
        f"object.spec.pytorchReplicaSpecs.map(t, [double(has({_REPLICA}.replicas) ? {_REPLICA}.replicas : 1), "
        f"{_gpus_of_pod(f'{_REPLICA}.template.spec')}])",
    ),
)


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


def match_conditions() -> list[dict]:
    """Which matched requests the rules see: a job that names a queue, on CREATE, or on an
    UPDATE that makes it queued or changes its declared limit. Kueue's own writes (unsuspend,
    node selectors, eviction) and the Training Operator's never touch those labels, so no rule
    can ever refuse them, even for a job created before the policy existed. Every access is
    guarded: a condition that errors would refuse the request (failurePolicy Fail)."""
    new, old = "object.metadata.labels", "oldObject.metadata.labels"
    limit_new, limit_old = f"'{MAX_EXEC_TIME_LABEL}' in {new}", f"'{MAX_EXEC_TIME_LABEL}' in {old}"
    return [
        # The objectSelector matches an UPDATE if the old or the new object has the label.
        {"name": "queued", "expression": _has(new, QUEUE_NAME_LABEL)},
        {
            "name": "submitted-or-relimited",
            "expression": f"request.operation == 'CREATE' || !({_has(old, QUEUE_NAME_LABEL)}) || "
            f"({limit_old}) != ({limit_new}) || "
            f"({limit_new} && {new}['{MAX_EXEC_TIME_LABEL}'] != {old}['{MAX_EXEC_TIME_LABEL}'])",
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
            "expression": f"'{MAX_EXEC_TIME_LABEL}' in {labels} && {value}.matches('^0*[0-9]{{1,{LIMIT_DIGITS}}}$')"
            f" ? int({value}) : -1",
        },
        {"name": "podSets", "expression": kind.pod_sets},
    ]


def validations(limits: Limits) -> list[dict]:
    """One rule each; its message names what is wrong, the value, the limit and the setting."""
    key, labels = MAX_EXEC_TIME_LABEL, "object.metadata.labels"
    allowed = f"an integer from 1 to {limits.max_seconds} seconds (setting aiJobMaxMinutes {limits.max_minutes})"
    per_pod = "variables.podSets.map(p, p[1])"
    total = "variables.podSets.map(p, p[0] * p[1]).sum()"
    return [
        {
            "expression": f"'{key}' in {labels}",
            "message": f"label {key} is missing; a queued AI job must declare its longest run: expected {allowed}",
        },
        {
            "expression": f"!('{key}' in {labels}) || "
            f"(variables.declared >= 1 && variables.declared <= variables.{MAX_SECONDS_VARIABLE})",
            "messageExpression": f"'label {key}: \"' + {labels}['{key}'] + '\" is not allowed; expected {allowed}'",
            "message": f"label {key} is not allowed; expected {allowed}",
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
                        "resources": [kind.resource],  # not jobs/status: controllers write status there
                        "operations": ["CREATE", "UPDATE"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: JOBS_NAMESPACE}},
                "objectSelector": {"matchExpressions": [{"key": QUEUE_NAME_LABEL, "operator": "Exists"}]},
            },
            "matchConditions": match_conditions(),
            "variables": variables(kind, limits),
            "validations": validations(limits),
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
    """What the rendered policies allow, read from their variables; they must all agree."""
    found = set()
    for obj in objs:
        if obj["kind"] == "ValidatingAdmissionPolicy":
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
        f"  refused at submit ({POLICY_PREFIX}-*): no such label or one above the limit, a pod asking for more "
        f"than 1 GPU, a job asking for more than {limits.gpus} GPUs (what AI may hold: workerCount, or the AI share if aiBorrowsHpcGpus is false)",
    ]


class AiRunLimit(pulumi.ComponentResource):
    """The policies and their bindings. After Kueue: its gate probe, a queued PyTorchJob, is
    dry-run before any rule exists, and it declares a limit for every run after that."""

    def __init__(self, name: str, args: AiRunLimitArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:platform:AiRunLimit", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=list(args.after))
        limits = Limits(args.max_minutes * 60, args.gpus)
        for kind in KINDS:
            rule, bound = policy(kind, limits), binding(kind)
            created = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
                f"{name}-{kind.resource}", metadata=rule["metadata"], spec=rule["spec"], opts=child
            )
            # A binding to a policy not there yet binds nothing; created after it all the same.
            k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
                f"{name}-{kind.resource}-binding",
                metadata=bound["metadata"],
                spec=bound["spec"],
                opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[created])),
            )
        self.register_outputs({"maxSeconds": args.max_minutes * 60})

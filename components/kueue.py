"""Kueue: the one admission point for GPU work on both sides, and the HPC/AI split of the GPUs.

PyTorchJobs and batch Jobs labelled with the AI LocalQueue are admitted whole or not at all
against the AI ClusterQueue's GPU quota; every slurmd pod is its own 1-GPU workload in the HPC
ClusterQueue (the `pod` integration; the NodeSet's pod labels name the queue), so Kueue's quota
counts the GPUs Slurm holds and admission is exact. The two ClusterQueues share one cohort: each
side's nominalQuota is its share, lent to the other only when the policy says so. No queue may
preempt a slurmd pod (Kueue preempts by deleting the pod, which kills the Slurm job):
`hpc_preemption_problems` refuses any configuration that would allow it. Kueue's two pod
webhooks are narrowed to pods that carry the queue label, so a Kueue outage never blocks
slurmctld, slurmrestd or any other pod.

Evidence (kubernetes-sigs/kueue@v0.19.2): charts/kueue/values.yaml, templates/manager/
manager-config.yaml, templates/webhook/manifests.yaml; apis/config/v1beta2/configuration_types.go
and defaults.go; apis/kueue/v1beta2/{clusterqueue,localqueue,resourceflavor,cohort,
workloadpriorityclass}_types.go.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_command as command
import pulumi_kubernetes as k8s

from components import helm, remote_script, training_operator
from components.webhook_gate import webhook_gate
from core import host_layout, trusted_yaml
from core.names import (
    AI_CLUSTER_QUEUE,
    AI_LOCAL_QUEUE,
    AI_PRIORITY_CLASSES,
    GPU_COHORT,
    GPU_FLAVOR,
    GPU_RESOURCE,
    HPC_CLUSTER_QUEUE,
    HPC_LOCAL_QUEUE,
    HPC_PRIORITY_CLASS,
    JOBS_NAMESPACE,
    KUEUE_GROUP_VERSION,
    KUEUE_NAMESPACE,
    KUEUE_POD_WEBHOOKS,
    KUEUE_RELEASE,
    MAX_EXEC_TIME_LABEL,
    NAMESPACE_NAME_LABEL,
    QUEUE_NAME_LABEL,
    SLURM_NAMESPACE,
    GpuShares,
    kueue_webhook_configuration,
)
from core.settings import SettingsError

CHART = "oci://registry.k8s.io/kueue/charts/kueue"
# `pod` manages the slurmd pods. Not `deployment` or `statefulset` (the chart's default list has
# them): their webhooks would then fail closed for slurmrestd's Deployment and slurmctld's
# StatefulSet in namespace slurm (manifests.yaml: failurePolicy Fail only when enabled).
FRAMEWORKS = ("batch/job", "kubeflow.org/pytorchjob", "pod")
# What the two pod webhooks act on once patched: only pods that name a queue. Without it their
# only scope is managedJobsNamespaceSelector, and with `pod` on they fail closed (manifests.yaml)
# for every pod in namespace slurm, slurmctld's too. The API server matches an UPDATE if the old
# or the new object matches (kubernetes/kubernetes@v1.34.0: staging/src/k8s.io/apiserver/pkg/
# admission/plugin/webhook/predicates/object/matcher.go).
POD_WEBHOOK_OBJECT_SELECTOR = {"matchExpressions": [{"key": QUEUE_NAME_LABEL, "operator": "Exists"}]}
# waitForPodsReady is on in 0.19 whatever the config says (defaults.go; only the deprecated
# alpha gate DisableWaitForPodsReady turns it off). With images pre-pulled on every worker an
# admitted workload whose pods are not all Ready after this long is stuck: evicting it gives
# back what it holds and requeues it (60 s backoff, doubling). A PyTorchJob counts as ready once
# its Master runs (JobRunning); a slurmd pod once it is Ready, so the timeout only ever evicts a
# slurmd pod that never became Ready, which runs no Slurm job.
PODS_READY_TIMEOUT = "10m"
# "0s" turns the recovery check off (configuration_types.go RecoveryTimeout): Kueue never evicts
# running work because one of its pods went unready, so a slurmd pod whose readiness flaps keeps
# its Slurm job; the jobs' own restart policies decide instead.
PODS_READY_RECOVERY_TIMEOUT = "0s"
# Only the GPUs are contended: CPU and memory stay the scheduler's business (Beta, on in 0.19).
QUOTA_CHECK_STRATEGY = "IgnoreUndeclared"
# The slurmd pods' priority equals ai-normal's: between the two sides, Kueue orders by "within
# nominal quota first", then priority, then age (pkg/scheduler/scheduler.go classicalIterator),
# so neither side jumps the other's share. Priority only ever evicts within `ai`.
PRIORITY_VALUES = {**dict(zip(AI_PRIORITY_CLASSES, (100, 1000), strict=True)), HPC_PRIORITY_CLASS: 100}
NEVER = "Never"


@dataclass
class KueueArgs:
    version: str
    shares: GpuShares
    provider: k8s.Provider
    control_connection: command.remote.ConnectionArgs
    # The Training Operator: the pytorchjob integration starts at once only if its CRD exists.
    after: Sequence[pulumi.Resource]


def chart(version: str) -> helm.Chart:
    return helm.Chart(KUEUE_RELEASE, KUEUE_NAMESPACE, CHART, version)


def managed_namespaces() -> tuple[str, ...]:
    """Where Kueue's webhooks (failurePolicy Fail) act: where AI users submit and where the slurmd
    pods are created, so a Kueue outage never blocks system pods or Helm hook Jobs elsewhere.
    The slurm chart 1.0.0 creates no Job (SlinkyProject/slurm-operator@v1.0.0:helm/slurm/
    templates), and the pod webhooks are narrowed to labelled pods (`pod_webhook_patches`)."""
    return (JOBS_NAMESPACE, SLURM_NAMESPACE)


def manager_config(version: str) -> dict:
    """Kueue's Configuration: the chart's, with the program's changes (a copy of its own for each caller)."""
    return copy.deepcopy(_manager_config(version))


@functools.cache
def _manager_config(version: str) -> dict:
    # built once per version: the program, its checks and the twin ask for it on every run
    base = trusted_yaml.load(helm.base_values(chart(version))["managerConfig"]["controllerManagerConfigYaml"])
    derived = {
        "managedJobsNamespaceSelector": {
            "matchExpressions": [{"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": list(managed_namespaces())}]
        },
        "manageJobsWithoutQueueName": False,  # unlabelled Jobs in the namespace run as before
        "integrations": {"frameworks": list(FRAMEWORKS)},
        "waitForPodsReady": {
            "timeout": PODS_READY_TIMEOUT,
            "recoveryTimeout": PODS_READY_RECOVERY_TIMEOUT,
            "blockAdmission": False,  # one stuck gang must not hold every other admission
        },
        "resources": {"quotaCheckStrategy": QUOTA_CHECK_STRATEGY},
        # kueue_cluster_queue_resource_pending, which the slurmd scaler reads, is reported only
        # with this on (kubernetes-sigs/kueue@v0.19.2:pkg/cache/queue/metrics.go, cmd/kueue/main.go).
        "metrics": {"enableClusterQueueResources": True},
    }
    return helm.deep_merge(base, derived)


def values(version: str) -> dict:
    """The release's values: the chart's, with the image tag and `manager_config` (a copy of its own for each caller)."""
    return copy.deepcopy(_values(version))


@functools.cache
def _values(version: str) -> dict:
    base = helm.base_values(chart(version))
    computed = {
        "controllerManager": {"manager": {"image": {"tag": f"v{version}"}}},
        "managerConfig": {"controllerManagerConfigYaml": trusted_yaml.dump(manager_config(version), sort_keys=False)},
    }
    return helm.deep_merge(base, computed)


def _object(kind: str, name: str, spec: dict | None = None, namespace: str | None = None, **top) -> dict:
    metadata = {"name": name} | ({"namespace": namespace} if namespace else {})
    return {
        "apiVersion": KUEUE_GROUP_VERSION,
        "kind": kind,
        "metadata": metadata,
        **({"spec": spec} if spec else {}),
        **top,
    }


def _gpu_quota(nominal: int, **limits: int) -> dict:
    return {
        "coveredResources": [GPU_RESOURCE],
        "flavors": [{"name": GPU_FLAVOR, "resources": [{"name": GPU_RESOURCE, "nominalQuota": nominal, **limits}]}],
    }


def cluster_queues(shares: GpuShares) -> list[dict]:
    """HPC's share (the slurmd pods) and AI's in one cohort. Each lends its share to the other
    only if the policy allows (lendingLimit 0 otherwise). No queue reclaims or preempts across
    the cohort, and nothing preempts within `hpc`: Kueue preempts by deleting the pod."""
    never = {"reclaimWithinCohort": NEVER, "borrowWithinCohort": {"policy": NEVER}, "withinClusterQueue": NEVER}
    hpc = _object(
        "ClusterQueue",
        HPC_CLUSTER_QUEUE,
        {
            "cohortName": GPU_COHORT,
            "resourceGroups": [
                _gpu_quota(shares.hpc_gpus, lendingLimit=shares.hpc_gpus if shares.ai_borrows_hpc_gpus else 0)
            ],
            # One 1-GPU workload per slurmd pod: StrictFIFO admits them in the order the NodeSet
            # created them, and a 1-GPU head never blocks a smaller one.
            "queueingStrategy": "StrictFIFO",
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: SLURM_NAMESPACE}},
            "preemption": copy.deepcopy(never),
        },
    )
    ai = _object(
        "ClusterQueue",
        AI_CLUSTER_QUEUE,
        {
            "cohortName": GPU_COHORT,
            "resourceGroups": [
                _gpu_quota(
                    shares.ai_guaranteed_gpus,
                    lendingLimit=shares.ai_guaranteed_gpus if shares.hpc_borrows_ai_gpus else 0,
                )
            ],
            # StrictFIFO: a job that does not fit stays at the head (pkg/cache/queue/cluster_queue.go
            # RequeueIfNotPresent), so GPUs freed on AI's side are held for it instead of going to
            # later, smaller jobs, and slurmd's rule reserves the rest for it (slurmd_scaling
            # RESERVE_AFTER_SECONDS): a gang that fits the testbed waits a bounded time. A job that
            # could never fit would stop the queue; the AI run-limit policy refuses those at submit.
            # Priority orders the queue first: ai-high goes before ai-normal.
            "queueingStrategy": "StrictFIFO",
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: JOBS_NAMESPACE}},
            # AI never takes back what it lent, nor preempts to borrow; only a higher-priority AI
            # workload may evict a lower one, within `ai`, and only if the policy says so.
            "preemption": never
            | {"withinClusterQueue": "LowerPriority" if shares.ai_preempts_lower_priority else NEVER},
        },
    )
    return [hpc, ai]


def hpc_preemption_problems(queues: Sequence[dict], manager: dict) -> list[str]:
    """Every field of the rendered ClusterQueues (and the manager configuration) that would let
    Kueue preempt a slurmd pod, one line each; empty when none can be. A preempted slurmd pod is
    deleted with its Slurm job (pkg/controller/jobs/pod/pod_controller.go Stop), and there is no
    per-workload flag against it: a workload is preempted only by another workload of its own
    ClusterQueue (withinClusterQueue) or of its cohort (reclaimWithinCohort, borrowWithinCohort),
    or by fair sharing (apis/kueue/v1beta2/clusterqueue_types.go ClusterQueuePreemption; the
    kubebuilder defaults are Never)."""
    problems = []
    by_name = {q["metadata"]["name"]: q for q in queues}
    hpc = by_name.get(HPC_CLUSTER_QUEUE)
    if hpc is None:
        return [f"ClusterQueue {HPC_CLUSTER_QUEUE}: missing; the slurmd pods need it"]
    cohort = hpc["spec"].get("cohortName")
    for name, q in sorted(by_name.items()):
        preemption = q["spec"].get("preemption", {})
        fields = (
            [("withinClusterQueue", preemption.get("withinClusterQueue", NEVER))] if name == HPC_CLUSTER_QUEUE else []
        )
        if cohort is not None and q["spec"].get("cohortName") == cohort:
            fields += [
                ("reclaimWithinCohort", preemption.get("reclaimWithinCohort", NEVER)),
                ("borrowWithinCohort.policy", preemption.get("borrowWithinCohort", {}).get("policy", NEVER)),
            ]
        problems += [
            f"ClusterQueue {name}: preemption.{field} {value!r} is not allowed; expected {NEVER!r}: it would let "
            "Kueue preempt a slurmd pod, which deletes the pod and kills its Slurm job"
            for field, value in fields
            if value != NEVER
        ]
    if manager.get("fairSharing", {}).get("enable"):
        problems.append(
            "Kueue configuration: fairSharing.enable true is not allowed; expected false: fair sharing "
            "preempts across the cohort by share, slurmd pods included"
        )
    return problems


def objects(shares: GpuShares) -> list[dict]:
    """Every Kueue object the program creates, in the order they may be created."""
    gpu_key, gpu_value = host_layout.GPU_NODE_LABEL
    flavor = _object("ResourceFlavor", GPU_FLAVOR, {"nodeLabels": {gpu_key: gpu_value}})
    priorities = [
        _object("WorkloadPriorityClass", name, value=value, description=_PRIORITY_DESCRIPTIONS[name])
        for name, value in PRIORITY_VALUES.items()
    ]
    locals_ = [
        _object("LocalQueue", AI_LOCAL_QUEUE, {"clusterQueue": AI_CLUSTER_QUEUE}, namespace=JOBS_NAMESPACE),
        _object("LocalQueue", HPC_LOCAL_QUEUE, {"clusterQueue": HPC_CLUSTER_QUEUE}, namespace=SLURM_NAMESPACE),
    ]
    return [flavor, *priorities, *cluster_queues(shares), *locals_]


_PRIORITY_DESCRIPTIONS = {
    "ai-normal": "AI work, normal priority",
    "ai-high": "AI work, high priority",
    HPC_PRIORITY_CLASS: "slurmd pods (HPC); never preempted: components/kueue.py hpc_preemption_problems",
}


def pod_webhook_patches() -> list[dict]:
    """The server-side-apply patches that narrow the chart's two pod webhooks to labelled pods.
    `webhooks` is a map list keyed by name (k8s.io/api admissionregistration/v1 types.go
    +listType=map +listMapKey=name), so the patch owns this one field of one entry; Kueue's
    certificate rotation rewrites only each webhook's clientConfig.caBundle on the object it
    read (open-policy-agent/cert-controller@v0.16.0: pkg/rotator/rotator.go injectCertToWebhook),
    and a Helm upgrade's three-way merge leaves a field that neither manifest sets."""
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": f"{kind.capitalize()}WebhookConfiguration",
            "metadata": {"name": kueue_webhook_configuration(kind)},
            "webhooks": [{"name": webhook, "objectSelector": copy.deepcopy(POD_WEBHOOK_OBJECT_SELECTOR)}],
        }
        for kind, webhook in KUEUE_POD_WEBHOOKS.items()
    ]


def pod_webhook_scope_steps(triggers: Sequence[pulumi.Input] = ()) -> dict[str, remote_script.RemoteStep]:
    """Per webhook configuration: passes once the API server serves its pod webhook with the
    objectSelector, read back from the live object (`kubectl wait --for=jsonpath`)."""
    key = POD_WEBHOOK_OBJECT_SELECTOR["matchExpressions"][0]["key"]
    steps = {}
    for patch in pod_webhook_patches():
        webhook = patch["webhooks"][0]["name"]
        path = f'{{.webhooks[?(@.name=="{webhook}")].objectSelector.matchExpressions[0].key}}'
        args = {
            "TIMEOUT_SECONDS": "300",
            "RESOURCE": f"{patch['kind'].lower()}/{patch['metadata']['name']}",
            "CONDITION": f"jsonpath={path}={key}",
        }
        steps[webhook] = remote_script.RemoteStep("wait-condition.sh", args, triggers=triggers)
    return steps


def references(obj: dict) -> list[tuple[str, str]]:
    """The (kind, name) of the Kueue objects `obj` names, which must exist before it."""
    spec = obj.get("spec", {})
    if obj["kind"] == "ClusterQueue":
        return sorted({("ResourceFlavor", f["name"]) for g in spec["resourceGroups"] for f in g["flavors"]})
    if obj["kind"] == "LocalQueue":
        return [("ClusterQueue", spec["clusterQueue"])]
    return []


def webhook_probe() -> dict:
    """A queued PyTorchJob: admitted only once Kueue's pytorchjob webhooks serve (and the
    Training Operator's); only ever dry-run. It declares the shortest run limit, which every
    aiJobMaxMinutes allows: the gate runs again on a Kueue upgrade, when the run-limit policies
    (components/ai_run_limit.py) refuse a queued job without one."""
    probe = copy.deepcopy(training_operator.webhook_probe())
    probe["metadata"]["name"] = "testbed-kueue-probe"
    probe["metadata"]["labels"] = {QUEUE_NAME_LABEL: AI_LOCAL_QUEUE, MAX_EXEC_TIME_LABEL: "1"}
    return probe


def workload_probe() -> dict:
    """The smallest Workload in AI's LocalQueue: Kueue's workload webhooks default and validate
    it (pkg/webhooks/workload_webhook.go); the doctor only ever dry-runs it."""
    container = {"name": "probe", "image": training_operator.PROBE_IMAGE}
    return _object(
        "Workload",
        "testbed-doctor-probe",
        {
            "queueName": AI_LOCAL_QUEUE,
            "podSets": [{"name": "main", "count": 1, "template": {"spec": {"containers": [container]}}}],
        },
        namespace=JOBS_NAMESPACE,
    )


def policy_lines(shares: GpuShares) -> list[str]:
    """The fairness policy in words, as `plan` prints it."""
    lent = {True: "lends its idle share", False: "never lends its share"}
    return [
        f"GPUs: {shares.gpus_total} (cohort {GPU_COHORT}; every slurmd pod and every queued AI job is a Kueue workload)",
        f"  HPC (slurmd pods, LocalQueue {SLURM_NAMESPACE}/{HPC_LOCAL_QUEUE}): {shares.hpc_gpus} guaranteed, "
        f"up to {shares.hpc_max_gpus} at once; {lent[shares.ai_borrows_hpc_gpus]} to AI",
        f"  AI (LocalQueue {JOBS_NAMESPACE}/{AI_LOCAL_QUEUE}): {shares.ai_guaranteed_gpus} guaranteed, "
        f"up to {shares.ai_max_gpus} admitted at once; {lent[shares.hpc_borrows_ai_gpus]} to HPC",
        "  a borrowed GPU comes back when the work on it ends: a slurmd pod is never preempted",
        "  preemption: none across the cohort, none of slurmd pods; within AI "
        + ("higher priority evicts lower" if shares.ai_preempts_lower_priority else "none"),
        "  priorities: " + ", ".join(f"{n}={v}" for n, v in PRIORITY_VALUES.items()),
    ]


def refuse_hpc_preemption(shares: GpuShares, version: str) -> None:
    """Refuse, before anything is created, a configuration that would let Kueue preempt a slurmd pod."""
    problems = hpc_preemption_problems(cluster_queues(shares), manager_config(version))
    if problems:
        raise SettingsError(problems)


class KubernetesObject(pulumi.CustomResource):
    """A custom resource registered whole: pulumi-kubernetes' Python CustomResource takes only
    `spec`, and a WorkloadPriorityClass keeps `value` and `description` at the top level. The
    type token is the one CustomResource registers (`kubernetes:<apiVersion>:<kind>`)."""

    def __init__(self, name: str, obj: dict, opts: pulumi.ResourceOptions):
        super().__init__(f"kubernetes:{obj['apiVersion']}:{obj['kind']}", name, copy.deepcopy(obj), opts)


class Kueue(pulumi.ComponentResource):
    """Kueue, its pod webhooks narrowed, its gate, then the queues. The slurm chart waits for
    `ready` (platform.py): no slurmd pod is created before the narrowed webhooks and the LocalQueue
    `hpc` exist, so none slips past Kueue or waits on a queue that is not there."""

    def __init__(self, name: str, args: KueueArgs, opts: pulumi.ResourceOptions | None = None):
        refuse_hpc_preemption(args.shares, args.version)
        super().__init__("testbed:platform:Kueue", name, None, opts)
        self.release = helm.release(
            f"{name}-release",
            chart(args.version),
            values(args.version),
            args.provider,
            parent=self,
            depends_on=args.after,
        )
        child = pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=[self.release])
        patches = [
            cls(
                f"{name}-{patch['webhooks'][0]['name']}-scope",
                metadata=patch["metadata"],
                webhooks=patch["webhooks"],
                opts=child,
            )
            for patch in pod_webhook_patches()
            for cls in [
                k8s.admissionregistration.v1.MutatingWebhookConfigurationPatch
                if patch["kind"] == "MutatingWebhookConfiguration"
                else k8s.admissionregistration.v1.ValidatingWebhookConfigurationPatch
            ]
        ]
        scopes = [
            remote_script.run(f"{name}-{webhook}-scope-check", step, args.control_connection, self, patches)
            for webhook, step in pod_webhook_scope_steps(helm.upgrade_triggers(self.release)).items()
        ]
        # Kueue's job webhooks fail closed: nothing queued is created before they serve.
        self.webhook_gate = webhook_gate(
            f"{name}-webhook-gate", webhook_probe(), None, args.control_connection, parent=self, release=self.release
        )
        # The LocalQueue of the slurmd pods needs namespace slurm before the slurm chart exists
        # (it installs after Kueue: platform.py); the chart's create_namespace then finds it.
        self.slurm_namespace = k8s.core.v1.Namespace(
            f"{name}-slurm-namespace",
            metadata={"name": SLURM_NAMESPACE},
            opts=pulumi.ResourceOptions(parent=self, provider=args.provider),
        )
        created: dict[tuple[str, str], KubernetesObject] = {}
        for obj in objects(args.shares):
            kind, obj_name = obj["kind"], obj["metadata"]["name"]
            namespaced = [self.slurm_namespace] if obj["metadata"].get("namespace") == SLURM_NAMESPACE else []
            created[kind, obj_name] = KubernetesObject(
                f"{name}-{kind.lower()}-{obj_name}",
                obj,
                pulumi.ResourceOptions(
                    parent=self,
                    provider=args.provider,
                    depends_on=[
                        self.webhook_gate,
                        *namespaced,
                        *(created[ref] for ref in references(obj)),
                    ],
                ),
            )
        self.ready: list[pulumi.Resource] = [self.webhook_gate, *scopes, *created.values()]
        self.register_outputs(
            {"localQueue": f"{JOBS_NAMESPACE}/{AI_LOCAL_QUEUE}", "slurmdQueue": f"{SLURM_NAMESPACE}/{HPC_LOCAL_QUEUE}"}
        )

"""Kueue: the one admission point for Kubernetes GPU work, and the HPC/AI split of the GPUs.

PyTorchJobs and batch Jobs labelled with the AI LocalQueue are admitted whole or not at all
against the AI ClusterQueue's GPU quota; the two ClusterQueues share one cohort, so the AI side
borrows HPC's share only when the policy says so. slurmd stays outside Kueue (README, "Kueue":
the `pod` integration's webhook would fail closed for slurmctld's own pods), so the split
between the two sides is carried by Kueue's quota here and by KEDA's replica cap
(`Names.slurmd_max_replicas`).

Evidence (kubernetes-sigs/kueue@v0.19.2): charts/kueue/values.yaml, templates/manager/
manager-config.yaml, templates/webhook/manifests.yaml; apis/config/v1beta2/configuration_types.go
and defaults.go; apis/kueue/v1beta2/{clusterqueue,localqueue,resourceflavor,cohort,
workloadpriorityclass}_types.go.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_command as command
import pulumi_kubernetes as k8s
import yaml

from components import helm, host_layout, training_operator
from components.names import (
    AI_CLUSTER_QUEUE,
    AI_LOCAL_QUEUE,
    AI_PRIORITY_CLASSES,
    GPU_COHORT,
    GPU_FLAVOR,
    GPU_RESOURCE,
    HPC_CLUSTER_QUEUE,
    JOBS_NAMESPACE,
    KUEUE_GROUP_VERSION,
    KUEUE_NAMESPACE,
    KUEUE_RELEASE,
    QUEUE_NAME_LABEL,
    GpuShares,
)
from components.webhook_gate import webhook_gate

CHART = "oci://registry.k8s.io/kueue/charts/kueue"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace
# Only these: the chart's default list also turns on `pod`, `deployment` and `statefulset`,
# whose webhooks then fail closed for every pod in a managed namespace (manifests.yaml).
FRAMEWORKS = ("batch/job", "kubeflow.org/pytorchjob")
# waitForPodsReady is on in 0.19 whatever the config says (defaults.go; only the deprecated
# alpha gate DisableWaitForPodsReady turns it off). With images pre-pulled on every worker an
# admitted workload whose pods are not all Ready after this long is stuck behind GPUs Kueue
# cannot see (slurmd's): evicting it gives back what it holds and requeues it (60 s backoff,
# doubling). A PyTorchJob counts as ready once its Master runs (JobRunning).
PODS_READY_TIMEOUT = "10m"
# "0s" turns the recovery check off (configuration_types.go): Kueue never evicts running work
# because one of its pods went unready; the jobs' own restart policies decide instead.
PODS_READY_RECOVERY_TIMEOUT = "0s"
# Only the GPUs are contended: CPU and memory stay the scheduler's business (Beta, on in 0.19).
QUOTA_CHECK_STRATEGY = "IgnoreUndeclared"
PRIORITY_VALUES = dict(zip(AI_PRIORITY_CLASSES, (100, 1000), strict=True))


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
    """Where Kueue's job webhooks (failurePolicy Fail) act: only where AI users submit, so a
    Kueue outage never blocks system pods, Slurm's pods or Helm hook Jobs elsewhere."""
    return (JOBS_NAMESPACE,)


def manager_config(version: str) -> dict:
    base = yaml.safe_load(helm.base_values(chart(version))["managerConfig"]["controllerManagerConfigYaml"])
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
    base = helm.base_values(chart(version))
    computed = {
        "controllerManager": {"manager": {"image": {"tag": f"v{version}"}}},
        "managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(manager_config(version), sort_keys=False)},
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
    """HPC's share and AI's in one cohort. The HPC queue admits nothing (slurmd is outside
    Kueue): it holds HPC's share in the cohort, lent to AI only when the policy allows."""
    never = {"reclaimWithinCohort": "Never", "borrowWithinCohort": {"policy": "Never"}, "withinClusterQueue": "Never"}
    hpc = _object(
        "ClusterQueue",
        HPC_CLUSTER_QUEUE,
        {
            "cohortName": GPU_COHORT,
            "resourceGroups": [
                _gpu_quota(shares.hpc_gpus, lendingLimit=shares.hpc_gpus if shares.ai_borrows_hpc_gpus else 0)
            ],
            "preemption": never,
            # No namespaceSelector: a null selector admits from no namespace (clusterqueue_types.go).
        },
    )
    ai = _object(
        "ClusterQueue",
        AI_CLUSTER_QUEUE,
        {
            "cohortName": GPU_COHORT,
            "resourceGroups": [_gpu_quota(shares.ai_guaranteed_gpus)],
            # Not StrictFIFO: there every workload that does not fit goes straight back to the head
            # (pkg/cache/queue/cluster_queue.go RequeueIfNotPresent), so one job larger than the
            # AI side can ever get would stop the whole queue. Priority orders it either way.
            "queueingStrategy": "BestEffortFIFO",
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: JOBS_NAMESPACE}},
            # Kueue preempts by deleting: AI never takes back what it lent or borrowed; only a
            # higher-priority AI workload may evict a lower one, and only if the policy says so.
            "preemption": never
            | {"withinClusterQueue": "LowerPriority" if shares.ai_preempts_lower_priority else "Never"},
        },
    )
    return [hpc, ai]


def objects(shares: GpuShares) -> list[dict]:
    """Every Kueue object the program creates, in the order they may be created."""
    gpu_key, gpu_value = host_layout.GPU_NODE_LABEL
    flavor = _object("ResourceFlavor", GPU_FLAVOR, {"nodeLabels": {gpu_key: gpu_value}})
    priorities = [
        _object("WorkloadPriorityClass", name, value=value, description=f"AI work, {name.removeprefix('ai-')} priority")
        for name, value in PRIORITY_VALUES.items()
    ]
    local = _object("LocalQueue", AI_LOCAL_QUEUE, {"clusterQueue": AI_CLUSTER_QUEUE}, namespace=JOBS_NAMESPACE)
    return [flavor, *priorities, *cluster_queues(shares), local]


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
    Training Operator's); only ever dry-run."""
    probe = copy.deepcopy(training_operator.webhook_probe())
    probe["metadata"]["name"] = "testbed-kueue-probe"
    probe["metadata"]["labels"] = {QUEUE_NAME_LABEL: AI_LOCAL_QUEUE}
    return probe


def policy_lines(shares: GpuShares) -> list[str]:
    """The fairness policy in words, as `plan` prints it."""
    ai_max = shares.ai_max_gpus
    return [
        f"GPUs: {shares.gpus_total} (cohort {GPU_COHORT})",
        f"  HPC (slurmd, outside Kueue): up to {shares.hpc_gpus}; guaranteed only while no AI work holds them"
        if shares.ai_borrows_hpc_gpus
        else f"  HPC (slurmd, outside Kueue): {shares.hpc_gpus}, never lent to AI",
        f"  AI (LocalQueue {JOBS_NAMESPACE}/{AI_LOCAL_QUEUE}): {shares.ai_guaranteed_gpus} guaranteed (slurmd never takes them), "
        f"up to {ai_max} admitted at once",
        "  preemption: none across the cohort; within AI "
        + ("higher priority evicts lower" if shares.ai_preempts_lower_priority else "none"),
        "  priorities: " + ", ".join(f"{n}={v}" for n, v in PRIORITY_VALUES.items()),
    ]


class KubernetesObject(pulumi.CustomResource):
    """A custom resource registered whole: pulumi-kubernetes' Python CustomResource takes only
    `spec`, and a WorkloadPriorityClass keeps `value` and `description` at the top level. The
    type token is the one CustomResource registers (`kubernetes:<apiVersion>:<kind>`)."""

    def __init__(self, name: str, obj: dict, opts: pulumi.ResourceOptions):
        super().__init__(f"kubernetes:{obj['apiVersion']}:{obj['kind']}", name, copy.deepcopy(obj), opts)


class Kueue(pulumi.ComponentResource):
    def __init__(self, name: str, args: KueueArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:platform:Kueue", name, None, opts)
        self.release = helm.release(
            f"{name}-release",
            chart(args.version),
            values(args.version),
            args.provider,
            parent=self,
            depends_on=args.after,
        )
        # Kueue's job webhooks fail closed: nothing queued is created before they serve.
        self.webhook_gate = webhook_gate(
            f"{name}-webhook-gate", webhook_probe(), None, args.control_connection, parent=self, release=self.release
        )
        created: dict[tuple[str, str], KubernetesObject] = {}
        for obj in objects(args.shares):
            kind, obj_name = obj["kind"], obj["metadata"]["name"]
            created[kind, obj_name] = KubernetesObject(
                f"{name}-{kind.lower()}-{obj_name}",
                obj,
                pulumi.ResourceOptions(
                    parent=self,
                    provider=args.provider,
                    depends_on=[self.webhook_gate, *(created[ref] for ref in references(obj))],
                ),
            )
        self.register_outputs({"localQueue": f"{JOBS_NAMESPACE}/{AI_LOCAL_QUEUE}"})

"""Kueue: what the program derives (webhook scope, integrations, quota, cohort, priorities, install
order, gate probe), checked on the renderers and on the recorded default run."""

import json
from pathlib import Path

import pytest
import yaml

from components import bootstrap, kueue, names, training_operator
from components.names import GpuShares
from stacks import artifacts
from tests.conftest import by_type, depends, run_program, step_args

JOBS_DIR = Path(names.__file__).resolve().parent.parent / "jobs" / "kubernetes"
RELEASE = "kubernetes:helm.sh/v3:Release"
WORKER = bootstrap.WorkerBootstrap(
    "1.34.7", "1.34", "580", "1.18.1", "10.0.0.10", "abcdef.0123456789abcdef", "sha256:00"
)


def shares(total=4, ai=0, borrow=True, preempt=False) -> GpuShares:
    return GpuShares(total, ai, borrow, preempt)


def gpu_quota(cq: dict) -> dict:
    (group,) = cq["spec"]["resourceGroups"]
    (flavor,) = group["flavors"]
    (quota,) = flavor["resources"]
    assert group["coveredResources"] == [quota["name"]] == [names.GPU_RESOURCE]
    return quota


def by_kind(objs):
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def test_manager_config_scopes_webhooks_to_the_jobs_namespace_only():
    config = yaml.safe_load(kueue.values("0.19.2")["managerConfig"]["controllerManagerConfigYaml"])
    (expr,) = config["managedJobsNamespaceSelector"]["matchExpressions"]
    assert expr == {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [names.JOBS_NAMESPACE]}
    for system in ("kube-system", names.KUEUE_NAMESPACE, names.SLURM_NAMESPACE, names.MONITORING_NAMESPACE):
        assert system not in expr["values"]
    # Only Job and PyTorchJob: `pod`, `deployment`, `statefulset` would make the pod webhook fail closed.
    assert config["integrations"]["frameworks"] == ["batch/job", "kubeflow.org/pytorchjob"]
    assert config["manageJobsWithoutQueueName"] is False
    # Kept from the base: the chart's own defaults still configure the manager.
    assert config["webhook"]["port"] == 9443 and config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert "internalCertManagement" not in config  # the chart then turns on Kueue's own certificates


def test_wait_for_pods_ready_is_decided_not_defaulted():
    wfpr = yaml.safe_load(kueue.values("0.19.2")["managerConfig"]["controllerManagerConfigYaml"])["waitForPodsReady"]
    assert wfpr["recoveryTimeout"] == "0s"  # running work is never evicted for a flapping pod
    assert wfpr["blockAdmission"] is False
    assert wfpr["timeout"] != "30m"  # not the 0.19 default: images are pre-pulled


def test_the_image_follows_the_chart_version_from_the_release_registry():
    image = kueue.values("0.20.1")["controllerManager"]["manager"]["image"]
    assert image == {"repository": "registry.k8s.io/kueue/kueue", "tag": "v0.20.1", "pullPolicy": "IfNotPresent"}


@pytest.mark.parametrize(("total", "ai", "borrow"), [(4, 0, True), (4, 1, False), (2, 1, True), (8, 3, True)])
def test_quotas_add_up_to_the_gpus_and_lending_follows_the_policy(total, ai, borrow):
    objs = by_kind(kueue.objects(shares(total, ai, borrow)))
    hpc, ai_cq = objs["ClusterQueue", names.HPC_CLUSTER_QUEUE], objs["ClusterQueue", names.AI_CLUSTER_QUEUE]
    assert hpc["spec"]["cohortName"] == ai_cq["spec"]["cohortName"] == names.GPU_COHORT
    assert gpu_quota(hpc)["nominalQuota"] + gpu_quota(ai_cq)["nominalQuota"] == total
    assert gpu_quota(ai_cq)["nominalQuota"] == ai
    assert gpu_quota(hpc)["lendingLimit"] == (total - ai if borrow else 0)
    assert ai + gpu_quota(hpc)["lendingLimit"] == shares(total, ai, borrow).ai_max_gpus


def test_nothing_running_is_ever_preempted_across_the_cohort():
    for preempt in (False, True):
        objs = by_kind(kueue.objects(shares(preempt=preempt)))
        for cq in (objs["ClusterQueue", names.HPC_CLUSTER_QUEUE], objs["ClusterQueue", names.AI_CLUSTER_QUEUE]):
            p = cq["spec"]["preemption"]
            assert p["reclaimWithinCohort"] == "Never" and p["borrowWithinCohort"] == {"policy": "Never"}
        ai_cq = objs["ClusterQueue", names.AI_CLUSTER_QUEUE]
        assert ai_cq["spec"]["preemption"]["withinClusterQueue"] == ("LowerPriority" if preempt else "Never")
        assert objs["ClusterQueue", names.HPC_CLUSTER_QUEUE]["spec"]["preemption"]["withinClusterQueue"] == "Never"


def test_only_the_jobs_namespace_reaches_a_queue():
    objs = by_kind(kueue.objects(shares()))
    assert "namespaceSelector" not in objs["ClusterQueue", names.HPC_CLUSTER_QUEUE]["spec"]  # null: no namespace
    ai_cq = objs["ClusterQueue", names.AI_CLUSTER_QUEUE]
    assert ai_cq["spec"]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": names.JOBS_NAMESPACE}}
    local = objs["LocalQueue", names.AI_LOCAL_QUEUE]
    assert local["metadata"]["namespace"] == names.JOBS_NAMESPACE
    assert local["metadata"]["name"] != "default"  # `default` would catch unlabelled pods (pod_webhook.go)
    assert local["spec"]["clusterQueue"] == names.AI_CLUSTER_QUEUE


def test_the_flavor_pins_admitted_pods_to_gpu_workers_and_every_reference_resolves():
    objs = kueue.objects(shares())
    keyed = by_kind(objs)
    flavor = keyed["ResourceFlavor", names.GPU_FLAVOR]
    # the label every GPU worker's kubelet registers itself with (kubeadm JoinConfiguration)
    ((key, value),) = flavor["spec"]["nodeLabels"].items()
    assert f"{key}={value}" in bootstrap.kubeadm_join_config(WORKER)
    seen = set()
    for obj in objs:  # created in order: every object it names already exists
        assert set(kueue.references(obj)) <= seen, obj["metadata"]["name"]
        seen.add((obj["kind"], obj["metadata"]["name"]))


def test_priority_classes_are_ordered_and_the_example_jobs_use_them():
    objs = by_kind(kueue.objects(shares()))
    values = [objs["WorkloadPriorityClass", n]["value"] for n in names.AI_PRIORITY_CLASSES]
    assert values == sorted(values) and len(set(values)) == len(values)
    for path in ("pytorchjob-ddp.yaml", "inference-job.yaml"):
        job = yaml.safe_load((JOBS_DIR / path).read_text())
        labels = job["metadata"]["labels"]
        assert labels[names.QUEUE_NAME_LABEL] == objs["LocalQueue", names.AI_LOCAL_QUEUE]["metadata"]["name"]
        assert job["metadata"]["namespace"] == objs["LocalQueue", names.AI_LOCAL_QUEUE]["metadata"]["namespace"]
        assert ("WorkloadPriorityClass", labels[names.PRIORITY_CLASS_LABEL]) in objs


def test_gate_probe_is_a_queued_pytorchjob_the_training_operator_also_accepts():
    probe = kueue.webhook_probe()
    assert probe["metadata"]["labels"] == {names.QUEUE_NAME_LABEL: names.AI_LOCAL_QUEUE}
    assert probe["metadata"]["namespace"] in kueue.managed_namespaces()
    assert probe["spec"] == training_operator.webhook_probe()["spec"]
    assert probe["metadata"]["name"] != training_operator.webhook_probe()["metadata"]["name"]


def test_install_order_gate_and_objects_in_the_recorded_program(default_run):
    rec = default_run
    (release,) = [r for r in by_type(rec, RELEASE) if r.inputs["name"] == names.KUEUE_RELEASE]
    assert release.inputs["namespace"] == names.KUEUE_NAMESPACE and release.inputs["chart"] == kueue.CHART
    gate = rec.named("testbed-kueue-webhook-gate")
    assert json.loads(step_args(rec, "testbed-kueue-webhook-gate")["PROBE_MANIFEST"]) == kueue.webhook_probe()
    assert depends(rec, gate, release)
    assert depends(rec, release, rec.named("testbed-training-operator-install"))  # the PyTorchJob CRD first
    (keda,) = [r for r in by_type(rec, RELEASE) if r.inputs["name"] == "keda"]
    kueue_objects = [r for r in rec.resources if r.type.startswith("kubernetes:kueue.x-k8s.io/")]
    assert len(kueue_objects) == len(kueue.objects(rec_shares(rec)))
    for obj in kueue_objects:
        assert depends(rec, obj, gate), obj.name
        assert depends(rec, keda, obj), obj.name  # KEDA still installs last
    (ai_cq,) = [r for r in kueue_objects if r.name.endswith(f"clusterqueue-{names.AI_CLUSTER_QUEUE}")]
    assert depends(rec, ai_cq, rec.named(f"testbed-kueue-resourceflavor-{names.GPU_FLAVOR}"))


def rec_shares(rec) -> GpuShares:
    return names.Names.from_settings(rec.settings).shares


def test_default_run_quota_is_every_gpu_and_plan_shows_the_policy(default_run):
    s = rec_shares(default_run)
    assert s.gpus_total == default_run.settings.worker_count * names.GPUS_PER_WORKER
    cqs = {
        r.inputs["metadata"]["name"]: r.inputs
        for r in default_run.resources
        if r.type == "kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue"
    }
    assert sum(gpu_quota(cq)["nominalQuota"] for cq in cqs.values()) == s.gpus_total
    text = artifacts.plan_text(default_run)
    assert "helm kueue 0.19.2 (ns kueue-system)" in text
    policy = text.split("GPU fairness policy (Kueue):\n", 1)[1]
    assert f"GPUs: {s.gpus_total}" in policy and f"up to {s.ai_max_gpus} admitted at once" in policy


def test_a_changed_policy_reaches_kueue_keda_and_plan_together():
    rec = run_program(aiGuaranteedGpus=1, aiBorrowsHpcGpus=False, aiPreemptsLowerPriority=True)
    cqs = {
        r.inputs["metadata"]["name"]: r.inputs
        for r in rec.resources
        if r.type == "kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue"
    }
    ai_cq, hpc = cqs[names.AI_CLUSTER_QUEUE], cqs[names.HPC_CLUSTER_QUEUE]
    assert gpu_quota(ai_cq)["nominalQuota"] == 1 and gpu_quota(hpc) == {
        "name": names.GPU_RESOURCE,
        "nominalQuota": 3,
        "lendingLimit": 0,
    }
    assert ai_cq["spec"]["preemption"]["withinClusterQueue"] == "LowerPriority"
    (scaled_object,) = by_type(rec, "kubernetes:keda.sh/v1alpha1:ScaledObject")
    # slurmd never scales onto the GPU Kueue guarantees to AI: the two caps add up to the GPUs
    assert scaled_object.inputs["spec"]["maxReplicaCount"] + gpu_quota(ai_cq)["nominalQuota"] == 4
    policy = artifacts.plan_text(rec).split("GPU fairness policy (Kueue):\n", 1)[1]
    assert "1 guaranteed" in policy and "up to 1 admitted at once" in policy and "never lent to AI" in policy
    assert "higher priority evicts lower" in policy


def test_an_oversized_job_cannot_stop_the_ai_queue():
    # StrictFIFO requeues every unfit workload at the head (kueue@v0.19.2 pkg/cache/queue/cluster_queue.go)
    ai_cq = by_kind(kueue.objects(shares()))["ClusterQueue", names.AI_CLUSTER_QUEUE]
    assert ai_cq["spec"]["queueingStrategy"] == "BestEffortFIFO"

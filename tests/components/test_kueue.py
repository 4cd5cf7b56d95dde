"""Kueue: what the program derives (webhook scope, integrations, quota, cohort, priorities, install
order, gate probe), checked on the renderers and on the recorded default run."""

import json
from pathlib import Path

import pytest

from cli import artifacts
from components import bootstrap, kueue, training_operator
from core import names, trusted_yaml
from core.names import GpuShares
from tests.conftest import by_type, depends, run_program, step_args

JOBS_DIR = Path(names.__file__).resolve().parent.parent / "jobs" / "kubernetes"
RELEASE = "kubernetes:helm.sh/v3:Release"
WORKER = bootstrap.WorkerBootstrap(
    "1.34.7", "1.34", "580", "1.18.1", "10.0.0.10", "abcdef.0123456789abcdef", "sha256:00"
)


def shares(total=4, ai=2, borrow=True, preempt=False, hpc_borrows=True) -> GpuShares:
    return GpuShares(total, ai, borrow, preempt, hpc_borrows)


def gpu_quota(cq: dict) -> dict:
    (group,) = cq["spec"]["resourceGroups"]
    (flavor,) = group["flavors"]
    (quota,) = flavor["resources"]
    assert group["coveredResources"] == [quota["name"]] == [names.GPU_RESOURCE]
    return quota


def by_kind(objs):
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def test_manager_config_scopes_webhooks_to_the_jobs_and_slurm_namespaces_only():
    config = trusted_yaml.load(kueue.values("0.19.2")["managerConfig"]["controllerManagerConfigYaml"])
    (expr,) = config["managedJobsNamespaceSelector"]["matchExpressions"]
    assert expr == {
        "key": "kubernetes.io/metadata.name",
        "operator": "In",
        "values": [names.JOBS_NAMESPACE, names.SLURM_NAMESPACE],
    }
    for system in ("kube-system", names.KUEUE_NAMESPACE, names.MONITORING_NAMESPACE, names.KEDA_NAMESPACE):
        assert system not in expr["values"]
    # `pod` for the slurmd pods; not `deployment`/`statefulset`, whose webhooks would then fail
    # closed for slurmrestd and slurmctld in namespace slurm.
    assert config["integrations"]["frameworks"] == ["batch/job", "kubeflow.org/pytorchjob", "pod"]
    assert config["manageJobsWithoutQueueName"] is False
    # Kept from the base: the chart's own defaults still configure the manager.
    assert config["webhook"]["port"] == 9443 and config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert "internalCertManagement" not in config  # the chart then turns on Kueue's own certificates


def test_the_pod_webhooks_are_narrowed_to_pods_that_name_a_queue():
    patches = {p["kind"]: p for p in kueue.pod_webhook_patches()}
    assert set(patches) == {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    for kind, prefix in (("MutatingWebhookConfiguration", "m"), ("ValidatingWebhookConfiguration", "v")):
        patch = patches[kind]
        # the chart's names: `<kueue.fullname>-<kind>-webhook-configuration`, fullname = the release
        assert patch["metadata"] == {
            "name": f"kueue-{kind.removesuffix('WebhookConfiguration').lower()}-webhook-configuration"
        }
        # one entry, keyed by name (listType=map): the patch owns its objectSelector and nothing else
        assert patch["webhooks"] == [
            {
                "name": f"{prefix}pod.kb.io",
                "objectSelector": {"matchExpressions": [{"key": names.QUEUE_NAME_LABEL, "operator": "Exists"}]},
            }
        ]
    # the slurmd pods carry the label the selector needs; slurmctld and slurmrestd do not
    assert names.QUEUE_NAME_LABEL in names.slurmd_queue_labels()


def test_the_scope_checks_read_the_selector_back_from_the_live_configurations():
    steps = kueue.pod_webhook_scope_steps()
    assert set(steps) == set(names.KUEUE_POD_WEBHOOKS.values())
    for webhook, step in steps.items():
        assert step.script == "wait-condition.sh"
        assert step.args["CONDITION"] == (
            f'jsonpath={{.webhooks[?(@.name=="{webhook}")].objectSelector.matchExpressions[0].key}}'
            f"={names.QUEUE_NAME_LABEL}"
        )
    resources = sorted(s.args["RESOURCE"] for s in steps.values())
    assert resources == [
        "mutatingwebhookconfiguration/kueue-mutating-webhook-configuration",
        "validatingwebhookconfiguration/kueue-validating-webhook-configuration",
    ]


def test_wait_for_pods_ready_is_decided_not_defaulted():
    wfpr = trusted_yaml.load(kueue.values("0.19.2")["managerConfig"]["controllerManagerConfigYaml"])["waitForPodsReady"]
    assert wfpr["recoveryTimeout"] == "0s"  # running work is never evicted for a flapping pod
    assert wfpr["blockAdmission"] is False
    assert wfpr["timeout"] != "30m"  # not the 0.19 default: images are pre-pulled


def test_the_image_follows_the_chart_version_from_the_release_registry():
    image = kueue.values("0.20.1")["controllerManager"]["manager"]["image"]
    assert image == {"repository": "registry.k8s.io/kueue/kueue", "tag": "v0.20.1", "pullPolicy": "IfNotPresent"}


@pytest.mark.parametrize(
    ("total", "ai", "borrow", "hpc_borrows"),
    [(4, 0, True, True), (4, 1, False, True), (2, 1, True, False), (8, 3, True, True), (4, 2, False, False)],
)
def test_quotas_add_up_to_the_gpus_and_lending_follows_the_policy(total, ai, borrow, hpc_borrows):
    s = shares(total, ai, borrow, hpc_borrows=hpc_borrows)
    objs = by_kind(kueue.objects(s))
    hpc, ai_cq = objs["ClusterQueue", names.HPC_CLUSTER_QUEUE], objs["ClusterQueue", names.AI_CLUSTER_QUEUE]
    assert hpc["spec"]["cohortName"] == ai_cq["spec"]["cohortName"] == names.GPU_COHORT
    assert gpu_quota(hpc)["nominalQuota"] + gpu_quota(ai_cq)["nominalQuota"] == total
    assert gpu_quota(ai_cq)["nominalQuota"] == ai
    assert gpu_quota(hpc)["lendingLimit"] == (total - ai if borrow else 0)
    assert gpu_quota(ai_cq)["lendingLimit"] == (ai if hpc_borrows else 0)
    # what each side may reach: its own share plus what the other lends
    assert ai + gpu_quota(hpc)["lendingLimit"] == s.ai_max_gpus
    assert total - ai + gpu_quota(ai_cq)["lendingLimit"] == s.hpc_max_gpus


def test_nothing_running_is_ever_preempted_across_the_cohort():
    for preempt in (False, True):
        objs = by_kind(kueue.objects(shares(preempt=preempt)))
        for cq in (objs["ClusterQueue", names.HPC_CLUSTER_QUEUE], objs["ClusterQueue", names.AI_CLUSTER_QUEUE]):
            p = cq["spec"]["preemption"]
            assert p["reclaimWithinCohort"] == "Never" and p["borrowWithinCohort"] == {"policy": "Never"}
        ai_cq = objs["ClusterQueue", names.AI_CLUSTER_QUEUE]
        assert ai_cq["spec"]["preemption"]["withinClusterQueue"] == ("LowerPriority" if preempt else "Never")
        assert objs["ClusterQueue", names.HPC_CLUSTER_QUEUE]["spec"]["preemption"]["withinClusterQueue"] == "Never"
        assert kueue.hpc_preemption_problems(kueue.cluster_queues(shares(preempt=preempt)), {}) == []


def _flip(queue: str, path: tuple[str, ...], value):
    def edit(queues: list[dict]) -> None:
        (q,) = [q for q in queues if q["metadata"]["name"] == queue]
        node = q["spec"]["preemption"]
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            _flip("hpc", ("withinClusterQueue",), "LowerPriority"),
            "ClusterQueue hpc: preemption.withinClusterQueue 'LowerPriority'",
        ),
        (
            _flip("hpc", ("withinClusterQueue",), "LowerOrNewerEqualPriority"),
            "ClusterQueue hpc: preemption.withinClusterQueue",
        ),
        (_flip("ai", ("reclaimWithinCohort",), "Any"), "ClusterQueue ai: preemption.reclaimWithinCohort 'Any'"),
        (_flip("ai", ("reclaimWithinCohort",), "LowerPriority"), "ClusterQueue ai: preemption.reclaimWithinCohort"),
        (
            _flip("ai", ("borrowWithinCohort", "policy"), "LowerPriority"),
            "ClusterQueue ai: preemption.borrowWithinCohort.policy",
        ),
        (_flip("hpc", ("reclaimWithinCohort",), "Any"), "ClusterQueue hpc: preemption.reclaimWithinCohort 'Any'"),
        (
            _flip("hpc", ("borrowWithinCohort", "policy"), "LowerPriority"),
            "ClusterQueue hpc: preemption.borrowWithinCohort",
        ),
    ],
)
def test_a_policy_that_could_preempt_a_slurmd_pod_is_refused(edit, expected):
    queues = kueue.cluster_queues(shares(preempt=True))
    edit(queues)
    (problem,) = kueue.hpc_preemption_problems(queues, {})
    assert problem.startswith(expected) and "kills its Slurm job" in problem


def test_a_third_queue_in_the_cohort_and_fair_sharing_are_refused_too():
    third = kueue.cluster_queues(shares())[1] | {"metadata": {"name": "batch"}}
    third = {**third, "spec": {**third["spec"], "preemption": {"reclaimWithinCohort": "Any"}}}
    queues = [*kueue.cluster_queues(shares()), third]
    assert kueue.hpc_preemption_problems(queues, {}) == [
        "ClusterQueue batch: preemption.reclaimWithinCohort 'Any' is not allowed; expected 'Never': it would let "
        "Kueue preempt a slurmd pod, which deletes the pod and kills its Slurm job"
    ]
    # a queue outside the cohort cannot reach hpc's workloads; within ai, priority may evict ai work
    outside = {**third, "spec": {**third["spec"], "cohortName": "other"}}
    assert kueue.hpc_preemption_problems([*kueue.cluster_queues(shares(preempt=True)), outside], {}) == []
    (fair,) = kueue.hpc_preemption_problems(kueue.cluster_queues(shares()), {"fairSharing": {"enable": True}})
    assert fair.startswith("Kueue configuration: fairSharing.enable true is not allowed")


def test_the_program_refuses_a_preempting_policy_before_creating_anything(monkeypatch):
    """Refused like bad settings: one line per problem, `plan` exits 2 (cli/__main__.py)."""
    from core import settings as settings_mod

    original = kueue.cluster_queues

    def preempting(s):
        queues = original(s)
        _flip("ai", ("reclaimWithinCohort",), "Any")(queues)
        return queues

    monkeypatch.setattr(kueue, "cluster_queues", preempting)
    with pytest.raises(settings_mod.SettingsError) as error:
        kueue.refuse_hpc_preemption(shares(), "0.19.2")
    assert error.value.problems[0].startswith("ClusterQueue ai: preemption.reclaimWithinCohort 'Any'")


def test_each_side_reaches_its_queue_from_its_own_namespace_only():
    objs = by_kind(kueue.objects(shares()))
    hpc = objs["ClusterQueue", names.HPC_CLUSTER_QUEUE]
    assert hpc["spec"]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": names.SLURM_NAMESPACE}}
    ai_cq = objs["ClusterQueue", names.AI_CLUSTER_QUEUE]
    assert ai_cq["spec"]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": names.JOBS_NAMESPACE}}
    for local_name, namespace, cq in (
        (names.AI_LOCAL_QUEUE, names.JOBS_NAMESPACE, names.AI_CLUSTER_QUEUE),
        (names.HPC_LOCAL_QUEUE, names.SLURM_NAMESPACE, names.HPC_CLUSTER_QUEUE),
    ):
        (local,) = [o for o in objs.values() if o["kind"] == "LocalQueue" and o["metadata"]["namespace"] == namespace]
        assert local["metadata"]["name"] == local_name != "default"  # `default` catches unlabelled pods
        assert local["spec"]["clusterQueue"] == cq


def test_the_nodeset_labels_name_the_hpc_queue_and_its_priority_class():
    from components import slinky

    values = slinky.slurm_values("1.0.0", "25.11-ubuntu24.04", names.slurm_names("slinky"))
    labels = values["nodesets"]["slinky"]["metadata"]["labels"]
    objs = by_kind(kueue.objects(shares()))
    local = objs["LocalQueue", labels[names.QUEUE_NAME_LABEL]]
    assert local["metadata"]["namespace"] == names.SLURM_NAMESPACE
    assert local["spec"]["clusterQueue"] == names.HPC_CLUSTER_QUEUE
    assert ("WorkloadPriorityClass", labels[names.PRIORITY_CLASS_LABEL]) in objs
    # every slurmd pod asks for exactly one GPU: one pod, one 1-GPU workload
    assert values["nodesets"]["slinky"]["slurmd"]["resources"]["limits"] == {names.GPU_RESOURCE: 1}


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
        job = trusted_yaml.load((JOBS_DIR / path).read_text())
        labels = job["metadata"]["labels"]
        assert labels[names.QUEUE_NAME_LABEL] == objs["LocalQueue", names.AI_LOCAL_QUEUE]["metadata"]["name"]
        assert job["metadata"]["namespace"] == objs["LocalQueue", names.AI_LOCAL_QUEUE]["metadata"]["namespace"]
        assert ("WorkloadPriorityClass", labels[names.PRIORITY_CLASS_LABEL]) in objs


def test_gate_probe_is_a_queued_pytorchjob_the_training_operator_also_accepts():
    probe = kueue.webhook_probe()
    # queued, with the shortest run limit: the run-limit policies admit it (test_ai_run_limit.py)
    assert probe["metadata"]["labels"] == {names.QUEUE_NAME_LABEL: names.AI_LOCAL_QUEUE, names.MAX_EXEC_TIME_LABEL: "1"}
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
    (hpc_lq,) = [r for r in kueue_objects if r.name.endswith(f"localqueue-{names.HPC_LOCAL_QUEUE}")]
    assert depends(rec, hpc_lq, rec.named("testbed-kueue-slurm-namespace"))


def test_no_slurmd_pod_can_be_created_before_kueue_admits_it(default_run):
    """The slurm chart (the NodeSet) waits for the narrowed pod webhooks, their checks, the gate
    and the LocalQueue `hpc`; and the patches are applied by server-side apply after the release."""
    rec = default_run
    (slurm,) = [r for r in by_type(rec, RELEASE) if r.inputs["name"] == names.SLURM_RELEASE]
    (release,) = [r for r in by_type(rec, RELEASE) if r.inputs["name"] == names.KUEUE_RELEASE]
    patches = [r for r in rec.resources if "WebhookConfigurationPatch" in r.type]
    assert sorted(p.type.rsplit(":", 1)[1] for p in patches) == [
        "MutatingWebhookConfigurationPatch",
        "ValidatingWebhookConfigurationPatch",
    ]
    expected = {p["metadata"]["name"]: p["webhooks"] for p in kueue.pod_webhook_patches()}
    for patch in patches:
        assert patch.inputs["webhooks"] == expected[patch.inputs["metadata"]["name"]]
        assert depends(rec, patch, release)
        assert depends(rec, slurm, patch), patch.name
    for webhook in names.KUEUE_POD_WEBHOOKS.values():
        check = rec.named(f"testbed-kueue-{webhook}-scope-check")
        assert all(depends(rec, check, p) for p in patches)
        assert depends(rec, slurm, check)
    assert depends(rec, slurm, rec.named("testbed-kueue-webhook-gate"))
    (hpc_lq,) = [r for r in rec.resources if r.name == f"testbed-kueue-localqueue-{names.HPC_LOCAL_QUEUE}"]
    assert depends(rec, slurm, hpc_lq)


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
    # the default split: half each (aiGuaranteedGpus -1); each side lends its idle share to the other
    assert [gpu_quota(cqs[q])["nominalQuota"] for q in ("hpc", "ai")] == [2, 2]
    assert [gpu_quota(cqs[q])["lendingLimit"] for q in ("hpc", "ai")] == [2, 2]
    (scaled_object,) = by_type(default_run, "kubernetes:keda.sh/v1alpha1:ScaledObject")
    assert scaled_object.inputs["spec"]["maxReplicaCount"] == s.hpc_max_gpus == s.gpus_total
    text = artifacts.plan_text(default_run)
    assert "helm kueue 0.19.2 (ns kueue-system)" in text
    policy = text.split("GPU fairness policy (Kueue):\n", 1)[1]
    assert f"GPUs: {s.gpus_total}" in policy and f"up to {s.ai_max_gpus} admitted at once" in policy


def test_a_changed_policy_reaches_kueue_keda_and_plan_together():
    rec = run_program(aiGuaranteedGpus=1, aiBorrowsHpcGpus=False, hpcBorrowsAiGpus=False, aiPreemptsLowerPriority=True)
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
    assert gpu_quota(ai_cq)["lendingLimit"] == 0
    assert ai_cq["spec"]["preemption"]["withinClusterQueue"] == "LowerPriority"
    (scaled_object,) = by_type(rec, "kubernetes:keda.sh/v1alpha1:ScaledObject")
    # without borrowing, KEDA never asks for a slurmd pod Kueue could not admit: the caps add up
    assert scaled_object.inputs["spec"]["maxReplicaCount"] + gpu_quota(ai_cq)["nominalQuota"] == 4
    policy = artifacts.plan_text(rec).split("GPU fairness policy (Kueue):\n", 1)[1]
    assert "AI (LocalQueue default/ai): 1 guaranteed, up to 1 admitted at once; never lends its share" in policy
    assert "3 guaranteed, up to 3 at once; never lends its share to AI" in policy
    assert "higher priority evicts lower" in policy


def test_the_ai_queue_holds_freed_gpus_for_its_head():
    # StrictFIFO requeues an unfit workload at the head (kueue@v0.19.2 pkg/cache/queue/cluster_queue.go):
    # a gang first in line is not overtaken by later, smaller jobs (slurmd's rule reserves the rest)
    ai_cq = by_kind(kueue.objects(shares()))["ClusterQueue", names.AI_CLUSTER_QUEUE]
    assert ai_cq["spec"]["queueingStrategy"] == "StrictFIFO"


def test_render_writes_the_pod_webhook_patches_apart_from_whole_objects(tmp_path, default_run):
    artifacts.render(default_run, tmp_path)
    patches = {p.name: trusted_yaml.load(p.read_text()) for p in (tmp_path / "patches").glob("*.yaml")}
    assert sorted(patches) == [
        "MutatingWebhookConfiguration-kueue-mutating-webhook-configuration.yaml",
        "ValidatingWebhookConfiguration-kueue-validating-webhook-configuration.yaml",
    ]
    assert [p["webhooks"] for p in patches.values()] == [p["webhooks"] for p in kueue.pod_webhook_patches()]
    assert not any("WebhookConfiguration" in p.name for p in (tmp_path / "manifests").glob("*.yaml"))

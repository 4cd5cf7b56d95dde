"""The AI run limit: the policies' scope, their CEL run (cel-python, with the Kubernetes library
functions tests/components/cel_policy.py supplies) against the example jobs and against jobs and
pods they must refuse, the limits they carry, and how the program wires them."""

import copy
import re

import kubernetes_validate
import pytest

from cli import artifacts
from components import ai_run_limit, kueue, training_operator
from core import names
from tests import tokens
from tests.components.cel_policy import admit, compile_expression
from tests.conftest import by_type, depends, run_program
from validation.scenarios import JOBS_DIR, load_objects

LIMIT = names.MAX_EXEC_TIME_LABEL
EXAMPLES = ("inference-job.yaml", "pytorchjob-ddp.yaml", "pytorchjob-nccl-allreduce.yaml")


def policies(max_minutes=60, gpus=4) -> dict[str, dict]:
    """The rendered policies by the kind they check."""
    objs = ai_run_limit.objects(max_minutes, gpus)
    return {
        o["spec"]["matchConstraints"]["resourceRules"][0]["resources"][0]: o
        for o in objs
        if o["kind"] == "ValidatingAdmissionPolicy"
    }


def served(obj: dict) -> dict:
    """The object as the API server hands it to a policy: a built-in Job decoded and defaulted
    (parallelism 1; quantities in their string form, resource.Quantity's ToUnstructured); a
    custom resource as stored, its int-or-string values as written."""
    obj = copy.deepcopy(obj)
    if obj["kind"] == "Job":
        obj["spec"].setdefault("parallelism", 1)
        for c in obj["spec"]["template"]["spec"]["containers"]:
            for values in c.get("resources", {}).values():
                values.update({k: str(v) for k, v in values.items()})
    return obj


def example(name: str) -> dict:
    (obj,) = load_objects(JOBS_DIR / "kubernetes" / name)
    return served(obj)


def check(obj: dict, operation="CREATE", old=None, **limits):
    policy = policies(**limits)[{"Job": "jobs", "PyTorchJob": "pytorchjobs", "Pod": "pods"}[obj["kind"]]]
    return admit(policy, operation, obj, old)


def with_limit(obj: dict, value: str | None) -> dict:
    obj = copy.deepcopy(obj)
    if value is None:
        del obj["metadata"]["labels"][LIMIT]
    else:
        obj["metadata"]["labels"][LIMIT] = value
    return obj


def test_the_policies_and_bindings_pass_kubernetes_1_34_strict_schemas():
    objs = ai_run_limit.objects(60, 4)
    assert [o["kind"] for o in objs] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * 3
    for obj in objs:
        kubernetes_validate.validate(obj, "1.34", strict=True)


def test_every_expression_parses_in_one_line_and_uses_only_variables_defined_before_it():
    for policy in policies().values():
        spec = policy["spec"]
        defined: list[str] = []
        for variable in spec["variables"]:
            assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", variable["name"])
            assert set(re.findall(r"variables\.(\w+)", variable["expression"])) <= set(defined)
            defined.append(variable["name"])
        for condition in spec["matchConditions"]:
            assert "variables." not in condition["expression"]  # conditions run before variables
        expressions = [c["expression"] for c in spec["matchConditions"]] + [v["expression"] for v in spec["variables"]]
        for validation in spec["validations"]:
            expressions += [validation["expression"], validation.get("messageExpression", "'x'")]
            assert "\n" not in validation["message"]  # the API server refuses a multi-line message
            assert set(re.findall(r"variables\.(\w+)", validation["expression"])) <= set(defined)
        for expression in expressions:
            assert "\n" not in expression
            compile_expression(expression)  # CEL's grammar, or celpy's CELParseError
        for pattern in re.findall(r"matches\('([^']*)'\)", " ".join(expressions)):
            re.compile(pattern)  # RE2 and Python agree on this syntax: anchors, classes, counts


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_example_jobs_declare_their_deadline_as_their_run_limit_and_are_admitted(name):
    obj = example(name)
    run_policy = obj["spec"]["runPolicy"] if obj["kind"] == "PyTorchJob" else obj["spec"]
    assert obj["metadata"]["labels"][LIMIT] == str(run_policy["activeDeadlineSeconds"])
    decision = check(obj)
    assert decision.evaluated and decision.allowed, decision
    # within the default bound, so not the bound itself everywhere: the label is the job's own
    assert int(obj["metadata"]["labels"][LIMIT]) <= 60 * 60


@pytest.mark.parametrize(
    ("value", "max_minutes", "allowed"),
    [
        ("2700", 45, True),
        ("2701", 45, False),
        ("1", 45, True),
        ("0", 45, False),
        ("000060", 45, True),  # Kueue's Atoi reads leading zeros
        ("12345678", 10080, False),  # more digits than any setting allows: never given to int()
        ("99999999999999999999", 10080, False),  # would overflow int(): refused in words, not an error
        ("1h", 45, False),
        ("604800", 10080, True),
    ],
)
def test_a_limit_is_refused_unless_an_integer_up_to_the_setting(value, max_minutes, allowed):
    decision = check(with_limit(example("inference-job.yaml"), value), max_minutes=max_minutes)
    assert decision.allowed is allowed
    if not allowed:
        (message,) = decision.denials
        assert message == (
            f'label {LIMIT}: "{value}" is not allowed; expected an integer from 1 to {max_minutes * 60} seconds '
            f"(setting aiJobMaxMinutes {max_minutes})"
        )


def test_a_queued_job_without_a_limit_is_refused_in_one_line():
    for name in EXAMPLES:
        (message,) = check(with_limit(example(name), None)).denials
        assert message.startswith(f"label {LIMIT} is missing;") and "1 to 3600 seconds" in message
        assert "aiJobMaxMinutes 60" in message and "\n" not in message


def _ddp(workers: int, worker_gpus=1) -> dict:
    obj = example("pytorchjob-ddp.yaml")
    worker = obj["spec"]["pytorchReplicaSpecs"]["Worker"]
    worker["replicas"] = workers
    worker["template"]["spec"]["containers"][0]["resources"]["limits"][names.GPU_RESOURCE] = worker_gpus
    return obj


def test_a_pytorchjob_wider_than_the_workers_or_with_a_two_gpu_pod_is_refused():
    assert check(_ddp(5), gpus=6).allowed  # Master + 5 Workers on 6 GPUs
    (wide,) = check(_ddp(5), gpus=5).denials
    assert wide == (
        f"the job asks for 6 {names.GPU_RESOURCE} in all; expected at most 5 (the most AI may hold: workerCount, or the AI share if aiBorrowsHpcGpus is false): "
        "Kueue could never admit it"
    )
    (pod,) = check(_ddp(1, worker_gpus="2")).denials  # a string quantity, as kubectl may send it
    assert pod.startswith(f"a pod asks for 2 {names.GPU_RESOURCE}; expected at most 1")
    assert check(_ddp(2, worker_gpus=0)).allowed  # a Worker without a GPU counts none


def test_a_batch_job_counts_its_pods_at_once_as_kueue_does():
    job = example("inference-job.yaml")
    job["spec"]["parallelism"] = 5
    (wide,) = check(job).denials
    assert wide.startswith(f"the job asks for 5 {names.GPU_RESOURCE} in all; expected at most 4")
    job["spec"]["completions"] = 2  # never more pods at once than completions
    assert check(job).allowed
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["resources"]["limits"][names.GPU_RESOURCE] = "2"
    (pod,) = check(job).denials
    assert pod.startswith(f"a pod asks for 2 {names.GPU_RESOURCE}")


def test_kueues_and_the_operators_updates_never_reach_the_rules():
    """A job created before the policy, without a limit: Kueue unsuspending it, setting its node
    selector, or the garbage collector's finalizer, leave the labels and pods alone and are not evaluated."""
    for name in EXAMPLES:
        old = with_limit(example(name), None)
        new = copy.deepcopy(old)
        new["metadata"]["finalizers"] = ["foregroundDeletion"]
        new["spec"]["suspend"] = False
        assert check(new, "UPDATE", old).evaluated is False


def test_leaving_the_queue_with_gpus_is_refused_and_without_gpus_is_not_checked():
    """Unqueued, a GPU job would run beside Kueue with no limit; one without GPUs is none of the rules' business."""
    queued = example("inference-job.yaml")
    unqueued = with_limit(queued, None)
    del unqueued["metadata"]["labels"][names.QUEUE_NAME_LABEL]
    (no_queue, no_limit) = check(unqueued, "UPDATE", queued).denials
    assert no_queue.startswith(f"the Job asks for {names.GPU_RESOURCE} and names no queue;")
    assert no_limit.startswith(f"label {LIMIT} is missing")
    assert check(unqueued).denials == (no_queue, no_limit)  # nor created so
    cpu_only = copy.deepcopy(unqueued)
    del cpu_only["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][names.GPU_RESOURCE]
    assert check(cpu_only).evaluated is False


def test_a_users_update_that_queues_a_job_or_changes_its_limit_is_checked():
    job = example("inference-job.yaml")
    (raised,) = check(with_limit(job, "7200"), "UPDATE", job).denials
    assert '"7200" is not allowed' in raised
    assert check(with_limit(job, "60"), "UPDATE", job).allowed
    assert check(with_limit(job, None), "UPDATE", job).denials  # dropping the limit
    unqueued = with_limit(job, None)
    del unqueued["metadata"]["labels"][names.QUEUE_NAME_LABEL]
    (missing,) = check(with_limit(job, None), "UPDATE", unqueued).denials  # now queued, no limit
    assert missing.startswith(f"label {LIMIT} is missing")


def test_kueues_gate_probe_passes_and_the_operators_probe_is_not_queued():
    probe = kueue.webhook_probe()
    assert check(probe, max_minutes=1).allowed  # the smallest setting
    assert check(training_operator.webhook_probe()).evaluated is False


def test_the_scope_is_queued_ai_jobs_in_their_namespace_and_every_refusal_denies():
    objs = ai_run_limit.objects(60, 4)
    by_name = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"}
    rules = {n: p["spec"]["matchConstraints"]["resourceRules"] for n, p in by_name.items()}
    assert rules == {
        "testbed-ai-run-limit-jobs": [
            {"apiGroups": ["batch"], "apiVersions": ["v1"], "resources": ["jobs"], "operations": ["CREATE", "UPDATE"]}
        ],
        "testbed-ai-run-limit-pytorchjobs": [
            {
                "apiGroups": ["kubeflow.org"],
                "apiVersions": ["v1"],
                "resources": ["pytorchjobs"],
                "operations": ["CREATE", "UPDATE"],
            }
        ],
        "testbed-ai-run-limit-pods": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods", "pods/ephemeralcontainers"],
                "operations": ["CREATE", "UPDATE"],
            }
        ],
    }
    # every kind Kueue manages in the jobs' namespace has its policy
    assert sorted(kind.split("/")[-1] + "s" for kind in kueue.FRAMEWORKS) == sorted(
        n.removeprefix("testbed-ai-run-limit-") for n in by_name
    )
    for policy in by_name.values():
        constraints = policy["spec"]["matchConstraints"]
        assert constraints["namespaceSelector"] == {
            "matchLabels": {"kubernetes.io/metadata.name": names.JOBS_NAMESPACE}
        }
        assert "objectSelector" not in constraints  # unqueued GPU work is seen too
        assert policy["spec"]["failurePolicy"] == "Fail"
    bindings = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert sorted(b["spec"]["policyName"] for b in bindings) == sorted(by_name)
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)


def test_the_limits_are_read_back_from_the_rendered_policies():
    assert ai_run_limit.limits(ai_run_limit.objects(90, 2)) == ai_run_limit.Limits(5400, 2)
    mixed = ai_run_limit.objects(90, 2)[:2] + ai_run_limit.objects(60, 2)[2:]
    with pytest.raises(ValueError):
        ai_run_limit.limits(mixed)


def test_the_program_creates_the_policies_after_kueue_from_the_settings():
    rec = run_program(aiJobMaxMinutes=90, workerCount=2)
    (component,) = by_type(rec, tokens.AI_RUN_LIMIT)
    created = [r for r in by_type(rec, tokens.VALIDATING_ADMISSION_POLICY) if r.parent == component.urn]
    bindings = [r for r in by_type(rec, tokens.VALIDATING_ADMISSION_POLICY_BINDING) if r.parent == component.urn]
    assert len(created) == len(bindings) == len(ai_run_limit.KINDS)
    assert ai_run_limit.limits([r.inputs for r in created]) == ai_run_limit.Limits(5400, 2)
    gate = rec.named("testbed-kueue-webhook-gate")
    for policy in created:
        assert policy.parent == component.urn and depends(rec, policy, gate)
    for binding in bindings:
        (policy,) = [p for p in created if p.inputs["metadata"]["name"] == binding.inputs["spec"]["policyName"]]
        assert depends(rec, binding, policy)
    policy_text = artifacts.plan_text(rec).split("GPU fairness policy (Kueue):\n", 1)[1]
    assert f"{LIMIT}, at most 5400 s (aiJobMaxMinutes 90)" in policy_text
    assert "a job asking for more than 2 GPUs (what AI may hold" in policy_text.replace("\n    ", " ")


def test_a_job_wider_than_ais_share_is_refused_when_ai_may_not_borrow():
    """StrictFIFO would keep such a job at the head for ever: AI's queue admits at most its share."""
    rec = run_program(workerCount=4, aiBorrowsHpcGpus=False)
    created = by_type(rec, tokens.VALIDATING_ADMISSION_POLICY)
    assert ai_run_limit.limits([r.inputs for r in created]).gpus == 2


def _pod(labels: dict | None = None, **spec) -> dict:
    """A bare Pod in the jobs' namespace, as served: quantities as strings."""
    container = {"name": "main", "image": "busybox", "resources": {"limits": {names.GPU_RESOURCE: "1"}}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": names.JOBS_NAMESPACE, "labels": labels or {}},
        "spec": {"containers": [container], **spec},
    }


QUEUED = {names.QUEUE_NAME_LABEL: names.AI_LOCAL_QUEUE}


def test_a_bare_pod_with_the_queue_label_and_no_limit_is_refused():
    (missing,) = check(_pod(QUEUED)).denials
    assert missing.startswith(f"label {LIMIT} is missing")
    assert check(_pod({**QUEUED, LIMIT: "600"})).allowed
    (two,) = check(_pod({**QUEUED, LIMIT: "600"}, initContainers=[_pod()["spec"]["containers"][0]])).denials
    assert two.startswith(f"a pod asks for 2 {names.GPU_RESOURCE}")
    # unqueued with a GPU: outside Kueue and every limit
    assert check(_pod()).denials[0].startswith(f"the Pod asks for {names.GPU_RESOURCE} and names no queue")
    (group,) = check(_pod({**QUEUED, LIMIT: "600", "kueue.x-k8s.io/pod-group-name": "g"})).denials
    assert "pod groups are not offered" in group


def test_the_pods_of_a_job_or_pytorchjob_are_left_to_their_owners_rules_but_a_forged_owner_kind_is_not():
    owned = _pod(ownerReferences=None)
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u", "controller": True}
    ]
    assert check(owned).evaluated is False
    owned["metadata"]["ownerReferences"][0]["kind"] = "ReplicaSet"
    assert check(owned).evaluated is True and not check(owned).allowed
    owned["metadata"]["ownerReferences"][0].update(kind="PyTorchJob", apiVersion="kubeflow.org/v1")
    assert check(owned).evaluated is False
    del owned["metadata"]["ownerReferences"][0]["controller"]  # an owner, not the controller
    assert not check(owned).allowed


@pytest.mark.parametrize("where", ["initContainers", "sidecar", "ephemeralContainers"])
def test_a_gpu_in_an_init_container_a_sidecar_or_an_ephemeral_container_counts(where):
    job = example("inference-job.yaml")
    pod = job["spec"]["template"]["spec"]
    extra = {"name": "x", "image": "busybox", "resources": {"limits": {names.GPU_RESOURCE: "1"}}}
    if where == "sidecar":
        extra["restartPolicy"] = "Always"
    pod["ephemeralContainers" if where == "ephemeralContainers" else "initContainers"] = [extra]
    (two,) = check(job).denials
    assert two.startswith(f"a pod asks for 2 {names.GPU_RESOURCE}")
    pod["containers"][0]["resources"]["limits"][names.GPU_RESOURCE] = "0"
    assert check(job).allowed  # the one GPU, asked for in the init container alone, is counted once
    job["spec"]["parallelism"] = 5
    assert check(job).denials[0].startswith(f"the job asks for 5 {names.GPU_RESOURCE} in all")


def test_an_init_container_gpu_in_a_pytorchjob_is_counted_per_replica():
    obj = _ddp(1)
    worker = obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    worker["initContainers"] = [{"name": "i", "image": "busybox", "resources": {"limits": {names.GPU_RESOURCE: 1}}}]
    (pod,) = check(obj).denials
    assert pod.startswith(f"a pod asks for 2 {names.GPU_RESOURCE}")


@pytest.mark.parametrize(
    ("limits", "requests"),
    [(-1, None), ("-1", None), ("500m", None), (1, 2), (None, 1), ("1", "2")],
)
def test_a_negative_fractional_or_request_unlike_limit_gpu_count_is_refused(limits, requests):
    """A PyTorchJob's template is not validated by the API server: a negative Worker would lower
    the job's total as Kueue counts it (here 4 Workers of 1 GPU and a replica of -1: 4 in all)."""
    obj = _ddp(3)
    resources = obj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resources"]
    resources.pop("limits", None)
    if limits is not None:
        resources["limits"] = {names.GPU_RESOURCE: limits}
    if requests is not None:
        resources["requests"] = {**resources.get("requests", {}), names.GPU_RESOURCE: requests}
    denials = check(obj).denials
    assert any(d.startswith(f"a container's {names.GPU_RESOURCE} is negative, not a whole number") for d in denials)
    resources["limits"] = {names.GPU_RESOURCE: 1}
    resources["requests"] = {names.GPU_RESOURCE: "1"}
    assert check(obj).allowed


def test_a_negative_replica_count_is_refused():
    obj = _ddp(3)
    obj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = -2
    assert any(d.startswith("a count of pods") for d in check(obj).denials)


def test_an_update_of_replicas_parallelism_or_gpus_is_checked_again():
    job = example("pytorchjob-ddp.yaml")
    wider = copy.deepcopy(job)
    wider["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 8  # labels untouched
    (wide,) = check(wider, "UPDATE", job).denials
    assert wide.startswith(f"the job asks for 9 {names.GPU_RESOURCE} in all; expected at most 4")
    batch = example("inference-job.yaml")
    parallel = copy.deepcopy(batch)
    parallel["spec"]["parallelism"] = 6
    assert check(parallel, "UPDATE", batch).denials[0].startswith(f"the job asks for 6 {names.GPU_RESOURCE}")
    more_gpus = copy.deepcopy(batch)
    more_gpus["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][names.GPU_RESOURCE] = "2"
    assert check(more_gpus, "UPDATE", batch).denials[0].startswith(f"a pod asks for 2 {names.GPU_RESOURCE}")
    # a job created before the policy, without a limit, is caught when its pods change
    unlimited = with_limit(batch, None)
    parallel_unlimited = with_limit(parallel, None)
    assert check(parallel_unlimited, "UPDATE", unlimited).evaluated is True

"""The AI run limit: the policies' scope, their CEL run (in the subset evaluator) against the example
jobs and against jobs they must refuse, the limits they carry, and how the program wires them."""

import copy
import re

import kubernetes_validate
import pytest

from cli import artifacts
from components import ai_run_limit, kueue, training_operator
from core import names
from tests import tokens
from tests.components.cel_subset import Parser, admit
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
    policy = policies(**limits)["jobs" if obj["kind"] == "Job" else "pytorchjobs"]
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
    assert [o["kind"] for o in objs] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * 2
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
            Parser(expression).parse()  # the subset's grammar, or SyntaxError
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
    selector, or the garbage collector's finalizer, leave the labels alone and are not evaluated."""
    for name in EXAMPLES:
        old = with_limit(example(name), None)
        new = copy.deepcopy(old)
        new["metadata"]["finalizers"] = ["foregroundDeletion"]
        new["spec"]["suspend"] = False
        assert check(new, "UPDATE", old).evaluated is False
        # leaving the queue, its limit with it, is not checked either (Kueue's own webhook decides
        # whether it may): the policy checks only jobs that stay queued
        queued = example(name)
        unqueued = with_limit(queued, None)
        del unqueued["metadata"]["labels"][names.QUEUE_NAME_LABEL]
        assert check(unqueued, "UPDATE", queued).evaluated is False


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
    }
    for policy in by_name.values():
        constraints = policy["spec"]["matchConstraints"]
        assert constraints["namespaceSelector"] == {
            "matchLabels": {"kubernetes.io/metadata.name": names.JOBS_NAMESPACE}
        }
        assert constraints["objectSelector"] == kueue.POD_WEBHOOK_OBJECT_SELECTOR
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
    created = by_type(rec, tokens.VALIDATING_ADMISSION_POLICY)
    bindings = by_type(rec, tokens.VALIDATING_ADMISSION_POLICY_BINDING)
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
    assert "a job asking for more than 2 GPUs (what AI may hold" in policy_text


def test_a_job_wider_than_ais_share_is_refused_when_ai_may_not_borrow():
    """StrictFIFO would keep such a job at the head for ever: AI's queue admits at most its share."""
    rec = run_program(workerCount=4, aiBorrowsHpcGpus=False)
    created = by_type(rec, tokens.VALIDATING_ADMISSION_POLICY)
    assert ai_run_limit.limits([r.inputs for r in created]).gpus == 2

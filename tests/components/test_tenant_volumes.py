"""Tenants keep to their own storage: the volume policy run by cel-python against the shipped AI
jobs' pods and pods that reach the share or a node's files."""

import kubernetes_validate
import pytest

from components import tenant_volumes
from core import names
from tests import tokens
from tests.components.cel_policy import admit
from tests.conftest import by_type, run_program
from validation.scenarios import JOBS_DIR, load_objects


def pod(*volumes: dict) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": names.JOBS_NAMESPACE},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], "volumes": list(volumes)},
    }


def test_an_nfs_volume_in_default_is_refused_in_one_line_naming_it():
    (message,) = admit(
        tenant_volumes.policy(), "CREATE", pod({"name": "share", "nfs": {"server": "10.0.0.10", "path": "/mnt/share"}})
    ).denials
    assert message.startswith("volume share: a pod in a tenant namespace may use only configMap, csi,")
    assert "no nfs, no hostPath" in message and "\n" not in message


def test_a_host_path_and_any_other_volume_outside_restricted_are_refused_and_named():
    volumes = [
        {"name": "root", "hostPath": {"path": "/"}},
        {"name": "ok", "emptyDir": {}},
        {"name": "disk", "iscsi": {"targetPortal": "10.0.0.1:3260", "iqn": "iqn.x", "lun": 0}},
    ]
    (message,) = admit(tenant_volumes.policy(), "CREATE", pod(*volumes)).denials
    assert message.startswith("volume root, disk: a pod in a tenant namespace")


@pytest.mark.parametrize("name", sorted(p.name for p in (JOBS_DIR / "kubernetes").glob("*.yaml")))
def test_the_shipped_ai_jobs_pods_are_admitted(name):
    for obj in load_objects(JOBS_DIR / "kubernetes" / name):
        templates = (
            [r["template"] for r in obj["spec"]["pytorchReplicaSpecs"].values()]
            if obj["kind"] == "PyTorchJob"
            else [obj["spec"]["template"]]
        )
        for template in templates:
            assert admit(tenant_volumes.policy(), "CREATE", {"kind": "Pod", **template}).allowed
    assert admit(tenant_volumes.policy(), "CREATE", pod()).allowed  # no volumes at all


def test_the_policy_covers_the_tenant_namespace_and_passes_the_1_34_schemas():
    policy, binding = tenant_volumes.policy(), tenant_volumes.binding()
    for obj in (policy, binding):
        kubernetes_validate.validate(obj, "1.34", strict=True)
    (expression,) = policy["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"]
    assert expression["values"] == [names.JOBS_NAMESPACE]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}


def test_the_program_creates_the_policy_and_its_binding():
    rec = run_program()
    (component,) = by_type(rec, tokens.TENANT_VOLUMES)
    created = [r for r in by_type(rec, tokens.VALIDATING_ADMISSION_POLICY) if r.parent == component.urn]
    (policy,) = created
    assert policy.inputs["spec"]["validations"] == tenant_volumes.policy()["spec"]["validations"]
    bindings = [r for r in by_type(rec, tokens.VALIDATING_ADMISSION_POLICY_BINDING) if r.parent == component.urn]
    assert [b.inputs["spec"]["policyName"] for b in bindings] == [tenant_volumes.POLICY_NAME]

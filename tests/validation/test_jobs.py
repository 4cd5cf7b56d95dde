"""The example workloads are runnable as they are: schemas, the webhook's rules, shellcheck."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest

from validation.scenarios import JOBS_DIR, load_objects

MANIFESTS = sorted((JOBS_DIR / "kubernetes").glob("*.yaml"))
SCRIPTS = sorted((JOBS_DIR / "slurm").glob("*.sbatch"))
SHELLCHECK = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
PINNED_IMAGE = re.compile(r"^[\w.\-/]+:[\w.\-]+$")

# The PyTorchJob spec as kubeflow/training-operator@v1.8.1 serves it
# (manifests/base/crds/kubeflow.org_pytorchjobs.yaml, version v1): the fields it knows
# outside the pod templates, which are checked against Kubernetes' own PodTemplateSpec.
PYTORCHJOB_SPEC = {
    "type": "object",
    "required": ["pytorchReplicaSpecs"],
    "additionalProperties": False,
    "properties": {
        "elasticPolicy": {"type": "object"},
        "nprocPerNode": {"type": "string"},
        "runPolicy": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "activeDeadlineSeconds": {"type": "integer"},
                "backoffLimit": {"type": "integer"},
                "cleanPodPolicy": {"type": "string"},
                "schedulingPolicy": {"type": "object"},
                "suspend": {"type": "boolean"},
                "ttlSecondsAfterFinished": {"type": "integer"},
            },
        },
        "pytorchReplicaSpecs": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "replicas": {"type": "integer"},
                    "restartPolicy": {"type": "string"},
                    "template": {"type": "object"},
                },
            },
        },
    },
}
# Values the operator accepts (pkg/apis/kubeflow.org/v1: common_types.go RestartPolicy, CleanPodPolicy).
RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}
CLEAN_POD_POLICIES = {"All", "Running", "None"}


def objects():
    return [(path.name, obj) for path in MANIFESTS for obj in load_objects(path)]


def pod_templates(obj):
    if obj["kind"] == "PyTorchJob":
        return [spec["template"] for spec in obj["spec"]["pytorchReplicaSpecs"].values()]
    return [obj["spec"]["template"]] if obj["kind"] == "Job" else []


def test_there_are_the_example_workloads():
    assert {p.name for p in MANIFESTS} == {
        "pytorchjob-ddp.yaml",
        "pytorchjob-nccl-allreduce.yaml",
        "inference-job.yaml",
        "leak-probe.yaml",
    }
    assert {p.name for p in SCRIPTS} == {
        "gpu-smoke.sbatch",
        "hold-gpus.sbatch",
        "mpi-gpu.sbatch",
        "nccl-allreduce.sbatch",
        "openfoam-cavity.sbatch",
    }


@pytest.mark.parametrize("name,obj", [(n, o) for n, o in objects() if o["kind"] != "PyTorchJob"])
def test_builtin_kinds_validate_strictly_against_kubernetes_1_34(name, obj):
    kubernetes_validate.validate(obj, "1.34", strict=True)


@pytest.mark.parametrize("name,obj", objects())
def test_every_pod_template_validates_strictly_and_pins_its_images(name, obj):
    for template in pod_templates(obj):
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template},
            "1.34",
            strict=True,
        )
        for container in template["spec"]["containers"]:
            assert PINNED_IMAGE.match(container["image"]) and not container["image"].endswith(":latest")


def test_strict_validation_rejects_an_unknown_field():
    (obj,) = load_objects(JOBS_DIR / "kubernetes/inference-job.yaml")
    obj["spec"]["template"]["spec"]["containers"][0]["gpus"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, "1.34", strict=True)


def pytorchjobs():
    return [obj for _, obj in objects() if obj["kind"] == "PyTorchJob"]


@pytest.mark.parametrize("obj", pytorchjobs())
def test_pytorchjob_follows_the_crd_and_the_webhook(obj):
    assert obj["apiVersion"] == "kubeflow.org/v1"
    jsonschema.validate(obj["spec"], PYTORCHJOB_SPEC)
    specs = obj["spec"]["pytorchReplicaSpecs"]
    # pkg/webhooks/pytorch/pytorchjob_webhook.go@v1.8.1: DNS-1035 name, Master/Worker
    # only, Master has 1 replica, a container named pytorch with an image.
    assert re.match(r"^[a-z]([-a-z0-9]*[a-z0-9])?$", obj["metadata"]["name"])
    assert set(specs) == {"Master", "Worker"}
    assert specs["Master"]["replicas"] == 1
    assert obj["spec"]["runPolicy"]["cleanPodPolicy"] in CLEAN_POD_POLICIES
    for spec in specs.values():
        assert spec["restartPolicy"] in RESTART_POLICIES
        (container,) = spec["template"]["spec"]["containers"]
        assert container["name"] == "pytorch" and container["image"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_the_crd_check_rejects_a_misspelt_field():
    obj = pytorchjobs()[0]
    obj["spec"]["pytorchReplicaSpecs"]["Worker"]["replica"] = 2
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(obj["spec"], PYTORCHJOB_SPEC)


SHARED_CRD = (
    Path(__file__).resolve().parents[2].parent / "shared/reference/crds/kubeflow.org_pytorchjobs-v1.schema.json"
)


@pytest.mark.skipif(not SHARED_CRD.is_file(), reason="development aid: ../shared/reference is not here")
@pytest.mark.parametrize("obj", pytorchjobs())
def test_pytorchjob_against_the_full_crd_schema_when_available(obj):
    schema = json.loads(SHARED_CRD.read_text())["schema"]
    jsonschema.Draft7Validator(schema).validate(obj)


@pytest.mark.parametrize("name,obj", objects())
def test_inline_python_compiles(name, obj):
    for template in pod_templates(obj):
        for container in template["spec"]["containers"]:
            if container.get("command") == ["python", "-c"]:
                compile(container["args"][0], f"{name}:{container['name']}", "exec")


def test_pytorchjob_trains_with_ddp_over_nccl():
    (obj,) = [o for o in pytorchjobs() if o["metadata"]["name"] == "ddp-synthetic"]
    code = obj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"][0]
    assert 'init_process_group("nccl"' in code and "DistributedDataParallel" in code and "sys.exit(" in code


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_sbatch_scripts_are_bash_with_directives_and_output_on_the_share(script):
    text = script.read_text()
    assert text.startswith("#!/bin/bash\n")
    assert "#SBATCH --gres=gpu:1" in text
    assert "#SBATCH --output=/mnt/share/" in text


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_sbatch_scripts_pass_shellcheck(script):
    result = subprocess.run([SHELLCHECK, str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_shellcheck_does_find_problems(tmp_path):
    bad = tmp_path / "bad.sbatch"
    bad.write_text("#!/bin/bash\n#SBATCH --nodes=1\nrm -rf $DIR/*\n")
    assert subprocess.run([SHELLCHECK, str(bad)], capture_output=True).returncode != 0

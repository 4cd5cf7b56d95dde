"""Every rendered artifact checked against real references, inside the project's own suite:
Kubernetes 1.34 strict schemas (kubernetes-validate), shellcheck, cloud-config shape and size."""

import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest

from cli import artifacts
from components import bootstrap
from core import settings, trusted_yaml
from tests.conftest import run_program
from tests.core.test_settings_refusals import _rsa_line

SHELLCHECK = Path(sys.executable).parent / "shellcheck"
KUBERNETES = "1.34"
# cloud-config keys this program uses, all from cloud-init's documented modules
# (cc_write_files, cc_runcmd, cc_ssh: ssh_authorized_keys).
CLOUD_CONFIG_KEYS = {"write_files", "runcmd", "ssh_authorized_keys"}
# Custom resources: checked against their CRD schemas by ../shared/tools/check_artifacts.py
# (a development aid); here, their group/version and required fields.
CUSTOM_RESOURCES = {
    ("keda.sh/v1alpha1", "ScaledObject"): ("scaleTargetRef", "triggers"),
    ("slinky.slurm.net/v1beta1", "NodeSet"): ("controllerRef",),
    ("kubeflow.org/v1", "PyTorchJob"): ("pytorchReplicaSpecs",),
    ("cert-manager.io/v1", "ClusterIssuer"): (),
    ("kueue.x-k8s.io/v1beta2", "ResourceFlavor"): ("nodeLabels",),
    ("kueue.x-k8s.io/v1beta2", "ClusterQueue"): ("cohortName", "resourceGroups"),
    ("kueue.x-k8s.io/v1beta2", "LocalQueue"): ("clusterQueue",),
    ("kueue.x-k8s.io/v1beta2", "WorkloadPriorityClass"): (),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ("selector", "endpoints"),
    # slurm-operator v1.0.5 CRD (helm/slurm-operator-crds/templates/slinky.slurm.net_tokens.yaml): required
    ("slinky.slurm.net/v1beta1", "Token"): ("jwtHs256KeyRef", "username"),
}
# One worker runs the module, so `rendered` renders once, not once per worker that runs a test of it.
pytestmark = pytest.mark.xdist_group("artifacts")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("render")
    artifacts.render(run_program(), out)
    return out


def manifests(rendered):
    for path in sorted((rendered / "manifests").glob("*.yaml")):
        for obj in trusted_yaml.load_all(path.read_text()):
            yield path.name, obj


def test_render_writes_every_kind_of_artifact(rendered):
    for folder in ("cloud-init", "scripts", "values", "manifests"):
        assert any((rendered / folder).iterdir()), folder
    kinds = {obj["kind"] for _, obj in manifests(rendered)}
    assert {"PersistentVolume", "ScaledObject"} <= kinds


def test_built_in_kinds_pass_kubernetes_strict_schemas(rendered):
    checked = 0
    for _name, obj in manifests(rendered):
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_RESOURCES:
            continue
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)
        checked += 1
    assert checked


def test_a_broken_manifest_is_caught_by_the_same_check():
    bad = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": "x"},
        "spec": {"capacity": {"storage": "1Gi"}, "claimref": {}},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES, strict=True)


def test_custom_resources_use_the_served_version_and_required_fields(rendered):
    for name, obj in manifests(rendered):
        key = (obj["apiVersion"], obj["kind"])
        if key[1] in {k for _, k in CUSTOM_RESOURCES}:
            assert key in CUSTOM_RESOURCES, name
            assert all(field in obj["spec"] for field in CUSTOM_RESOURCES[key]), name


def test_every_rendered_script_passes_shellcheck(rendered):
    scripts = sorted((rendered / "scripts").iterdir())
    assert len(scripts) >= 8
    # A script rendered as the repository holds it is checked there (tests/components/
    # test_bootstrap.py test_scripts_pass_shellcheck); the ones the render changed are checked here,
    # with the library they source.
    source = {p.name: p.read_bytes() for p in bootstrap.SCRIPTS_DIR.glob("*.sh")}
    changed = [p for p in scripts if source.get(p.name) != p.read_bytes()]
    assert changed, "the render fills in the node scripts' parameters"
    sourced = rendered / "scripts" / "testbed-lib.sh"
    result = subprocess.run(
        [str(SHELLCHECK), "-x", "-f", "gcc", *map(str, sorted({*changed, sourced}))],
        capture_output=True,
        text=True,
        cwd=rendered / "scripts",
    )
    assert result.returncode == 0, result.stdout


def test_every_user_data_is_a_small_valid_cloud_config(rendered):
    for path in sorted((rendered / "cloud-init").iterdir()):
        raw = path.read_bytes()
        assert len(raw) <= bootstrap.USER_DATA_LIMIT, path.name
        text = raw.decode()
        assert text.startswith("#cloud-config\n"), path.name
        doc = trusted_yaml.load(text)
        assert set(doc) <= CLOUD_CONFIG_KEYS, path.name
        for f in doc["write_files"]:
            assert f["path"].startswith("/") and isinstance(f["content"], str)
            assert len(f["permissions"]) == 4 and int(f["permissions"], 8) <= 0o777
        assert all(isinstance(c, list) and all(isinstance(a, str) for a in c) for c in doc["runcmd"])


def test_the_largest_supported_stack_still_fits_user_data(tmp_path):
    key = _rsa_line(8192) + " "
    key += "x" * (settings.SSH_KEY_MAX_CHARS - len(key))  # the longest key line settings accept
    artifacts.render(run_program(sshPublicKey=key, workerCount=8), tmp_path)
    assert max(p.stat().st_size for p in (tmp_path / "cloud-init").iterdir()) <= bootstrap.USER_DATA_LIMIT


def test_helm_values_of_the_slurm_chart_keep_the_100_traps_out(rendered):
    values = trusted_yaml.load((rendered / "values" / "slurm.yaml").read_text())
    assert values["controller"]["persistence"].get("existingClaim") is None
    assert values["controller"]["persistence"].get("storageClassName") is None
    device_plugin = trusted_yaml.load((rendered / "values" / "nvidia-device-plugin.yaml").read_text())
    assert "failOnInitError" not in device_plugin

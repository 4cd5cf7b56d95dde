import pytest

from components import slinky, slurm_config
from core import host_layout
from core.names import SLURM_NAMESPACE, SlurmNames, helm_fullname, slurm_names

VERSION = "1.0.0"


def values(nodeset="slinky"):
    return slinky.slurm_values(
        VERSION, "25.11.6-ubuntu24.04", slurm_names(nodeset), service_monitor_labels={"release": "monitoring"}
    )


@pytest.mark.parametrize("release, fullname", [("slurm", "slurm"), ("hpc", "hpc-slurm"), ("my-slurm-2", "my-slurm-2")])
def test_fullname_follows_the_chart_helper(release, fullname):
    assert helm_fullname(release) == fullname


def test_names_derive_from_release_and_nodeset():
    n = SlurmNames(release="hpc", namespace="batch", nodeset="gpu")
    assert n.statesave_claim == "statesave-hpc-slurm-controller-0"
    assert n.nodeset_resource == "hpc-slurm-worker-gpu"
    assert n.cluster_name == "batch_hpc-slurm"


def test_statesave_volume_is_prebound_to_the_charts_claim_on_the_control_node():
    n = slurm_names("slinky")
    pv = slinky.statesave_volume(n)["spec"]
    assert pv["claimRef"]["name"] == "statesave-slurm-controller-0" == n.statesave_claim
    assert pv["claimRef"]["namespace"] == SLURM_NAMESPACE
    assert "storageClassName" not in pv
    assert pv["persistentVolumeReclaimPolicy"] == "Retain"
    assert pv["hostPath"]["path"] == host_layout.SLURM_STATE_DIR
    term = pv["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert term["key"] == host_layout.CONTROL_PLANE_NODE_LABEL


def test_statesave_volume_holds_what_the_chart_requests():
    requested = values()["controller"]["persistence"]["resources"]["requests"]["storage"]
    assert slinky.statesave_volume(slurm_names("slinky"))["spec"]["capacity"]["storage"] == requested


def test_the_100_template_traps_are_avoided():
    persistence = values()["controller"]["persistence"]
    assert persistence.get("existingClaim") is None and persistence.get("storageClassName") is None


def test_slurmctld_runs_on_the_control_node_as_slurm_with_fsgroup_401():
    spec = values()["controller"]["podSpec"]
    assert spec["nodeSelector"] == {host_layout.CONTROL_PLANE_NODE_LABEL: ""}
    assert {"key": host_layout.CONTROL_PLANE_TAINT, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 401, "runAsGroup": 401, "fsGroup": 401}
    assert host_layout.SLURM_UID == 401


def test_gpu_nodeset_one_gpu_per_pod_with_gres_and_autodetect():
    v = values()
    nodeset = v["nodesets"]["slinky"]
    assert nodeset["enabled"] is True and nodeset["replicas"] == 0
    assert nodeset["slurmd"]["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert nodeset["extraConfMap"]["Gres"] == ["gpu:tesla:1"]
    assert nodeset["podSpec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert v["configFiles"]["gres.conf"].strip() == "AutoDetect=nvidia"


def test_shared_directory_is_mounted_in_slurmctld_and_slurmd():
    v = values()
    for pod, container in (
        (v["controller"]["podSpec"], v["controller"]["slurmctld"]),
        (v["nodesets"]["slinky"]["podSpec"], v["nodesets"]["slinky"]["slurmd"]),
    ):
        (volume,) = [vol for vol in pod["volumes"] if vol["hostPath"]["path"] == host_layout.SHARE_DIR]
        assert {"name": volume["name"], "mountPath": host_layout.SHARE_DIR} in container["volumeMounts"]


def test_images_are_pinned_to_the_configured_tag():
    v = values()
    images = [
        v["controller"]["slurmctld"]["image"],
        v["controller"]["reconfigure"]["image"],
        v["restapi"]["slurmrestd"]["image"],
        v["nodesets"]["slinky"]["slurmd"]["image"],
        v["controller"]["logfile"]["image"],
        v["nodesets"]["slinky"]["logfile"]["image"],
    ]
    assert all(i["tag"] not in ("", "latest") for i in images)
    assert {i["tag"] for i in images[:4]} == {"25.11.6-ubuntu24.04"}


def test_login_set_disabled_metrics_and_service_monitor_on_with_the_prometheus_label():
    v = values()
    assert v["loginsets"]["slinky"]["enabled"] is False
    assert v["controller"]["metrics"]["enabled"] is True
    assert v["controller"]["metrics"]["serviceMonitor"]["enabled"] is True
    assert v["controller"]["metrics"]["serviceMonitor"]["labels"] == {"release": "monitoring"}


def test_default_partition_is_all_and_takes_every_nodeset():
    partition = values()["partitions"]["all"]
    assert partition["configMap"]["Default"] == "YES" and partition["nodesets"] == ["ALL"]


def test_a_renamed_nodeset_disables_the_charts_default_entry_and_keeps_a_complete_spec():
    v = values("gpu")
    assert v["nodesets"]["slinky"]["enabled"] is False
    gpu = v["nodesets"]["gpu"]
    assert gpu["updateStrategy"]["type"] == "RollingUpdate"  # the operator webhook requires it
    assert gpu["logfile"]["image"]["tag"] == "3.22.1"


def test_operator_webhook_probe_points_at_the_slurm_controller():
    n = slurm_names("slinky")
    probe = slinky.operator_webhook_probe(n)
    assert probe["spec"]["controllerRef"] == {"name": n.fullname}


def test_operator_webhook_probe_is_a_nodeset_the_webhook_validates_and_the_operator_ignores():
    probe = slinky.operator_webhook_probe(slurm_names("slinky"))
    assert probe == {
        "apiVersion": "slinky.slurm.net/v1beta1",
        "kind": "NodeSet",
        "metadata": {"name": "testbed-webhook-probe", "namespace": "slinky"},
        "spec": {
            "controllerRef": {"name": "slurm"},
            "replicas": 0,
            "updateStrategy": {"type": "RollingUpdate"},
        },
    }


def test_the_shared_directory_is_the_hosts_own_directory_mounted_by_name():
    v = values()
    shared = {"name": "shared", "hostPath": {"path": "/mnt/share", "type": "Directory"}}
    assert shared in v["controller"]["podSpec"]["volumes"] and shared in v["nodesets"]["slinky"]["podSpec"]["volumes"]
    mount = {"name": "shared", "mountPath": "/mnt/share"}
    assert v["controller"]["slurmctld"]["volumeMounts"] == [mount]
    assert v["nodesets"]["slinky"]["slurmd"]["volumeMounts"] == [mount]


def test_every_slinky_image_comes_from_the_project_registry_at_the_tag():
    v = values()
    tag = "25.11.6-ubuntu24.04"
    assert v["controller"]["slurmctld"]["image"] == {"repository": "ghcr.io/slinkyproject/slurmctld", "tag": tag}
    assert v["controller"]["reconfigure"]["image"] == {"repository": "ghcr.io/slinkyproject/slurmctld", "tag": tag}
    assert v["restapi"]["slurmrestd"]["image"] == {"repository": "ghcr.io/slinkyproject/slurmrestd", "tag": tag}
    assert v["nodesets"]["slinky"]["slurmd"]["image"] == {"repository": "ghcr.io/slinkyproject/slurmd", "tag": tag}


def test_charts_are_the_slinky_oci_charts_at_the_version():
    charts = {
        c.release: c
        for c in (
            slinky.crds_chart("1.2.3"),
            slinky.operator_chart("1.2.3"),
            slinky.slurm_chart("1.2.3", slurm_names("slinky")),
        )
    }
    assert {n: (c.namespace, c.chart, c.version, c.repo) for n, c in charts.items()} == {
        "slurm-operator-crds": ("slinky", "oci://ghcr.io/slinkyproject/charts/slurm-operator-crds", "1.2.3", None),
        "slurm-operator": ("slinky", "oci://ghcr.io/slinkyproject/charts/slurm-operator", "1.2.3", None),
        "slurm": ("slurm", "oci://ghcr.io/slinkyproject/charts/slurm", "1.2.3", None),
    }


def test_partition_limits_given_alone_still_bring_the_submit_check():
    """MaxTime without MaxNodes: both partitions carry it and job_submit.lua, which refuses a longer
    --time, is installed; with neither, the chart's partitions (MaxTime UNLIMITED) stay."""
    n = slurm_names("slinky")
    v = slinky.slurm_values(VERSION, "25.11.6-ubuntu24.04", n, max_minutes=30)
    assert v["partitions"]["all"]["configMap"] == {"State": "UP", "Default": "YES", "MaxTime": 30}
    assert v["nodesets"]["slinky"]["partition"]["configMap"] == {"MaxTime": 30}
    assert v["controller"]["extraConfMap"]["JobSubmitPlugins"] == "lua" and "job_submit.lua" in v["configFiles"]
    assert values()["partitions"]["all"]["configMap"]["MaxTime"] == "UNLIMITED"


def test_slurmctld_records_each_jobs_output_digest_where_validate_reads_it():
    """One EpilogSlurmctld, the script the operator mounts in /etc/slurm, writing the directory
    validate reads (core/host_layout.py); tests/engines/test_output_digest.py runs it on slurmctld."""
    v = values()
    files = slurm_config.slurm_files(v, slurm_names("slinky"))
    epilogs = [
        line["epilogslurmctld"] for line in slurm_config.conf_lines(files["slurm.conf"]) if "epilogslurmctld" in line
    ]
    # The slurm chart 1.0.5 keys the script `epilog-slurmctld-<values key>` in its ConfigMap, and the
    # operator names that key in slurm.conf (render_charts.py showed both on the real chart).
    assert epilogs == [f"{slurm_config.SLURM_ETC}/epilog-slurmctld-{slinky.OUTPUT_DIGEST_SCRIPT.name}"]
    script = files[epilogs[0].rsplit("/", 1)[1]]
    assert f"\nDIGEST_DIR={host_layout.OUTPUT_DIGEST_DIR}\n" in script
    assert host_layout.OUTPUT_DIGEST_DIR.startswith(host_layout.SLURM_STATE_DIR + "/")


def test_token_creation_is_disabled_with_or_without_partition_limits():
    """The AuthAltParameters override does not ride on the partition limits' extraConfMap: the
    chart values without limits still end slurm.conf with it, last (Slurm keeps the last value)."""
    for v in (values(), slinky.slurm_values(VERSION, "25.11.6-ubuntu24.04", slurm_names("slinky"), max_nodes=4)):
        conf = slurm_config.slurm_conf(v, slurm_names("slinky"))
        effective = slurm_config.global_setting(conf, "AuthAltParameters", "")
        assert effective == f"{slurm_config.OPERATOR_AUTH_ALT_PARAMETERS},{slinky.DISABLE_TOKEN_CREATION}"

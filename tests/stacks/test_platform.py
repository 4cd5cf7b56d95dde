"""The platform layer as the engine sees it: install order, names that must agree, pins."""

import json
import re
import shlex

import pytest

from cli import artifacts
from components import fair_share_controller, helm, images, monitoring, slinky, slurm_config, training_operator
from core import names, trusted_yaml
from stacks.offline import ROOT, reveal
from tests import tokens
from tests.conftest import by_type, depends, run_program, step_args
from tests.core.test_versions import article_config


def release(rec, name):
    (found,) = [r for r in by_type(rec, tokens.RELEASE) if r.inputs["name"] == name]
    return found


def command(rec, name):
    return rec.named(name)


def test_every_release_is_pinned_and_named(default_run):
    releases = {r.inputs["name"]: r.inputs for r in by_type(default_run, tokens.RELEASE)}
    assert set(releases) == {
        "nvidia-device-plugin",
        "cert-manager",
        "monitoring",
        "dcgm-exporter",
        "slurm-operator-crds",
        "slurm-operator",
        "slurm",
        "kueue",
        "keda",
    }
    for name, inputs in releases.items():
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", inputs["version"]), name
    s = default_run.settings
    assert releases["cert-manager"]["version"] == s.cert_manager_version == "v1.19.6"
    assert releases["keda"]["version"] == "2.20.2" and releases["nvidia-device-plugin"]["version"] == "0.17.4"
    assert {releases[n]["version"] for n in ("slurm-operator-crds", "slurm-operator", "slurm")} == {"1.0.5"}
    assert releases["slurm"]["chart"].startswith("oci://ghcr.io/slinkyproject/charts/")


def test_every_kubernetes_resource_uses_the_gated_provider(default_run):
    (provider,) = by_type(default_run, tokens.KUBERNETES_PROVIDER)
    gate = command(default_run, "testbed-readiness-wait")
    for r in default_run.resources:
        if r.type.startswith("kubernetes:"):
            assert r.provider.split("::")[:-1] == provider.urn.split("::"), r.name
    assert gate.urn in provider.depends_on


def test_install_order(default_run):
    rec = default_run
    cert_manager, cm_gate = release(rec, "cert-manager"), command(rec, "testbed-cert-manager-webhook-gate")
    operator, crds, slurm = release(rec, "slurm-operator"), release(rec, "slurm-operator-crds"), release(rec, "slurm")
    operator_gate = command(rec, "testbed-slinky-operator-webhook-gate")
    pv = by_type(rec, tokens.PERSISTENT_VOLUME)[0]
    stack, keda = release(rec, "monitoring"), release(rec, "keda")
    (scaled_object,) = by_type(rec, tokens.SCALED_OBJECT)
    assert cert_manager.urn in cm_gate.depends_on  # the gate probes the release it waits for
    assert cm_gate.urn in operator.depends_on  # the operator waits for the gate itself
    assert crds.urn in operator.depends_on
    assert depends(rec, operator_gate, operator)
    for before in (operator_gate, pv, stack):
        assert before.urn in slurm.depends_on
    for before in (keda, slurm):
        assert depends(rec, scaled_object, before)
    assert depends(rec, release(rec, "dcgm-exporter"), stack)  # its ServiceMonitor needs the CRD


def test_claim_ref_matches_the_pvc_the_slurm_release_creates(default_run):
    pv = by_type(default_run, tokens.PERSISTENT_VOLUME)[0]
    slurm = release(default_run, "slurm")
    derived = names.SlurmNames(
        release=slurm.inputs["name"], namespace=slurm.inputs["namespace"], nodeset=default_run.settings.nodeset_name
    )
    claim = pv.inputs["spec"]["claimRef"]
    assert (claim["namespace"], claim["name"]) == (slurm.inputs["namespace"], "statesave-slurm-controller-0")
    assert claim["name"] == derived.statesave_claim


def test_scaled_object_targets_the_nodeset_the_slurm_release_creates(default_run):
    (so,) = by_type(default_run, tokens.SCALED_OBJECT)
    slurm = release(default_run, "slurm")
    nodeset_keys = [k for k, v in slurm.inputs["values"]["nodesets"].items() if v.get("enabled")]
    assert nodeset_keys == [default_run.settings.nodeset_name]
    target = so.inputs["spec"]["scaleTargetRef"]
    assert target == {
        "apiVersion": "slinky.slurm.net/v1beta1",
        "kind": "NodeSet",
        "name": f"{slurm.inputs['name']}-worker-{nodeset_keys[0]}",
    }
    assert so.inputs["metadata"]["namespace"] == slurm.inputs["namespace"]


def test_the_queries_select_the_objects_the_releases_create(default_run):
    """The NodeSet pods by the namespace and name KEDA scales, the RestApi by the Deployment the
    operator names `<release>-restapi` (SlinkyProject/slurm-operator@v1.0.0:api/v1beta1/restapi_keys.go),
    and Kueue's pending GPUs by the resource the example jobs ask for."""
    (so,) = by_type(default_run, tokens.SCALED_OBJECT)
    slurm = release(default_run, "slurm")
    queries = {t["name"]: t["metadata"]["query"] for t in so.inputs["spec"]["triggers"]}
    pods = f'{{namespace="{slurm.inputs["namespace"]}", created_by_kind="NodeSet", '
    pods += f'created_by_name="{so.inputs["spec"]["scaleTargetRef"]["name"]}"}}'
    assert pods in queries["slurmd_pods"] and pods in queries["hold_while_restapi_down"]
    restapi = f'{{namespace="{slurm.inputs["namespace"]}", deployment="{slurm.inputs["name"]}-restapi"}}'
    assert restapi in queries["hold_while_restapi_down"]
    assert images.example_gpu_images()  # the example jobs ask for GPU_RESOURCE
    assert re.findall(r'resource="[^"]+"', queries["ai_waiting"]) == [f'resource="{names.GPU_RESOURCE}"']


def test_the_demand_aware_modifiers_are_the_fields_kedas_crd_defines(default_run):
    """ScalingModifiers (kedacore/keda@v2.20.2:apis/keda/v1alpha1/scaledobject_types.go): formula,
    target, activationTarget, metricType; unknown keys would be pruned by the API server."""
    (so,) = by_type(default_run, tokens.SCALED_OBJECT)
    modifiers = so.inputs["spec"]["advanced"]["scalingModifiers"]
    assert set(modifiers) == {"formula", "target", "activationTarget", "metricType"}
    assert (modifiers["target"], modifiers["activationTarget"], modifiers["metricType"]) == ("1", "0", "AverageValue")


def test_scaled_object_reads_the_prometheus_of_the_monitoring_release(default_run):
    (so,) = by_type(default_run, tokens.SCALED_OBJECT)
    stack = reveal(release(default_run, "monitoring").inputs)
    fullname = stack["values"]["fullnameOverride"]
    expected = f"http://{fullname}-prometheus.{stack['namespace']}.svc:{names.PROMETHEUS_PORT}"
    assert {t["metadata"]["serverAddress"] for t in so.inputs["spec"]["triggers"]} == {expected}


def test_queries_watch_every_partition_the_nodeset_serves(default_run):
    """The default partition (a plain sbatch) and the NodeSet's own one (`-p <nodeset key>`)."""
    (so,) = by_type(default_run, tokens.SCALED_OBJECT)
    values = release(default_run, "slurm").inputs["values"]
    (default,) = [name for name, p in values["partitions"].items() if p["configMap"].get("Default") == "YES"]
    (own,) = [key for key, n in values["nodesets"].items() if n.get("enabled") and n["partition"]["enabled"]]
    slurm_triggers = [t for t in so.inputs["spec"]["triggers"] if "slurm_" in t["metadata"]["query"]]
    assert {p for t in slurm_triggers for p in re.findall(r'partition="([^"]+)"', t["metadata"]["query"])} == {
        default,
        own,
    }


def test_partitions_refuse_a_job_larger_than_the_nodeset_at_submit(default_run):
    values = release(default_run, "slurm").inputs["values"]
    (so,) = by_type(default_run, tokens.SCALED_OBJECT)
    assert values["controller"]["extraConfMap"]["EnforcePartLimits"] == "NO"
    limits = {
        values["partitions"]["all"]["configMap"]["MaxNodes"],
        values["nodesets"]["slinky"]["partition"]["configMap"]["MaxNodes"],
    }
    assert limits == {so.inputs["spec"]["maxReplicaCount"]}


@pytest.mark.parametrize("minutes", [None, 90])  # 90: test_plan's, one recording for both
def test_both_partitions_end_a_job_at_slurm_job_max_minutes(default_run, minutes):
    """MaxTime on `all` (the chart's UNLIMITED replaced) and on the NodeSet's own partition, in the
    slurm.conf the operator assembles: the bound on how long AI waits for a GPU slurmd borrowed."""
    rec = default_run if minutes is None else run_program(slurmJobMaxMinutes=minutes)
    conf = artifacts.slurm_files(rec)["slurm.conf"]
    want = minutes or 60  # slurmJobMaxMinutes' documented default
    assert slurm_config.partition_max_minutes(conf) == {"all": want, "slinky": want}


def test_slurmctld_sizes_gpu_only_jobs_with_the_shipped_job_submit_lua(default_run):
    values = release(default_run, "slurm").inputs["values"]
    assert values["controller"]["extraConfMap"]["JobSubmitPlugins"] == "lua"
    assert values["configFiles"]["job_submit.lua"] == slinky.JOB_SUBMIT_LUA.read_text()


def test_slurmctld_mints_tokens_for_root_and_slurmuser_only(default_run):
    """The deployed slurm.conf gives AuthAltParameters twice: the operator's `jwt_key=` line, then
    the program's in EXTRA CONFIG, which Slurm keeps (the last value read): the same key file, so
    slurmctld still checks the exporter Token's JWT, and disable_token_creation, so `scontrol token`
    mints no token for any other user (tests/engines/test_slurm_token.py runs this file). The real
    chart 1.0.5 renders the same line in the Controller's extraConf (render_charts.py)."""
    conf = artifacts.slurm_files(default_run)["slurm.conf"]
    given = [line["authaltparameters"] for line in slurm_config.conf_lines(conf) if "authaltparameters" in line]
    assert given[0] == slurm_config.OPERATOR_AUTH_ALT_PARAMETERS
    assert conf.index("### EXTRA CONFIG ###") < conf.rindex("AuthAltParameters=")
    options = slurm_config.global_setting(conf, "AuthAltParameters", "").split(",")
    assert slinky.DISABLE_TOKEN_CREATION in options
    # auth_jwt.c _init_hs256 reads the first jwt_key= option; without one it looks in StateSaveLocation.
    assert [o for o in options if o.startswith("jwt_key=")] == [slurm_config.OPERATOR_AUTH_ALT_PARAMETERS]
    (token,) = by_type(default_run, tokens.SLURM_TOKEN)
    assert slurm_config.JWT_KEY_FILE.endswith("/" + token.inputs["spec"]["jwtHs256KeyRef"]["key"])


def test_job_submit_lua_holds_jobs_to_the_stack_s_worker_type():
    """The node shape the script enforces is workerInstanceType's, from core/instance_types.py."""
    values = release(run_program(workerInstanceType="g5.2xlarge"), "slurm").inputs["values"]
    script = values["configFiles"]["job_submit.lua"]
    assert "local NODE_CPUS = 8\n" in script and 'local WORKER_TYPE = "g5.2xlarge"\n' in script
    assert f"local NODE_MEMORY_MB = {int(32 * 1024 * 0.9)}\n" in script


def test_service_monitors_carry_the_label_prometheus_selects(default_run):
    stack = reveal(release(default_run, "monitoring").inputs)["values"]
    assert stack["prometheus"]["prometheusSpec"]["serviceMonitorSelectorNilUsesHelmValues"] is True
    wanted = {"release": release(default_run, "monitoring").inputs["name"]}
    slurm = release(default_run, "slurm").inputs["values"]
    assert slurm["controller"]["metrics"]["serviceMonitor"]["labels"] == wanted
    dcgm = release(default_run, "dcgm-exporter").inputs["values"]
    assert dcgm["serviceMonitor"]["additionalLabels"] == wanted


@pytest.mark.parametrize("workers", [2, 7])  # 7: test_infrastructure's, one recording for both
def test_keda_bounds_follow_the_worker_count(workers):
    rec = run_program(workerCount=workers)
    (so,) = by_type(rec, tokens.SCALED_OBJECT)
    spec = so.inputs["spec"]
    assert spec["maxReplicaCount"] == workers  # every GPU: slurmd borrows AI's idle half
    assert f"({float(workers)} - " in spec["advanced"]["scalingModifiers"]["formula"], (
        "the reclaim cap counts the workers"
    )
    assert (spec["idleReplicaCount"], spec["minReplicaCount"]) == (0, 1)
    assert spec["cooldownPeriod"] == 0  # the formula policy keeps slurmd warm in its query
    assert "[330s:30s]" in _trigger(spec, "recently_busy")["metadata"]["query"]


def _trigger(spec: dict, name: str) -> dict:
    return next(t for t in spec["triggers"] if t["name"] == name)


def test_keda_settings_flow_into_the_scaled_object():
    rec = run_program(
        kedaCooldownSeconds=120, kedaPollingSeconds=15, kedaMaxReplicas=3, kedaMinReplicas=2, hpcBorrowsAiGpus="true"
    )
    (so,) = by_type(rec, tokens.SCALED_OBJECT)
    spec = so.inputs["spec"]
    assert (spec["pollingInterval"], spec["minReplicaCount"], spec["maxReplicaCount"]) == (15, 2, 3)
    # kedaCooldownSeconds is how long slurmd stays warm when nobody waits: the query's window
    assert "[150s:30s]" in _trigger(spec, "recently_busy")["metadata"]["query"]
    assert spec["cooldownPeriod"] == 0
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == {
        "scaleDown": {"stabilizationWindowSeconds": 0}
    }


def test_nodeset_name_changes_every_place_it_must():
    rec = run_program(nodesetName="gpu", workerCount=2)  # test_names_contract's: one recording for both
    (so,) = by_type(rec, tokens.SCALED_OBJECT)
    assert so.inputs["spec"]["scaleTargetRef"]["name"] == "slurm-worker-gpu"
    nodesets = release(rec, "slurm").inputs["values"]["nodesets"]
    assert nodesets["gpu"]["enabled"] is True and nodesets["slinky"]["enabled"] is False


def test_sbatch_command_reaches_the_slurmctld_pod_with_the_hpc_kubeconfig(default_run):
    words = shlex.split(default_run.outputs["sbatchCommand"].split(" < ")[0])
    slurm = release(default_run, "slurm")
    (controller,) = [r for r in default_run.resources if r.type == tokens.ROLE and r.name.endswith("testbed-hpc-role")]
    # the pod the HPC Role names, in the release's namespace, with the kubeconfig the README saves
    role = reveal(controller.inputs)
    (pod,) = [rule["resourceNames"] for rule in role["rules"] if rule["resources"] == ["pods/exec"]]
    assert words[words.index("exec") + 2] in pod
    assert words[words.index("-n") + 1] == slurm.inputs["namespace"] == role["metadata"]["namespace"]
    saved = re.findall(r"--show-secrets hpcKubeconfig > ([\w.-]+)", (ROOT / "README.md").read_text())
    assert [words[words.index("--kubeconfig") + 1]] == saved
    assert words[-3:] == ["slurmctld", "--", "sbatch"]


def test_training_operator_is_applied_server_side_at_the_pinned_tag_and_removed_on_destroy(default_run):
    step = command(default_run, "testbed-training-operator-install")
    create = step_args(default_run, step.name)
    delete = step_args(default_run, step.name, "delete")
    overlay = "github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.4"
    assert (create["ACTION"], create["OVERLAY"]) == ("apply", overlay)
    assert (delete["ACTION"], delete["OVERLAY"]) == ("delete", overlay)
    assert (create["NAMESPACE"], create["DEPLOYMENT"]) == (names.TRAINING_NAMESPACE, training_operator.DEPLOYMENT)
    script = reveal(step.inputs["stdin"])
    assert 'kubectl apply --server-side --force-conflicts -k "$work"' in script
    # the applied kustomization is the same pinned overlay, not another source
    assert trusted_yaml.load(create["KUSTOMIZATION"])["resources"] == [overlay]
    probe = trusted_yaml.load(create["PROBE_MANIFEST"])
    containers = probe["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    assert probe["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] == 1 and containers[0]["name"] == "pytorch"


def test_cert_manager_gate_checks_healthz_and_a_dry_run(default_run):
    args = step_args(default_run, "testbed-cert-manager-webhook-gate")
    probe = trusted_yaml.load(args["PROBE_MANIFEST"])
    assert probe["apiVersion"].startswith("cert-manager.io/")
    assert args["HEALTH_NAMESPACE"] == release(default_run, "cert-manager").inputs["namespace"]
    assert "app.kubernetes.io/instance=cert-manager" in args["HEALTH_SELECTOR"]
    assert (args["HEALTH_PORT"], args["HEALTH_PATH"]) == ("6080", "healthz")


def test_no_loadbalancer_or_nodeport_services_by_default(default_run):
    for r in by_type(default_run, tokens.RELEASE):
        text = trusted_yaml.dump(reveal(r.inputs.get("values", {})))
        assert "LoadBalancer" not in text and "NodePort" not in text, r.inputs["name"]


@pytest.mark.parametrize(
    "gate, release_name",
    [
        ("testbed-cert-manager-webhook-gate", "cert-manager"),
        ("testbed-slinky-operator-webhook-gate", "slurm-operator"),
        ("testbed-keda-metrics-api", "keda"),
    ],
)
def test_gates_are_proven_again_when_their_release_is_upgraded(gate, release_name):
    default, upgraded = (
        run_program(),
        run_program(**article_config()),  # the article's set, as tests/core/test_versions.py runs it: one recording
    )
    for rec in (default, upgraded):
        triggers = reveal(rec.named(gate).inputs["triggers"])
        assert triggers[0] == release(rec, release_name).inputs["version"]
    assert reveal(default.named(gate).inputs["triggers"]) != reveal(upgraded.named(gate).inputs["triggers"])


def test_keda_installs_after_every_other_cluster_step(default_run):
    keda_component = default_run.named("testbed-keda")
    others = [
        r
        for r in default_run.resources
        if (r.type in (tokens.RELEASE, tokens.COMMAND) or r.type.startswith("kubernetes:core/"))
        and r.parent != keda_component.urn
    ]
    assert len(others) >= 10
    for r in others:
        assert depends(default_run, release(default_run, "keda"), r), r.name


def test_slurmctld_state_gets_its_pvc_and_the_pv_binds_to_exactly_that_claim(default_run):
    """The operator adds volumeClaimTemplate `statesave` to StatefulSet slurm-controller only when
    controller.persistence.enabled; the PV pre-bound by claimRef must name that PVC by kind,
    namespace and name, or it stays Available and slurmctld stays Pending."""
    slurm = release(default_run, "slurm")
    persistence = slurm.inputs["values"]["controller"]["persistence"]
    assert persistence["enabled"] is True
    assert persistence.get("existingClaim") is None and persistence.get("storageClassName") is None
    (pv,) = by_type(default_run, tokens.PERSISTENT_VOLUME)
    spec = pv.inputs["spec"]
    assert spec["claimRef"] == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "namespace": slurm.inputs["namespace"],
        "name": "statesave-slurm-controller-0",
    }
    assert spec["capacity"] == {"storage": persistence["resources"]["requests"]["storage"]} == {"storage": "4Gi"}
    assert spec["accessModes"] == ["ReadWriteOnce"] and spec["volumeMode"] == "Filesystem"
    assert "storageClassName" not in spec  # the chart's PVC has no class: a PV with one would not match
    assert spec["persistentVolumeReclaimPolicy"] == "Retain"
    assert spec["hostPath"] == {"path": "/var/spool/slurmctld", "type": "Directory"}
    assert spec["nodeAffinity"] == {
        "required": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}
            ]
        }
    }
    assert pv.inputs["metadata"]["name"] == "slurm-statesave"


def test_each_keda_trigger_is_a_prometheus_query_keda_can_use(default_run):
    """The queries themselves are the scaling rule's (tests/components/test_slurmd_scaling.py);
    here: what KEDA's prometheus scaler needs of each trigger (kedacore/keda@v2.20.2
    pkg/scalers/prometheus_scaler.go: serverAddress, query, threshold as strings)."""
    (so,) = by_type(default_run, tokens.SCALED_OBJECT)
    assert (so.inputs["apiVersion"], so.inputs["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    assert so.inputs["metadata"] == {"name": "slurmd", "namespace": "slurm"}
    triggers = so.inputs["spec"]["triggers"]
    assert triggers and len({t["name"] for t in triggers}) == len(triggers)
    formula = so.inputs["spec"]["advanced"]["scalingModifiers"]["formula"]
    for t in triggers:
        assert t["type"] == "prometheus" and t["metricType"] == "AverageValue", t["name"]
        assert {"serverAddress", "query", "threshold", "activationThreshold"} <= set(t["metadata"]), t["name"]
        assert (t["metadata"]["threshold"], t["metadata"]["activationThreshold"]) == ("1", "0")
        assert re.search(r"\b(slurm_partition|kube|kueue)_\w+\{", t["metadata"]["query"]), t["name"]
        assert all(isinstance(v, str) for v in t["metadata"].values()), t["name"]
        # scalingModifiers' formula names triggers as expr-lang variables (modifiers/formula.go)
        assert re.fullmatch(r"[A-Za-z_]\w*", t["name"]) and re.search(rf"\b{t['name']}\b", formula), t["name"]


def test_every_chart_comes_from_its_upstream_repository(default_run):
    charts = {
        r.inputs["name"]: (r.inputs["chart"], (r.inputs.get("repositoryOpts") or {}).get("repo"), r.inputs["namespace"])
        for r in by_type(default_run, tokens.RELEASE)
    }
    slinky = "oci://ghcr.io/slinkyproject/charts"
    assert charts == {
        "nvidia-device-plugin": (
            "nvidia-device-plugin",
            "https://nvidia.github.io/k8s-device-plugin",
            "nvidia-device-plugin",
        ),
        "cert-manager": ("cert-manager", "https://charts.jetstack.io", "cert-manager"),
        "monitoring": ("kube-prometheus-stack", "https://prometheus-community.github.io/helm-charts", "monitoring"),
        "dcgm-exporter": ("dcgm-exporter", "https://nvidia.github.io/dcgm-exporter/helm-charts", "monitoring"),
        "slurm-operator-crds": (f"{slinky}/slurm-operator-crds", None, "slinky"),
        "slurm-operator": (f"{slinky}/slurm-operator", None, "slinky"),
        "slurm": (f"{slinky}/slurm", None, "slurm"),
        "keda": ("keda", "https://kedacore.github.io/charts", "keda"),
        # Kueue publishes its chart only as an OCI artifact (kubernetes-sigs/kueue installation docs)
        "kueue": ("oci://registry.k8s.io/kueue/charts/kueue", None, "kueue-system"),
    }


def test_the_scaled_object_waits_for_kedas_external_metrics_api(default_run):
    args = step_args(default_run, "testbed-keda-metrics-api")
    assert (args["TESTBED_STEP"], args["RESOURCE"], args["CONDITION"]) == (
        "wait-condition.sh",
        "apiservice/v1beta1.external.metrics.k8s.io",  # the APIService KEDA's metrics server registers
        "Available",
    )
    assert int(args["TIMEOUT_SECONDS"]) == 600
    step = command(default_run, "testbed-keda-metrics-api")
    (so,) = by_type(default_run, tokens.SCALED_OBJECT)
    assert step.urn in so.depends_on and release(default_run, "keda").urn in step.depends_on


def test_keda_installs_its_crds_from_the_values_file(default_run):
    """KEDA's chart installs the ScaledObject CRD only with crds.install (values/keda.yaml)."""
    values = release(default_run, "keda").inputs["values"]
    assert (
        values == trusted_yaml.load((helm.VALUES_DIR / "keda.yaml").read_text()) and values["crds"]["install"] is True
    )


def test_prometheus_scrapes_the_kueue_metric_the_scaler_reads(default_run):
    """The demand-aware trigger reads kueue_cluster_queue_resource_pending for the AI ClusterQueue:
    Kueue must report it (metrics.enableClusterQueueResources), and a ServiceMonitor this Prometheus
    selects must scrape Kueue's metrics Service with a token allowed to read /metrics
    (kubernetes-sigs/kueue@v0.19.2: pkg/cache/queue/metrics.go, cmd/kueue/main.go, charts/kueue)."""
    (so,) = by_type(default_run, tokens.SCALED_OBJECT)
    (ai_waiting,) = [t for t in so.inputs["spec"]["triggers"] if t["name"] == "ai_waiting"]
    kueue_values = release(default_run, "kueue").inputs["values"]
    manager = trusted_yaml.load(kueue_values["managerConfig"]["controllerManagerConfigYaml"])
    assert manager["metrics"]["enableClusterQueueResources"] is True
    (local_queue,) = [  # the AI side's; the slurmd pods have their own (slurm/hpc)
        q
        for q in by_type(default_run, "kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue")
        if q.inputs["metadata"]["name"] == names.AI_LOCAL_QUEUE
    ]
    query = ai_waiting["metadata"]["query"]
    assert f'cluster_queue="{local_queue.inputs["spec"]["clusterQueue"]}"' in query
    assert f'kube_pod_status_unschedulable{{namespace="{local_queue.inputs["metadata"]["namespace"]}"}}' in query

    (monitor,) = [
        r
        for r in by_type(default_run, "kubernetes:monitoring.coreos.com/v1:ServiceMonitor")
        if r.inputs["metadata"]["namespace"] == release(default_run, "kueue").inputs["namespace"]
    ]
    stack = release(default_run, "monitoring")
    assert monitor.inputs["metadata"]["labels"] == {"release": stack.inputs["name"]}  # the stack's selector
    spec = monitoring.stack_values(
        default_run.settings.kube_prometheus_stack_version, names.Names.from_settings(default_run.settings)
    )["prometheus"]["prometheusSpec"]
    assert spec["serviceMonitorSelectorNilUsesHelmValues"] is True
    labels = monitor.inputs["spec"]["selector"]["matchLabels"]
    assert labels["app.kubernetes.io/instance"] == release(default_run, "kueue").inputs["name"]
    assert labels["app.kubernetes.io/component"] == "metrics-service"
    (endpoint,) = monitor.inputs["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["scheme"]) == ("https", "https")
    secret_name = endpoint["authorization"]["credentials"]["name"]
    (secret,) = [
        s for s in by_type(default_run, "kubernetes:core/v1:Secret") if s.inputs["metadata"]["name"] == secret_name
    ]
    assert secret.inputs["type"] == "kubernetes.io/service-account-token"
    account = secret.inputs["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    (binding,) = [
        b
        for b in by_type(default_run, "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")
        if b.inputs["metadata"]["name"] == account
    ]
    assert binding.inputs["roleRef"]["name"] == f"{release(default_run, 'kueue').inputs['name']}-metrics-reader"
    assert binding.inputs["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": secret.inputs["metadata"]["namespace"]}
    ]


def test_kueues_metrics_token_belongs_to_the_service_account_the_binding_names(default_run):
    """A service-account token Secret is filled by the token controller only for an existing
    account named in its annotation, and it is deleted if that account is missing
    (kubernetes/kubernetes@v1.34.0:pkg/controller/serviceaccount/tokens_controller.go)."""
    account = default_run.named("testbed-keda-kueue-scraper")
    token = default_run.named("testbed-keda-kueue-scraper-token")
    binding = default_run.named("testbed-keda-kueue-scraper-binding")
    sa = account.inputs["metadata"]
    assert token.inputs["type"] == "kubernetes.io/service-account-token"
    assert token.inputs["metadata"]["annotations"]["kubernetes.io/service-account.name"] == sa["name"]
    assert token.inputs["metadata"]["namespace"] == sa["namespace"]
    assert {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]} in binding.inputs["subjects"]
    assert depends(default_run, token, account)
    # API discovery fails while KEDA's metrics APIService is registered but not serving
    metrics_api = command(default_run, "testbed-keda-metrics-api")
    for later in (account, token, binding, default_run.named("testbed-keda-kueue-service-monitor")):
        assert depends(default_run, later, metrics_api), later.name


def test_the_operator_gate_dry_runs_a_nodeset_the_operators_webhook_validates(default_run):
    probe = trusted_yaml.load(step_args(default_run, "testbed-slinky-operator-webhook-gate")["PROBE_MANIFEST"])
    assert (probe["apiVersion"], probe["kind"]) == ("slinky.slurm.net/v1beta1", "NodeSet")


@pytest.mark.parametrize("name", ["slurm-operator-crds", "slurm-operator"])
def test_the_operator_releases_take_their_values_files(default_run, name):
    from_file = trusted_yaml.load((helm.VALUES_DIR / f"{name}.yaml").read_text()) or {}
    assert release(default_run, name).inputs["values"] == from_file


def test_every_slurm_image_follows_slurm_image_tag_and_slurmd_pods_join_the_hpc_queue(default_run):
    values = release(default_run, "slurm").inputs["values"]
    (nodeset,) = [n for n in values["nodesets"].values() if n.get("enabled")]
    assert {values["controller"]["slurmctld"]["image"]["tag"], nodeset["slurmd"]["image"]["tag"]} == {
        default_run.settings.slurm_image_tag
    }
    # nodeset-cr.yaml passes .metadata to the NodeSet's pod template (worker_app.go PodMetadata)
    (hpc_queue,) = [
        q
        for q in by_type(default_run, "kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue")
        if q.inputs["metadata"]["namespace"] == release(default_run, "slurm").inputs["namespace"]
    ]
    assert nodeset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == hpc_queue.inputs["metadata"]["name"]


def test_the_statesave_volume_does_not_hold_destroy_on_its_claim(default_run):
    """pulumi-kubernetes waits on no PV carrying skipAwait; the PVC outlives the release."""
    (pv,) = by_type(default_run, "kubernetes:core/v1:PersistentVolume")
    assert pv.inputs["metadata"]["annotations"] == {"pulumi.com/skipAwait": "true"}


# ------------------------------------------------------------------ the fair-share controller


def _fair_share(rec):
    component = rec.named("testbed-fair-share")
    assert component.type == tokens.FAIR_SHARE_CONTROLLER
    return [r for r in rec.resources if r.parent == component.urn]


def _cluster_queues(rec):
    queues = [r for r in rec.resources if r.type == f"kubernetes:{names.KUEUE_GROUP_VERSION}:ClusterQueue"]
    assert len(queues) == 2
    return queues


def _deployment(rec, parts):
    (deployment,) = [r for r in parts if r.type == tokens.DEPLOYMENT]
    return deployment


def test_the_fair_share_controller_starts_after_kueue_s_queues_and_gate_and_prometheus(default_run):
    deployment = _deployment(default_run, _fair_share(default_run))
    for before in [*_cluster_queues(default_run), command(default_run, "testbed-kueue-webhook-gate")]:
        assert depends(default_run, deployment, before), before.name
    assert depends(default_run, deployment, release(default_run, "monitoring"))
    for part in _fair_share(default_run):  # its RBAC and code before it
        assert part is deployment or depends(default_run, deployment, part) or part.type == tokens.NAMESPACE
    assert depends(default_run, release(default_run, "keda"), deployment), "KEDA last, as ever"


def test_the_controller_may_get_and_patch_the_two_queues_kueue_creates_and_nothing_else(default_run):
    from tests.stacks import rbac_evaluator as rbac

    parts = [reveal(r.inputs) for r in _fair_share(default_run)]
    rbac_objects = [o for o in parts if o["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
    (deployment,) = [o for o in parts if o["kind"] == "Deployment"]
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    namespace = deployment["metadata"]["namespace"]
    user = f"system:serviceaccount:{namespace}:{account}"
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]
    queues = sorted(reveal(q.inputs)["metadata"]["name"] for q in _cluster_queues(default_run))
    group = names.KUEUE_GROUP_VERSION.split("/")[0]

    def may(verb, resource, name="", where="", grp=group):
        return rbac.allowed(rbac_objects, user, groups, rbac.Request(verb, grp, resource, where, name))

    for queue in queues:
        assert may("get", "clusterqueues", queue) and may("patch", "clusterqueues", queue), queue
        assert not may("update", "clusterqueues", queue) and not may("delete", "clusterqueues", queue)
        # the quota policy leaves the status subresource to RBAC, which grants none of it
        status = rbac.Request("patch", group, "clusterqueues", "", queue, subresource="status")
        assert not rbac.allowed(rbac_objects, user, groups, status)
    assert not may("patch", "clusterqueues", "other") and not may("list", "clusterqueues")
    assert not may("patch", "localqueues", queues[0], "default")
    assert not may("get", "secrets", "", namespace, "") and not may("list", "secrets", "", namespace, "")
    assert not may("create", "pods", "", namespace, "") and not may("get", "pods", "", namespace, "")
    config = json.loads(next(o for o in parts if o["kind"] == "ConfigMap")["data"]["config.json"])
    assert sorted(config["clusterQueues"].values()) == queues, "it patches what it may patch"


def test_the_quota_policy_is_bound_before_the_controller_runs_for_the_account_it_runs_as(default_run):
    """What the controller's token may change (components/fair_share_controller.py quota_policy) is
    the program's policy, bound after it is created and before the pod starts, for the account
    the pod runs as, in the version of the queues the program creates."""
    from tests.components import cel_policy

    parts = _fair_share(default_run)
    deployment = _deployment(default_run, parts)
    (policy,) = [r for r in parts if r.type == tokens.VALIDATING_ADMISSION_POLICY]
    (binding,) = [r for r in parts if r.type == tokens.VALIDATING_ADMISSION_POLICY_BINDING]
    assert depends(default_run, binding, policy) and depends(default_run, deployment, binding)
    rendered = reveal(policy.inputs)
    n = names.Names.from_settings(default_run.settings)
    assert rendered == fair_share_controller.quota_policy(n)
    assert reveal(binding.inputs)["spec"]["policyName"] == rendered["metadata"]["name"]
    pod = reveal(deployment.inputs)
    user = (
        f"system:serviceaccount:{pod['metadata']['namespace']}:{pod['spec']['template']['spec']['serviceAccountName']}"
    )
    (queue, *_) = [reveal(q.inputs) for q in _cluster_queues(default_run)]
    (rule,) = rendered["spec"]["matchConstraints"]["resourceRules"]
    assert queue["apiVersion"].split("/")[0] in rule["apiGroups"] and rule["apiVersions"] == ["*"]
    changed = {**queue, "spec": {**queue["spec"], "stopPolicy": "HoldAndDrain"}}
    assert not cel_policy.admit(rendered, "UPDATE", changed, queue, user).allowed


def test_plan_says_what_the_controller_s_token_may_change_from_the_recorded_policy():
    rec = run_program(aiJobMaxMinutes=90, workerCount=2)  # the run-limit test's settings: one recording
    text = artifacts.plan_text(rec).replace("\n        ", " ")
    assert (
        "its token may change only the queues' nvidia.com/gpu nominalQuota and lendingLimit, from 0 to 2 GPUs" in text
    )
    assert f"{fair_share_controller.QUOTA_POLICY} refuses anything else" in text


def test_the_controller_runs_the_repository_s_files_against_the_scaler_s_prometheus(default_run):
    parts = {reveal(r.inputs)["kind"]: reveal(r.inputs) for r in _fair_share(default_run)}
    data = parts["ConfigMap"]["data"]
    for module in ("fair_share.py", "fair_share_loop.py"):
        assert data[module] == (ROOT / "components" / module).read_text(), module
    config = json.loads(data["config.json"])
    (scaled_object,) = by_type(default_run, tokens.SCALED_OBJECT)
    servers = {t["metadata"]["serverAddress"] for t in reveal(scaled_object.inputs)["spec"]["triggers"]}
    assert servers == {config["prometheusUrl"]}, "the Prometheus the scaler reads"
    (kueue_quota,) = [
        t["metadata"]["query"] for t in reveal(scaled_object.inputs)["spec"]["triggers"] if t["name"] == "ai_quota"
    ]
    assert config["clusterQueues"]["ai"] in kueue_quota, "the scaler follows the quota the controller moves"
    pod = parts["Deployment"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == default_run.settings.controller_image
    assert "@sha256:" in pod["containers"][0]["image"]
    assert pod["volumes"][0]["configMap"]["name"] == parts["ConfigMap"]["metadata"]["name"]


def test_the_controller_s_namespace_is_restricted_and_outside_the_tenants_and_kueue_s_reach(default_run):
    from components import kueue, tenant_volumes

    parts = {reveal(r.inputs)["kind"]: reveal(r.inputs) for r in _fair_share(default_run)}
    namespace = parts["Namespace"]["metadata"]
    assert namespace["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    cluster_wide = (
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    )
    for kind, part in parts.items():  # its own objects in it; only its RBAC and its policy are cluster-wide
        if kind != "Namespace":
            expected = None if kind in cluster_wide else namespace["name"]
            assert part["metadata"].get("namespace") == expected, kind
    assert namespace["name"] not in tenant_volumes.TENANT_NAMESPACES
    assert namespace["name"] not in kueue.managed_namespaces()


def test_a_changed_controller_image_reaches_the_deployment():
    image = "python:3.12.11-slim-bookworm@sha256:" + "b" * 64
    rec = run_program(controllerImage=image)
    for deployment in by_type(rec, tokens.DEPLOYMENT):  # the controller's and the runnable-jobs exporter's
        assert reveal(deployment.inputs)["spec"]["template"]["spec"]["containers"][0]["image"] == image


def test_doctor_checks_that_the_controller_s_pod_is_ready(default_run):
    from cli import doctor

    deployment = _deployment(default_run, _fair_share(default_run))
    assert reveal(deployment.inputs)["metadata"]["namespace"] in doctor.PLATFORM_NAMESPACES


# ------------------------------------------------------------------ the runnable-jobs exporter


def _runnable_exporter(rec):
    component = rec.named("testbed-runnable-exporter")
    assert component.type == tokens.RUNNABLE_EXPORTER
    return {r.type: r for r in rec.resources if r.parent == component.urn}


def test_the_exporter_starts_after_the_slurm_chart_and_the_monitoring_stack(default_run):
    parts = _runnable_exporter(default_run)
    slurm, stack = release(default_run, "slurm"), release(default_run, "monitoring")
    assert depends(default_run, parts[tokens.SLURM_TOKEN], slurm), "the Token CRD's operator and the JWT key"
    assert depends(default_run, parts[tokens.CONFIG_MAP], slurm), "the slurm namespace"
    deployment = parts[tokens.DEPLOYMENT]
    assert depends(default_run, deployment, parts[tokens.SLURM_TOKEN]) and depends(
        default_run, deployment, parts[tokens.CONFIG_MAP]
    )
    assert depends(default_run, parts[tokens.SERVICE_MONITOR], stack), "the ServiceMonitor CRD"
    assert depends(default_run, release(default_run, "keda"), deployment), "KEDA last, as ever"


def test_the_exporter_mounts_the_token_s_secret_signed_with_the_chart_s_key(default_run):
    parts = {t: reveal(r.inputs) for t, r in _runnable_exporter(default_run).items()}
    token, pod = parts[tokens.SLURM_TOKEN], parts[tokens.DEPLOYMENT]["spec"]["template"]["spec"]
    slurm = release(default_run, "slurm").inputs
    # token_keys.go (slurm-operator v1.0.5): key and written Secret in the Token's namespace, `<name>-jwt-<user>`
    assert token["metadata"]["namespace"] == slurm["namespace"] == parts[tokens.DEPLOYMENT]["metadata"]["namespace"]
    assert token["spec"]["jwtHs256KeyRef"]["name"] == f"{slurm['name']}-auth-jwths256"
    (jwt,) = [v for v in pod["volumes"] if "secret" in v]
    assert jwt["secret"]["secretName"] == f"{token['metadata']['name']}-jwt-{token['spec']['username']}"
    assert token["spec"]["username"] == "nobody" and token["spec"]["lifetime"] == "15m"
    assert pod["containers"][0]["image"] == default_run.settings.controller_image, "one pinned Python image"


def test_the_exporter_runs_the_repository_s_module(default_run):
    parts = {t: reveal(r.inputs) for t, r in _runnable_exporter(default_run).items()}
    code = parts[tokens.CONFIG_MAP]
    assert code["data"] == {"runnable_jobs.py": (ROOT / "components" / "runnable_jobs.py").read_text()}
    pod = parts[tokens.DEPLOYMENT]["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == code["metadata"]["name"]
    assert pod["containers"][0]["command"] == ["python", "-m", "components.runnable_jobs"]


def test_prometheus_scrapes_the_exporter_and_the_scaler_reads_what_it_serves(default_run):
    import dataclasses

    from components import runnable_jobs

    parts = {t: reveal(r.inputs) for t, r in _runnable_exporter(default_run).items()}
    deployment, service, monitor = parts[tokens.DEPLOYMENT], parts[tokens.SERVICE], parts[tokens.SERVICE_MONITOR]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    stack = release(default_run, "monitoring")
    assert {"release": stack.inputs["name"]}.items() <= monitor["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    assert monitor["spec"]["endpoints"][0]["port"] == port["name"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    exporter, listens = runnable_jobs.exporter_from_env({e["name"]: e["value"] for e in container["env"]})
    assert listens == port["port"] and {"name": port["targetPort"], "containerPort": listens} in container["ports"]
    served = {
        line.split(" ")[0]
        for line in dataclasses.replace(exporter, read=list).metrics().splitlines()
        if not line.startswith("#")
    }
    (scaled_object,) = by_type(default_run, tokens.SCALED_OBJECT)
    queries = " ".join(t["metadata"]["query"] for t in reveal(scaled_object.inputs)["spec"]["triggers"])
    # and the fair-share controller's, from the config its ConfigMap ships
    (code,) = [o for o in (reveal(r.inputs) for r in _fair_share(default_run)) if o["kind"] == "ConfigMap"]
    config = json.loads(code["data"][fair_share_controller.CONFIG_KEY])
    queries += " " + " ".join(config["queries"].values())
    read = set(re.findall(r'testbed_slurm_\w+\{partition="[^"]*"\}', queries))
    assert read and read == served, "the scaler and the controller read each series the exporter serves, and only those"
    rules = reveal(stack.inputs)["values"]["additionalPrometheusRulesMap"]
    alerts = {r["alert"]: r["expr"] for m in rules.values() for g in m["groups"] for r in g["rules"]}
    assert re.search(r"absent\((testbed_slurm_\w+\{[^}]*\})\)", alerts["SlurmRunnableJobsMissing"])[1] in served


def test_doctor_checks_that_the_exporter_s_pod_is_ready(default_run):
    from cli import doctor

    deployment = _runnable_exporter(default_run)[tokens.DEPLOYMENT]
    assert reveal(deployment.inputs)["metadata"]["namespace"] in doctor.PLATFORM_NAMESPACES

"""The hand-off dashboard (components/dashboard.py): it is what the program deploys, every query
names metrics and labels the exporters emit, and every object name comes from the stack."""

import json
import re

import pytest

from components import dashboard
from core import settings
from core.names import DEFAULT_PARTITION, Names
from tests.conftest import by_type, config

DEFAULT_NAMES = Names.from_settings(settings.load(config(), offline=True))

# dcgm-exporter 4.4.2-4.7.1 (the chart 4.7.1 pin). Metric names: etc/default-counters.csv at
# tag 4.4.2-4.7.1 (every non-comment row; DCGM_FI_DRIVER_VERSION is a label there, not a
# metric). Labels: internal/pkg/rendermetrics/render_metrics.go writes gpu, UUID,
# pci_bus_id, device, modelName, Hostname (+ label counters); the pod mapping
# (internal/pkg/transformation/const.go, kubernetes.go) adds pod, namespace, container.
# The chart's ServiceMonitor needs honorLabels: true, or Prometheus renames these three
# to exported_pod/... because the scrape target has its own pod/namespace/container.
DCGM_LABELS = {
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
    "pod",
    "namespace",
    "container",
}
DCGM_METRICS = [
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
]

# Slurm 25.11 OpenMetrics (SchedMD/slurm@slurm-25-11-0-1:src/plugins/metrics/openmetrics/openmetrics.c):
# ADD_METRIC_KEYVAL(..., partition_<x>, ..., "partition", name) emits slurm_partition_<x>{partition}.
# Only the names this project reads are listed; the doc prose's slurm_partition_pending_jobs is wrong.
SLURM_PARTITION = [
    "jobs_pending",
    "jobs_running",
    "jobs_max_job_nodes",
    "jobs_max_job_nodes_nohold",
    "jobs_min_job_nodes",
    "jobs_min_job_nodes_nohold",
    "nodes",
    "nodes_idle",
    "nodes_alloc",
    "nodes_mixed",
    "nodes_down",
    "nodes_drain",
    "cpus",
]

ALLOWED: dict[str, set[str]] = {
    **{m: DCGM_LABELS for m in DCGM_METRICS},
    **{f"slurm_partition_{m}": {"partition"} for m in SLURM_PARTITION},
    "slurm_jobs_pending": set(),  # openmetrics.c: ADD_METRIC(..., jobs_pending, ...) without labels
    # kube-state-metrics v2.17.0 (kube-prometheus-stack 80.9.2 -> chart 7.0.0), internal/store/pod.go:
    # default labels namespace, pod, uid; requests add container, node, resource, unit
    # (extended resources sanitised: nvidia.com/gpu -> nvidia_com_gpu, unit integer).
    "kube_pod_container_resource_requests": {"namespace", "pod", "uid", "container", "node", "resource", "unit"},
    "kube_pod_status_phase": {"namespace", "pod", "uid", "phase"},
    # internal/store/horizontalpodautoscaler.go: labels namespace, horizontalpodautoscaler.
    "kube_horizontalpodautoscaler_status_current_replicas": {"namespace", "horizontalpodautoscaler"},
    "kube_horizontalpodautoscaler_status_desired_replicas": {"namespace", "horizontalpodautoscaler"},
    # kedacore/keda@v2.20.2:pkg/metricscollector/prommetrics.go: keda_scaler_metrics_value
    # {namespace, metric, scaledObject, scaler, triggerIndex, type}.
    "keda_scaler_metrics_value": {"namespace", "metric", "scaledObject", "scaler", "triggerIndex", "type"},
}

GROUPING = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)"
KEYWORDS = {"and", "or", "unless", "bool", "offset"}


def parse(expr: str) -> tuple[set[str], set[str], dict[str, str]]:
    """(metric names, label names, {label: value}) of a PromQL expression."""
    matchers = dict(re.findall(r'([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)\s*"([^"]*)"', expr))
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    labels = set(matchers)
    for body in re.findall(GROUPING, text):
        labels |= set(re.findall(r"[a-zA-Z_]\w*", body))
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", re.sub(GROUPING, " ", text))
    metrics = {
        m.group(1)
        for m in re.finditer(r"([a-zA-Z_:][\w:]*)\s*(\()?", text)
        if not m.group(2) and m.group(1) not in KEYWORDS
    }
    return metrics, labels, matchers


def queries(names: Names = DEFAULT_NAMES):
    board = dashboard.handoff_dashboard(names)
    return [(p["title"], t) for p in board["panels"] for t in p["targets"]]


def problems(expr: str, legend: str = "") -> list[str]:
    metrics, labels, _ = parse(expr)
    found = [f"unknown metric {m}" for m in sorted(metrics - set(ALLOWED))]
    known = set().union(*(ALLOWED.get(m, set()) for m in metrics)) if metrics else set()
    used = labels | set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
    found += [f"label {label} not on {sorted(metrics)}" for label in sorted(used - known)]
    return found + ([] if metrics else ["no metric"])


def test_the_parser_reads_metrics_labels_and_matchers():
    metrics, labels, matchers = parse(
        'sum by (namespace) ((kube_pod_status_phase{phase="Pending"} == 1) * on (namespace, pod) group_left () '
        'max by (namespace, pod) (kube_pod_container_resource_requests{resource="nvidia_com_gpu"}))'
    )
    assert metrics == {"kube_pod_status_phase", "kube_pod_container_resource_requests"}
    assert labels == {"namespace", "pod", "phase", "resource"}
    assert matchers == {"phase": "Pending", "resource": "nvidia_com_gpu"}


def test_the_check_catches_wrong_names():
    assert problems('sum(slurm_partition_pending_jobs{partition="all"})') == [
        "unknown metric slurm_partition_pending_jobs",
        "label partition not on ['slurm_partition_pending_jobs']",
    ]
    assert problems("max by (exported_pod) (DCGM_FI_DEV_GPU_UTIL)") == [
        "label exported_pod not on ['DCGM_FI_DEV_GPU_UTIL']"
    ]
    assert problems("DCGM_FI_DEV_FB_USED", "{{node}}") == ["label node not on ['DCGM_FI_DEV_FB_USED']"]
    assert problems("vector(1)") == ["no metric"]


def test_the_program_deploys_the_dashboard_as_a_sidecar_config_map(default_run):
    (config_map,) = [
        m
        for m in by_type(default_run, "kubernetes:core/v1:ConfigMap")
        if m.parent == default_run.named("testbed-monitoring").urn
    ]
    (text,) = config_map.inputs["data"].values()
    assert json.loads(text) == dashboard.handoff_dashboard(DEFAULT_NAMES)


def test_the_dashboard_parses_and_is_loadable():
    board = json.loads(json.dumps(dashboard.handoff_dashboard(DEFAULT_NAMES)))
    assert board["uid"] == "gpu-handoff" and board["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) == 6
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource"]
    for p in board["panels"]:
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])


@pytest.mark.parametrize("title,target", queries(), ids=lambda v: v if isinstance(v, str) else v["refId"])
def test_every_query_names_real_metrics_and_labels(title, target):
    assert problems(target["expr"], target.get("legendFormat", "")) == []


def test_queries_name_the_objects_the_platform_creates(default_run):
    values = {}
    for _, target in queries():
        for label, value in parse(target["expr"])[2].items():
            values.setdefault(label, set()).add(value)
    (scaled_object,) = by_type(default_run, "kubernetes:keda.sh/v1alpha1:ScaledObject")
    so_name, namespace = scaled_object.inputs["metadata"]["name"], scaled_object.inputs["metadata"]["namespace"]
    # The partition plain `sbatch` lands in: the chart's default (values/slurm.yaml partitions.all).
    assert values["partition"] == {DEFAULT_PARTITION}
    # KEDA names its HPA keda-hpa-<ScaledObject> (kedacore/keda@v2.20.2:controllers/keda/hpa.go).
    assert values["horizontalpodautoscaler"] == {f"keda-hpa-{so_name}"}
    assert values["scaledObject"] == {so_name}
    assert namespace in values["namespace"]
    # NodeSet pods are <NodeSet>-<ordinal> (slurm-operator@v1.0.0 internal/controller/nodeset/utils/utils.go).
    assert f"{scaled_object.inputs['spec']['scaleTargetRef']['name']}-.*" in values["pod"]
    assert values["resource"] == {"nvidia_com_gpu"}


def test_the_dashboard_shows_what_the_issue_asks_for():
    used = set()
    for _, target in queries():
        used |= parse(target["expr"])[0]
    assert {
        "DCGM_FI_DEV_GPU_UTIL",
        "slurm_partition_jobs_pending",
        "slurm_partition_jobs_running",
        "slurm_partition_nodes_alloc",
        "kube_horizontalpodautoscaler_status_current_replicas",
        "kube_pod_container_resource_requests",
        "kube_pod_status_phase",
    } <= used
    holder = next(t for title, t in queries() if title.startswith("Who holds each GPU"))
    assert {"pod", "UUID", "Hostname"} <= parse(holder["expr"])[1]

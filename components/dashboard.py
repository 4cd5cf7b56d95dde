"""The Grafana dashboard of the live hand-off, generated from the names contract.

Every name a query or a description carries (namespace, NodeSet, KEDA's HPA and ScaledObject,
the partition) comes from `Names`, so `nodesetName` and the other settings reach the dashboard
as they reach the ScaledObject. Metric and label names are checked against the exporters'
sources in tests/validation/test_dashboard.py.
"""

from __future__ import annotations

from typing import Any

from core.names import DEFAULT_PARTITION, Names

UID = "gpu-handoff"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
STEP_COUNTS = {"defaults": {"min": 0, "decimals": 0, "custom": {"lineInterpolation": "stepAfter"}}, "overrides": []}
# A Pending pod that asked for a GPU (kube-state-metrics sanitises nvidia.com/gpu to nvidia_com_gpu).
PENDING_GPU_PODS = (
    '(kube_pod_status_phase{phase="Pending"} == 1) * on (namespace, pod) group_left () '
    'max by (namespace, pod) (kube_pod_container_resource_requests{resource="nvidia_com_gpu"})'
)


def _targets(*queries: tuple[str, str], **extra: Any) -> list[dict]:
    return [
        {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": chr(ord("A") + i), **extra}
        for i, (expr, legend) in enumerate(queries)
    ]


def _panel(pid: int, kind: str, title: str, description: str, grid: tuple[int, int, int, int], **rest: Any) -> dict:
    h, w, x, y = grid
    return {
        "id": pid,
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"h": h, "w": w, "x": x, "y": y},
        **rest,
    }


def handoff_dashboard(n: Names) -> dict:
    slurm = n.slurm
    ns, partition = slurm.namespace, DEFAULT_PARTITION
    hpa = f'namespace="{ns}", horizontalpodautoscaler="{n.keda_hpa}"'

    def by_partition(metric: str) -> str:
        return f'sum(slurm_partition_{metric}{{partition="{partition}"}})'

    panels = [
        _panel(
            1,
            "state-timeline",
            "Who holds each GPU (dcgm-exporter pod labels)",
            f"One row per (GPU, pod) pair; a bar while that pod holds the GPU. {ns}/{slurm.slurmd_pod_prefix}N "
            "is slurmd (the GPU belongs to Slurm), anything else is a Kubernetes job. A GPU never has two bars "
            "at the same time.",
            (10, 24, 0, 0),
            options={"showValue": "never", "mergeValues": True, "rowHeight": 0.8, "legend": {"showLegend": False}},
            fieldConfig={
                "defaults": {
                    "color": {"mode": "palette-classic-by-name"},
                    "mappings": [{"type": "value", "options": {"1": {"text": "held"}}}],
                },
                "overrides": [],
            },
            targets=_targets(
                (
                    'max by (Hostname, UUID, namespace, pod) (DCGM_FI_DEV_GPU_UTIL{pod!=""} * 0 + 1)',
                    "{{Hostname}} {{UUID}} → {{namespace}}/{{pod}}",
                )
            ),
        ),
        _panel(
            2,
            "table",
            "GPU owners now",
            "Every GPU with the pod the device plugin gave it to (empty pod: free) and its framebuffer use in MiB.",
            (7, 12, 0, 10),
            transformations=[
                {
                    "id": "organize",
                    "options": {"excludeByName": {"Time": True}, "renameByName": {"Value": "FB used (MiB)"}},
                }
            ],
            targets=_targets(
                ("max by (Hostname, gpu, UUID, namespace, pod, container) (DCGM_FI_DEV_FB_USED)", ""),
                instant=True,
                range=False,
                format="table",
            ),
        ),
        _panel(
            3,
            "timeseries",
            "GPU utilisation by holder",
            "GPU utilisation (%) per holding pod.",
            (7, 12, 12, 10),
            fieldConfig={"defaults": {"unit": "percent", "min": 0, "max": 100}, "overrides": []},
            targets=_targets(
                (
                    'max by (Hostname, namespace, pod) (DCGM_FI_DEV_GPU_UTIL{pod!=""})',
                    "{{Hostname}} {{namespace}}/{{pod}}",
                )
            ),
        ),
        _panel(
            4,
            "timeseries",
            "slurmd replicas (KEDA)",
            f"KEDA's HPA {n.keda_hpa} drives NodeSet {slurm.nodeset_resource}. At 0 KEDA scales the NodeSet itself "
            "and the HPA stays at its minimum, so the Running slurmd pod count is the ground truth for 0.",
            (8, 8, 0, 17),
            fieldConfig=STEP_COUNTS,
            targets=_targets(
                (f"max(kube_horizontalpodautoscaler_status_current_replicas{{{hpa}}})", "HPA current"),
                (f"max(kube_horizontalpodautoscaler_status_desired_replicas{{{hpa}}})", "HPA desired"),
                (
                    f'sum(kube_pod_status_phase{{namespace="{ns}", pod=~"{slurm.slurmd_pod_prefix}.*", '
                    'phase="Running"})',
                    "slurmd pods Running",
                ),
                (f'max(keda_scaler_metrics_value{{scaledObject="{n.scaled_object}"}})', "KEDA metric value"),
            ),
        ),
        _panel(
            5,
            "timeseries",
            f"Slurm jobs and nodes (partition {partition})",
            "From slurmctld's OpenMetrics endpoint (/metrics/partitions). A node running a 1-GPU job on 4 CPUs "
            "is MIXED, so allocated counts alloc + mixed.",
            (8, 8, 8, 17),
            fieldConfig=STEP_COUNTS,
            targets=_targets(
                (by_partition("jobs_pending"), "jobs pending"),
                (by_partition("jobs_running"), "jobs running"),
                (f"{by_partition('nodes_alloc')} + {by_partition('nodes_mixed')}", "nodes allocated (alloc + mixed)"),
                (by_partition("nodes_idle"), "nodes idle"),
            ),
        ),
        _panel(
            6,
            "timeseries",
            "Kubernetes GPU pods pending",
            f"Pods that asked for nvidia.com/gpu and wait for one. slurmd pods waiting here (namespace {ns}) mean "
            "Kubernetes jobs still hold the GPUs.",
            (8, 8, 16, 17),
            fieldConfig=STEP_COUNTS,
            targets=_targets(
                (f"sum by (namespace) ({PENDING_GPU_PODS})", "GPUs asked by Pending pods in {{namespace}}"),
                (f"count by (namespace) ({PENDING_GPU_PODS})", "Pending GPU pods in {{namespace}}"),
            ),
        ),
    ]
    return {
        "uid": UID,
        "title": "GPU hand-off: Slurm and Kubernetes",
        "description": "Live view of the Under-pattern hand-off: which pod holds each GPU, slurmd replicas, "
        "Slurm queue, pending GPU pods.",
        "tags": ["gpu", "slurm", "keda", "testbed"],
        "timezone": "browser",
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "refresh": 1,
                }
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }

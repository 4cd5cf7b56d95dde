"""The process probe: which pod's processes run on each GPU, seen from the node.

The runner deploys a short-lived privileged DaemonSet on the GPU workers and removes it when
the run ends. Each sample it execs `nvidia-smi --query-compute-apps=gpu_uuid,pid` in the probe
on every GPU node and maps each PID to its pod through /proc/PID/cgroup (hostPID, so the
driver's PIDs are the ones in /proc). That record does not trust the allocations: a process on
a GPU its pod was not given, or two pods' processes on one GPU, shows up here.

Why the probe sees every GPU: it is privileged, and the toolkit honours NVIDIA_VISIBLE_DEVICES
for containers with CAP_SYS_ADMIN even with accept-nvidia-visible-devices-envvar-when-
unprivileged = false (NVIDIA/nvidia-container-toolkit@v1.18.1:internal/config/image/
cuda_image.go VisibleDevices, privileged.go); NVIDIA_DRIVER_CAPABILITIES=utility brings nvidia-smi.
"""

from __future__ import annotations

import re

from core import host_layout
from core.names import DEVICE_PLUGIN_NAMESPACE
from validation.timeline import GpuProcess

NAMESPACE = DEVICE_PLUGIN_NAMESPACE  # beside the device plugin, which is privileged as well
NAME = "gpu-process-probe"
LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "gpu-testbed-validation"}
CONTAINER = "probe"
# CUDA 12.4 base (Ubuntu 22.04): the same CUDA line as the jobs' pytorch image; no GPU request.
IMAGE = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"

# One line per compute process: UUID,PID,pod UID as the cgroup path spells it ("" outside pods).
# The kubelet's systemd cgroup driver writes pod<uid with _ for ->.slice, cgroupfs pod<uid>.
# PROC is unset in the probe (the host's /proc via hostPID); tests point it at a fake tree.
QUERY = [
    "sh",
    "-c",
    "nvidia-smi --query-compute-apps=gpu_uuid,pid --format=csv,noheader | "
    "while IFS=', ' read -r uuid pid; do "
    'pod=$(grep -o "pod[0-9a-f]\\{8\\}[-_][0-9a-f]\\{4\\}[-_][0-9a-f]\\{4\\}[-_][0-9a-f]\\{4\\}[-_][0-9a-f]\\{12\\}" '
    '"${PROC:-/proc}/$pid/cgroup" 2>/dev/null | head -n 1); '
    'printf "%s,%s,%s\\n" "$uuid" "$pid" "$pod"; '
    "done",
]
_POD_UID = re.compile(r"^pod([0-9a-f]{8})[-_]([0-9a-f]{4})[-_]([0-9a-f]{4})[-_]([0-9a-f]{4})[-_]([0-9a-f]{12})$")


def parse_processes(text: str, node: str) -> list[GpuProcess]:
    found = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3 or not fields[0].startswith("GPU-") or not fields[1].isdigit():
            continue
        uuid, pid, pod = fields
        match = _POD_UID.match(pod)
        found.append(GpuProcess(uuid, int(pid), node, "-".join(match.groups()) if match else ""))
    return found


def daemonset() -> dict:
    key, value = host_layout.GPU_NODE_LABEL
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": dict(LABELS)},
        "spec": {
            "selector": {"matchLabels": dict(LABELS)},
            "template": {
                "metadata": {"labels": dict(LABELS)},
                "spec": {
                    "nodeSelector": {key: value},
                    "hostPID": True,  # the PIDs nvidia-smi reports are the host's
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": CONTAINER,
                            "image": IMAGE,
                            "command": ["sleep", "infinity"],
                            "env": [
                                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                                {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
                            ],
                            "securityContext": {"privileged": True},
                            "resources": {
                                "requests": {"cpu": "10m", "memory": "16Mi"},
                                "limits": {"memory": "64Mi"},
                            },
                        }
                    ],
                },
            },
        },
    }

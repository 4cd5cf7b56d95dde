"""NVIDIA device plugin: hands each GPU to exactly one pod (`nvidia.com/gpu: 1`)."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from components import helm
from core.names import DEVICE_PLUGIN_NAMESPACE

REPO = "https://nvidia.github.io/k8s-device-plugin"

# How a pod receives its GPU. With volume-mounts the plugin answers each allocation with one
# /dev/null mount at <root>/<GPU UUID> per GPU and NVIDIA_VISIBLE_DEVICES=<root>, the root being
# core/host_layout.py's DEVICE_LIST_ROOT, the plugin's own
# (NVIDIA/k8s-device-plugin@v0.17.0:internal/plugin/server.go, updateResponseForDeviceMounts),
# which toolkit 1.18.1 reads when accept-nvidia-visible-devices-as-volume-mounts is true, before
# and instead of the variable (NVIDIA/nvidia-container-toolkit@v1.18.1:internal/config/image/
# cuda_image.go, VisibleDevices). A pod cannot forge the mount without a hostPath volume. Chosen
# over CDI (cdi-cri): it needs no containerd CDI setting, which 1.7 leaves off and 2.x turns on,
# and no CDI specs kept in step with the driver. gpu-worker.sh sets the toolkit side.
DEVICE_LIST_STRATEGY = "volume-mounts"
DEVICE_ID_STRATEGY = "uuid"  # the mount names are GPU UUIDs, what nvidia-smi and dcgm-exporter report


@dataclass
class DevicePluginArgs:
    version: str
    gpu_feature_discovery: bool
    provider: k8s.Provider


def chart(version: str) -> helm.Chart:
    # The chart refuses namespace `default`.
    return helm.Chart("nvidia-device-plugin", DEVICE_PLUGIN_NAMESPACE, "nvidia-device-plugin", version, REPO)


def device_plugin_values(version: str, gpu_feature_discovery: bool) -> dict:
    # No failOnInitError: 0.17.0 renders it unquoted and the DaemonSet is rejected. No
    # affinity override: the default schedules on nodes labelled nvidia.com/gpu.present=true,
    # which every GPU worker is at join. No runtimeClassName: nvidia is containerd's default.
    # No securityContext: with a volume-mounts strategy the chart adds CAP_SYS_ADMIN to the
    # plugin and GFD (templates/_helpers.tpl, requiresCapSysAdmin), which is what the toolkit
    # calls privileged, so their NVIDIA_VISIBLE_DEVICES=all still shows them every GPU.
    return helm.merged_values(
        chart(version),
        {
            "gfd": {"enabled": gpu_feature_discovery},
            "deviceListStrategy": DEVICE_LIST_STRATEGY,
            "deviceIDStrategy": DEVICE_ID_STRATEGY,
        },
    )


class DevicePlugin(pulumi.ComponentResource):
    def __init__(self, name: str, args: DevicePluginArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:platform:DevicePlugin", name, None, opts)
        self.release = helm.release(
            f"{name}-release",
            chart(args.version),
            device_plugin_values(args.version, args.gpu_feature_discovery),
            args.provider,
            parent=self,
        )
        self.register_outputs({"release": self.release.name})

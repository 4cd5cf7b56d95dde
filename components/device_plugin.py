"""NVIDIA device plugin: hands each GPU to exactly one pod (`nvidia.com/gpu: 1`)."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from components import helm
from components.names import DEVICE_PLUGIN_NAMESPACE

REPO = "https://nvidia.github.io/k8s-device-plugin"


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
    return helm.merged_values(chart(version), {"gfd": {"enabled": gpu_feature_discovery}})


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

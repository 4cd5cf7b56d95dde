"""A pod reaches a GPU only through the device plugin: the toolkit settings the GPU worker
bootstrap writes, the device-list strategy the plugin is given, and what dcgm-exporter, the
plugin itself and slurmd keep seeing, checked against the pinned versions' real keys and a
model of the toolkit's own decision.

Upstream, read at the tags:
* NVIDIA/nvidia-container-toolkit@v1.18.1:internal/config/config.go (Config's toml keys, GetDefault),
  internal/config/image/cuda_image.go (VisibleDevices, requestsFromMounts,
  DeviceListAsVolumeMountsRoot), internal/config/image/privileged.go (IsPrivileged:
  CAP_SYS_ADMIN in the bounding set), cmd/nvidia-ctk/config/config.go (`--set key=value`, `--in-place`).
* NVIDIA/k8s-device-plugin@v0.17.0:api/config/v1/consts.go (strategies),
  internal/plugin/server.go (updateResponseForDeviceMounts),
  deployments/helm/nvidia-device-plugin/templates/_helpers.tpl (securityContext, requiresCapSysAdmin),
  templates/daemonset-device-plugin.yml (NVIDIA_VISIBLE_DEVICES=all on the plugin container).
* SlinkyProject/slurm-operator@v1.0.0:internal/builder/worker_app.go (slurmd privileged).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

import pytest

from components import bootstrap, device_plugin
from core import host_layout, settings
from tests.components.test_bootstrap_idempotent import (
    DRIVER_PACKAGES,
    Sandbox,
    control_user_data,
    succeeded,
    worker_user_data,
)
from tests.conftest import by_type, config

RELEASE = "kubernetes:helm.sh/v3:Release"
# toolkit 1.18.1 Config: the two top-level keys this project sets, with their defaults.
TOOLKIT_KEYS_AND_DEFAULTS = {
    "accept-nvidia-visible-devices-envvar-when-unprivileged": True,
    "accept-nvidia-visible-devices-as-volume-mounts": False,
}
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"  # GetConfigFilePath, no XDG override
TOOLKIT_VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"  # DeviceListAsVolumeMountsRoot
PLUGIN_STRATEGIES = {"envvar", "volume-mounts", "cdi-annotations", "cdi-cri"}  # device plugin 0.17.0
TOOLKIT_PACKAGES = ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools")
UUIDS = ("GPU-0f0e0d0c-0000-0000-0000-000000000001", "GPU-0f0e0d0c-0000-0000-0000-000000000002")


def toolkit_settings(calls: list[str], root: str) -> dict[str, bool]:
    """What `nvidia-ctk config --set` calls leave in the toolkit config file, over the defaults."""
    settings = dict(TOOLKIT_KEYS_AND_DEFAULTS)
    for call in calls:
        argv = shlex.split(call)
        if argv[:2] != ["nvidia-ctk", "config"]:
            continue
        assert f"--config-file={root}{TOOLKIT_CONFIG}" in argv and "--in-place" in argv, call
        for i, arg in enumerate(argv):
            if arg == "--set":
                key, _, value = argv[i + 1].partition("=")
                assert key in TOOLKIT_KEYS_AND_DEFAULTS, f"{key} is not a toolkit 1.18.1 key this test knows"
                settings[key] = {"true": True, "false": False}[value]
    return settings


@dataclass
class Container:
    """What the runtime sees of a container: its environment, mounts and capability bounding set."""

    env: dict[str, str]
    mounts: list[tuple[str, str]] = field(default_factory=list)  # (source, destination)
    bounding: set[str] = field(default_factory=set)


def visible_devices(c: Container, settings: dict[str, bool]) -> list[str]:
    """toolkit 1.18.1 CUDA.VisibleDevices (no CDI annotations, no IMEX): volume-mount requests
    first when accepted, then NVIDIA_VISIBLE_DEVICES for privileged containers or when accepted."""
    if settings["accept-nvidia-visible-devices-as-volume-mounts"]:
        from_mounts = [
            dest[len(TOOLKIT_VOLUME_MOUNTS_ROOT) :].strip("/")
            for src, dest in c.mounts
            if src == "/dev/null" and dest.startswith(TOOLKIT_VOLUME_MOUNTS_ROOT)
        ]
        if [d for d in from_mounts if d]:
            return [d for d in from_mounts if d]
    requested = [d for d in c.env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if d and d != "void"]
    if not requested:
        return []
    if "CAP_SYS_ADMIN" in c.bounding or settings["accept-nvidia-visible-devices-envvar-when-unprivileged"]:
        return requested
    return []


def allocated(env: dict[str, str], uuid: str, bounding: set[str] = frozenset()) -> Container:
    """A container after kubelet applied the plugin's Allocate answer for `uuid` (volume-mounts)."""
    assert device_plugin.DEVICE_LIST_STRATEGY == "volume-mounts"
    return Container(
        {**env, "NVIDIA_VISIBLE_DEVICES": host_layout.DEVICE_LIST_ROOT},
        [("/dev/null", f"{host_layout.DEVICE_LIST_ROOT}/{uuid}")],
        set(bounding),
    )


def chart_security_context(values: dict) -> dict:
    """device plugin chart 0.17.0 `nvidia-device-plugin.securityContext` (no MIG, no CPU manager)."""
    if values.get("securityContext"):
        return values["securityContext"]
    if values.get("compatWithCPUManager"):
        return {"privileged": True}
    if "volume-mounts" in (values.get("deviceListStrategy") or ""):
        return {"capabilities": {"add": ["SYS_ADMIN"]}}
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def bounding_set(security_context: dict) -> set[str]:
    """containerd's capability set for a container: all when privileged, else drops then adds."""
    if security_context.get("privileged"):
        return {"CAP_SYS_ADMIN", "CAP_BPF", "CAP_NET_ADMIN"}  # all of them; these are enough here
    caps = security_context.get("capabilities", {})
    base = set() if "ALL" in caps.get("drop", []) else {"CAP_CHOWN", "CAP_KILL"}  # runtime defaults (part)
    return base | {f"CAP_{c}" for c in caps.get("add", [])}


@pytest.fixture(scope="module")
def worker_runs(tmp_path_factory):
    """A worker's two clean bootstrap runs on one sandbox, made once for the tests that only read them."""
    box = Sandbox(tmp_path_factory.mktemp("worker"), worker_user_data())
    return box, succeeded(box.run()), succeeded(box.run())


def test_the_worker_bootstrap_makes_the_toolkit_ignore_the_variable_in_unprivileged_pods(worker_runs):
    box, first, second = worker_runs
    for run in (first, second):  # the second run rewrites the same settings
        settings = toolkit_settings(run.calls, str(box.root))
        assert settings == {
            "accept-nvidia-visible-devices-envvar-when-unprivileged": False,
            "accept-nvidia-visible-devices-as-volume-mounts": True,
        }
        ctk = [i for i, c in enumerate(run.calls) if c.startswith("nvidia-ctk config ")]
        install = max(
            i for i, c in enumerate(run.calls) if c.startswith("apt-get") and "nvidia-container-toolkit=" in c
        )
        restart = max(i for i, c in enumerate(run.calls) if c == "systemctl restart containerd")
        assert len(ctk) == 1 and install < ctk[0] < restart  # the package's postinst cannot undo it
    # the toolkit side and the plugin side of the device list agree
    assert TOOLKIT_VOLUME_MOUNTS_ROOT == host_layout.DEVICE_LIST_ROOT
    assert device_plugin.DEVICE_LIST_STRATEGY in PLUGIN_STRATEGIES - {"envvar"}


def test_driver_toolkit_and_containerd_packages_are_held_on_every_run(worker_runs):
    _box, first, second = worker_runs
    for run in (first, second):
        holds = [set(shlex.split(c)[2:]) for c in run.calls if c.startswith("apt-mark hold ")]
        held = set().union(*holds)
        assert set(DRIVER_PACKAGES.split()) <= held, held
        assert set(TOOLKIT_PACKAGES) | {"libnvidia-container1", "containerd", "kubelet"} <= held
        # unheld only for the pinned reinstall, then held again
        unhold = max(i for i, c in enumerate(run.calls) if c.startswith("apt-mark unhold nvidia-container-toolkit"))
        hold = max(
            i for i, c in enumerate(run.calls) if c.startswith("apt-mark hold ") and "nvidia-container-toolkit" in c
        )
        assert unhold < hold
    # containerd: installed on the first run only; a held package is never reinstalled
    assert [c for c in first.calls if c.endswith(" install containerd")]
    assert not [c for c in second.calls if c.startswith("apt-get") and re.search(r"\bcontainerd\b", c)]


def test_a_driver_install_that_left_no_package_to_hold_stops_the_bootstrap(tmp_path):
    box = Sandbox(tmp_path, worker_user_data())
    box.fail("dpkg-query -W -f ${db:Status-Status} ${Package}\\n *-")
    run = box.run()
    assert run.returncode != 0
    assert "no installed NVIDIA" in run.failed_lines()[-1], run.output
    assert not [c for c in run.calls if c.startswith("kubeadm join")]


def test_the_control_node_holds_containerd_too(tmp_path):
    box = Sandbox(tmp_path, control_user_data())
    first = succeeded(box.run())
    assert "apt-mark hold kubelet kubeadm kubectl containerd" in first.calls


def test_only_an_allocated_pod_gets_a_gpu_and_the_monitors_still_see_every_gpu(default_run, worker_runs):
    box, first, _ = worker_runs
    settings = toolkit_settings(first.calls, str(box.root))
    releases = {r.inputs["name"]: r.inputs["values"] for r in by_type(default_run, RELEASE)}
    plugin_values, dcgm_values = releases["nvidia-device-plugin"], releases["dcgm-exporter"]
    assert plugin_values["deviceListStrategy"] == device_plugin.DEVICE_LIST_STRATEGY
    assert plugin_values["deviceIDStrategy"] == "uuid"  # mount names are the UUIDs the runner reads
    every_gpu = ["all"]

    cuda_image = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
    # The leak: any CUDA image, no nvidia.com/gpu request. Before the bootstrap's settings it saw every GPU.
    leak = Container(dict(cuda_image))
    assert visible_devices(leak, TOOLKIT_KEYS_AND_DEFAULTS) == every_gpu
    assert visible_devices(leak, settings) == []
    # A pod that asked for one GPU gets exactly the one the plugin allocated.
    assert visible_devices(allocated(cuda_image, UUIDS[1]), settings) == [UUIDS[1]]
    # slurmd is privileged (worker_app.go) and sets no NVIDIA_* variable: its mount still decides.
    slurmd = allocated({}, UUIDS[0], bounding_set({"privileged": True}))
    assert visible_devices(slurmd, settings) == [UUIDS[0]]
    # The device plugin container: NVIDIA_VISIBLE_DEVICES=all in the chart's template, and the
    # chart's securityContext for this strategy carries CAP_SYS_ADMIN.
    plugin = Container({"NVIDIA_VISIBLE_DEVICES": "all"}, bounding=bounding_set(chart_security_context(plugin_values)))
    assert visible_devices(plugin, settings) == every_gpu
    # dcgm-exporter: no GPU request, SYS_ADMIN kept, the variable set on the container.
    assert dcgm_values["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN"]
    env = {e["name"]: e["value"] for e in dcgm_values["extraEnv"]}
    dcgm = Container(env, bounding=bounding_set(dcgm_values["securityContext"]))
    assert visible_devices(dcgm, settings) == every_gpu
    assert "resources" not in dcgm_values or "nvidia.com/gpu" not in str(dcgm_values["resources"])


def test_the_model_follows_the_toolkit_where_it_matters():
    """The model itself can fail: a forged mount outside the root, or from a real file, is no request."""
    on = {
        "accept-nvidia-visible-devices-envvar-when-unprivileged": False,
        "accept-nvidia-visible-devices-as-volume-mounts": True,
    }
    assert visible_devices(Container({}, [("/etc/hosts", f"{TOOLKIT_VOLUME_MOUNTS_ROOT}/{UUIDS[0]}")]), on) == []
    assert visible_devices(Container({}, [("/dev/null", f"/elsewhere/{UUIDS[0]}")]), on) == []
    off = {**on, "accept-nvidia-visible-devices-as-volume-mounts": False}
    assert visible_devices(allocated({}, UUIDS[0]), off) == []  # the variable names a path, not a GPU
    assert chart_security_context({"deviceListStrategy": "envvar"})["capabilities"]["drop"] == ["ALL"]


def test_the_worker_user_data_carries_the_settings_and_no_other_script_overrides_them():
    script = bootstrap.script("gpu-worker.sh")
    assert "--set accept-nvidia-visible-devices-envvar-when-unprivileged=false" in script
    assert "--set accept-nvidia-visible-devices-as-volume-mounts=true" in script
    for name in ("node-common.sh", "control-plane.sh", "testbed-lib.sh"):
        assert "accept-nvidia-visible-devices" not in bootstrap.script(name), name


def test_privileged_slurmd_is_safe_only_because_multi_gpu_workers_are_refused():
    """slurmd is privileged (worker_app.go): every GPU device of its host is in it. The README's
    claim that this is harmless rests on the settings refusing workers with more than one GPU."""
    with pytest.raises(settings.SettingsError, match=r'"g4dn\.12xlarge" has 4 GPUs; each worker must have exactly one'):
        settings.load(config(workerInstanceType="g4dn.12xlarge"), offline=True)

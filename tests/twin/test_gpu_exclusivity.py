"""A GPU can have two owners in the twin exactly when the enforcement that prevents it is off
(docs/gpu-exclusivity.md): the device plugin advertises each GPU once, and kubelet's device manager
hands each device to one container. The twin reads the plugin's sharing from the program's rendered
values (twin/program.py gpu_replicas); a time-slicing config, a real misconfiguration, lets two pods
bind to one GPU and `double_held` reports it."""

import dataclasses
import functools
from pathlib import Path

import pytest
import yaml

from components import device_plugin
from core import settings
from stacks import offline
from tests.twin import runs
from twin import program, scenario, sim
from twin.kube import KUBERNETES, SLURMD, Kubernetes, Pod

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
SHIPPED = sorted(p.stem for p in SCENARIOS.glob("*.yaml"))


@functools.cache
def dev() -> settings.Settings:
    return offline.stack_settings("dev", [])


def shipped_values() -> dict:
    s = dev()
    return device_plugin.device_plugin_values(s.device_plugin_version, s.gpu_feature_discovery)


def sharing(kind: str, replicas: int) -> str:
    """A device plugin config file (NVIDIA/k8s-device-plugin@v0.17.0 api/config/v1) sharing GPUs."""
    return yaml.safe_dump(
        {"version": "v1", "sharing": {kind: {"resources": [{"name": "nvidia.com/gpu", "replicas": replicas}]}}}
    )


def with_config(**config) -> dict:
    values = shipped_values()
    return {**values, "config": {**values.get("config", {}), **config}}


def test_the_shipped_device_plugin_advertises_each_gpu_once():
    assert program.gpu_replicas(shipped_values()) == 1
    assert program.setup(dev()).gpu_replicas == 1


@pytest.mark.parametrize(
    "config, replicas",
    [
        ({"map": {"default": sharing("timeSlicing", 2)}}, 2),  # `named` finds "default"
        ({"map": {"ts": sharing("timeSlicing", 4)}}, 4),  # `single`: the only file
        ({"map": {"ts": sharing("mps", 3), "plain": "version: v1\n"}, "default": "ts"}, 3),
        ({"map": {"ts": sharing("timeSlicing", 4), "plain": "version: v1\n"}, "default": "plain"}, 1),
        ({"map": {"a": sharing("timeSlicing", 2), "b": "version: v1\n"}, "fallbackStrategies": ["empty"]}, 1),
    ],
)
def test_the_twin_reads_the_sharing_of_the_config_the_plugin_selects(config, replicas):
    assert program.gpu_replicas(with_config(**config)) == replicas


@pytest.mark.parametrize(
    "config, message",
    [
        ({"name": "my-configs"}, "external ConfigMap"),
        ({"map": {"a": sharing("timeSlicing", 2), "b": "version: v1\n"}}, "no config file selected"),
        (
            {"map": {"default": yaml.safe_dump({"sharing": {"timeSlicing": {"renameByDefault": True}}})}},
            "renameByDefault",
        ),
    ],
)
def test_a_device_plugin_config_the_twin_cannot_follow_is_refused(config, message):
    with pytest.raises(ValueError, match=message):
        program.gpu_replicas(with_config(**config))


def test_with_time_slicing_two_pods_bind_to_one_gpu_and_double_held_says_so():
    kube = Kubernetes(gpus=2, cold=False, gpu_replicas=2)
    for i in range(3):
        kube.create_pod(Pod(f"p{i}", KUBERNETES if i else SLURMD, "x", "job", float(i)))
    kube.step(0)
    assert [p.gpu for p in kube.pods] == [0, 0, 1] and kube.double_held == {0}


@pytest.mark.parametrize("name", ["handoff", "partial-release", "heavy-mix"])
def test_a_time_sliced_device_plugin_double_books_a_shipped_scenario_the_shipped_one_does_not(name):
    """The same scenario on the program's setup and on one whose device plugin time-slices each GPU
    in two: only the second has a GPU with two pods, and the run fails for it."""
    sc = scenario.load(SCENARIOS / f"{name}.yaml")
    shipped = program.setup(dev())
    shared = dataclasses.replace(
        shipped, gpu_replicas=program.gpu_replicas(with_config(map={"default": sharing("timeSlicing", 2)}))
    )
    assert runs.result(shipped, sc)["double_held"] == []  # a run other modules make too: cached
    r = sim.Run(shared, sc).run()
    assert r["double_held"] and not sim.ok(r)

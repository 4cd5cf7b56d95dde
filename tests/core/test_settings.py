import contextvars
import json

import pytest

from core import settings
from tests.conftest import config


def problems(**values) -> list[str]:
    with pytest.raises(settings.SettingsError) as error:
        settings.load(config(**values), offline=True)
    return error.value.problems


def test_example_stack_file_loads():
    from stacks import offline

    loaded = settings.load(offline.stack_config("dev"), offline=True)
    assert loaded.worker_count == 4 and loaded.region == "us-east-1"


def test_derived_addresses_follow_the_vpc():
    s = settings.load(config(vpcCidr="10.8.0.0/16", workerCount=3), offline=True)
    assert s.subnet_cidr == "10.8.0.0/24"
    assert s.control_private_ip == "10.8.0.10"
    assert s.worker_private_ips == ["10.8.0.20", "10.8.0.21", "10.8.0.22"]
    assert s.kubernetes_minor == "1.34"
    assert s.ai_gpus == 1  # -1: half of 3, rounded down
    assert s.slurmd_max_replicas == 3  # every GPU: slurmd borrows AI's idle share by default
    assert settings.load(config(workerCount=3, hpcBorrowsAiGpus=False), offline=True).slurmd_max_replicas == 2


def test_missing_admin_cidr_is_refused():
    with pytest.raises(settings.SettingsError) as error:
        settings.load({}, offline=True)
    assert error.value.problems == [
        f"adminCidr: missing; required: {settings.SETTINGS_BY_KEY['adminCidr'].description}"
    ]


def test_open_ingress_is_accepted_only_with_the_opt_in():
    assert settings.load(config(adminCidr="0.0.0.0/0", allowOpenIngress=True), offline=True).admin_cidr == "0.0.0.0/0"


def test_unknown_key_suggests_the_closest_setting():
    found = problems(workrCount="3")
    assert found == ['workrCount: "3" is not a setting of gpu-testbed; did you mean workerCount?']


def test_a_deployment_refuses_the_example_documentation_address_offline_runs_accept():
    example = config()  # adminCidr 203.0.113.7/32, as in Pulumi.dev.yaml
    assert settings.load(example, offline=True).admin_cidr == "203.0.113.7/32"
    with pytest.raises(settings.SettingsError) as error:
        settings.load(example)
    (problem,) = error.value.problems
    assert problem.startswith('adminCidr: "203.0.113.7/32" is a documentation example address')
    assert settings.load(config(adminCidr="81.2.69.0/28")).admin_cidr == "81.2.69.0/28"


def test_the_program_reads_its_stack_and_refuses_the_example_address_as_a_deployment(monkeypatch):
    """`pulumi up` runs __main__.py, which calls settings_from_pulumi(): the stack is Pulumi's, and a
    deployment is never treated as an offline run (the example adminCidr would pass)."""
    import pulumi
    from pulumi.runtime import config as runtime_config

    from stacks import testbed

    monkeypatch.setenv("PULUMI_CONFIG", json.dumps(config()))  # adminCidr 203.0.113.7/32
    no_explicit_config = contextvars.ContextVar("config")  # only the environment's, as `pulumi up` passes it
    no_explicit_config.set({})
    monkeypatch.setattr(runtime_config, "CONFIG", no_explicit_config)
    monkeypatch.setattr(pulumi, "get_stack", lambda: "lab")
    with pytest.raises(settings.SettingsError) as error:
        testbed.settings_from_pulumi()
    (problem,) = error.value.problems
    assert problem.startswith('adminCidr: "203.0.113.7/32" is a documentation example address')
    assert testbed.settings_from_pulumi(offline=True).stack == "lab"

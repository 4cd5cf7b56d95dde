from pathlib import Path

import pytest
import yaml

from stacks import settings
from tests.conftest import config

ROOT = Path(__file__).resolve().parents[2]
KINDS = {str: "string", int: "integer", bool: "boolean"}


def problems(**values) -> list[str]:
    with pytest.raises(settings.SettingsError) as error:
        settings.load(config(**values), offline=True)
    return error.value.problems


def test_pulumi_yaml_declares_exactly_the_settings_with_the_same_types_and_defaults():
    declared = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["config"]
    assert list(declared) == [s.key for s in settings.SETTINGS]
    for s in settings.SETTINGS:
        entry = declared[s.key]
        assert entry["type"] == KINDS[s.kind], s.key
        assert entry.get("default") == s.default, s.key
        assert entry["description"] == s.description, s.key


def test_settings_attributes_match_the_table():
    fields = {f for f in settings.Settings.__dataclass_fields__ if f != "stack"}
    assert fields == {s.attribute for s in settings.SETTINGS}


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
    assert s.slurmd_max_replicas == 3


BAD_VALUES = [
    ({"workerCount": "0"}, "workerCount", "from 1 to"),
    ({"workerCount": "-2"}, "workerCount", "from 1 to"),
    ({"workerCount": "four"}, "workerCount", "a whole number"),
    ({"workerCount": "400"}, "workerCount", "subnet's capacity"),
    ({"workerInstanceType": "m5.large"}, "workerInstanceType", "NVIDIA GPU"),
    ({"adminCidr": "203.0.113.7"}, "adminCidr", "CIDR"),
    ({"adminCidr": "203.0.113.7/33"}, "adminCidr", "CIDR"),
    ({"adminCidr": "0.0.0.0/0"}, "adminCidr", "allowOpenIngress"),
    ({"adminCidr": "::/0"}, "adminCidr", "IPv4 only"),
    ({"adminCidr": "2001:db8::/64"}, "adminCidr", "IPv4 only"),
    ({"region": "useast1"}, "region", "region name"),
    ({"availabilityZone": "us-east-1"}, "availabilityZone", "zone name"),
    ({"availabilityZone": "eu-west-1a"}, "availabilityZone", "zone of region us-east-1"),
    ({"kubernetesVersion": "1.28.3"}, "kubernetesVersion", "1.29.0 or later"),
    ({"kubernetesVersion": "1.34"}, "kubernetesVersion", "MAJOR.MINOR.PATCH"),
    ({"workerRootVolumeGb": "20"}, "workerRootVolumeGb", "from 60"),
    ({"controlRootVolumeGb": "8"}, "controlRootVolumeGb", "from 20"),
    ({"kedaMinReplicas": "3", "workerCount": "4", "kedaMaxReplicas": "2"}, "kedaMinReplicas", "maxReplicaCount (2)"),
    ({"kedaMinReplicas": "0"}, "kedaMinReplicas", "from 1"),
    ({"kedaMaxReplicas": "5"}, "kedaMaxReplicas", "workerCount (4)"),
    ({"kedaCooldownSeconds": "0"}, "kedaCooldownSeconds", "from 1"),
    ({"kedaPollingSeconds": "-5"}, "kedaPollingSeconds", "from 1"),
    ({"nodesetName": "GPU_nodes"}, "nodesetName", "DNS label"),
    ({"certManagerVersion": "1.19.2"}, "certManagerVersion", "leading v"),
    ({"slinkyVersion": "latest"}, "slinkyVersion", "MAJOR.MINOR.PATCH"),
    ({"spotWorkers": "yes"}, "spotWorkers", "true or false"),
    ({"vpcCidr": "8.8.0.0/16"}, "vpcCidr", "private IPv4"),
    ({"sshPublicKey": "not-a-key"}, "sshPublicKey", "OpenSSH public key"),
    ({"amiId": "ubuntu"}, "amiId", "AMI id"),
    ({"nvidiaDriverBranch": "latest"}, "nvidiaDriverBranch", "three-digit"),
]


@pytest.mark.parametrize("values, key, allowed", BAD_VALUES)
def test_bad_value_is_refused_naming_setting_value_and_what_is_allowed(values, key, allowed):
    found = [p for p in problems(**values) if p.startswith(f"{key}: ")]
    assert len(found) == 1, problems(**values)
    assert f'"{values[key]}"' in found[0] and allowed in found[0]


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


def test_every_problem_is_reported_at_once_and_none_twice():
    found = problems(workerCount="x", region="nowhere", kedaCooldownSeconds="0", adminCidr="bad")
    assert sorted(p.split(":")[0] for p in found) == ["adminCidr", "kedaCooldownSeconds", "region", "workerCount"]


def test_a_deployment_refuses_the_example_documentation_address_offline_runs_accept():
    example = config()  # adminCidr 203.0.113.7/32, as in Pulumi.dev.yaml
    assert settings.load(example, offline=True).admin_cidr == "203.0.113.7/32"
    with pytest.raises(settings.SettingsError) as error:
        settings.load(example)
    (problem,) = error.value.problems
    assert problem.startswith('adminCidr: "203.0.113.7/32" is a documentation example address')
    assert settings.load(config(adminCidr="81.2.69.0/28")).admin_cidr == "81.2.69.0/28"

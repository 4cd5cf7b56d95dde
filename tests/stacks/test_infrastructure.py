import pytest

from stacks import offline, pricing
from tests import tokens
from tests.conftest import by_type, config, run_program, step_args


def instances(rec, role):
    return [i for i in by_type(rec, tokens.INSTANCE) if i.inputs["tags"]["testbed:role"] == role]


def test_default_is_one_t3_medium_control_node_and_four_g4dn_xlarge_workers(default_run):
    assert [i.inputs["instanceType"] for i in instances(default_run, "control-plane")] == ["t3.medium"]
    assert [i.inputs["instanceType"] for i in instances(default_run, "gpu-worker")] == ["g4dn.xlarge"] * 4


@pytest.mark.parametrize("count", [1, 2, 7])  # 2 and 7: other tests' too, one recording each
def test_worker_count_changes_instances_gate_and_outputs(count):
    rec = run_program(workerCount=count)
    workers = instances(rec, "gpu-worker")
    assert len(workers) == count
    worker_ips = sorted(w.inputs["privateIp"] for w in workers)
    assert sorted(rec.outputs["workerPrivateIps"]) == worker_ips
    gate = rec.named("testbed-readiness-wait")
    waited_for = [line.split()[1:3] for line in step_args(rec, gate.name)["NODES"].splitlines()]  # ROLE IP ID REACH
    nodes = [*instances(rec, "control-plane"), *workers]
    assert sorted(waited_for) == sorted([n.inputs["privateIp"], f"{n.name}-placeholder"] for n in nodes)
    assert {w.urn for w in workers} <= set(gate.depends_on)


def test_every_node_shares_the_one_security_group_and_subnet(default_run):
    (group,) = by_type(default_run, tokens.SECURITY_GROUP)
    (subnet,) = by_type(default_run, tokens.SUBNET)
    for node in by_type(default_run, tokens.INSTANCE):
        assert node.inputs["vpcSecurityGroupIds"] == [f"{group.name}-placeholder"]
        assert node.inputs["subnetId"] == f"{subnet.name}-placeholder"


def test_every_instance_requires_imdsv2_with_hop_limit_1_and_encrypts_its_root_volume(default_run):
    for node in by_type(default_run, tokens.INSTANCE):
        assert node.inputs["metadataOptions"] == {
            "httpEndpoint": "enabled",
            "httpTokens": "required",
            "httpPutResponseHopLimit": 1,
        }
        assert node.inputs["rootBlockDevice"]["encrypted"] is True
        assert node.inputs["rootBlockDevice"]["volumeType"] == "gp3"


def test_workers_boot_in_parallel_with_the_control_plane(default_run):
    control = instances(default_run, "control-plane")[0]
    for worker in instances(default_run, "gpu-worker"):
        assert control.urn not in worker.depends_on


def test_control_node_user_data_waits_for_the_elastic_ip(default_run):
    (eip,) = by_type(default_run, tokens.EIP)
    control = instances(default_run, "control-plane")[0]
    assert eip.urn in control.depends_on
    (association,) = by_type(default_run, tokens.EIP_ASSOCIATION)
    assert association.inputs["instanceId"] == f"{control.name}-placeholder"


def test_ami_lookup_asks_canonical_for_the_newest_ubuntu_2404_amd64_hvm_image(default_run):
    rec = default_run
    assert [token for token, _ in rec.invokes].count(tokens.GET_AMI) == 1
    lookup = rec.invoke_args[tokens.GET_AMI]  # the mocks keep each invoke's first arguments
    assert lookup["owners"] == ["099720109477"]  # Canonical's AWS account (Ubuntu's cloud image docs)
    assert lookup["mostRecent"] is True
    assert {f["name"]: f["values"] for f in lookup["filters"]} == {
        "name": ["ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*"],
        "architecture": ["x86_64"],
        "virtualization-type": ["hvm"],
    }
    # every node boots the image the lookup returned
    assert {i.inputs["ami"] for i in by_type(rec, tokens.INSTANCE)} == {"ami-0placeholder000000"}


def test_a_pinned_ami_replaces_the_lookup():
    rec = run_program(amiId="ami-0123456789abcdef0")
    assert {i.inputs["ami"] for i in by_type(rec, tokens.INSTANCE)} == {"ami-0123456789abcdef0"}
    assert tokens.GET_AMI not in {token for token, _ in rec.invokes}


def test_spot_workers_are_one_time_requests_that_end_with_the_instance_and_cost_less(spot_run, default_run):
    rec = spot_run
    for worker in instances(rec, "gpu-worker"):
        options = worker.inputs["instanceMarketOptions"]
        assert options["marketType"] == "spot"
        assert options["spotOptions"] == {"spotInstanceType": "one-time", "instanceInterruptionBehavior": "terminate"}
    assert all("instanceMarketOptions" not in c.inputs for c in instances(rec, "control-plane"))
    on_demand = pricing.estimate(default_run.settings)
    spot = pricing.estimate(rec.settings)
    assert spot.hourly_usd == pytest.approx(on_demand.hourly_usd - spot.spot_saving_hourly_usd)
    assert spot.spot_saving_hourly_usd == pytest.approx(4 * 0.526 * pricing.SPOT_DISCOUNT_ASSUMED)


def test_hourly_cost_grows_with_the_workers():
    two, four = (pricing.estimate(run_program(workerCount=n).settings).hourly_usd for n in (2, 4))
    per_worker = 0.526 + 100 * 0.08 / 730 + pricing.PUBLIC_IPV4_HOURLY
    assert four - two == pytest.approx(2 * per_worker, abs=1e-3)


def test_unpriced_region_says_so():
    estimate = pricing.estimate(run_program(region="ap-south-1").settings)
    assert estimate.hourly_usd is None and "ap-south-1" in estimate.basis


def test_ssh_key_pair_is_generated_and_an_extra_user_key_is_authorized():
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIqI4910CfGV/VLbLTy6XXLKZwm/HZQSG/N0iAG0D29c me@laptop"  # parses
    rec = run_program(sshPublicKey=key)
    from core import trusted_yaml
    from stacks.offline import reveal

    for node in by_type(rec, tokens.INSTANCE):
        assert trusted_yaml.load(reveal(node.inputs["userData"]))["ssh_authorized_keys"] == [key]
    (pair,) = by_type(rec, tokens.KEY_PAIR)
    (ssh_key,) = [k for k in by_type(rec, tokens.PRIVATE_KEY) if k.name == "testbed-ssh-key"]
    assert pair.inputs["publicKey"] == ssh_key.outputs["publicKeyOpenssh"]


class NamedKeyPair(offline.TestbedMocks):
    """The default mocks, plus the key pair's name output (AWS fills it in from the resource name)."""

    def new_resource(self, args):
        resource_id, outputs = super().new_resource(args)
        if args.typ == tokens.KEY_PAIR:
            outputs["keyName"] = args.name
        return resource_id, outputs


def test_every_node_is_launched_with_the_hardened_options():
    rec = offline.run(config(controlRootVolumeGb=50, workerRootVolumeGb=120), mocks=NamedKeyPair())
    (pair,) = by_type(rec, tokens.KEY_PAIR)
    root_gb = {"control-plane": 50, "gpu-worker": 120}
    for node in by_type(rec, tokens.INSTANCE):
        role = node.inputs["tags"]["testbed:role"]
        assert node.inputs["tags"] == {"Name": node.name, "testbed:role": role, "testbed:stack": "dev"}
        assert node.inputs["keyName"] == pair.name
        assert node.inputs["userDataReplaceOnChange"] is True  # cloud-init runs once per instance
        assert node.inputs["rootBlockDevice"] == {
            "volumeType": "gp3",
            "volumeSize": root_gb[role],
            "encrypted": True,
            "deleteOnTermination": True,
        }
        # the fixed private IP frees only with the old instance; a newer AMI replaces nothing
        assert node.options == {"deleteBeforeReplace": True, "ignoreChanges": ["ami"]}

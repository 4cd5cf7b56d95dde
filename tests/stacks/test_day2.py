"""Changes after deployment are explicit: a change that would replace the control node is refused
unless controlPlaneGeneration is raised, and a deliberate rebuild recreates everything in the cluster."""

import pytest

from stacks import infrastructure, offline
from tests.conftest import config

CONTROL = "testbed-control-instance"


def deployed(**changes: str) -> dict[str, dict[str, str]]:
    """The stack outputs of a last deployment with the default settings, but for `changes`."""
    s = offline.settings_mod.load(config(), offline=True)
    return {infrastructure.CONTROL_PLANE_SETTINGS_OUTPUT: {**infrastructure.control_plane_settings(s), **changes}}


class RecordingMocks(offline.TestbedMocks):
    def __init__(self, deployed_outputs):
        super().__init__(deployed_outputs)
        self.created: list[str] = []

    def new_resource(self, args):
        self.created.append(args.typ)
        return super().new_resource(args)


WANTED = {**deployed()[infrastructure.CONTROL_PLANE_SETTINGS_OUTPUT]}


@pytest.mark.parametrize(
    "previous, refused",
    [
        (None, None),  # a first deployment
        ({}, None),
        (WANTED, None),
        ({**WANTED, "kubernetesVersion": "1.34.6"}, ["kubernetesVersion"]),
        (
            {**WANTED, "sshPublicKey": "ssh-ed25519 AAAA old", "flannelVersion": "v0.27.3"},
            ["flannelVersion", "sshPublicKey"],
        ),
        ({**WANTED, "vpcCidr": "10.1.0.0/16", "region": "eu-west-1"}, ["region", "vpcCidr"]),
        ({**WANTED, "kubernetesVersion": "1.34.6", "controlPlaneGeneration": "0"}, None),  # raised: on purpose
    ],
)
def test_a_change_that_replaces_the_control_node_needs_a_new_generation(previous, refused):
    problem = infrastructure.rebuild_refusal(previous, WANTED)
    if refused is None:
        assert problem is None
        return
    assert problem.startswith(", ".join(refused) + ": changed since the last deployment")
    assert "controlPlaneGeneration=2" in problem and "\n" not in problem


def test_a_silent_rebuild_is_refused_before_any_aws_resource_is_registered():
    mocks = RecordingMocks(deployed(kubernetesVersion="1.34.6"))
    with pytest.raises(Exception, match=r"^kubernetesVersion: changed since the last deployment.*Generation=2"):
        offline.run(config(), mocks=mocks)
    assert not [t for t in mocks.created if t.startswith("aws:")], mocks.created


def test_a_deliberate_rebuild_replaces_the_control_node_and_everything_in_its_cluster(default_run):
    rec = offline.run(
        config(controlPlaneGeneration=2), mocks=offline.TestbedMocks(deployed(kubernetesVersion="1.34.6"))
    )
    control = rec.named(CONTROL)
    assert control.options["replacementTrigger"] == 2 and control.options["deleteBeforeReplace"] is True
    assert rec.outputs[infrastructure.CONTROL_PLANE_SETTINGS_OUTPUT][infrastructure.GENERATION] == "2"
    in_cluster = [r for r in rec.resources if r.type.startswith("kubernetes:") or r.type == "command:remote:Command"]
    assert len(in_cluster) > 15
    for r in in_cluster:
        assert r.options["replaceWith"] == [control.urn], r.name
        assert r.options["deleteBeforeReplace"] is True, r.name  # the new cluster answers at the same address
    assert "replacementTrigger" not in default_run.named(CONTROL).options  # generation 1: none
    # workers are not rebuilt with it: their changes replace only them, and they rejoin by their token step
    for worker in (r for r in rec.resources if r.type == "aws:ec2/instance:Instance" and r is not control):
        assert "replacementTrigger" not in worker.options and "replaceWith" not in worker.options

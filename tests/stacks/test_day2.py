"""Changes after deployment are explicit: a change that would replace the control node is refused
unless controlPlaneGeneration is raised, and a deliberate rebuild recreates everything in the cluster."""

import pytest

from components import gpu_worker, remote_script
from stacks import infrastructure, offline
from tests.conftest import config, depends, deployed_outputs, step_args

CONTROL = "testbed-control-instance"


class RecordingMocks(offline.TestbedMocks):
    def __init__(self, outputs):
        super().__init__(outputs)
        self.created: list[str] = []

    def new_resource(self, args):
        self.created.append(args.typ)
        return super().new_resource(args)


WANTED = {**deployed_outputs()[infrastructure.CONTROL_PLANE_SETTINGS_OUTPUT]}


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
    mocks = RecordingMocks(deployed_outputs(kubernetesVersion="1.34.6"))
    with pytest.raises(Exception, match=r"^kubernetesVersion: changed since the last deployment.*Generation=2"):
        offline.run(config(), mocks=mocks)
    assert not [t for t in mocks.created if t.startswith("aws:")], mocks.created


def test_a_deliberate_rebuild_replaces_the_control_node_and_everything_in_its_cluster(default_run):
    rec = offline.run(
        config(controlPlaneGeneration=2), mocks=offline.TestbedMocks(deployed_outputs(kubernetesVersion="1.34.6"))
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
    # workers are not rebuilt with it: their changes replace only them, and they rejoin by their token
    # step; all at once, as on a first deployment (the new cluster serves nothing yet), and their
    # joined steps run again in the new cluster (replaceWith above)
    assert_joined_step_waits_for_its_own_worker(rec)
    for worker, _ in worker_steps(rec):
        assert "replacementTrigger" not in worker.options and "replaceWith" not in worker.options
        assert workers_waited_for(rec, worker) == [], worker.name


WORKERS = [f"testbed-worker-{i}" for i in range(4)]


def worker_steps(rec) -> list[tuple[offline.RecordedResource, offline.RecordedResource]]:
    """Each worker's instance and joined step, in worker order."""
    return [(rec.named(f"{w}-instance"), rec.named(f"{w}-joined")) for w in WORKERS]


def assert_joined_step_waits_for_its_own_worker(rec):
    control, gate = rec.named(CONTROL), rec.named("testbed-readiness-wait")
    for name, (instance, joined) in zip(WORKERS, worker_steps(rec), strict=True):
        instance_id = f"{instance.name}-placeholder"  # the id the mock gives the instance
        assert instance.urn in joined.depends_on
        # run again for a new instance, and for one restarted with another type (in place)
        assert joined.inputs["triggers"] == [instance_id, instance.inputs["instanceType"]]
        args = step_args(rec, joined.name)
        assert args[remote_script.STEP_NAME] == gpu_worker.JOINED_SCRIPT
        assert (args["WORKER"], args["NODE_IP"], args["INSTANCE_ID"]) == (
            name,
            instance.inputs["privateIp"],
            instance_id,
        )
        # it lives, dies and is rebuilt with the cluster; no delete command, so destroy never dials for it
        assert joined.options["deletedWith"] == control.urn and joined.options["replaceWith"] == [control.urn]
        assert "delete" not in joined.inputs
        # the gate waits for it: it finishes before the device plugin is installed, so it waits for a
        # GPU only where the plugin already runs (a worker replaced in a running cluster)
        assert joined.urn in gate.depends_on


def workers_waited_for(rec, instance) -> list[str]:
    """The other workers (by name) whose instance or joined step this worker's instance waits for."""
    others = [(w, steps) for w, steps in zip(WORKERS, worker_steps(rec), strict=True) if steps[0] is not instance]
    return [w for w, steps in others if any(depends(rec, instance, r) for r in steps)]


def test_a_first_deployment_boots_every_worker_at_once(default_run):
    assert_joined_step_waits_for_its_own_worker(default_run)
    for instance, _ in worker_steps(default_run):
        assert workers_waited_for(default_run, instance) == [], instance.name


def test_on_a_deployed_stack_each_worker_waits_for_the_previous_one_to_have_joined(deployed_run, default_run):
    assert_joined_step_waits_for_its_own_worker(deployed_run)
    steps = worker_steps(deployed_run)
    order = [r.urn for r in deployed_run.resources]  # the order the SDK sent the registrations in
    assert workers_waited_for(deployed_run, steps[0][0]) == []
    for index in range(1, len(steps)):
        instance, (_, previous_joined) = steps[index][0], steps[index - 1]
        assert previous_joined.urn in instance.depends_on, instance.name
        assert workers_waited_for(deployed_run, instance) == WORKERS[:index]
        assert order.index(previous_joined.urn) < order.index(instance.urn)
    # a dependency only: the worker's inputs are a first deployment's, so the order replaces nothing
    for instance, first in zip(steps, worker_steps(default_run), strict=True):
        assert instance[0].inputs == first[0].inputs and instance[1].inputs == first[1].inputs


IPS = ["10.0.0.20", "10.0.0.21"]  # the last deployment had two workers


@pytest.mark.parametrize(
    "index, previous, previous_ips, waits",
    [
        (1, None, None, False),  # a first deployment
        (1, {}, None, False),
        (1, WANTED, IPS, True),
        (0, WANTED, IPS, False),  # the first worker waits for no other
        (1, {**WANTED, "nvidiaDriverBranch": "570"}, IPS, True),  # not a control-plane setting
        (2, WANTED, IPS, False),  # added by a larger workerCount: it serves nothing yet
        (3, WANTED, None, True),  # the last worker list unknown: the safe side
        (1, {**WANTED, "controlPlaneGeneration": "0"}, IPS, False),  # a rebuild: the cluster starts empty
    ],
)
def test_a_worker_waits_for_the_previous_one_only_where_the_cluster_keeps_serving(index, previous, previous_ips, waits):
    assert infrastructure.waits_for_previous_worker(index, previous, previous_ips, WANTED) is waits

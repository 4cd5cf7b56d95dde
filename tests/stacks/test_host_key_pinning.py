"""Every SSH step to the control node pins the host key that node published (read by the local
command from its console), and no instance's user-data carries a private key."""

from pathlib import Path

from components import ssh_access
from core import trusted_yaml
from stacks.offline import reveal
from tests import tokens
from tests.conftest import by_type

ROOT = Path(__file__).resolve().parents[2]
LOCAL_COMMAND = "command:local:Command"


def test_every_ssh_step_pins_the_key_the_control_node_published(default_run):
    (reader,) = [r for r in by_type(default_run, LOCAL_COMMAND) if r.name.endswith("-host-key")]
    (association,) = by_type(default_run, tokens.EIP_ASSOCIATION)
    control = default_run.named("testbed-control-instance")
    # it reads the console of the instance SSH reaches (the Elastic IP's), once that instance exists
    assert reveal(reader.inputs["environment"])["INSTANCE_ID"] == association.inputs["instanceId"]
    assert control.urn in reader.depends_on
    assert reveal(reader.inputs["environment"])["REGION"] == default_run.settings.region
    assert (ROOT / reader.inputs["create"].split()[-1]).is_file()  # run from the project directory
    pinned = ssh_access.pinned_host_key(reader.outputs["stdout"])
    steps = by_type(default_run, tokens.COMMAND)
    assert len(steps) > 5
    for step in steps:
        assert reveal(step.inputs["connection"])["hostKey"] == pinned, step.name
    ca_key_step = default_run.named("testbed-ca-key")
    assert reader.urn in ca_key_step.depends_on  # the CA key waits for the pinned key


def test_no_user_data_carries_a_private_key(default_run):
    instances = by_type(default_run, tokens.INSTANCE)
    assert instances
    for node in instances:
        text = reveal(node.inputs["userData"])
        assert "PRIVATE KEY" not in text, node.name
        doc = trusted_yaml.load(text)
        # cloud-config's host-key fields (cc_ssh `ssh_keys`) would put one there
        assert "ssh_keys" not in doc and "ssh_genkeytypes" not in doc, node.name

"""The component tree: `pulumi up` shows, groups and deletes resources by it, and URNs derive
from it (a resource that moves to another parent is replaced on the next update)."""

from tests import tokens

COMPONENTS = {
    "testbed-network": "testbed:aws:Network",
    "testbed-ssh": "testbed:aws:SshAccess",
    "testbed-identity": "testbed:cluster:Identity",
    "testbed-control": "testbed:aws:ControlNode",
    **{f"testbed-worker-{i}": "testbed:aws:GpuWorker" for i in range(4)},
    "testbed-readiness": "testbed:cluster:ReadinessGate",
    "testbed-device-plugin": "testbed:platform:DevicePlugin",
    "testbed-cert-manager": "testbed:platform:CertManager",
    "testbed-monitoring": "testbed:platform:Monitoring",
    "testbed-slinky": "testbed:platform:Slinky",
    "testbed-keda": "testbed:platform:Keda",
    "testbed-training-operator": "testbed:platform:TrainingOperator",
}


def test_components_have_their_types_and_sit_at_the_top(default_run):
    components = {r.name: r for r in default_run.resources if r.type.startswith("testbed:")}
    assert {name: r.type for name, r in components.items()} == COMPONENTS
    assert {r.parent.split("::")[2] for r in components.values()} == {tokens.STACK}


def test_every_resource_belongs_to_the_component_named_in_its_name(default_run):
    by_urn = {r.urn: r for r in default_run.resources}
    for r in default_run.resources:
        if r.type.startswith(("testbed:", "pulumi:providers:")):
            continue
        parent = by_urn.get(r.parent)
        assert parent is not None and parent.type.startswith("testbed:"), r.name
        assert r.name.startswith(parent.name + "-"), (r.name, parent.name)

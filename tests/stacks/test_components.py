"""The component tree: `pulumi up` shows, groups and deletes resources by it, and URNs derive
from it (a resource that moves to another parent is replaced on the next update)."""

from tests import tokens
from tests.conftest import BUDGET_AND_WORKSPACE_NOT_KEPT, by_type, run_program

COMPONENTS = {
    "testbed-network": "testbed:aws:Network",
    "testbed-ssh": "testbed:aws:SshAccess",
    "testbed-evidence": "testbed:aws:ManagedPrometheus",  # managedPrometheus (default true)
    "testbed-identity": "testbed:cluster:Identity",
    "testbed-node-credentials": "testbed:cluster:NodeCredentials",
    "testbed-control": "testbed:aws:ControlNode",
    **{f"testbed-worker-{i}": "testbed:aws:GpuWorker" for i in range(4)},
    "testbed-readiness": "testbed:cluster:ReadinessGate",
    "testbed-device-plugin": "testbed:platform:DevicePlugin",
    "testbed-cert-manager": "testbed:platform:CertManager",
    "testbed-monitoring": "testbed:platform:Monitoring",
    "testbed-slinky": "testbed:platform:Slinky",
    "testbed-keda": "testbed:platform:Keda",
    "testbed-kueue": "testbed:platform:Kueue",
    "testbed-ai-run-limit": tokens.AI_RUN_LIMIT,
    "testbed-fair-share": tokens.FAIR_SHARE_CONTROLLER,
    "testbed-runnable-exporter": tokens.RUNNABLE_EXPORTER,
    "testbed-tenant-volumes": tokens.TENANT_VOLUMES,
    "testbed-user-roles": "testbed:platform:UserRoles",
    "testbed-training-operator": "testbed:platform:TrainingOperator",
}


def test_components_have_their_types_and_sit_at_the_top(default_run):
    components = {r.name: r for r in default_run.resources if r.type.startswith("testbed:")}
    assert {name: r.type for name, r in components.items()} == COMPONENTS
    assert {r.parent.split("::")[2] for r in components.values()} == {tokens.STACK}
    # the budget alarm, when asked for, is a component at the top too
    budget = run_program(**BUDGET_AND_WORKSPACE_NOT_KEPT).named("testbed-budget")
    assert budget.type == "testbed:aws:BudgetAlarm" and budget.parent.split("::")[2] == tokens.STACK


WORKERS = [f"testbed-worker-{i}" for i in range(4)]
# Made for a node by a component that is not the node's own, so named for the node: each worker's
# join token (minted with the cluster's identity) and what `pulumi up` delivers over SSH.
FOR_A_NODE = {
    "testbed-identity": {f"{w}-token-{part}" for w in WORKERS for part in ("id", "secret")},
    "testbed-node-credentials": {"testbed-ca-key", *(f"{w}-join-token" for w in WORKERS)},
    "testbed-ssh": {"testbed-control-host-key"},  # the control node's published host key, read
}


def test_every_resource_belongs_to_the_component_named_in_its_name(default_run):
    by_urn = {r.urn: r for r in default_run.resources}
    (self_reference,) = by_type(default_run, tokens.STACK_REFERENCE)
    assert self_reference.parent.split("::")[2] == tokens.STACK
    assert self_reference.name.endswith("/gpu-testbed/dev")  # <organization>/<project>/<stack>
    for_a_node = {name: set() for name in FOR_A_NODE}
    for r in default_run.resources:
        if r.type.startswith(("testbed:", "pulumi:providers:")) or r is self_reference:
            continue
        parent = by_urn.get(r.parent)
        if parent is not None and r.name in FOR_A_NODE.get(parent.name, ()):
            for_a_node[parent.name].add(r.name)
            continue
        assert parent is not None and parent.type.startswith("testbed:"), r.name
        assert r.name.startswith(parent.name + "-"), (r.name, parent.name)
    assert for_a_node == FOR_A_NODE  # each made, under the component that makes it

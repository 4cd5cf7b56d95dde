"""Evidence that outlives the cluster (managedPrometheus) and the budget alarm: every value is
read from what the program registered and what the mock engine returned, never from the settings."""

from __future__ import annotations

import json
import re

import pytest

from components import dashboard, keda, managed_prometheus, monitoring, slurmd_scaling
from core import host_layout
from core.names import Names
from core.settings import SettingsError, load
from stacks import infrastructure, offline
from tests import tokens
from tests.conftest import BUDGET_AND_WORKSPACE_NOT_KEPT, by_type, config, deployed_outputs, run_program

CONTROL = "testbed-control-instance"


def stack_release_values(rec: offline.Recording) -> dict:
    (release,) = [r for r in by_type(rec, tokens.RELEASE) if r.inputs["name"] == "monitoring"]
    return offline.reveal(release.inputs["values"])


def prometheus_spec(rec: offline.Recording) -> dict:
    return stack_release_values(rec)["prometheus"]["prometheusSpec"]


@pytest.fixture(scope="module")
def without_evidence() -> offline.Recording:
    return run_program(managedPrometheus=False)


def test_prometheus_writes_to_the_workspace_the_program_created(default_run):
    (workspace,) = by_type(default_run, tokens.AMP_WORKSPACE)
    ((remote,),) = [prometheus_spec(default_run)["remoteWrite"]]
    # the URL is the workspace's own endpoint (what AWS returned) with the remote-write path
    endpoint = workspace.outputs["prometheusEndpoint"]
    assert remote["url"] == endpoint + "api/v1/remote_write" and endpoint.endswith("/")
    assert remote["url"].startswith(f"https://aps-workspaces.{default_run.settings.region}.amazonaws.com/workspaces/")
    # signed for the region of the provider that created the workspace, with the instance role
    (provider,) = by_type(default_run, tokens.AWS_PROVIDER)
    assert workspace.provider.startswith(provider.urn + "::")
    assert remote["sigv4"] == {"region": provider.inputs["region"]}
    assert prometheus_spec(default_run)["externalLabels"] == {monitoring.STACK_LABEL: default_run.settings.stack}
    assert workspace.inputs["alias"] == f"gpu-testbed-{default_run.settings.stack}"


def test_the_grant_is_remote_write_on_that_workspace_on_the_control_nodes_role_only(default_run):
    (workspace,) = by_type(default_run, tokens.AMP_WORKSPACE)
    (role,) = by_type(default_run, tokens.IAM_ROLE)
    (grant,) = by_type(default_run, tokens.IAM_ROLE_POLICY)
    (profile,) = by_type(default_run, tokens.INSTANCE_PROFILE)
    (statement,) = json.loads(grant.inputs["policy"])["Statement"]
    assert statement == {
        "Sid": "RemoteWriteThisWorkspace",
        "Effect": "Allow",
        "Action": "aps:RemoteWrite",
        "Resource": workspace.outputs["arn"],
    }
    assert grant.inputs["role"] == role.outputs["name"] == profile.inputs["role"]
    (trust,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert trust["Principal"] == {"Service": "ec2.amazonaws.com"} and trust["Action"] == "sts:AssumeRole"
    holders = {i.name: i.inputs.get("iamInstanceProfile") for i in by_type(default_run, tokens.INSTANCE)}
    assert holders.pop(CONTROL) == profile.outputs["name"]
    assert holders and set(holders.values()) == {None}, "a GPU worker got AWS credentials"


def test_the_role_is_bounded_by_the_administrators_policy_in_the_account_it_is_made_in(default_run):
    """The boundary ARN is built from the account the stack's own provider answers with (its
    caller identity), which is the account the workspace was made in; the policy name is the
    one the deployer policy and preflight expect."""
    (role,) = by_type(default_run, tokens.IAM_ROLE)
    (workspace,) = by_type(default_run, tokens.AMP_WORKSPACE)
    (provider,) = by_type(default_run, tokens.AWS_PROVIDER)
    asked = [ref for token, ref in default_run.invokes if token == tokens.GET_CALLER_IDENTITY]
    assert asked == [role.provider] and role.provider.startswith(provider.urn + "::")
    account = workspace.outputs["arn"].split(":")[4]
    assert role.inputs["permissionsBoundary"] == f"arn:aws:iam::{account}:policy/testbed-evidence-writer-boundary"
    assert account == offline.PLACEHOLDER_ACCOUNT  # what the engine's identity answered, not a setting


def test_hop_limit_1_on_every_node_and_prometheus_in_the_control_nodes_network(default_run):
    roles = {i.inputs["tags"]["testbed:role"]: i for i in by_type(default_run, tokens.INSTANCE)}
    assert set(roles) == {"control-plane", "gpu-worker"}
    for node in by_type(default_run, tokens.INSTANCE):
        assert node.inputs["metadataOptions"]["httpPutResponseHopLimit"] == 1, node.name
    spec = prometheus_spec(default_run)
    # hop limit 1 reaches IMDS from the host's network namespace only
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    # and the host is the control node: kubeadm's label and the taint it keeps
    assert spec["nodeSelector"] == {host_layout.CONTROL_PLANE_NODE_LABEL: ""}
    (toleration,) = spec["tolerations"]
    assert toleration["key"] == host_layout.CONTROL_PLANE_TAINT and toleration["effect"] == "NoSchedule"
    assert roles["control-plane"].inputs["iamInstanceProfile"]


def test_the_workspace_outlives_destroy_unless_told_otherwise(default_run):
    (workspace,) = by_type(default_run, tokens.AMP_WORKSPACE)
    assert workspace.options["retainOnDelete"] is True
    (deleted,) = by_type(run_program(**BUDGET_AND_WORKSPACE_NOT_KEPT), tokens.AMP_WORKSPACE)
    assert "retainOnDelete" not in deleted.options
    # only the workspace is kept: the role and its grant go with the stack
    for token in (tokens.IAM_ROLE, tokens.IAM_ROLE_POLICY, tokens.INSTANCE_PROFILE):
        assert "retainOnDelete" not in by_type(default_run, token)[0].options


def test_managed_prometheus_false_keeps_metrics_in_the_cluster(default_run, without_evidence):
    assert not {r.type for r in without_evidence.resources} & tokens.EVIDENCE_TYPES
    assert all("iamInstanceProfile" not in i.inputs for i in by_type(without_evidence, tokens.INSTANCE))
    spec = prometheus_spec(without_evidence)
    assert not {"remoteWrite", "hostNetwork", "dnsPolicy", "nodeSelector", "tolerations", "externalLabels"} & set(spec)
    # everything else about Prometheus is as with the workspace
    with_evidence = prometheus_spec(default_run)
    assert {k: v for k, v in with_evidence.items() if k in spec} == spec


def test_adding_the_workspace_to_a_deployed_stack_replaces_no_node(without_evidence):
    """A stack deployed without the workspace (or before it existed) gets it by an in-place
    change of the control instance's instance profile: its user-data, the control-plane guard's
    settings and every worker stay as they are."""
    rec = offline.run(config(), mocks=offline.TestbedMocks(deployed_outputs()))
    before = {i.name: i for i in by_type(without_evidence, tokens.INSTANCE)}
    for node in by_type(rec, tokens.INSTANCE):
        old = before[node.name]
        changed = {k for k in node.inputs.keys() | old.inputs.keys() if node.inputs.get(k) != old.inputs.get(k)}
        assert changed == ({"iamInstanceProfile"} if node.name == CONTROL else set()), node.name
        assert "replacementTrigger" not in node.options and "iamInstanceProfile" not in node.options.get(
            "replaceOnChanges", []
        )
    assert infrastructure.control_plane_settings(rec.settings) == infrastructure.control_plane_settings(
        without_evidence.settings
    )


def metric_names(expr: str) -> set[str]:
    """The series a PromQL expression reads: names before a label matcher or standing alone,
    not functions (followed by "("), keywords or label names in by/on lists."""
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\b(by|on|without|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    words = re.findall(r"(?<![\w.:])([A-Za-z_:][\w:]*)\b(?!\s*\()", expr)
    return {w for w in words if w not in {"by", "on", "or", "and", "unless", "bool", "offset"}}


def written(name: str) -> bool:
    """Whether the remote-write relabelling keeps a series (Prometheus anchors each regex)."""
    spec = monitoring.remote_write_values("https://x/", "us-east-1", "dev")["prometheus"]["prometheusSpec"]
    ((remote,),) = [spec["remoteWrite"]]
    rules = remote["writeRelabelConfigs"]
    for rule in rules:
        assert rule["sourceLabels"] == ["__name__"]
        matched = re.fullmatch(rule["regex"], name) is not None
        if (rule["action"] == "keep") != matched:
            return False
    return True


def test_every_series_the_dashboard_and_keda_read_is_written_and_the_bulk_is_not(default_run):
    n = Names.from_settings(default_run.settings)
    exprs = [t["expr"] for p in dashboard.handoff_dashboard(n)["panels"] for t in p.get("targets", [])]
    exprs += [t["metadata"]["query"] for policy in slurmd_scaling.POLICIES for t in keda.triggers(n, policy)]
    read = set().union(*map(metric_names, exprs))
    assert {"DCGM_FI_DEV_GPU_UTIL", "slurm_partition_nodes_alloc", "kueue_cluster_queue_resource_pending"} <= read
    assert {name for name in read if not written(name)} == set()
    for bulk in (
        "container_cpu_usage_seconds_total",  # cAdvisor, per container
        "apiserver_request_duration_seconds_bucket",
        "node_cpu_seconds_total",
        "kueue_admission_wait_time_seconds_bucket",  # a kept family's histogram buckets
        "kube_pod_container_status_restarts_total",
    ):
        assert not written(bulk), bulk


def test_remote_write_renderer_derives_the_url_from_any_endpoint_form():
    assert (
        managed_prometheus.remote_write_url("https://h/workspaces/ws-1/")
        == "https://h/workspaces/ws-1/api/v1/remote_write"
    )
    assert (
        managed_prometheus.remote_write_url("https://h/workspaces/ws-1")
        == "https://h/workspaces/ws-1/api/v1/remote_write"
    )


# ------------------------------------------------------------------------------ budget


def test_no_budget_unless_asked(default_run):
    assert not default_run.of_type(tokens.BUDGET)


def test_a_budget_alarms_at_the_forecast_and_the_actual_cost():
    rec = run_program(**BUDGET_AND_WORKSPACE_NOT_KEPT)
    (budget,) = by_type(rec, tokens.BUDGET)
    assert (budget.inputs["budgetType"], budget.inputs["timeUnit"]) == ("COST", "MONTHLY")
    assert (budget.inputs["limitAmount"], budget.inputs["limitUnit"]) == ("250", "USD")
    alarms = {n["notificationType"]: n for n in budget.inputs["notifications"]}
    assert set(alarms) == {"FORECASTED", "ACTUAL"}
    for n in alarms.values():
        assert n["subscriberEmailAddresses"] == ["ops@example.com"]
        assert (n["comparisonOperator"], n["threshold"], n["thresholdType"]) == ("GREATER_THAN", 100, "PERCENTAGE")
    (provider,) = by_type(rec, tokens.AWS_PROVIDER)
    assert budget.provider.startswith(provider.urn + "::")


@pytest.mark.parametrize(
    "settings, problem",
    [
        (
            {"budgetMonthlyUsd": "100"},
            'budgetEmail: missing with budgetMonthlyUsd "100"; expected the e-mail address the budget alarm goes to',
        ),
        (
            {"budgetEmail": "ops@example.com"},
            'budgetEmail: "ops@example.com" is not allowed without a budget; expected budgetMonthlyUsd above 0 too, '
            "or budgetEmail empty",
        ),
        (
            {"budgetMonthlyUsd": "100", "budgetEmail": "Ops <ops@example.com>"},
            'budgetEmail: "Ops <ops@example.com>" is not allowed; expected one e-mail address, e.g. you@example.com',
        ),
        (
            {"budgetMonthlyUsd": "100001", "budgetEmail": "ops@example.com"},
            'budgetMonthlyUsd: "100001" is not allowed; expected an integer from 0 to 100000',
        ),
    ],
)
def test_budget_settings_are_refused_with_one_line_each(settings, problem):
    with pytest.raises(SettingsError) as error:
        load(config(**settings), offline=True)
    assert error.value.problems == [problem]


def test_plan_says_where_the_evidence_lives_and_what_watches_the_bill(default_run, without_evidence):
    from cli import artifacts
    from stacks import pricing

    lines = artifacts.guard_lines(default_run, pricing.estimate(default_run.settings))
    assert lines == [
        "evidence: AMP workspace gpu-testbed-dev (kept after `pulumi destroy`); the control node's Prometheus "
        "remote-writes the evidence series with aps:RemoteWrite on that workspace only, within the boundary "
        "testbed-evidence-writer-boundary an administrator creates once per account (preflight checks it)",
        "budget: none (set budgetMonthlyUsd and budgetEmail for a cost alarm)",
    ]
    assert artifacts.guard_lines(without_evidence, pricing.estimate(without_evidence.settings))[0].startswith(
        "evidence: in the cluster's Prometheus only"
    )
    rec = run_program(**BUDGET_AND_WORKSPACE_NOT_KEPT)
    cost = pricing.estimate(rec.settings)
    evidence, budget = artifacts.guard_lines(rec, cost)
    assert "(deleted with the stack)" in evidence
    assert budget == (
        "budget: $250/month for the whole account; actual and forecasted cost above it emails ops@example.com "
        f"(this stack left running all month: about ${cost.hourly_usd * 730:,.0f})"
    )
    assert budget in artifacts.plan_text(rec).splitlines()


def test_a_real_prometheus_accepts_the_remote_write_as_the_operator_renders_it(default_run, tmp_path):
    """Prometheus 3's promtool (from the real-engine root tools/engine-root.sh builds) parses the
    remote_write block the operator generates from the Prometheus resource: SigV4, the relabel rules
    in RE2, the external label. prometheus-operator's camelCase fields are Prometheus' snake_case ones."""
    import subprocess

    from core import trusted_yaml
    from tests.engines import harness

    promtool = harness.promtool()
    spec = prometheus_spec(default_run)
    ((remote,),) = [spec["remoteWrite"]]
    config_file = tmp_path / "prometheus.yml"
    config_file.write_text(
        trusted_yaml.dump(
            {
                "global": {"external_labels": spec["externalLabels"]},
                "remote_write": [
                    {
                        "url": remote["url"],
                        "sigv4": remote["sigv4"],
                        "write_relabel_configs": [
                            {"source_labels": r["sourceLabels"], "regex": r["regex"], "action": r["action"]}
                            for r in remote["writeRelabelConfigs"]
                        ],
                    }
                ],
            }
        )
    )
    done = subprocess.run([promtool, "check", "config", str(config_file)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr

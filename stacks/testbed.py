"""The whole program: settings -> infrastructure -> cluster -> platform -> outputs."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws
from pulumi.runtime import config as runtime_config

from components.budget import BudgetAlarm, BudgetAlarmArgs
from core import settings
from core.settings import PROJECT, Settings
from stacks import cluster, infrastructure, platform, pricing, workloads


def settings_from_pulumi(offline: bool = False) -> Settings:
    """Settings from the running Pulumi program's config (the only reader of it; here, not in
    core/, which stays free of Pulumi).

    Every key is read, to refuse the unknown ones. The public API cannot list them (pulumi 3.272.0:
    pulumi.Config and runtime.get_config read one named key; runtime.get_config_env is only the
    PULUMI_CONFIG the CLI passes), and config a host sets with runtime.set_all_config (the
    automation API's inline programs, automation/_server.py; the mocks) is kept only in the
    private runtime/config.py CONFIG, so it is read there."""
    config = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    return settings.load(config, stack=pulumi.get_stack(), offline=offline)


def build(s: Settings) -> dict[str, pulumi.Input]:
    """Create every resource; return the stack outputs."""
    last = infrastructure.last_deployment()
    control_plane = infrastructure.guard_control_plane(s, last)
    aws_provider = aws.Provider(
        "testbed-aws",
        # the same region, once the guard passed: no AWS resource is touched when it refuses
        region=control_plane.apply(lambda _: s.region),
        default_tags={"tags": {"testbed:project": PROJECT, "testbed:stack": s.stack}},
    )
    if s.budget_monthly_usd:
        BudgetAlarm(
            "testbed-budget",
            BudgetAlarmArgs(monthly_usd=s.budget_monthly_usd, email=s.budget_email),
            opts=pulumi.ResourceOptions(provider=aws_provider),
        )
    identity = cluster.build_identity()
    infra = infrastructure.build(s, identity, aws_provider, last, cluster.lives_and_dies_with)
    access = cluster.build_access(s, infra, identity)
    testbed_platform = platform.build(s, access, infra.evidence)
    return {
        **workloads.outputs(infra, access, testbed_platform, pricing.estimate(s)),
        infrastructure.CONTROL_PLANE_SETTINGS_OUTPUT: control_plane,  # what the next run compares with
    }

"""KEDA and the ScaledObject that hands GPUs between Slurm and Kubernetes: slurmd scales 0..N
from slurmctld's partition metrics (rule and queries in `slurmd_scaling`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_command as command
import pulumi_kubernetes as k8s

from components import helm, monitoring, remote_script, slurmd_scaling
from core.names import (
    KEDA_NAMESPACE,
    NODESET_GROUP,
    NODESET_KIND,
    NODESET_VERSION,
    Names,
)

REPO = "https://kedacore.github.io/charts"
EXTERNAL_METRICS_API = "apiservice/v1beta1.external.metrics.k8s.io"
APISERVICE_TIMEOUT_SECONDS = 10 * 60


@dataclass
class KedaArgs:
    version: str
    names: Names  # the NodeSet, Prometheus, replica bounds, cooldown and polling
    min_replicas: int
    provider: k8s.Provider
    control_connection: command.remote.ConnectionArgs
    scaled_object_after: Sequence[pulumi.Resource]  # the slurm chart that creates the NodeSet
    # While KEDA's external-metrics APIService is registered but not yet serving, API
    # discovery fails for every other client: install KEDA after everything else.
    release_after: Sequence[pulumi.Resource] = ()
    policy: str = slurmd_scaling.DEFAULT_POLICY  # others only for comparison in the twin


def chart(version: str) -> helm.Chart:
    return helm.Chart("keda", KEDA_NAMESPACE, "keda", version, REPO)


def triggers(n: Names, policy: str = slurmd_scaling.DEFAULT_POLICY) -> list[dict]:
    """The ScaledObject's triggers for a stack: the doctor asks Prometheus the same queries."""
    target = slurmd_scaling.scaling_target(n)
    return slurmd_scaling.keda_triggers(n.prometheus_url, target, policy, n.cooldown_seconds)


def scaling_modifiers(n: Names, policy: str = slurmd_scaling.DEFAULT_POLICY) -> dict:
    """The formula over the triggers and the composite metric's target: what the doctor expects
    the deployed ScaledObject and its HPA to read."""
    return {
        "formula": slurmd_scaling.formula(slurmd_scaling.scaling_target(n), policy),
        "target": "1",
        "activationTarget": "0",
        "metricType": "AverageValue",
    }


def _formula_policy(n: Names, policy: str) -> dict:
    """What the formula policies change: the triggers are combined by a formula, and the
    cooldown (kedaCooldownSeconds) lives in its `recently_busy` query, so KEDA's cooldownPeriod and
    the HPA's scale-down window are 0 and a GPU goes back as soon as the formula says so.
    kedacore/keda@v2.20.2: apis/keda/v1alpha1/scaledobject_types.go (ScalingModifiers, a
    cooldownPeriod pointer: 0 is 0, pkg/scaling/executor/scale_scaledobjects.go), controllers/keda/
    hpa.go (the composite metric with this target and metricType; behavior passed through).
    An unset scale-down window would be the controller's 300 s default (kubernetes/kubernetes@
    v1.34.0:pkg/apis/autoscaling/v2/defaults.go leaves it nil); the policies stay the defaults."""
    return {
        "cooldownPeriod": 0,
        "advanced": {
            "scalingModifiers": scaling_modifiers(n, policy),
            "horizontalPodAutoscalerConfig": {"behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}},
        },
    }


def scaled_object(n: Names, min_replicas: int, policy: str = slurmd_scaling.DEFAULT_POLICY) -> dict:
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": n.scaled_object, "namespace": n.slurm.namespace},
        "spec": {
            # The NodeSet's /scale subresource; same namespace, as KEDA requires.
            "scaleTargetRef": {
                "apiVersion": f"{NODESET_GROUP}/{NODESET_VERSION}",
                "kind": NODESET_KIND,
                "name": n.slurm.nodeset_resource,
            },
            "idleReplicaCount": 0,  # GPUs go back to Kubernetes when Slurm is idle
            "minReplicaCount": min_replicas,  # must exceed idle, or KEDA rejects the object
            "maxReplicaCount": n.slurmd_max_replicas,
            "cooldownPeriod": n.cooldown_seconds,
            "pollingInterval": n.polling_seconds,
            "triggers": triggers(n, policy),
            **(_formula_policy(n, policy) if policy in slurmd_scaling.FORMULA_POLICIES else {}),
        },
    }


def metrics_api_step(triggers: Sequence[pulumi.Input] = ()) -> remote_script.RemoteStep:
    args = {
        "TIMEOUT_SECONDS": str(APISERVICE_TIMEOUT_SECONDS),
        "RESOURCE": EXTERNAL_METRICS_API,
        "CONDITION": "Available",
    }
    return remote_script.RemoteStep("wait-condition.sh", args, triggers=triggers)


class Keda(pulumi.ComponentResource):
    def __init__(self, name: str, args: KedaArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:platform:Keda", name, None, opts)
        self.release = helm.release(
            f"{name}-release",
            chart(args.version),
            helm.base_values(chart(args.version)),
            args.provider,
            parent=self,
            depends_on=args.release_after,
        )
        # Until KEDA's metrics API is Available, API discovery (and so every apply) fails.
        metrics_api = remote_script.run(
            f"{name}-metrics-api",
            metrics_api_step(triggers=helm.upgrade_triggers(self.release)),  # again after an upgrade
            args.control_connection,
            parent=self,
            depends_on=[self.release],
        )
        manifest = scaled_object(args.names, args.min_replicas, args.policy)
        self.scaled_object = k8s.apiextensions.CustomResource(
            f"{name}-scaled-object",
            api_version=manifest["apiVersion"],
            kind=manifest["kind"],
            metadata=manifest["metadata"],
            spec=manifest["spec"],
            opts=pulumi.ResourceOptions(
                parent=self, provider=args.provider, depends_on=[self.release, metrics_api, *args.scaled_object_after]
            ),
        )
        # What the demand-aware triggers read of Kueue: after Kueue (its namespace and ClusterRole)
        # and the monitoring stack (the ServiceMonitor CRD), which the KEDA release waits for, and,
        # like every apply, after KEDA's metrics API serves.
        scrape_opts = pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=[metrics_api])
        sa, token, binding, monitor = monitoring.kueue_scrape_manifests()
        scraper = k8s.core.v1.ServiceAccount(f"{name}-kueue-scraper", metadata=sa["metadata"], opts=scrape_opts)
        # The token controller deletes a token Secret whose service account does not exist yet.
        k8s.core.v1.Secret(
            f"{name}-kueue-scraper-token",
            metadata=token["metadata"],
            type=token["type"],
            opts=pulumi.ResourceOptions.merge(scrape_opts, pulumi.ResourceOptions(depends_on=[scraper])),
        )
        k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-kueue-scraper-binding",
            metadata=binding["metadata"],
            role_ref=binding["roleRef"],
            subjects=binding["subjects"],
            opts=scrape_opts,
        )
        k8s.apiextensions.CustomResource(
            f"{name}-kueue-service-monitor",
            api_version=monitor["apiVersion"],
            kind=monitor["kind"],
            metadata=monitor["metadata"],
            spec=monitor["spec"],
            opts=scrape_opts,
        )
        self.register_outputs({"scaledObject": args.names.scaled_object})

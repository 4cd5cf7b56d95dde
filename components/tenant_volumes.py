"""Tenants keep to their own storage: a ValidatingAdmissionPolicy refuses, in the tenants'
namespace (`default`, where AI users run), a Pod with any volume outside Pod Security's
restricted list: configMap, csi, downwardAPI, emptyDir, ephemeral, persistentVolumeClaim,
projected, secret (kubernetes/pod-security-admission@v0.34.0 policy/check_restrictedVolumes.go).
So no `nfs` volume reaches the share that privileged slurmd pods run from, and no `hostPath`
reaches a node's files. A claim needs a volume an admin made: tenants create no PersistentVolumes.

Pod Security restricted itself would do the same and more (non-root, no capabilities), which the
shipped PyTorch images, running as root, do not meet; the volume rule is the part that guards
what privileged pods run. Pods are what the kubelet mounts, so every controller's pods pass here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from components import ai_run_limit
from core.names import ADMISSION_API_VERSION, JOBS_NAMESPACE, NAMESPACE_NAME_LABEL

API_VERSION = ADMISSION_API_VERSION
POLICY_NAME = "testbed-tenant-volumes"

TENANT_NAMESPACES = (JOBS_NAMESPACE,)
ALLOWED_VOLUMES = (
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
)


def _allowed(v: str) -> str:
    return " || ".join(f"has({v}.{kind})" for kind in ALLOWED_VOLUMES)


def policy() -> dict:
    volumes = "object.spec.volumes"
    refused = f"{volumes}.filter(v, !({_allowed('v')})).map(v, v.name)"
    allowed = ", ".join(ALLOWED_VOLUMES)
    return {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                # volumes are immutable: CREATE is where one arrives
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"]}
                ],
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": list(TENANT_NAMESPACES)}
                    ]
                },
            },
            "validations": [
                {
                    "expression": f"!has({volumes}) || {volumes}.all(v, {_allowed('v')})",
                    "messageExpression": f"'volume ' + {refused}.join(', ') + ': a pod in a tenant namespace may "
                    f"use only {allowed} volumes (no nfs, no hostPath): the share and the nodes are the admin\\'s'",
                    "message": f"a pod in a tenant namespace may use only {allowed} volumes (no nfs, no hostPath)",
                }
            ],
        },
    }


def binding() -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME},
        "spec": {"policyName": POLICY_NAME, "validationActions": ["Deny"]},
    }


@dataclass
class TenantVolumesArgs:
    provider: k8s.Provider
    after: Sequence[pulumi.Resource]  # the cluster answering


class TenantVolumes(pulumi.ComponentResource):
    """The policy, then its binding."""

    def __init__(self, name: str, args: TenantVolumesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:platform:TenantVolumes", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=list(args.after))
        ai_run_limit.policy_and_binding(f"{name}-policy", policy(), binding(), child)
        self.register_outputs({"policy": POLICY_NAME})

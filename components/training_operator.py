"""Kubeflow Training Operator from its pinned standalone overlay, applied server-side on the
control node (the CRDs are too large for client-side apply) and deleted on `pulumi destroy`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_command as command

from components import remote_script
from components.names import JOBS_NAMESPACE, TRAINING_NAMESPACE

SCRIPT = "training-operator.sh"
DEPLOYMENT = "training-operator"  # manifests/base/deployment.yaml at the tag
READY_TIMEOUT_SECONDS = 10 * 60
PROBE_IMAGE = "registry.k8s.io/pause:3.10"  # never pulled: the probe is only dry-run


@dataclass
class TrainingOperatorArgs:
    version: str
    control_connection: command.remote.ConnectionArgs
    after: Sequence[pulumi.Resource]


def webhook_probe() -> dict:
    """The smallest PyTorchJob the v1.8.1 webhook accepts: Master with 1 replica, container `pytorch`."""
    replica = {
        "replicas": 1,
        "restartPolicy": "Never",
        "template": {"spec": {"containers": [{"name": "pytorch", "image": PROBE_IMAGE}]}},
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "testbed-webhook-probe", "namespace": JOBS_NAMESPACE},
        "spec": {"pytorchReplicaSpecs": {"Master": replica}},
    }


def overlay(version: str) -> str:
    """The pinned standalone overlay, as `kubectl -k` fetches it."""
    return f"github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref={version}"


def install_step(version: str) -> remote_script.RemoteStep:
    return remote_script.RemoteStep(
        SCRIPT,
        {
            "ACTION": "apply",
            "OVERLAY": overlay(version),
            "NAMESPACE": TRAINING_NAMESPACE,
            "DEPLOYMENT": DEPLOYMENT,
            "TIMEOUT_SECONDS": str(READY_TIMEOUT_SECONDS),
            "PROBE_MANIFEST": json.dumps(webhook_probe(), sort_keys=True),
        },
        delete_args={"ACTION": "delete", "OVERLAY": overlay(version)},
    )


class TrainingOperator(pulumi.ComponentResource):
    def __init__(self, name: str, args: TrainingOperatorArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:platform:TrainingOperator", name, None, opts)
        self.install = remote_script.run(
            f"{name}-install", install_step(args.version), args.control_connection, parent=self, depends_on=args.after
        )
        self.register_outputs({"namespace": TRAINING_NAMESPACE})

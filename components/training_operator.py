"""Kubeflow Training Operator from its pinned standalone overlay, applied server-side on the
control node (the CRDs are too large for client-side apply) and deleted on `pulumi destroy`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_command as command

from components import remote_script

SCRIPT = "training-operator.sh"
NAMESPACE = "kubeflow"
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
        "metadata": {"name": "testbed-webhook-probe", "namespace": "default"},
        "spec": {"pytorchReplicaSpecs": {"Master": replica}},
    }


class TrainingOperator(pulumi.ComponentResource):
    def __init__(self, name: str, args: TrainingOperatorArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:platform:TrainingOperator", name, None, opts)
        self.install = remote_script.run_script(
            f"{name}-install",
            SCRIPT,
            ["apply", args.version, str(READY_TIMEOUT_SECONDS), json.dumps(webhook_probe(), sort_keys=True)],
            args.control_connection,
            parent=self,
            depends_on=args.after,
            delete_arguments=["delete", args.version],
        )
        self.register_outputs({"namespace": NAMESPACE})

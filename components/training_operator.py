"""Kubeflow Training Operator from its pinned standalone overlay, applied server-side on the
control node (the CRDs are too large for client-side apply) and deleted on `pulumi destroy`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_command as command

from components import remote_script
from core import trusted_yaml
from core.names import JOBS_NAMESPACE, TRAINING_NAMESPACE

SCRIPT = "training-operator.sh"
DEPLOYMENT = "training-operator"  # manifests/base/deployment.yaml at the tag
READY_TIMEOUT_SECONDS = 10 * 60
PROBE_IMAGE = "registry.k8s.io/pause:3.10"  # never pulled: the probe is only dry-run
# Every PyTorchJob Worker gets an init container that looks up `<job>-master-0` this many times,
# 2 s apart, and fails the Worker (restartPolicy Never) when it gives up; the default is 100
# (kubeflow/trainer@v1.9.4, as at v1.8.1: pkg/config/config.go, pkg/controller.v1/pytorch/
# initcontainer.go, flag --pytorch-init-container-max-tries in cmd/training-operator.v1/main.go).
# An hour: a Worker waits for its Master as long as the example jobs may run at all
# (activeDeadlineSeconds), so the wait ends with the job, never on its own.
INIT_CONTAINER_WAIT_SECONDS = 3600
INIT_CONTAINER_MAX_TRIES = INIT_CONTAINER_WAIT_SECONDS // 2
INIT_CONTAINER_IMAGE = "alpine:3.10"  # config.go PyTorchInitContainerImageDefault: pre-pulled on workers


@dataclass
class TrainingOperatorArgs:
    version: str
    control_connection: command.remote.ConnectionArgs
    after: Sequence[pulumi.Resource]


def webhook_probe() -> dict:
    """The smallest PyTorchJob the webhook accepts: Master with 1 replica, container `pytorch`
    (kubeflow/trainer@v1.9.4:pkg/webhooks/pytorch/pytorchjob_webhook.go, as at v1.8.1; 1.9 also
    checks `runPolicy.managedBy`, which the probe leaves unset)."""
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


def kustomization(version: str) -> dict:
    """The pinned overlay with one change: the operator's init-container wait (the Deployment in
    manifests/base/deployment.yaml has a command and no args, at v1.8.1 and v1.9.4)."""
    flag = f"--pytorch-init-container-max-tries={INIT_CONTAINER_MAX_TRIES}"
    patch = [{"op": "add", "path": "/spec/template/spec/containers/0/args", "value": [flag]}]
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [overlay(version)],
        "patches": [{"target": {"kind": "Deployment", "name": DEPLOYMENT}, "patch": trusted_yaml.dump(patch)}],
    }


def install_step(version: str) -> remote_script.RemoteStep:
    return remote_script.RemoteStep(
        SCRIPT,
        {
            "ACTION": "apply",
            "OVERLAY": overlay(version),
            "KUSTOMIZATION": trusted_yaml.dump(kustomization(version), sort_keys=False),
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

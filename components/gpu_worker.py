"""One GPU worker: joins the cluster by itself, in parallel with the control plane; and a step on
the control node that passes once it has (re)joined, which the next worker may wait for."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_command as command

from components import ec2, remote_script
from core import names

JOINED_SCRIPT = "wait-node-joined.sh"
# Driver install and kubeadm join dominate a worker's boot: ~10-20 minutes is typical, as for the
# readiness gate (stacks/cluster.py READINESS_TIMEOUT_SECONDS).
JOINED_TIMEOUT_SECONDS = 45 * 60


@dataclass
class JoinedArgs:
    """What the worker's joined step needs of the cluster it joins."""

    connection: command.remote.ConnectionArgs  # to the control node
    region: str  # for the console-log command printed on failure
    after: Sequence[pulumi.Resource]  # e.g. the Elastic IP association SSH goes through


def joined_step(
    worker: str, private_ip: str, instance_id: pulumi.Input[str], instance_type: pulumi.Input[str], region: str
) -> remote_script.RemoteStep:
    """Passes once the worker's node is registered, heard from since the step started, Ready and,
    where the device plugin runs, allocates its GPU; run again for every new instance, and for an
    instance restarted with another type (an in-place change: EC2 stops it to change the type)."""
    return remote_script.RemoteStep(
        JOINED_SCRIPT,
        {
            "WORKER": worker,
            "NODE_IP": private_ip,
            "INSTANCE_ID": instance_id,
            "REGION": region,
            "GPU_RESOURCE": names.GPU_RESOURCE,
            "GPUS": str(names.GPUS_PER_WORKER),
            "DEVICE_PLUGIN_NAMESPACE": names.DEVICE_PLUGIN_NAMESPACE,
            "TIMEOUT_SECONDS": str(JOINED_TIMEOUT_SECONDS),
        },
        triggers=[instance_id, instance_type],
        # longer than the script's own deadline, so its diagnosis is always printed
        timeout_seconds=JOINED_TIMEOUT_SECONDS + 5 * 60,
    )


class GpuWorker(pulumi.ComponentResource):
    def __init__(self, name: str, node: ec2.NodeSpec, joined: JoinedArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:aws:GpuWorker", name, None, opts)
        self.instance = ec2.launch(f"{name}-instance", node, parent=self)
        self.private_ip = self.instance.private_ip
        # No delete command: `pulumi destroy` never dials for it (pulumi/pulumi-command@v1.2.1:
        # provider/pkg/provider/remote/commandController.go Delete returns when Delete is unset).
        self.joined = remote_script.run(
            f"{name}-joined",
            joined_step(name, node.private_ip, self.instance.id, self.instance.instance_type, joined.region),
            joined.connection,
            parent=self,
            depends_on=[self.instance, *joined.after],
        )
        self.register_outputs({"privateIp": self.private_ip})

"""The readiness gate: nothing is installed on the cluster before every node is Ready and its
bootstrap done. It, and every remote step that waits for a node, stops as soon as a node's
bootstrap records a failed step (testbed-lib.sh `record`), naming the node, the step, the tail
of its log and how to reach it."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_command as command

from components import remote_script
from core import host_layout

READINESS_SCRIPT = "wait-cluster-ready.sh"


def ssh_command(control_public_ip: str, private_ip: str | None = None) -> list[str]:
    """How you reach a node: the control node directly, a worker only through it (`-J`), the
    form docs/troubleshooting.md shows and `doctor` runs."""
    control = f"{host_layout.SSH_USER}@{control_public_ip}"
    return ["ssh", control] if private_ip is None else ["ssh", "-J", control, f"{host_layout.SSH_USER}@{private_ip}"]


def _lift(fn: Callable[..., str], *inputs: pulumi.Input[str]) -> pulumi.Input[str]:
    """fn over the inputs' values: a plain string when they are all known now."""
    if all(isinstance(i, str) for i in inputs):
        return fn(*inputs)
    return pulumi.Output.all(*inputs).apply(lambda values: fn(*values))


@dataclass(frozen=True)
class BootstrapWatch:
    """What a remote step on the control node needs to read the nodes' bootstrap status: a
    worker's over SSH from the control node, with the stack's key (every node authorizes it as
    its EC2 key pair), which travels on stdin as a secret."""

    control_public_ip: pulumi.Input[str]
    control_private_ip: str
    ssh_private_key: pulumi.Input[str]

    @classmethod
    def over(cls, connection: command.remote.ConnectionArgs, control_private_ip: str) -> BootstrapWatch:
        """From the connection the steps dial the control node with (by the stack's key)."""
        key = connection.private_key
        if key is None:
            raise ValueError("the control node's connection has no private key to reach the workers with")
        return cls(connection.host, control_private_ip, key)

    def reach(self, private_ip: str | None = None) -> pulumi.Input[str]:
        """`ssh_command` as one line, for a failure message; the control node without `private_ip`."""
        return _lift(lambda host: shlex.join(ssh_command(host, private_ip)), self.control_public_ip)

    def args(self) -> dict[str, str]:
        return {
            "BOOTSTRAP_LOG": host_layout.BOOTSTRAP_LOG,
            "BOOTSTRAP_STATUS": host_layout.BOOTSTRAP_STATUS,
            "SSH_USER": host_layout.SSH_USER,
        }

    def control_args(self) -> dict[str, pulumi.Input[str]]:
        """For a step that watches one worker: the control node, whose bootstrap it needs too."""
        return {"CONTROL_IP": self.control_private_ip, "CONTROL_REACH": self.reach()}

    def secrets(self) -> dict[str, pulumi.Input[str]]:
        return {"SSH_PRIVATE_KEY": self.ssh_private_key}


def readiness_step(
    watch: BootstrapWatch,
    region: str,
    node_ips: Sequence[str],
    instance_ids: Sequence[pulumi.Input[str]],
    timeout_seconds: int,
) -> remote_script.RemoteStep:
    """The gate's step. NODES: one "ROLE IP INSTANCE_ID REACH..." a line, ROLE control or worker."""

    def lines(host: str, *ids: str) -> str:
        return "\n".join(
            " ".join(
                ("control", ip, instance, shlex.join(ssh_command(host)))
                if ip == watch.control_private_ip
                else ("worker", ip, instance, shlex.join(ssh_command(host, ip)))
            )
            for ip, instance in zip(node_ips, ids, strict=True)
        )

    return remote_script.RemoteStep(
        READINESS_SCRIPT,
        {
            "TIMEOUT_SECONDS": str(timeout_seconds),
            "REGION": region,
            "NODES": _lift(lines, watch.control_public_ip, *instance_ids),
            **watch.args(),
        },
        secrets=watch.secrets(),
        triggers=list(instance_ids),  # a replaced node must be waited for again
        # longer than the script's own deadline, so its diagnosis is always printed
        timeout_seconds=timeout_seconds + 10 * 60,
    )


@dataclass
class ReadinessGateArgs:
    connection: command.remote.ConnectionArgs
    region: str  # for the console-log command printed on failure
    watch: BootstrapWatch
    node_ips: Sequence[str]  # every node that must be Ready, control plane included
    nodes: Sequence[pulumi.CustomResource]  # the instances behind those IPs, same order
    timeout_seconds: int
    after: Sequence[pulumi.Resource] = ()  # e.g. the Elastic IP association SSH goes through


class ReadinessGate(pulumi.ComponentResource):
    def __init__(self, name: str, args: ReadinessGateArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:cluster:ReadinessGate", name, None, opts)
        step = readiness_step(args.watch, args.region, args.node_ips, [n.id for n in args.nodes], args.timeout_seconds)
        self.command = remote_script.run(
            f"{name}-wait", step, args.connection, parent=self, depends_on=[*args.nodes, *args.after]
        )
        self.register_outputs({"stdout": self.command.stdout})

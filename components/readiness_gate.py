"""The readiness gate: nothing is installed on the cluster before every node is Ready."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_command as command

from components import host_layout, remote_script

READINESS_SCRIPT = "wait-cluster-ready.sh"


@dataclass
class ReadinessGateArgs:
    connection: command.remote.ConnectionArgs
    region: str  # for the console-log command printed on failure
    node_ips: Sequence[str]  # every node that must be Ready, control plane included
    nodes: Sequence[pulumi.CustomResource]  # the instances behind those IPs, same order
    timeout_seconds: int
    after: Sequence[pulumi.Resource] = ()  # e.g. the Elastic IP association SSH goes through


class ReadinessGate(pulumi.ComponentResource):
    def __init__(self, name: str, args: ReadinessGateArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:cluster:ReadinessGate", name, None, opts)
        named_nodes = [
            pulumi.Output.concat(ip, "=", node.id) for ip, node in zip(args.node_ips, args.nodes, strict=True)
        ]
        step = remote_script.RemoteStep(
            READINESS_SCRIPT,
            {
                "TIMEOUT_SECONDS": str(args.timeout_seconds),
                "REGION": args.region,
                "NODES": pulumi.Output.all(*named_nodes).apply(" ".join),
                "BOOTSTRAP_LOG": host_layout.BOOTSTRAP_LOG,
            },
            triggers=[n.id for n in args.nodes],  # a replaced node must be waited for again
            # longer than the script's own deadline, so its diagnosis is always printed
            timeout_seconds=args.timeout_seconds + 10 * 60,
        )
        self.command = remote_script.run(
            f"{name}-wait", step, args.connection, parent=self, depends_on=[*args.nodes, *args.after]
        )
        self.register_outputs({"stdout": self.command.stdout})

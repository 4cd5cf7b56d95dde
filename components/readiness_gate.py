"""The readiness gate: nothing is installed on the cluster before every node is Ready."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pulumi
import pulumi_command as command

from components import remote_script

READINESS_SCRIPT = "wait-cluster-ready.sh"


@dataclass
class ReadinessGateArgs:
    connection: command.remote.ConnectionArgs
    node_ips: Sequence[str]  # every node that must be Ready, control plane included
    nodes: Sequence[pulumi.CustomResource]  # the instances behind those IPs
    timeout_seconds: int
    after: Sequence[pulumi.Resource] = ()  # e.g. the Elastic IP association SSH goes through


class ReadinessGate(pulumi.ComponentResource):
    def __init__(self, name: str, args: ReadinessGateArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:cluster:ReadinessGate", name, None, opts)
        self.command = remote_script.run_script(
            f"{name}-wait", READINESS_SCRIPT, [str(args.timeout_seconds), *args.node_ips], args.connection,
            parent=self, depends_on=[*args.nodes, *args.after],
            triggers=[n.id for n in args.nodes])  # a replaced node must be waited for again
        self.register_outputs({"stdout": self.command.stdout})

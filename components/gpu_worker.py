"""One GPU worker: joins the cluster by itself, in parallel with the control plane."""

from __future__ import annotations

import pulumi

from components import ec2


class GpuWorker(pulumi.ComponentResource):
    def __init__(self, name: str, node: ec2.NodeSpec, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:aws:GpuWorker", name, None, opts)
        self.instance = ec2.launch(f"{name}-instance", node, parent=self)
        self.private_ip = self.instance.private_ip
        self.register_outputs({"privateIp": self.private_ip})

"""Layer 4: the stack outputs a user needs to reach and use the testbed."""
from __future__ import annotations

import pulumi

from components import host_layout
from stacks.cluster import ClusterAccess
from stacks.infrastructure import Infrastructure
from stacks.pricing import CostEstimate
from stacks.settings import Settings


def outputs(s: Settings, infra: Infrastructure, access: ClusterAccess, cost: CostEstimate) -> dict[str, pulumi.Input]:
    return {
        "kubeconfig": access.kubeconfig,
        "controlPlanePublicIp": infra.control.public_ip,
        "workerPrivateIps": [w.private_ip for w in infra.workers],
        "sshPrivateKey": infra.ssh.private_key,
        "sshCommand": pulumi.Output.concat(
            "pulumi stack output --show-secrets sshPrivateKey > testbed.pem && chmod 600 testbed.pem && ssh -i testbed.pem ",
            host_layout.SSH_USER, "@", infra.control.public_ip),
        "estimatedHourlyCostUsd": cost.hourly_usd,
    }

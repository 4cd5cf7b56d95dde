"""Layer 4: the stack outputs a user needs to reach and use the testbed."""

from __future__ import annotations

import pulumi

from core import host_layout
from core.names import SLURMCTLD_CONTAINER, SlurmNames, hpc_user_role
from stacks.cluster import ClusterAccess
from stacks.infrastructure import WORKER_IPS_OUTPUT, Infrastructure
from stacks.platform import Platform
from stacks.pricing import CostEstimate

KUBECONFIG_FILE = "kubeconfig.yaml"
SSH_KEY_FILE = "testbed.pem"


def sbatch_command(names: SlurmNames) -> str:
    """HPC users submit from inside slurmctld, with their own kubeconfig (which may reach that
    one pod, by name: components/user_roles.py); the job script travels on stdin."""
    role = hpc_user_role(names)
    return (
        f"kubectl --kubeconfig {role.kubeconfig_file} -n {names.namespace} exec -i {names.controller_pod} "
        f"-c {SLURMCTLD_CONTAINER} -- sbatch < job.sbatch"
    )


def outputs(
    infra: Infrastructure, access: ClusterAccess, platform: Platform, cost: CostEstimate
) -> dict[str, pulumi.Input]:
    return {
        "kubeconfig": access.kubeconfig,  # the operator's: cluster-admin
        **access.role_kubeconfigs,  # hpcKubeconfig, aiKubeconfig: short-lived, least privilege
        "controlPlanePublicIp": infra.control.public_ip,
        WORKER_IPS_OUTPUT: [w.private_ip for w in infra.workers],  # the next run reads it back
        "sshPrivateKey": infra.ssh.private_key,
        # umask 077: the key file is 0600 from its first byte; chmod: also when it existed before
        "sshCommand": pulumi.Output.concat(
            f"(umask 077 && pulumi stack output --show-secrets sshPrivateKey > {SSH_KEY_FILE}) && "
            f"chmod 600 {SSH_KEY_FILE} && ssh -i {SSH_KEY_FILE} {host_layout.SSH_USER}@",
            infra.control.public_ip,
        ),
        "sbatchCommand": sbatch_command(platform.names.slurm),
        "grafanaAdminPassword": platform.monitoring.grafana_password,
        "estimatedHourlyCostUsd": cost.hourly_usd,
    }

"""What the twin takes from the program: the rendered ScaledObject, slurm chart values and Kueue
objects, for a policy, from the stack's settings (`stacks/settings.py`) through the names contract."""

from __future__ import annotations

from components import keda, kueue, slinky, slurmd_scaling
from components.names import DEFAULT_PARTITION, Names
from stacks.settings import Settings
from twin.sim import Setup
from twin.slurm import SlurmConfig


def setup(s: Settings, policy: str = slurmd_scaling.DEFAULT_POLICY) -> Setup:
    names = Names.from_settings(s)
    args = keda.KedaArgs(
        version=s.keda_version,
        names=names,
        min_replicas=s.keda_min_replicas,
        provider=None,
        control_connection=None,
        scaled_object_after=(),
        policy=policy,
    )
    # The older policies ran with the chart's unlimited partitions and no job_submit plugin.
    max_nodes = names.slurmd_max_replicas if policy == slurmd_scaling.SAFE else None
    values = slinky.slurm_values(s.slinky_version, s.slurm_image_tag, names.slurm, {}, max_nodes)
    limit = values["partitions"][DEFAULT_PARTITION]["configMap"].get("MaxNodes")
    conf = values["controller"].get("extraConfMap") or {}
    enforce = conf.get("EnforcePartLimits") == "ALL"
    lua = conf.get("JobSubmitPlugins") == "lua" and slinky.JOB_SUBMIT_LUA.name in values.get("configFiles", {})
    target = keda.scaling_target(names.slurm)
    return Setup(
        scaled_object=keda.scaled_object(args),
        slurm=SlurmConfig(DEFAULT_PARTITION, target.nodeset_partition, int(limit) if limit else None, enforce, lua),
        namespace=target.namespace,
        nodeset=target.nodeset,
        host_prefix=names.slurm.nodeset,
        restapi_deployment=target.restapi_deployment,
        workers=names.gpus_total,
        kueue_objects=tuple(kueue.objects(names.shares)),
        kueue_config=kueue.manager_config(s.kueue_version),
    )

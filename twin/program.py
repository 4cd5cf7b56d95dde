"""What the twin takes from the program: the rendered ScaledObject, slurm chart values and Kueue
objects, the run-limit policies, the images its pods run and those on every node, the Training
Operator's init-container tries and how many pods the device plugin lets share a GPU, for a policy,
from the stack's settings (`core/settings.py`) through the names contract."""

from __future__ import annotations

from components import (
    ai_run_limit,
    bootstrap,
    device_plugin,
    fair_share,
    fair_share_controller,
    images,
    keda,
    kueue,
    slinky,
    slurm_config,
    slurmd_scaling,
    training_operator,
)
from core import trusted_yaml
from core.names import DEFAULT_PARTITION, GPU_RESOURCE, Names
from core.settings import Settings
from twin import kube
from twin.slurm import SlurmConfig
from twin.world import Setup

TRIES_FLAG = "--pytorch-init-container-max-tries="


def init_container_tries(training_operator_version: str) -> int:
    """The tries the program's overlay gives the operator (the flag in its Deployment patch), or
    the upstream default when it sets none."""
    for patch in training_operator.kustomization(training_operator_version)["patches"]:
        for op in trusted_yaml.load(patch["patch"]):
            for arg in op["value"] if op["path"].endswith("/args") else []:
                if arg.startswith(TRIES_FLAG):
                    return int(arg.removeprefix(TRIES_FLAG))
    return kube.INIT_TRIES_DEFAULT


def gpu_replicas(values: dict) -> int:
    """The devices the device plugin advertises per GPU, from its rendered chart values: the
    `replicas` of `nvidia.com/gpu` in the sharing section of the config the plugin selects, else 1.
    Followed (NVIDIA/k8s-device-plugin@v0.17.0): deployments/helm/nvidia-device-plugin/values.yaml
    `config` (`map` of named config files, `default`, `fallbackStrategies`);
    cmd/config-manager/main.go:350-390 (the default if set, else `named` picks "default" and
    `single` the only file; a node label could pick another, and the program sets none);
    api/config/v1/sharing.go:37-54 (MPS when set, else time-slicing) and replicas.go:243-255
    (replicas of 2 or more). Values the twin cannot follow are refused."""
    config = values.get("config") or {}
    if config.get("name"):
        raise ValueError("device plugin config.name: an external ConfigMap, which the twin cannot read")
    files = config.get("map") or {}
    if not files:
        return 1
    chosen = config.get("default")
    for strategy in [] if chosen else config.get("fallbackStrategies", ["named", "single"]):
        if strategy == "named" and "default" in files:
            chosen = "default"
        elif strategy == "single" and len(files) == 1:
            (chosen,) = files
        elif strategy == "empty":
            return 1  # an empty config: no sharing
        if chosen:
            break
    if chosen not in files:
        raise ValueError(f"device plugin config: no config file selected among {sorted(files)}")
    sharing = (trusted_yaml.load(files[chosen]) or {}).get("sharing") or {}
    replicated = sharing["mps"] if sharing.get("mps") is not None else sharing.get("timeSlicing") or {}
    if replicated.get("renameByDefault"):
        raise ValueError("device plugin sharing.renameByDefault: shared GPUs under another resource name")
    return max([r["replicas"] for r in replicated.get("resources", []) if r["name"] == GPU_RESOURCE] or [1])


# The first 1.0 patch whose logfile sidecar exits on SIGTERM and whose draining scale-in victim
# requeues its NodeSet (SlinkyProject/slurm-operator@v1.0.5:CHANGELOG/CHANGELOG-1.0.md,
# internal/builder/scripts/logfile.sh, internal/controller/nodeset/nodeset_sync.go:720-721;
# neither is in v1.0.4).
SLINKY_FIXED = (1, 0, 5)


def slinky_behaviour(slinky_version: str) -> dict:
    """The Setup fields that follow the Slinky release: a deleted slurmd pod holds its GPU for the
    grace period before 1.0.5 (twin/kube.py GRACE_PERIOD), and the 30 s drain requeue fires from 1.0.5."""
    fixed = tuple(int(p) for p in slinky_version.split(".")) >= SLINKY_FIXED
    return {"slurmd_termination": kube.TERMINATION if fixed else kube.GRACE_PERIOD, "drain_requeue": fixed}


def pod_images(slurm_values: dict) -> dict[str, str]:
    """The reference each of the twin's image roles (kube.IMAGE_PULL) runs: the slurmd pod's two
    from the rendered chart values, the example jobs' GPU containers, the operator's init container."""
    slurmd, logfile = images.nodeset_pod_images(slurm_values)
    gpu = images.example_gpu_images()
    return {
        "slurmd": slurmd,
        "logfile": logfile,
        "pytorch": gpu["PyTorchJob"],
        "job": gpu["Job"],
        "init": training_operator.INIT_CONTAINER_IMAGE,
    }


def setup(s: Settings, policy: str = slurmd_scaling.DEFAULT_POLICY) -> Setup:
    names = Names.from_settings(s)
    # The older policies ran with the chart's unlimited partitions (MaxTime too) and no job_submit plugin.
    guarded = policy in slurmd_scaling.GUARDED_POLICIES
    values = slinky.slurm_values(
        s.slinky_version,
        s.slurm_image_tag,
        names.slurm,
        max_nodes=names.slurmd_max_replicas if guarded else None,
        metrics_interval_seconds=names.metrics_interval_seconds,
        max_minutes=names.slurm_job_max_minutes if guarded else None,
        worker_type=names.worker_instance_type,
    )
    conf = slurm_config.slurm_files(values, names.slurm)
    slurm_conf = conf["slurm.conf"]
    limit = slurm_config.partition_max_nodes(slurm_conf)[DEFAULT_PARTITION]
    minutes = slurm_config.partition_max_minutes(slurm_conf)[DEFAULT_PARTITION]
    # Slurm's default is NO (src/common/read_config.c); ALL and ANY both check registered nodes.
    enforce = slurm_config.global_setting(slurm_conf, "EnforcePartLimits", "NO").upper() != "NO"
    lua = "lua" in slurm_config.global_setting(slurm_conf, "JobSubmitPlugins", "") and (
        slinky.JOB_SUBMIT_LUA.name in conf
    )
    kill_invalid_depend = "kill_invalid_depend" in slurm_config.global_setting(slurm_conf, "DependencyParameters", "")
    return_to_service = int(slurm_config.global_setting(slurm_conf, "ReturnToService", "0"))
    target = slurmd_scaling.scaling_target(names)
    return Setup(
        scaled_object=keda.scaled_object(names, s.keda_min_replicas, policy),
        slurm=SlurmConfig(
            DEFAULT_PARTITION,
            target.nodeset_partition,
            limit,
            enforce,
            lua,
            minutes,
            kill_invalid_depend,
            return_to_service,
        ),
        namespace=target.namespace,
        nodeset=target.nodeset,
        host_prefix=names.slurm.nodeset,
        restapi_deployment=target.restapi_deployment,
        workers=names.gpus_total,
        kueue_objects=tuple(kueue.objects(names.shares)),
        kueue_config=kueue.manager_config(s.kueue_version),
        images=pod_images(values),
        prepulled=images.worker_images(values),
        init_tries=init_container_tries(s.training_operator_version),
        slurmd_labels=values["nodesets"][names.slurm.nodeset]["metadata"]["labels"],
        scrape_interval=names.metrics_interval_seconds,
        run_limit=ai_run_limit.limits(ai_run_limit.objects(names.ai_job_max_minutes, names.shares.ai_max_gpus)),
        gpu_replicas=gpu_replicas(device_plugin.device_plugin_values(s.device_plugin_version, s.gpu_feature_discovery)),
        hpa_tolerance=float(bootstrap.HPA_TOLERANCE),
        fair_share_queries=(
            tuple(slurmd_scaling.fair_share_queries(target).items())
            if policy in slurmd_scaling.QUOTA_POLICIES
            else None
        ),
        guaranteed=(
            (fair_share.HPC, names.shares.hpc_gpus),
            (fair_share.AI, names.shares.ai_guaranteed_gpus),
        ),
        lends=tuple(fair_share_controller.lends(names).items()),
        turn_limit_s=fair_share_controller.no_starvation_bounds(names)["turn_start_s"],
        runnable_partitions=target.partitions if guarded else (),
        **slinky_behaviour(s.slinky_version),
    )

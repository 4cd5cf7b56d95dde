"""Slinky: slurm-operator (CRDs, operator behind the cert-manager gate), the slurmctld
statesave volume, and the `slurm` chart with one GPU NodeSet."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_command as command
import pulumi_kubernetes as k8s

from components import helm, slurm_config
from components.webhook_gate import webhook_gate
from core import host_layout, instance_types
from core.names import (
    DEFAULT_PARTITION,
    GPU_RESOURCE,
    GPUS_PER_WORKER,
    SLINKY_OPERATOR_NAMESPACE,
    SLURM_CHART,
    SLURM_METRICS_INTERVAL_SECONDS,
    Names,
    SlurmNames,
    slurmd_queue_labels,
)

CHARTS = "oci://ghcr.io/slinkyproject/charts"
IMAGES = "ghcr.io/slinkyproject"
STATESAVE_SIZE = "4Gi"  # the chart's controller.persistence request
GPU_GRES = "gpu:tesla:1"  # one Tesla T4 per slurmd pod
SHARED_VOLUME = "shared"
# slurmctld's job_submit/lua script: a job sized only in GPUs gets one node per GPU, or a refusal.
JOB_SUBMIT_LUA = Path(__file__).with_name("job_submit.lua")
# slurmctld's EpilogSlurmctld: the sha256 of each ended job's output, which `validate` checks.
OUTPUT_DIGEST_SCRIPT = Path(__file__).with_name("scripts") / "output-digest.sh"


def gpu_types() -> tuple[str, ...]:
    """The GPU types every slurmd node advertises (GPU_GRES `gpu:<type>:<count>`)."""
    return (GPU_GRES.split(":")[1],)


def job_submit_parameters(worker_type: str) -> dict[str, int | str]:
    """job_submit.lua's parameters for a worker instance type (core/instance_types.py): what one
    slurmd pod's node offers. CPUs: the type's vCPUs, as slurmd counts them (every hardware thread,
    CR_Core_Memory); memory: instance_types.slurm_memory_mb."""
    spec = instance_types.CATALOGUE[worker_type]
    return {
        "GPUS_PER_NODE": GPUS_PER_WORKER,
        "NODE_CPUS": spec.vcpu,
        "NODE_MEMORY_MB": instance_types.slurm_memory_mb(worker_type),
        "GPU_TYPES": ",".join(gpu_types()),
        "WORKER_TYPE": worker_type,
    }


def job_submit_script(parameters: dict[str, int | str]) -> str:
    """components/job_submit.lua with its parameter lines (`local NAME = value`) set; every one must
    be there exactly once."""
    text = JOB_SUBMIT_LUA.read_text()
    for key, value in parameters.items():
        literal = f'"{value}"' if isinstance(value, str) else str(value)
        text, found = re.subn(rf"^local {key} = .*$", f"local {key} = {literal}", text, count=1, flags=re.M)
        if found != 1:
            raise ValueError(f"job_submit.lua has no parameter line `local {key} = ...`")
    return text


@dataclass
class SlinkyArgs:
    version: str
    image_tag: str
    names: SlurmNames  # release, namespace and NodeSet key: the PVC, NodeSet and ClusterName follow
    service_monitor_labels: dict[str, str]
    provider: k8s.Provider
    control_connection: command.remote.ConnectionArgs
    operator_after: Sequence[pulumi.Resource]  # the cert-manager webhook gate
    cluster_after: Sequence[pulumi.Resource]  # the ServiceMonitor CRD (monitoring stack)
    max_nodes: int | None = None  # partition MaxNodes, enforced at submit; None: unlimited
    metrics_interval_seconds: int = SLURM_METRICS_INTERVAL_SECONDS  # the ServiceMonitor's scrape interval
    max_minutes: int | None = None  # partition MaxTime, enforced at submit; None: the chart's UNLIMITED
    worker_type: str = Names.worker_instance_type  # workerInstanceType: the node shape job_submit.lua enforces


CHART_DEFAULT_NODESET = "slinky"  # the key of the chart's own entry under `nodesets:`


def crds_chart(version: str) -> helm.Chart:
    return helm.Chart("slurm-operator-crds", SLINKY_OPERATOR_NAMESPACE, f"{CHARTS}/slurm-operator-crds", version)


def operator_chart(version: str) -> helm.Chart:
    return helm.Chart("slurm-operator", SLINKY_OPERATOR_NAMESPACE, f"{CHARTS}/slurm-operator", version)


def slurm_chart(version: str, n: SlurmNames) -> helm.Chart:
    return helm.Chart(n.release, n.namespace, f"{CHARTS}/{SLURM_CHART}", version)


def _image(component: str, tag: str) -> dict:
    return {"repository": f"{IMAGES}/{component}", "tag": tag}


def _shared_volume() -> tuple[dict, dict]:
    """/mnt/share from the host (NFS on workers, the export itself on the control node)."""
    volume = {"name": SHARED_VOLUME, "hostPath": {"path": host_layout.SHARE_DIR, "type": "Directory"}}
    mount = {"name": SHARED_VOLUME, "mountPath": host_layout.SHARE_DIR}
    return volume, mount


def _partition_limits(max_nodes: int | None, max_minutes: int | None) -> dict:
    """The limits both partitions carry; job_submit.lua refuses a job over one at submit (from these
    configured values), instead of a job that pends forever (PartitionNodeLimit, PartitionTimeLimit).
    * MaxNodes: the most nodes a job may ask, the NodeSet's largest size.
    * MaxTime (minutes): the longest a job may run (slurmJobMaxMinutes). slurmctld ends a job at its
      time limit (TIMEOUT), and a job without --time gets MaxTime as its limit when it starts, as no
      DefaultTime is set (SchedMD/slurm@slurm-25-11-6-1:src/slurmctld/node_scheduler.c
      select_nodes, job_mgr.c job_time_limit): so it bounds how long AI waits for a GPU slurmd
      borrowed. It replaces the chart's `MaxTime: UNLIMITED` on `all` (helm/slurm/values.yaml).
    `controller.extraConfMap` and `partitions.<p>.configMap` become slurm.conf lines
    (SlinkyProject/slurm-operator@v1.0.0: helm/slurm/templates/controller/_helpers.tpl),
    `nodesets.<k>.partition.configMap` the NodeSet's own partition line (nodeset/nodeset-cr.yaml);
    components/slurm_config.py assembles them."""
    limits = {"MaxNodes": max_nodes, "MaxTime": max_minutes}
    return {key: value for key, value in limits.items() if value}


# Never a limit that depends on how many slurmd pods exist at submit: Slinky's slurmd are dynamic
# nodes, deleted on scale-in, so with slurmd at 0 the partitions hold no node, and any other value
# makes slurmctld compare each job with that empty partition and refuse it ("More processors
# requested than permitted"; SchedMD/slurm@slurm-25-11-6-1:src/slurmctld/job_mgr.c _part_access_check,
# _valid_job_part). Seen on the real slurmctld (tests/engines/test_slurm_submit.py).
ENFORCE_PART_LIMITS = "NO"
# A job whose dependency can never be satisfied (afterok on a job that failed or timed out) is
# cancelled instead of pending for good (SchedMD/slurm@slurm-25-11-6-1: doc/man/man5/slurm.conf.5
# DependencyParameters; src/slurmctld/job_mgr.c reads it as 26.05.5 does, which tests/engines runs):
# a pending job that can never start would otherwise count as work, and slurmd would start for it
# each time the stall memory of components/slurmd_scaling.py runs out.
DEPENDENCY_PARAMETERS = "kill_invalid_depend"


DISABLE_TOKEN_CREATION = "disable_token_creation"


def _auth_alt_parameters() -> dict:
    """AuthAltParameters again, after the operator's `jwt_key=...` line: the same key file (without
    it slurmctld would look for the key in StateSaveLocation; auth_jwt.c _init_hs256) and
    disable_token_creation, so only root and SlurmUser may mint a JWT with `scontrol token`
    (SchedMD/slurm@slurm-25-11-6-1 and @slurm-26-05-0-1: src/slurmctld/proc_req.c
    _slurm_rpc_auth_token, validate_slurm_user). Without it any user, or anyone holding any valid
    token such as the exporter's 15-minute one for `nobody`, mints a token of any lifespan for itself.
    Slurm keeps the last value of a keyword given twice (src/common/parse_config.c _handle_common:
    "specified more than once, latest value used"), and the operator writes controller.extraConf after
    its own lines (SlinkyProject/slurm-operator@v1.0.5: internal/builder/controller_config.go
    buildSlurmConf), which has no other way to change them. Nothing here asks slurmctld for a token:
    the operator signs its own (slurm, for slurmrestd) and each Token's with the key itself
    (internal/controller/slurmclient/slurmclient_sync.go, internal/builder/token_secret.go).
    max_token_lifespan is not set: it binds exactly the users disable_token_creation refuses (root and
    SlurmUser are exempt), and slurmctld applies it only when minting, never when it checks a token
    (auth_jwt.c checks `exp` alone), so it cannot shorten a token the operator signs."""
    return {"AuthAltParameters": [slurm_config.OPERATOR_AUTH_ALT_PARAMETERS, DISABLE_TOKEN_CREATION]}


def _job_submit_plugin() -> dict:
    """JobSubmitPlugins=lua runs /etc/slurm/job_submit.lua (beside slurm.conf) on every submission
    (SchedMD/slurm@slurm-25-11-0-1:src/plugins/job_submit/lua/job_submit_lua.c init). The plugin is in
    the slurmctld image: SlinkyProject/containers@ec9c4802:schedmd/slurm/25.11/ubuntu24.04/Dockerfile
    builds Slurm with its debian/control build-depends (liblua5.3-dev), configure enables Lua when it
    finds it (auxdir/x_ac_lua.m4), debian/rules puts every plugin in slurm-smd, which the slurmctld
    stage installs (pulling liblua5.3-0 through ${shlibs:Depends}). `configFiles` entries are mounted
    in slurmctld's /etc/slurm (SlinkyProject/slurm-operator@v1.0.0:helm/slurm/templates/controller/
    config-configmap.yaml, internal/builder/controller_app.go); the operator's webhook knows the name
    job_submit.lua (internal/webhook/controller_webhook.go)."""
    return {"JobSubmitPlugins": "lua"}


def slurm_values(
    version: str,
    image_tag: str,
    n: SlurmNames,
    *,
    service_monitor_labels: dict[str, str] | None = None,
    max_nodes: int | None = None,
    metrics_interval_seconds: int = SLURM_METRICS_INTERVAL_SECONDS,
    max_minutes: int | None = None,
    worker_type: str = Names.worker_instance_type,
) -> dict:
    volume, mount = _shared_volume()
    limits = _partition_limits(max_nodes, max_minutes)
    gpu_key, gpu_value = host_layout.GPU_NODE_LABEL
    base = helm.base_values(slurm_chart(version, n))
    gpu_nodeset = helm.deep_merge(
        base["nodesets"][CHART_DEFAULT_NODESET],
        {
            "enabled": True,
            "replicas": 0,  # KEDA owns the count from here on
            # On every slurmd pod (nodeset/nodeset-cr.yaml -> internal/builder/worker_app.go
            # PodMetadata): each pod is its own 1-GPU Kueue workload in queue `hpc`, gated until
            # admitted, so Kueue's quota sees the GPUs Slurm holds (components/kueue.py).
            "metadata": {"labels": slurmd_queue_labels()},
            "slurmd": {
                "image": _image("slurmd", image_tag),
                "resources": {"limits": {GPU_RESOURCE: GPUS_PER_WORKER}},
                "volumeMounts": [mount],
            },
            "extraConfMap": {"Gres": [GPU_GRES]},
            "podSpec": {"nodeSelector": {gpu_key: gpu_value}, "volumes": [volume]},
            **({"partition": {"configMap": limits}} if limits else {}),
        },
    )
    nodesets = {n.nodeset: gpu_nodeset}
    if n.nodeset != CHART_DEFAULT_NODESET:
        nodesets[CHART_DEFAULT_NODESET] = {"enabled": False}  # the chart's default entry is merged in otherwise
    computed: dict[str, Any] = {
        "controller": {
            "slurmctld": {"image": _image("slurmctld", image_tag), "volumeMounts": [mount]},
            "reconfigure": {"image": _image("slurmctld", image_tag)},
            "persistence": {"enabled": True, "resources": {"requests": {"storage": STATESAVE_SIZE}}},
            "podSpec": {
                "nodeSelector": {host_layout.CONTROL_PLANE_NODE_LABEL: ""},
                "tolerations": [{"key": host_layout.CONTROL_PLANE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
                # A given securityContext replaces the operator's whole default: restate it.
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": host_layout.SLURM_UID,
                    "runAsGroup": host_layout.SLURM_UID,
                    "fsGroup": host_layout.SLURM_UID,
                },
                "volumes": [volume],
            },
            # The scrape interval is the triggers' subquery step (components/slurmd_scaling.py).
            "metrics": {
                "enabled": True,
                "serviceMonitor": {
                    "enabled": True,
                    "labels": dict(service_monitor_labels or {}),
                    "interval": f"{metrics_interval_seconds}s",
                },
            },
        },
        "restapi": {"slurmrestd": {"image": _image("slurmrestd", image_tag)}},
        "nodesets": nodesets,
        # The chart keys each entry epilog-slurmctld-<key> in a ConfigMap; the operator mounts it in
        # /etc/slurm and writes EpilogSlurmctld=/etc/slurm/epilog-slurmctld-<key>
        # (slurm_config.epilog_slurmctld_files, which cites both at v1.0.5).
        "epilogSlurmctldScripts": {OUTPUT_DIGEST_SCRIPT.name: OUTPUT_DIGEST_SCRIPT.read_text()},
    }
    computed["controller"]["extraConfMap"] = _auth_alt_parameters()
    if limits:
        computed["controller"]["extraConfMap"].update(
            {
                "EnforcePartLimits": ENFORCE_PART_LIMITS,
                "DependencyParameters": DEPENDENCY_PARAMETERS,
                **_job_submit_plugin(),
            }
        )
        computed["partitions"] = {DEFAULT_PARTITION: {"configMap": limits}}
        computed["configFiles"] = {JOB_SUBMIT_LUA.name: job_submit_script(job_submit_parameters(worker_type))}
    return helm.deep_merge(base, computed)


def statesave_volume(n: SlurmNames) -> dict:
    """A hostPath PV pre-bound to the chart's own PVC: the 1.0.0 chart cannot name a claim or a
    class, and kubeadm has no provisioner. No storageClassName, so the class-less PVC matches.
    Its metadata and spec: the PersistentVolume resource sets apiVersion and kind."""
    return {
        "metadata": {
            "name": n.statesave_volume,
            # The PVC outlives the release; do not hold `pulumi destroy` on the PV's finalizer.
            "annotations": {"pulumi.com/skipAwait": "true"},
        },
        "spec": {
            "capacity": {"storage": STATESAVE_SIZE},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "volumeMode": "Filesystem",
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": n.namespace,
                "name": n.statesave_claim,
            },
            # Owned by the slurm UID on the host: hostPath ignores fsGroup.
            "hostPath": {"path": host_layout.SLURM_STATE_DIR, "type": "Directory"},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": host_layout.CONTROL_PLANE_NODE_LABEL, "operator": "Exists"}]}
                    ]
                }
            },
        },
    }


def operator_webhook_probe(n: SlurmNames) -> dict:
    """A NodeSet the operator's webhook (failurePolicy Fail) validates; only ever dry-run.
    `controllerRef` names the Controller alone: since 1.0.4 it is a LocalObjectReference, resolved
    in the NodeSet's own namespace, and the CRD has no `namespace` there any more
    (SlinkyProject/slurm-operator@v1.0.5:api/v1beta1/nodeset_types.go; 1.0.0's ObjectReference has
    it optional, so the same probe passes both). In the operator's namespace it names no Controller,
    so nothing would act on it even if it were stored."""
    return {
        "apiVersion": "slinky.slurm.net/v1beta1",
        "kind": "NodeSet",
        "metadata": {"name": "testbed-webhook-probe", "namespace": SLINKY_OPERATOR_NAMESPACE},
        "spec": {
            "controllerRef": {"name": n.fullname},
            "replicas": 0,
            "updateStrategy": {"type": "RollingUpdate"},
        },
    }


class Slinky(pulumi.ComponentResource):
    def __init__(self, name: str, args: SlinkyArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:platform:Slinky", name, None, opts)
        self.names = args.names
        child = pulumi.ResourceOptions(parent=self, provider=args.provider)
        crds = helm.release(
            f"{name}-crds",
            crds_chart(args.version),
            helm.base_values(crds_chart(args.version)),
            args.provider,
            parent=self,
        )
        operator = helm.release(
            f"{name}-operator",
            operator_chart(args.version),
            helm.base_values(operator_chart(args.version)),
            args.provider,
            parent=self,
            depends_on=[crds, *args.operator_after],
        )
        # Ready pods are not enough: the caBundle must be injected and the API server must reach the pod.
        operator_gate = webhook_gate(
            f"{name}-operator-webhook-gate",
            operator_webhook_probe(self.names),
            None,
            args.control_connection,
            parent=self,
            release=operator,
        )
        pv = statesave_volume(self.names)
        self.statesave_volume = k8s.core.v1.PersistentVolume(
            f"{name}-statesave", metadata=pv["metadata"], spec=pv["spec"], opts=child
        )
        self.cluster = helm.release(
            f"{name}-cluster",
            slurm_chart(args.version, self.names),
            slurm_values(
                args.version,
                args.image_tag,
                self.names,
                service_monitor_labels=args.service_monitor_labels,
                max_nodes=args.max_nodes,
                metrics_interval_seconds=args.metrics_interval_seconds,
                max_minutes=args.max_minutes,
                worker_type=args.worker_type,
            ),
            args.provider,
            parent=self,
            depends_on=[operator_gate, self.statesave_volume, *args.cluster_after],
        )
        self.register_outputs({"nodeset": self.names.nodeset_resource, "controllerPod": self.names.controller_pod})

"""Layer 3: everything that turns the bare cluster into the Under pattern (pulumi-kubernetes).

Order, as dependencies: cert-manager -> its webhook gate -> slurm-operator -> its gate;
monitoring (ServiceMonitor CRD) and the statesave PV -> slurm chart; Training Operator (the
PyTorchJob CRD) -> Kueue (its own certificates, no cert-manager) -> its pod webhooks narrowed
(checked) and its webhook gate -> queues -> slurm chart: every slurmd pod is a Kueue workload, so
none may be created before the narrowed webhooks and its LocalQueue exist; Kueue -> the AI run
limit (its policies refuse a queued job without a limit, which the gate's probe must not meet first);
Kueue's queues and monitoring -> the fair-share controller, which patches the queues' quotas;
slurm chart (Token CRD, JWT key) and monitoring -> the runnable-jobs exporter the scaler reads;
everything else -> KEDA (its metrics API disturbs discovery while it starts) -> ScaledObject.
The device plugin and the Training Operator need only the cluster."""

from __future__ import annotations

from dataclasses import dataclass

from components.ai_run_limit import AiRunLimit, AiRunLimitArgs
from components.cert_manager import CertManager, CertManagerArgs
from components.device_plugin import DevicePlugin, DevicePluginArgs
from components.fair_share_controller import FairShareController, FairShareControllerArgs
from components.keda import Keda, KedaArgs
from components.kueue import Kueue, KueueArgs
from components.managed_prometheus import ManagedPrometheus
from components.monitoring import Monitoring, MonitoringArgs, RemoteWrite, service_monitor_labels
from components.runnable_exporter import RunnableExporter, RunnableExporterArgs
from components.slinky import Slinky, SlinkyArgs
from components.tenant_volumes import TenantVolumes, TenantVolumesArgs
from components.training_operator import TrainingOperator, TrainingOperatorArgs
from components.user_roles import UserRoles, UserRolesArgs
from core.names import Names
from core.settings import Settings
from stacks.cluster import ClusterAccess


@dataclass
class Platform:
    names: Names
    device_plugin: DevicePlugin
    cert_manager: CertManager
    monitoring: Monitoring
    slinky: Slinky
    keda: Keda
    training_operator: TrainingOperator
    kueue: Kueue
    ai_run_limit: AiRunLimit
    fair_share: FairShareController
    runnable_exporter: RunnableExporter
    tenant_volumes: TenantVolumes
    user_roles: UserRoles


def build(s: Settings, access: ClusterAccess, evidence: ManagedPrometheus | None) -> Platform:
    provider, ssh = access.provider, access.control_connection
    names = Names.from_settings(s)
    device_plugin = DevicePlugin(
        "testbed-device-plugin",
        DevicePluginArgs(
            version=s.device_plugin_version, gpu_feature_discovery=s.gpu_feature_discovery, provider=provider
        ),
    )
    cert_manager = CertManager(
        "testbed-cert-manager",
        CertManagerArgs(version=s.cert_manager_version, provider=provider, control_connection=ssh),
    )
    monitoring = Monitoring(
        "testbed-monitoring",
        MonitoringArgs(
            kube_prometheus_stack_version=s.kube_prometheus_stack_version,
            dcgm_exporter_version=s.dcgm_exporter_version,
            names=names,
            provider=provider,
            remote_write=RemoteWrite(evidence.remote_write_url, s.region, s.stack) if evidence else None,
        ),
    )
    training_operator = TrainingOperator(
        "testbed-training-operator",
        TrainingOperatorArgs(version=s.training_operator_version, control_connection=ssh, after=[access.gate]),
    )
    kueue = Kueue(
        "testbed-kueue",
        KueueArgs(
            version=s.kueue_version,
            shares=names.shares,
            provider=provider,
            control_connection=ssh,
            after=[training_operator],
        ),
    )
    ai_run_limit = AiRunLimit(
        "testbed-ai-run-limit",
        AiRunLimitArgs(
            max_minutes=names.ai_job_max_minutes, gpus=names.shares.ai_max_gpus, provider=provider, after=kueue.ready
        ),
    )
    # The fair-share controller patches Kueue's ClusterQueues (after its webhook gate and the
    # queues) from what Prometheus reads (components/fair_share_controller.py)
    fair_share = FairShareController(
        "testbed-fair-share",
        FairShareControllerArgs(
            names=names,
            image=s.controller_image,
            kubernetes_minor=s.kubernetes_minor,
            provider=provider,
            after=[*kueue.ready, monitoring.stack],
        ),
    )
    # Tenants' pods keep off the share and the nodes' files from the first pod on (components/tenant_volumes.py)
    tenant_volumes = TenantVolumes("testbed-tenant-volumes", TenantVolumesArgs(provider=provider, after=[access.gate]))
    # what the hpcKubeconfig and aiKubeconfig outputs may do (components/user_roles.py)
    user_roles = UserRoles(
        "testbed-user-roles", UserRolesArgs(slurm=names.slurm, provider=provider, after=[kueue.slurm_namespace])
    )
    slinky = Slinky(
        "testbed-slinky",
        SlinkyArgs(
            version=s.slinky_version,
            image_tag=s.slurm_image_tag,
            names=names.slurm,
            service_monitor_labels=service_monitor_labels(),
            provider=provider,
            control_connection=ssh,
            operator_after=[cert_manager.webhook_gate],
            cluster_after=[monitoring.stack, *kueue.ready],
            max_nodes=names.slurmd_max_replicas,
            metrics_interval_seconds=names.metrics_interval_seconds,
            max_minutes=names.slurm_job_max_minutes,
            worker_type=names.worker_instance_type,
        ),
    )
    # Runnable pending work read from slurmrestd for the scaler (components/runnable_exporter.py):
    # its Token needs the Slurm chart's JWT key, its ServiceMonitor the monitoring stack's CRD
    runnable_exporter = RunnableExporter(
        "testbed-runnable-exporter",
        RunnableExporterArgs(
            names=names,
            image=s.controller_image,
            monitor_labels=service_monitor_labels(),
            provider=provider,
            slurm_after=[slinky.cluster],
            monitoring_after=[monitoring.stack],
        ),
    )
    keda = Keda(
        "testbed-keda",
        KedaArgs(
            version=s.keda_version,
            names=names,
            min_replicas=s.keda_min_replicas,
            provider=provider,
            control_connection=ssh,
            scaled_object_after=[slinky.cluster],
            release_after=[
                device_plugin,
                cert_manager,
                monitoring,
                slinky,
                training_operator,
                kueue,
                ai_run_limit,
                fair_share,
                runnable_exporter,
                tenant_volumes,
                user_roles,
            ],
        ),
    )
    return Platform(
        names,
        device_plugin,
        cert_manager,
        monitoring,
        slinky,
        keda,
        training_operator,
        kueue,
        ai_run_limit,
        fair_share,
        runnable_exporter,
        tenant_volumes,
        user_roles,
    )

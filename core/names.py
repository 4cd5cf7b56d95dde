"""The names contract: every name another part relies on, derived once from `Settings`.

The program, the Grafana dashboard, the commands the stack prints, the validation runner and
the tools that read a deployed stack all take their names from here, so a setting such as
`nodesetName` changes every place at once. No Pulumi imports: reading names costs nothing.

Evidence for the derived names (SlinkyProject/slurm-operator@v1.0.0): helm/slurm/templates/
_helpers.tpl (`slurm.fullname`), nodeset/nodeset-cr.yaml (`<fullname>-worker-<key>`),
api/v1beta1/controller_keys.go and restapi_keys.go (Services `<fullname>-controller` and
`<fullname>-restapi`), internal/builder/controller_app.go (StatefulSet `<controller>`,
volumeClaimTemplate `statesave`, port 6817, mount /var/spool/slurmctld/<ClusterName>),
restapi_app.go (port 6820), internal/controller/nodeset/utils/utils.go (pods
`<nodeset>-<ordinal>`), api/v1beta1/well_known.go and internal/builder/labels/labels.go (labels).
KEDA's HPA is `keda-hpa-<ScaledObject>` (kedacore/keda@v2.20.2:controllers/keda/hpa.go).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.instance_types import GPUS_PER_WORKER as GPUS_PER_WORKER  # read here with the other names
from core.settings import SETTINGS_BY_KEY, GpuShares, Settings

# Slinky: the release name is built into every object name, so it is pinned.
SLURM_RELEASE = "slurm"
SLURM_NAMESPACE = "slurm"
SLURM_CHART = "slurm"
SLINKY_OPERATOR_NAMESPACE = "slinky"
DEFAULT_PARTITION = "all"  # the chart's partitions.all has Default=YES: plain `sbatch` lands there
SLURMCTLD_CONTAINER = "slurmctld"
SLURMD_CONTAINER = "slurmd"
STATESAVE_VOLUME = "statesave"
SLURMCTLD_PORT = 6817
SLURMRESTD_PORT = 6820
SLURM_METRICS_INTERVAL_SECONDS: int = SETTINGS_BY_KEY["slurmMetricsIntervalSeconds"].default
NODESET_GROUP = "slinky.slurm.net"
NODESET_VERSION = "v1beta1"
NODESET_PLURAL = "nodesets"
NODESET_KIND = "NodeSet"
# The pod's hostname, which is also its Slurm node name (well_known.go LabelNodeSetPodHostname).
SLURMD_HOSTNAME_LABEL = "nodeset.slinky.slurm.net/pod-hostname"

KEDA_NAMESPACE = "keda"
SCALED_OBJECT = "slurmd"
# The pods' `app` labels (kedacore/charts@v2.16.1: keda/templates/manager/deployment.yaml and
# metrics-server/deployment.yaml, `<operator.name>` and `<operator.name>-metrics-apiserver`).
KEDA_OPERATOR_APP = "keda-operator"
KEDA_METRICS_SERVER_APP = "keda-operator-metrics-apiserver"
# The one External metric of the HPA of a ScaledObject with a formula (kedacore/keda@v2.16.1:
# apis/keda/v1alpha1/scaledobject_types.go CompositeMetricName).
KEDA_COMPOSITE_METRIC = "composite-metric"

MONITORING_NAMESPACE = "monitoring"
MONITORING_RELEASE = "monitoring"  # also kube-prometheus-stack's fullnameOverride
PROMETHEUS_PORT = 9090
GRAFANA_PORT = 80
# On the pod template of the testbed's own programs (fair-share controller, runnable-jobs
# exporter): the hash of the code they run, so a changed file rolls the pod.
CODE_HASH_ANNOTATION = "testbed/code-sha256"

CERT_MANAGER_NAMESPACE = "cert-manager"
CERT_MANAGER_RELEASE = "cert-manager"
DEVICE_PLUGIN_NAMESPACE = "nvidia-device-plugin"  # the chart refuses `default`
TRAINING_NAMESPACE = "kubeflow"  # the Training Operator's standalone overlay
JOBS_NAMESPACE = "default"  # where the example Kubernetes jobs run

# Kueue (kubernetes-sigs/kueue@v0.19.2): the chart's documented release and namespace; the webhook
# Service and Deployment are `<fullname>-webhook-service` and `<fullname>-controller-manager`.
KUEUE_RELEASE = "kueue"
KUEUE_NAMESPACE = "kueue-system"
KUEUE_GROUP_VERSION = "kueue.x-k8s.io/v1beta2"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"  # pkg/controller/constants/constants.go QueueLabel
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"  # constants.go WorkloadPriorityClassLabel
# A job's longest run once admitted, in seconds (constants.go MaxExecTimeSecondsLabel): Kueue
# deactivates its workload when admitted that long (components/ai_run_limit.py).
MAX_EXEC_TIME_LABEL = "kueue.x-k8s.io/max-exec-time-seconds"
GPU_RESOURCE = "nvidia.com/gpu"  # the NVIDIA device plugin's extended resource
GPU_COHORT = "gpus"  # the cohort both sides' ClusterQueues share
HPC_CLUSTER_QUEUE = "hpc"  # HPC's share of the GPUs: admits the slurmd pods
HPC_LOCAL_QUEUE = "hpc"  # in SLURM_NAMESPACE, named on the NodeSet's pod labels
HPC_PRIORITY_CLASS = "hpc-slurmd"  # the slurmd pods' WorkloadPriorityClass
AI_CLUSTER_QUEUE = "ai"
AI_LOCAL_QUEUE = "ai"  # in JOBS_NAMESPACE; never `default`, which Kueue treats as a catch-all
GPU_FLAVOR = "gpu-worker"
# The fair-share controller (components/fair_share_controller.py): its namespace, and the one name
# of its Deployment, ServiceAccount, ConfigMap and RBAC objects.
FAIR_SHARE_NAMESPACE = "fair-share"
FAIR_SHARE_CONTROLLER = "fair-share-controller"
AI_PRIORITY_CLASSES = ("ai-normal", "ai-high")  # lowest first; the example jobs use the first
# The chart's webhook configurations, `<kueue.fullname>-{mutating,validating}-webhook-configuration`,
# and its two pod webhooks (charts/kueue/templates/webhook/manifests.yaml).
KUEUE_POD_WEBHOOKS = {"mutating": "mpod.kb.io", "validating": "vpod.kb.io"}
# ValidatingAdmissionPolicy and its binding (components/ai_run_limit.py, components/tenant_volumes.py)
ADMISSION_API_VERSION = "admissionregistration.k8s.io/v1"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace

# Pulumi resource types the program creates and the tools find again in a plan or a stack's state.
INSTANCE_TYPE_TOKEN = "aws:ec2/instance:Instance"
AMP_WORKSPACE_TYPE_TOKEN = "aws:amp/workspace:Workspace"
IAM_ROLE_TYPE_TOKEN = "aws:iam/role:Role"
REMOTE_COMMAND_TYPE_TOKEN = "command:remote:Command"

# The evidence writer role's permissions boundary: a customer-managed policy an administrator
# creates once per account from iam/writer-boundary.json (docs/security-and-day2.md); the program
# names it, the deployer policy may create the role only with it, preflight checks it is there.
WRITER_BOUNDARY_POLICY = "testbed-evidence-writer-boundary"


def writer_boundary_arn(account: str) -> str:
    return f"arn:aws:iam::{account}:policy/{WRITER_BOUNDARY_POLICY}"


def helm_fullname(release: str, chart: str = SLURM_CHART) -> str:
    """`slurm.fullname`: the release name if it contains the chart name, else `<release>-<chart>`."""
    name = release if chart in release else f"{release}-{chart}"
    return name[:63].rstrip("-")


def kueue_webhook_configuration(kind: str) -> str:
    """`kind` is `mutating` or `validating`; `kueue.fullname` is the release (it contains `kueue`)."""
    return f"{helm_fullname(KUEUE_RELEASE, 'kueue')}-{kind}-webhook-configuration"


def kueue_controller_manager() -> str:
    """The Deployment `<kueue.fullname>-controller-manager`: its pods run the controllers and serve
    every webhook (charts/kueue/templates/manager/manager.yaml; webhook/service.yaml selects them)."""
    return f"{helm_fullname(KUEUE_RELEASE, 'kueue')}-controller-manager"


def slurmd_queue_labels() -> dict[str, str]:
    """The labels that make each slurmd pod its own Kueue workload in queue `hpc`."""
    return {QUEUE_NAME_LABEL: HPC_LOCAL_QUEUE, PRIORITY_CLASS_LABEL: HPC_PRIORITY_CLASS}


def label_selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


@dataclass(frozen=True)
class SlurmNames:
    """What the Slinky chart and operator name after the release and the NodeSet key."""

    release: str
    namespace: str
    nodeset: str  # the key under `nodesets:`; also the NodeSet's own Slurm partition

    @property
    def fullname(self) -> str:
        return helm_fullname(self.release)

    @property
    def controller_statefulset(self) -> str:
        return f"{self.fullname}-controller"

    @property
    def controller_pod(self) -> str:
        return f"{self.controller_statefulset}-0"

    @property
    def controller_service(self) -> str:
        return f"{self.fullname}-controller"

    @property
    def restapi_service(self) -> str:
        return f"{self.fullname}-restapi"

    @property
    def statesave_claim(self) -> str:
        """The PVC the StatefulSet's volumeClaimTemplate creates for pod 0."""
        return f"{STATESAVE_VOLUME}-{self.controller_pod}"

    @property
    def statesave_volume(self) -> str:
        return f"{self.fullname}-statesave"

    @property
    def nodeset_resource(self) -> str:
        return f"{self.fullname}-worker-{self.nodeset}"

    @property
    def slurmd_pod_prefix(self) -> str:
        """slurmd pods are `<NodeSet>-<ordinal>`."""
        return f"{self.nodeset_resource}-"

    @property
    def cluster_name(self) -> str:
        return f"{self.namespace}_{self.fullname}"

    @property
    def partitions(self) -> tuple[str, str]:
        """The partitions the NodeSet serves: the chart's default one and its own."""
        return (DEFAULT_PARTITION, self.nodeset)

    @property
    def slurmctld_selector(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": "slurmctld", "app.kubernetes.io/instance": self.fullname}

    @property
    def slurmd_selector(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": "slurmd", "app.kubernetes.io/instance": self.nodeset_resource}

    def exec_prefix(self) -> str:
        """The `kubectl exec` that users type to reach slurmctld."""
        return f"kubectl exec -i -n {self.namespace} {self.controller_pod} -c {SLURMCTLD_CONTAINER} --"


@dataclass(frozen=True)
class UserRole:
    """One kind of user's access (components/user_roles.py): a short-lived client certificate
    whose CN is `user` and whose O is `group` (the API server's x509 authenticator reads them as
    the user and its group), a Role and RoleBinding named `role` in `namespace` bound to that
    group, and the stack output that holds the kubeconfig."""

    role: str
    user: str
    group: str
    namespace: str
    output: str  # the stack output with its kubeconfig
    kubeconfig_file: str  # where the README saves it


# "testbed:" keeps the groups clear of the API server's reserved "system:" prefix
AI_USER_ROLE = UserRole("testbed-ai", "testbed-ai", "testbed:ai-users", JOBS_NAMESPACE, "aiKubeconfig", "ai.kubeconfig")


def hpc_user_role(slurm: SlurmNames) -> UserRole:
    return UserRole(
        "testbed-hpc", "testbed-hpc", "testbed:hpc-users", slurm.namespace, "hpcKubeconfig", "hpc.kubeconfig"
    )


def slurm_names(nodeset: str) -> SlurmNames:
    return SlurmNames(release=SLURM_RELEASE, namespace=SLURM_NAMESPACE, nodeset=nodeset)


@dataclass(frozen=True)
class Names:
    """Every cross-component name and count of one stack."""

    slurm: SlurmNames
    gpus_total: int  # GPUs the workers offer, and so the most slurmd pods
    slurmd_max_replicas: int
    cooldown_seconds: int
    polling_seconds: int
    shares: GpuShares
    metrics_interval_seconds: int = SLURM_METRICS_INTERVAL_SECONDS  # slurmctld's scrape interval
    # the partitions' MaxTime; every queued AI job's max-exec-time (the settings' defaults)
    slurm_job_max_minutes: int = SETTINGS_BY_KEY["slurmJobMaxMinutes"].default
    ai_job_max_minutes: int = SETTINGS_BY_KEY["aiJobMaxMinutes"].default
    # workerInstanceType: the shape of every slurmd node
    worker_instance_type: str = SETTINGS_BY_KEY["workerInstanceType"].default

    @classmethod
    def from_settings(cls, s: Settings) -> Names:
        return cls(
            slurm=slurm_names(s.nodeset_name),
            gpus_total=s.gpu_shares.gpus_total,
            slurmd_max_replicas=s.slurmd_max_replicas,
            cooldown_seconds=s.keda_cooldown_seconds,
            polling_seconds=s.keda_polling_seconds,
            shares=s.gpu_shares,
            metrics_interval_seconds=s.slurm_metrics_interval_seconds,
            slurm_job_max_minutes=s.slurm_job_max_minutes,
            ai_job_max_minutes=s.ai_job_max_minutes,
            worker_instance_type=s.worker_instance_type,
        )

    @property
    def scaled_object(self) -> str:
        return SCALED_OBJECT

    @property
    def keda_hpa(self) -> str:
        return f"keda-hpa-{SCALED_OBJECT}"

    @property
    def prometheus_service(self) -> str:
        """`<fullname>-prometheus`; fullnameOverride makes fullname the release."""
        return f"{MONITORING_RELEASE}-prometheus"

    @property
    def prometheus_url(self) -> str:
        return f"http://{self.prometheus_service}.{MONITORING_NAMESPACE}.svc:{PROMETHEUS_PORT}"

    @property
    def grafana_service(self) -> str:
        return f"{MONITORING_RELEASE}-grafana"

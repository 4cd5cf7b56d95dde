"""What the node bootstrap guarantees on every host, and what the platform layer relies on."""

SHARE_DIR = "/mnt/share"  # NFS from the control node, mounted on every worker; root's, 0755
# One directory per owner under it, none world-writable: Slurm jobs' scripts and output (they run
# as SLURM_UID), and the tools the admin's build job installs (nccl-tests and its NCCL), which
# Slurm jobs in privileged slurmd pods load and only SHARE_TOOLS_UID writes. The export squashes
# root, so root in a pod or on a worker writes neither.
SHARE_SLURM_DIR = f"{SHARE_DIR}/slurm"  # control-plane.sh makes both, under SHARE_DIR by these names
SHARE_TOOLS_DIR = f"{SHARE_DIR}/tools"
SHARE_TOOLS_UID = 402  # no user in the Slinky or CUDA images; the build job's copy step runs as it
SLURM_STATE_DIR = "/var/spool/slurmctld"  # on the control node, owned by SLURM_UID
# <job id>.sha256 per ended Slurm job, written by slurmctld's EpilogSlurmctld as SLURM_UID
# (components/scripts/output-digest.sh): no job and no share user can rewrite it.
OUTPUT_DIGEST_DIR = f"{SLURM_STATE_DIR}/output-digests"
SLURM_UID = 401  # the slurm user in the Slinky 25.11 images
POD_CIDR = "10.244.0.0/16"  # Flannel's default Network
# kubeadm's default service network, set explicitly (kubernetes/kubernetes@v1.34.0:
# cmd/kubeadm/app/apis/kubeadm/v1beta4/types.go Networking.ServiceSubnet)
SERVICE_CIDR = "10.96.0.0/12"
API_SERVER_PORT = 6443
GPU_NODE_LABEL = ("nvidia.com/gpu.present", "true")  # device plugin 0.17.0 schedules only here
# Where a GPU pod finds the GPUs it was given: the device plugin's volume-mounts strategy mounts
# /dev/null at DEVICE_LIST_ROOT/<GPU UUID> per GPU (components/device_plugin.py says why).
DEVICE_LIST_ROOT = "/var/run/nvidia-container-devices"
CONTROL_PLANE_NODE_LABEL = "node-role.kubernetes.io/control-plane"  # set by kubeadm init
CONTROL_PLANE_TAINT = "node-role.kubernetes.io/control-plane"  # NoSchedule, kept
ADMIN_KUBECONFIG = "/etc/kubernetes/admin.conf"
BOOTSTRAP_LOG = "/var/log/testbed-bootstrap.log"
# Where the bootstrap records its running, failed or done step (testbed-lib.sh `record`), root-only.
BOOTSTRAP_STATUS = "/var/log/testbed-bootstrap.status"
SSH_USER = "ubuntu"
# How the control node's bootstrap marks its SSH host key on the serial console, where
# read-host-key.sh finds it (components/ssh_access.py)
HOST_KEY_MARKER = "testbed-host-key:"

#!/usr/bin/env bash
# GPU worker: NVIDIA driver and container toolkit (nvidia as containerd's default runtime),
# the shared directory from the control node, DCGM's GPU diagnostic and kubeadm join, then the
# images the first slurmd pod and the first example jobs need (PREPULL_IMAGES, space-separated),
# so the readiness gate, which waits for this script on every node, passes only once they are on
# the node. Idempotent.
set -Eeuo pipefail
# shellcheck source=testbed-lib.sh
. "$(dirname "$0")/testbed-lib.sh"
load_env
require NVIDIA_DRIVER_BRANCH NVIDIA_CONTAINER_TOOLKIT_VERSION CONTROL_PLANE_IP API_SERVER_PORT SHARE_DIR KUBEADM_CONFIG
require CRI_SOCKET GPU_DIAG_LEVEL DCGM_VERSION DCGM_CUDA_MAJOR CUDA_REPO

step "NVIDIA ${NVIDIA_DRIVER_BRANCH}-server driver"
if ! nvidia-smi -L >/dev/null 2>&1; then
  # DKMS builds the open kernel module (right for Turing and later) against the running
  # kernel's headers, so the module loads now, without pulling a new kernel and a reboot.
  apt_get install "linux-headers-$(uname -r)" \
    "nvidia-headless-${NVIDIA_DRIVER_BRANCH}-server-open" "nvidia-utils-${NVIDIA_DRIVER_BRANCH}-server"
  modprobe nvidia || die "the nvidia kernel module does not load on kernel $(uname -r)"
fi
nvidia-smi -L || die "nvidia-smi sees no GPU"

step "nvidia-container-toolkit ${NVIDIA_CONTAINER_TOOLKIT_VERSION}"
keyring=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg  # as apt sees it; the file is ${ROOT}${keyring}
if [ ! -s "${ROOT}${keyring}" ]; then
  retry 5 10 curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey -o "${ROOT}/tmp/nvidia-container.key" \
    || die "cannot download the nvidia-container-toolkit signing key"
  gpg --dearmor --yes -o "${ROOT}${keyring}" "${ROOT}/tmp/nvidia-container.key"
fi
echo "deb [signed-by=${keyring}] https://nvidia.github.io/libnvidia-container/stable/deb/\$(ARCH) /" \
  >"${ROOT}/etc/apt/sources.list.d/nvidia-container-toolkit.list"
apt_get update
toolkit="${NVIDIA_CONTAINER_TOOLKIT_VERSION}-1"
toolkit_packages=(nvidia-container-toolkit nvidia-container-toolkit-base libnvidia-container-tools libnvidia-container1)
apt-mark unhold "${toolkit_packages[@]}" >/dev/null 2>&1 || true
apt_get install --allow-downgrades --allow-change-held-packages "${toolkit_packages[@]/%/=${toolkit}}"
# After node-common set SystemdCgroup: nvidia-ctk copies runc's options into the new runtime.
nvidia-ctk runtime configure --runtime=containerd --set-as-default
# A pod reaches a GPU only through the device plugin. Toolkit 1.18.1 defaults
# accept-nvidia-visible-devices-envvar-when-unprivileged to true, so any image with
# NVIDIA_VISIBLE_DEVICES=all (every CUDA image) would get every GPU without asking. With false,
# the variable counts only in containers holding CAP_SYS_ADMIN (the device plugin,
# dcgm-exporter, slurmd), and any other pod gets exactly the /dev/null mounts under
# /var/run/nvidia-container-devices that the device plugin's volume-mounts strategy adds for
# its allocation (NVIDIA/nvidia-container-toolkit@v1.18.1:internal/config/config.go,
# internal/config/image/cuda_image.go VisibleDevices, internal/config/image/privileged.go).
# After the package install: its postinst rewrites this file.
nvidia-ctk config --config-file="${ROOT}/etc/nvidia-container-runtime/config.toml" --in-place \
  --set accept-nvidia-visible-devices-envvar-when-unprivileged=false \
  --set accept-nvidia-visible-devices-as-volume-mounts=true
systemctl restart containerd

# unattended-upgrades must not replace the NVIDIA userspace libraries under the loaded kernel
# module ("Driver/library version mismatch" until reboot): every installed package of the
# driver branch and the toolkit stay held, as containerd is by node-common (the README says
# how to upgrade them deliberately).
step "holding the NVIDIA ${NVIDIA_DRIVER_BRANCH}-server driver and the toolkit"
mapfile -t driver_packages < <(installed_packages "*-${NVIDIA_DRIVER_BRANCH}-server*")
[ "${#driver_packages[@]}" -gt 0 ] || die "no installed NVIDIA ${NVIDIA_DRIVER_BRANCH}-server driver package to hold"
apt-mark hold "${driver_packages[@]}" "${toolkit_packages[@]}" >/dev/null

step "shared directory ${SHARE_DIR} from ${CONTROL_PLANE_IP}"
add_line "${ROOT}/etc/fstab" "${CONTROL_PLANE_IP}:${SHARE_DIR} ${SHARE_DIR} nfs4 rw,_netdev,nofail,timeo=600,retrans=5 0 0"
mountpoint -q "${ROOT}${SHARE_DIR}" || retry 60 20 mount "${ROOT}${SHARE_DIR}" || die "cannot mount ${SHARE_DIR} from ${CONTROL_PLANE_IP}"

if [ -f "${ROOT}/etc/kubernetes/kubelet.conf" ]; then
  log "already joined"
else
  # A GPU that fails DCGM's diagnostic must not join. Only before the join: a joined node may be
  # running GPU work.
  step "GPU diagnostic (DCGM ${DCGM_VERSION} dcgmi diag -r ${GPU_DIAG_LEVEL})"
  keyring=/usr/share/keyrings/cuda-archive-keyring.gpg
  if [ ! -s "${ROOT}${keyring}" ]; then
    retry 5 10 curl -fsSL "${CUDA_REPO}/3bf863cc.pub" -o "${ROOT}/tmp/cuda.key" || die "cannot download the CUDA repo key"
    gpg --dearmor --yes -o "${ROOT}${keyring}" "${ROOT}/tmp/cuda.key"
  fi
  echo "deb [signed-by=${keyring}] ${CUDA_REPO}/ /" >"${ROOT}/etc/apt/sources.list.d/cuda-dcgm.list"
  # Priority 100: only what Ubuntu lacks comes from there, never its driver or CUDA
  printf 'Package: *\nPin: origin developer.download.nvidia.com\nPin-Priority: 100\n' >"${ROOT}/etc/apt/preferences.d/cuda-dcgm.pref"
  apt_get update
  dcgm=(datacenter-gpu-manager-4-{core,proprietary,cuda"$DCGM_CUDA_MAJOR",proprietary-cuda"$DCGM_CUDA_MAJOR"})
  apt_get install "${dcgm[@]/%/=1:${DCGM_VERSION}-1}"
  apt-mark hold "${dcgm[@]}" >/dev/null
  # The host engine runs for the diagnostic only: dcgm-exporter embeds its own.
  systemctl start nvidia-dcgm || die "the DCGM host engine (nvidia-dcgm) does not start"
  rc=0
  dcgmi diag -r "$GPU_DIAG_LEVEL" 2>&1 | tee "${ROOT}/tmp/gpu-diag.txt" || rc=$?
  systemctl stop nvidia-dcgm || true
  if [ "$rc" -ne 0 ]; then
    failed=$(grep -i -m 3 fail "${ROOT}/tmp/gpu-diag.txt" || true)
    die "dcgmi diag -r ${GPU_DIAG_LEVEL} failed (exit ${rc}): ${failed//$'\n'/; }"
  fi
  step "kubeadm join ${CONTROL_PLANE_IP}:${API_SERVER_PORT} (retried until the control plane answers)"
  join() { kubeadm join --config "${ROOT}${KUBEADM_CONFIG}" || { kubeadm reset -f >/dev/null 2>&1; false; }; }
  retry 20 30 join || die "kubeadm join did not succeed"
fi
step "images for the first slurmd pod and the example jobs"
# Through the CRI, as the kubelet pulls: the images land in containerd's k8s.io namespace.
for image in ${PREPULL_IMAGES:-}; do
  if crictl --runtime-endpoint "$CRI_SOCKET" inspecti "$image" >/dev/null 2>&1; then
    log "image ${image} already present"
  else
    log "pulling ${image}"
    retry 5 30 crictl --runtime-endpoint "$CRI_SOCKET" pull "$image" >/dev/null || die "cannot pull ${image}"
  fi
done
finish "gpu-worker done"

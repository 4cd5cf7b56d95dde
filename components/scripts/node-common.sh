#!/usr/bin/env bash
# Every node: kernel settings, containerd, and kubelet/kubeadm/kubectl from pkgs.k8s.io.
# Idempotent: a second run converges to the same state.
set -Eeuo pipefail
# shellcheck source=testbed-lib.sh
. "$(dirname "$0")/testbed-lib.sh"
load_env
require KUBERNETES_VERSION KUBERNETES_MINOR SHARE_DIR

step "kernel modules and sysctls for the pod network"
printf 'overlay\nbr_netfilter\n' >"${ROOT}/etc/modules-load.d/testbed-k8s.conf"
modprobe overlay
modprobe br_netfilter
cat >"${ROOT}/etc/sysctl.d/99-testbed-k8s.conf" <<'SYSCTL'
net.bridge.bridge-nf-call-iptables = 1
net.bridge.bridge-nf-call-ip6tables = 1
net.ipv4.ip_forward = 1
SYSCTL
sysctl --system >/dev/null

step "swap off (kubelet refuses to start with swap)"
swapoff -a
sed -ri '/\sswap\s/s/^([^#])/#\1/' "${ROOT}/etc/fstab"

step "Kubernetes v${KUBERNETES_VERSION} packages"
apt_get update
apt_get install apt-transport-https ca-certificates curl gpg
install -d -m 0755 "${ROOT}/etc/apt/keyrings"
keyring=/etc/apt/keyrings/kubernetes-apt-keyring.gpg  # as apt sees it; the file is ${ROOT}${keyring}
if [ ! -s "${ROOT}${keyring}" ]; then
  retry 5 10 curl -fsSL "https://pkgs.k8s.io/core:/stable:/v${KUBERNETES_MINOR}/deb/Release.key" \
    -o "${ROOT}/tmp/k8s-release.key" || die "cannot download the pkgs.k8s.io signing key"
  gpg --dearmor --yes -o "${ROOT}${keyring}" "${ROOT}/tmp/k8s-release.key"
fi
echo "deb [signed-by=${keyring}] https://pkgs.k8s.io/core:/stable:/v${KUBERNETES_MINOR}/deb/ /" \
  >"${ROOT}/etc/apt/sources.list.d/kubernetes.list"
apt_get update
package_version="${KUBERNETES_VERSION}-1.1"
apt-mark unhold kubelet kubeadm kubectl >/dev/null 2>&1 || true
apt_get install --allow-change-held-packages \
  "kubelet=${package_version}" "kubeadm=${package_version}" "kubectl=${package_version}" nfs-common
# containerd is installed once and then held: unattended-upgrades must not restart it under
# running pods, and a later run keeps the version the node was configured for.
[ -n "$(installed_packages containerd)" ] || apt_get install containerd
apt-mark hold kubelet kubeadm kubectl containerd >/dev/null

step "containerd: systemd cgroups and the pause image kubeadm expects"
containerd_major=$(containerd --version | sed -nE 's/.* v?([0-9]+)\.[0-9]+\.[0-9]+.*/\1/p')
[ -n "$containerd_major" ] || die "cannot read the containerd version from: $(containerd --version)"
pause_image=$(kubeadm config images list --kubernetes-version "v${KUBERNETES_VERSION}" 2>/dev/null | grep '/pause:' || true)
[ -n "$pause_image" ] || die "kubeadm did not name a pause image"
config=${ROOT}/etc/containerd/config.toml
install -d -m 0755 "${ROOT}/etc/containerd"
containerd config default >"$config"
# containerd 1.x writes config version 2 (sandbox_image), 2.x version 3 (pinned_images.sandbox).
sed -ri \
  -e 's/^(\s*)SystemdCgroup = false/\1SystemdCgroup = true/' \
  -e "s#^(\s*)sandbox_image = .*#\1sandbox_image = \"${pause_image}\"#" \
  -e "s#^(\s*)sandbox = .*#\1sandbox = '${pause_image}'#" \
  "$config"
grep -q 'SystemdCgroup = true' "$config" \
  || die "containerd ${containerd_major}.x config has no SystemdCgroup key to set"
grep -qF "$pause_image" "$config" \
  || die "containerd ${containerd_major}.x config has no sandbox image key to set"
systemctl enable containerd >/dev/null
systemctl restart containerd
systemctl enable kubelet >/dev/null

install -d -m 0755 "${ROOT}${SHARE_DIR}"
log "node-common done (containerd ${containerd_major}.x, pause ${pause_image})"

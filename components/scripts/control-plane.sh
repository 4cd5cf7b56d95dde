#!/usr/bin/env bash
# Control node: NFS export of the shared directory, Slurm state directory, kubeadm init with
# the pre-made CA and token, and the Flannel CNI. Idempotent.
set -Eeuo pipefail
# shellcheck source=testbed-lib.sh
. "$(dirname "$0")/testbed-lib.sh"
load_env
require SHARE_DIR SHARE_EXPORT_CIDR SLURM_STATE_DIR SLURM_UID FLANNEL_VERSION KUBEADM_CONFIG ADMIN_KUBECONFIG SSH_USER
require TOOLS_UID
require CA_KEY_FILE CA_KEY_WAIT_SECONDS HOST_KEY_MARKER

# The SSH host key goes to the serial console, which `aws ec2 get-console-output` reads through
# the EC2 API: `pulumi up` pins it (read-host-key.sh) before an SSH step carries the CA key. A
# public key; only root writes the console. Here, first: cloud-init's own keys_to_console runs
# in its final stage after runcmd (canonical/cloud-init config/cloud.cfg.tmpl,
# cloud_final_modules), so after this script, which waits for the CA key. The key is the one
# cloud-init's ssh module generated (cc_ssh, before runcmd).
step "SSH host key to the console"
host_key=$(cut -d ' ' -f 1,2 "${ROOT}/etc/ssh/ssh_host_ed25519_key.pub")
echo "${HOST_KEY_MARKER} ${host_key}" >"${ROOT}/dev/console"

step "NFS server exporting ${SHARE_DIR} to ${SHARE_EXPORT_CIDR}"
apt_get install nfs-kernel-server git  # git: kubectl kustomize fetches remote overlays
# One directory per owner, none world-writable (core/host_layout.py); -m resets an old 1777
install -d -m 0755 "${ROOT}${SHARE_DIR}"
install -d -m 0755 -o "$SLURM_UID" -g "$SLURM_UID" "${ROOT}${SHARE_DIR}/slurm"
install -d -m 0755 -o "$TOOLS_UID" -g "$TOOLS_UID" "${ROOT}${SHARE_DIR}/tools"
install -d -m 0755 "${ROOT}/etc/exports.d"
echo "${SHARE_DIR} ${SHARE_EXPORT_CIDR}(rw,sync,no_subtree_check,root_squash)" >"${ROOT}/etc/exports.d/testbed.exports"
systemctl enable --now nfs-server >/dev/null
exportfs -ra

step "Slurm state directory ${SLURM_STATE_DIR} owned by ${SLURM_UID} (hostPath ignores fsGroup)"
install -d -m 0750 -o "$SLURM_UID" -g "$SLURM_UID" "${ROOT}${SLURM_STATE_DIR}"

export KUBECONFIG=${ROOT}${ADMIN_KUBECONFIG}
if [ -f "$KUBECONFIG" ]; then
  log "kubeadm init already done"
else
  # The CA key is not in user-data: `pulumi up` delivers it over SSH (deliver-ca-key.sh).
  step "waiting up to ${CA_KEY_WAIT_SECONDS}s for the cluster CA key at ${CA_KEY_FILE}"
  wait_until "$CA_KEY_WAIT_SECONDS" test -s "${ROOT}${CA_KEY_FILE}" \
    || die "the cluster CA key did not arrive at ${CA_KEY_FILE} within ${CA_KEY_WAIT_SECONDS}s (pulumi up delivers it over SSH)"
  step "kubeadm init"
  # --skip-token-print: the join command with its token never reaches a log or the console
  kubeadm init --config "${ROOT}${KUBEADM_CONFIG}" --upload-certs=false --skip-token-print
fi

step "the API server answers"
retry 60 5 kubectl get --raw=/readyz >/dev/null || die "the API server did not become ready"

step "Flannel ${FLANNEL_VERSION}"
retry 10 15 kubectl apply -f \
  "https://raw.githubusercontent.com/flannel-io/flannel/${FLANNEL_VERSION}/Documentation/kube-flannel.yml" \
  || die "cannot apply Flannel ${FLANNEL_VERSION}"

step "admin kubeconfig for ${SSH_USER}"
install -d -m 0700 -o "$SSH_USER" -g "$SSH_USER" "${ROOT}/home/${SSH_USER}/.kube"
install -m 0600 -o "$SSH_USER" -g "$SSH_USER" "$KUBECONFIG" "${ROOT}/home/${SSH_USER}/.kube/config"
finish "control-plane done"

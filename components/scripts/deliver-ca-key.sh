#!/usr/bin/env bash
# Remote step on the control node, before `kubeadm init`: writes the cluster CA key the program
# minted. It never travels in user-data, which anyone allowed ec2:DescribeInstanceAttribute
# (and any hostNetwork pod, through the instance metadata service) can read for the node's life.
# control-plane.sh waits for the file. Parameters: CA_KEY_PEM (secret, on stdin), CA_KEY_FILE;
# TESTBED_LIB.
set -Eeuo pipefail
# shellcheck source=testbed-lib.sh
. "$TESTBED_LIB"
require CA_KEY_PEM CA_KEY_FILE

umask 077  # the key and any directory made for it: root only, from the first byte
mkdir -p "${ROOT}${CA_KEY_FILE%/*}"
printf '%s\n' "${CA_KEY_PEM%$'\n'}" >"${ROOT}${CA_KEY_FILE}.new"
mv -f "${ROOT}${CA_KEY_FILE}.new" "${ROOT}${CA_KEY_FILE}"  # kubeadm never sees half a key
log "cluster CA key delivered to ${CA_KEY_FILE}"

#!/usr/bin/env bash
# Remote step on the control node, one per worker, run again when the worker is replaced: waits
# until that worker's node has (re)joined: registered, its kubelet heard from since this step
# started, Ready, and, where the device plugin runs in the cluster, its GPU allocatable. On a
# deployed stack the next worker is replaced only after this step passed (program/infrastructure.py).
# Parameters: WORKER, NODE_IP, INSTANCE_ID, REGION, GPU_RESOURCE, GPUS, DEVICE_PLUGIN_NAMESPACE,
# TIMEOUT_SECONDS; KUBECONFIG, TESTBED_LIB.
set -Eeuo pipefail
# shellcheck source=testbed-lib.sh
. "$TESTBED_LIB"
require WORKER NODE_IP INSTANCE_ID REGION GPU_RESOURCE GPUS DEVICE_PLUGIN_NAMESPACE TIMEOUT_SECONDS KUBECONFIG
deadline=$((SECONDS + TIMEOUT_SECONDS))
who="worker ${WORKER} (${NODE_IP}, instance ${INSTANCE_ID})"

api_ready() { [ -r "$KUBECONFIG" ] && kubectl get --raw=/readyz >/dev/null 2>&1; }
wait_until $((deadline - SECONDS)) api_ready \
  || die "${who}: the API server did not answer within ${TIMEOUT_SECONDS}s"

# "name ready gpus" of the node with this InternalIP, nothing when none is registered. jsonpath
# needs the dots of the resource name escaped; a missing key prints nothing.
gpu_key=${GPU_RESOURCE//./\\.}
node_state() {
  kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.status.addresses[?(@.type=="InternalIP")].address}{" "}{.status.conditions[?(@.type=="Ready")].status}{" "}{.status.allocatable.'"${gpu_key}"'}{"\n"}{end}' 2>/dev/null \
    | awk -v ip="$NODE_IP" '$2 == ip { print $1, $3, $4 }' || true
}

# A replacement keeps the IP, and so the name, of the node it replaces: that Node object stays, with
# its last Ready status and GPU count, until the new kubelet reports. Only a live kubelet renews
# the node's Lease (kube-node-lease/<node>, every 10 s), and this step starts only once the old
# instance is gone (delete-before-replace, components/ec2.py; the provider waits for `terminated`,
# hashicorp/terraform-provider-aws internal/service/ec2 WaitInstanceDeleted) or, after a type
# change, running again: a renewal seen after this step started is the new kubelet's.
lease_renewal() {
  [ -n "$1" ] || return 0
  kubectl -n kube-node-lease get lease "$1" -o jsonpath='{.spec.renewTime}' 2>/dev/null || true
}
read -r name _ <<<"$(node_state)" || true
renewal_at_start=$(lease_renewal "${name:-}")

# The device plugin is installed after the readiness gate: in a new cluster the GPU cannot be
# allocatable yet, and this step must not wait for it there.
device_plugin_runs() {
  kubectl -n "$DEVICE_PLUGIN_NAMESPACE" get daemonsets -o name 2>/dev/null | grep -q .
}

why="no node with InternalIP ${NODE_IP} is registered"
joined() {
  local ready allocatable
  read -r name ready allocatable <<<"$(node_state)" || true
  if [ -z "${name:-}" ]; then
    why="no node with InternalIP ${NODE_IP} is registered"
    return 1
  fi
  local renewal
  renewal=$(lease_renewal "$name")
  if [ -z "$renewal" ] || [ "$renewal" = "$renewal_at_start" ]; then
    why="node ${name}: no kubelet has renewed its lease since this step started (the old instance's node, or the new one not joined yet)"
    return 1
  fi
  if [ "${ready:-}" != True ]; then
    why="node ${name} is not Ready (Ready=${ready:-unknown})"
    return 1
  fi
  case ${allocatable:-} in '' | *[!0-9]*) allocatable=0 ;; esac
  if [ "$allocatable" -lt "$GPUS" ] && device_plugin_runs; then
    why="node ${name} is Ready but has ${allocatable} allocatable ${GPU_RESOURCE}, ${GPUS} expected (the device plugin runs in namespace ${DEVICE_PLUGIN_NAMESPACE})"
    return 1
  fi
}

if ! wait_until $((deadline - SECONDS)) joined; then
  if [ -n "${name:-}" ]; then
    echo "--- conditions of node ${name}:" >&2
    kubectl get node "$name" -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}' 2>/dev/null \
      | redact >&2 || true
  fi
  # cloud-init copies the bootstrap output to the instance console.
  echo "${who}: its bootstrap log:" \
    "aws ec2 get-console-output --region ${REGION} --instance-id ${INSTANCE_ID} --latest --output text | tail -n 60" >&2
  die "${who} did not rejoin within ${TIMEOUT_SECONDS}s: ${why}; workers after it were not replaced, run pulumi up again to wait for it and go on"
fi
log "${who} joined as node ${name}"

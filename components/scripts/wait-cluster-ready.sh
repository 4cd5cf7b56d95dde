#!/usr/bin/env bash
# Readiness gate, a remote step on the control node: cloud-init finished there, then every
# expected node is Ready. Nodes are named by private IP and EC2 instance id.
# Parameters (environment): TIMEOUT_SECONDS, REGION, NODES ("IP=INSTANCE_ID ..."),
# BOOTSTRAP_LOG; KUBECONFIG, TESTBED_LIB.
set -Eeuo pipefail
# shellcheck source=testbed-lib.sh
. "$TESTBED_LIB"
require TIMEOUT_SECONDS REGION NODES BOOTSTRAP_LOG KUBECONFIG
read -r -a expected <<<"$NODES"

report_failure() {
  if [ -r "$KUBECONFIG" ]; then kubectl get nodes -o wide >&2 || true; fi
  echo "--- last lines of ${BOOTSTRAP_LOG} on the control node:" >&2
  tail -n 40 "$BOOTSTRAP_LOG" | redact >&2 || true
  die "readiness gate: $1"
}

# One deadline for the whole gate, cloud-init included.
deadline=$((SECONDS + TIMEOUT_SECONDS))
status=0
timeout "$TIMEOUT_SECONDS" cloud-init status --wait >/dev/null || status=$?
# 2 means finished with recoverable ("degraded") errors: the bootstrap itself succeeded.
[ "$status" -eq 0 ] || [ "$status" -eq 2 ] || report_failure "cloud-init on the control node ended with status ${status}"

# InternalIP -> Ready condition of every registered node, one "ip status" per line.
node_states() {
  kubectl get nodes -o jsonpath='{range .items[*]}{.status.addresses[?(@.type=="InternalIP")].address}{" "}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}'
}

missing=("${expected[@]}")
all_ready() {
  local states node
  states=$(node_states 2>/dev/null || true)
  missing=()
  for node in "${expected[@]}"; do
    grep -qxF "${node%%=*} True" <<<"$states" || missing+=("$node")
  done
  [ "${#missing[@]}" -eq 0 ]
}

if ! wait_until $((deadline - SECONDS)) all_ready; then
  for node in "${missing[@]}"; do
    # cloud-init copies the bootstrap output to the instance console.
    echo "node ${node%%=*} (instance ${node#*=}) is not Ready; its bootstrap log:" \
      "aws ec2 get-console-output --region ${REGION} --instance-id ${node#*=} --latest --output text | tail -n 60" >&2
  done
  report_failure "not Ready after ${TIMEOUT_SECONDS}s: ${missing[*]%%=*}"
fi
log "all ${#expected[@]} nodes Ready"

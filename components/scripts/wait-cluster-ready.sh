#!/usr/bin/env bash
# Readiness gate, run over SSH on the control node: cloud-init finished there, then every
# expected node is Ready. Nodes are named by private IP and EC2 instance id.
# Usage: wait-cluster-ready.sh TIMEOUT_SECONDS REGION IP=INSTANCE_ID...
set -euo pipefail
timeout_seconds=$1
region=$2
shift 2
expected=("$@")
bootstrap_log=/var/log/testbed-bootstrap.log
export KUBECONFIG=/etc/kubernetes/admin.conf

report_failure() {
  echo "readiness gate FAILED: $1" >&2
  if [ -r "$KUBECONFIG" ]; then kubectl get nodes -o wide >&2 || true; fi
  echo "--- last lines of ${bootstrap_log} on the control node:" >&2
  tail -n 40 "$bootstrap_log" >&2 || true
  exit 1
}

# One deadline for the whole gate, cloud-init included.
deadline=$((SECONDS + timeout_seconds))
status=0
timeout "$timeout_seconds" cloud-init status --wait >/dev/null || status=$?
# 2 means finished with recoverable ("degraded") errors: the bootstrap itself succeeded.
[ "$status" -eq 0 ] || [ "$status" -eq 2 ] || report_failure "cloud-init on the control node ended with status ${status}"

# InternalIP -> Ready condition of every registered node, one "ip status" per line.
node_states() {
  kubectl get nodes -o jsonpath='{range .items[*]}{.status.addresses[?(@.type=="InternalIP")].address}{" "}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}'
}

while :; do
  missing=()
  states=$(node_states 2>/dev/null || true)
  for node in "${expected[@]}"; do
    grep -qxF "${node%%=*} True" <<<"$states" || missing+=("$node")
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    echo "all ${#expected[@]} nodes Ready"
    exit 0
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    for node in "${missing[@]}"; do
      # cloud-init copies the bootstrap output to the instance console.
      echo "node ${node%%=*} (instance ${node#*=}) is not Ready; its bootstrap log:" \
        "aws ec2 get-console-output --region ${region} --instance-id ${node#*=} --latest --output text | tail -n 60" >&2
    done
    report_failure "not Ready after ${timeout_seconds}s: ${missing[*]%%=*}"
  fi
  sleep 15
done

#!/usr/bin/env bash
# Readiness gate, run over SSH on the control node: cloud-init finished there, then every
# expected node (by private IP) is Ready. Usage: wait-cluster-ready.sh TIMEOUT_SECONDS IP...
set -euo pipefail
timeout_seconds=$1
shift
expected_ips=("$@")
bootstrap_log=/var/log/testbed-bootstrap.log
export KUBECONFIG=/etc/kubernetes/admin.conf

report_failure() {
  echo "readiness gate FAILED: $1" >&2
  if [ -r "$KUBECONFIG" ]; then kubectl get nodes -o wide >&2 || true; fi
  echo "--- last lines of ${bootstrap_log} on the control node:" >&2
  tail -n 40 "$bootstrap_log" >&2 || true
  echo "--- on a worker, read the same file: ssh -J ubuntu@<controlPlanePublicIp> ubuntu@<workerPrivateIp>" >&2
  exit 1
}

status=0
timeout "$timeout_seconds" cloud-init status --wait >/dev/null || status=$?
# 2 means finished with recoverable ("degraded") errors: the bootstrap itself succeeded.
[ "$status" -eq 0 ] || [ "$status" -eq 2 ] || report_failure "cloud-init on the control node ended with status ${status}"

# InternalIP -> Ready condition of every registered node, one "ip status" per line.
node_states() {
  kubectl get nodes -o jsonpath='{range .items[*]}{.status.addresses[?(@.type=="InternalIP")].address}{" "}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}'
}

deadline=$((SECONDS + timeout_seconds))
while :; do
  missing=()
  states=$(node_states 2>/dev/null || true)
  for ip in "${expected_ips[@]}"; do
    grep -qxF "${ip} True" <<<"$states" || missing+=("$ip")
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    echo "all ${#expected_ips[@]} nodes Ready"
    exit 0
  fi
  [ "$SECONDS" -lt "$deadline" ] || report_failure "not Ready after ${timeout_seconds}s: ${missing[*]}"
  sleep 15
done

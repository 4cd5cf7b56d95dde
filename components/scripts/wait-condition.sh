#!/usr/bin/env bash
# Wait, on the control node, until a cluster object reports a condition.
# Usage: wait-condition.sh TIMEOUT_SECONDS RESOURCE CONDITION   (e.g. apiservice/v1beta1.external.metrics.k8s.io Available)
set -euo pipefail
timeout_seconds=$1
resource=$2
condition=$3
export KUBECONFIG=/etc/kubernetes/admin.conf
deadline=$((SECONDS + timeout_seconds))
# `kubectl wait` fails at once while the object does not exist yet: retry until the deadline.
until kubectl wait --for="condition=${condition}" --timeout=30s "$resource"; do
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "${resource} not ${condition} after ${timeout_seconds}s" >&2
    kubectl get "$resource" -o yaml >&2 || true
    exit 1
  fi
  sleep 10
done

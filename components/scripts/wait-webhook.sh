#!/usr/bin/env bash
# Webhook gate, run over SSH on the control node: succeeds only when the API server admits a
# server-side dry-run of MANIFEST_JSON (which proves CRDs, caBundle and the network path to
# the webhook pod) and, if a pod is named, that pod's health endpoint answers HTTP 200
# (cert-manager's /healthz answers 200 with an empty body).
# Usage: wait-webhook.sh TIMEOUT_SECONDS MANIFEST_JSON [NAMESPACE LABEL_SELECTOR HEALTH_PORT HEALTH_PATH]
set -euo pipefail
timeout_seconds=$1
manifest=$2
namespace=${3:-}
selector=${4:-}
health_port=${5:-}
health_path=${6:-healthz}
export KUBECONFIG=/etc/kubernetes/admin.conf

health_ok() {
  [ -n "$namespace" ] || return 0
  local pod
  pod=$(kubectl -n "$namespace" get pods -l "$selector" --field-selector=status.phase=Running \
    -o jsonpath='{.items[0].metadata.name}' 2>/dev/null) || return 1
  [ -n "$pod" ] || return 1
  # `kubectl get --raw` exits non-zero unless the endpoint answers 2xx.
  kubectl get --raw "/api/v1/namespaces/${namespace}/pods/${pod}:${health_port}/proxy/${health_path}" >/dev/null 2>&1
}

deadline=$((SECONDS + timeout_seconds))
last_error="not tried yet"
while :; do
  if health_ok; then
    if last_error=$(kubectl create --dry-run=server -o name -f - <<<"$manifest" 2>&1); then
      echo "webhook gate passed: ${last_error}"
      exit 0
    fi
  else
    last_error="health endpoint /${health_path} of pod (${selector}) in ${namespace} did not answer 200"
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "webhook gate FAILED after ${timeout_seconds}s: ${last_error}" >&2
    [ -z "$namespace" ] || kubectl -n "$namespace" get pods -o wide >&2 || true
    exit 1
  fi
  sleep 10
done

#!/usr/bin/env bash
# Webhook gate, a remote step on the control node: succeeds only when the API server admits a
# server-side dry-run of PROBE_MANIFEST (which proves CRDs, caBundle and the network path to
# the webhook pod) and, if HEALTH_NAMESPACE is set, that the pod's health endpoint answers
# HTTP 200 (cert-manager's /healthz answers 200 with an empty body).
# Parameters (environment): TIMEOUT_SECONDS, PROBE_MANIFEST (JSON), optional HEALTH_NAMESPACE,
# HEALTH_SELECTOR, HEALTH_PORT, HEALTH_PATH; KUBECONFIG, TESTBED_LIB.
set -Eeuo pipefail
# shellcheck source=testbed-lib.sh
. "$TESTBED_LIB"
require TIMEOUT_SECONDS PROBE_MANIFEST KUBECONFIG
HEALTH_NAMESPACE=${HEALTH_NAMESPACE:-}
[ -z "$HEALTH_NAMESPACE" ] || require HEALTH_SELECTOR HEALTH_PORT HEALTH_PATH

health_ok() {
  [ -n "$HEALTH_NAMESPACE" ] || return 0
  local pod
  pod=$(kubectl -n "$HEALTH_NAMESPACE" get pods -l "$HEALTH_SELECTOR" --field-selector=status.phase=Running \
    -o jsonpath='{.items[0].metadata.name}' 2>/dev/null) || return 1
  [ -n "$pod" ] || return 1
  # `kubectl get --raw` exits non-zero unless the endpoint answers 2xx.
  kubectl get --raw "/api/v1/namespaces/${HEALTH_NAMESPACE}/pods/${pod}:${HEALTH_PORT}/proxy/${HEALTH_PATH}" \
    >/dev/null 2>&1
}

last_error="not tried yet"
webhook_admits() {
  if ! health_ok; then
    last_error="health endpoint /${HEALTH_PATH:-} of pod (${HEALTH_SELECTOR:-}) in ${HEALTH_NAMESPACE} did not answer 200"
    return 1
  fi
  last_error=$(kubectl create --dry-run=server -o name -f - <<<"$PROBE_MANIFEST" 2>&1)
}

if ! wait_until "$TIMEOUT_SECONDS" webhook_admits; then
  [ -z "$HEALTH_NAMESPACE" ] || kubectl -n "$HEALTH_NAMESPACE" get pods -o wide >&2 || true
  die "webhook gate after ${TIMEOUT_SECONDS}s: ${last_error}"
fi
log "webhook gate passed: ${last_error}"

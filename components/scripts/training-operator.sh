#!/usr/bin/env bash
# Remote step on the control node: the Kubeflow Training Operator from its pinned standalone
# overlay, applied server-side (its CRDs exceed the client-side annotation limit) through
# KUSTOMIZATION (the overlay plus the program's patch of the operator's flags); waits for the
# operator and its webhook. `ACTION=delete` removes it again on `pulumi destroy`.
# Parameters (environment): ACTION (apply|delete), OVERLAY, NAMESPACE, DEPLOYMENT, and for
# apply KUSTOMIZATION (YAML), TIMEOUT_SECONDS and PROBE_MANIFEST (JSON); KUBECONFIG, TESTBED_LIB.
set -Eeuo pipefail
# shellcheck source=testbed-lib.sh
. "$TESTBED_LIB"
require ACTION OVERLAY KUBECONFIG

case "$ACTION" in
  apply)
    require NAMESPACE DEPLOYMENT TIMEOUT_SECONDS PROBE_MANIFEST KUSTOMIZATION
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    printf '%s\n' "$KUSTOMIZATION" >"${work}/kustomization.yaml"
    # The overlay is fetched from GitHub: retry transient failures.
    retry 5 20 kubectl apply --server-side --force-conflicts -k "$work" || die "apply of ${OVERLAY}"
    kubectl -n "$NAMESPACE" rollout status "deployment/${DEPLOYMENT}" --timeout="${TIMEOUT_SECONDS}s"
    # The webhook (failurePolicy Fail) rejects PyTorchJobs until it serves: wait for admission.
    result="not tried yet"
    admitted() { result=$(kubectl create --dry-run=server -o name -f - <<<"$PROBE_MANIFEST" 2>&1); }
    wait_until "$TIMEOUT_SECONDS" admitted || die "webhook not admitting after ${TIMEOUT_SECONDS}s: ${result}"
    log "training-operator ready: ${result}"
    ;;
  delete)
    # Best effort: the objects go with the nodes anyway, and destroy must not hang on GitHub.
    kubectl delete -k "$OVERLAY" --ignore-not-found --wait=false || log "training-operator: delete skipped"
    ;;
  *)
    die "ACTION=${ACTION}: expected apply or delete"
    ;;
esac

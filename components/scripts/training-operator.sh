#!/usr/bin/env bash
# Kubeflow Training Operator from its pinned standalone overlay, applied server-side (its CRDs
# exceed the client-side annotation limit); waits for the operator and its webhook.
# Usage: training-operator.sh apply VERSION TIMEOUT_SECONDS PROBE_MANIFEST_JSON
#        training-operator.sh delete VERSION
set -euo pipefail
action=$1
version=$2
overlay="github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=${version}"
export KUBECONFIG=/etc/kubernetes/admin.conf

case "$action" in
  apply)
    timeout_seconds=$3
    probe=$4
    attempt=1
    # The overlay is fetched from GitHub: retry transient failures.
    until kubectl apply --server-side --force-conflicts -k "$overlay"; do
      [ "$attempt" -lt 5 ] || { echo "training-operator: apply of ${overlay} FAILED" >&2; exit 1; }
      attempt=$((attempt + 1))
      sleep 20
    done
    kubectl -n kubeflow rollout status deployment/training-operator --timeout="${timeout_seconds}s"
    deadline=$((SECONDS + timeout_seconds))
    # The webhook (failurePolicy Fail) rejects PyTorchJobs until it serves: wait for admission.
    until result=$(kubectl create --dry-run=server -o name -f - <<<"$probe" 2>&1); do
      if [ "$SECONDS" -ge "$deadline" ]; then
        echo "training-operator: webhook not admitting after ${timeout_seconds}s: ${result}" >&2
        exit 1
      fi
      sleep 10
    done
    echo "training-operator ${version} ready: ${result}"
    ;;
  delete)
    # Best effort: the objects go with the nodes anyway, and destroy must not hang on GitHub.
    kubectl delete -k "$overlay" --ignore-not-found --wait=false || echo "training-operator: delete skipped" >&2
    ;;
  *)
    echo "usage: training-operator.sh apply|delete VERSION ..." >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# Remote step on the control node: wait until a cluster object reports a condition.
# Parameters (environment): TIMEOUT_SECONDS, RESOURCE (e.g. apiservice/v1beta1.external.metrics.k8s.io),
# CONDITION (e.g. Available, or jsonpath=<expression>=<value> for a field), KUBECONFIG, TESTBED_LIB.
set -Eeuo pipefail
# shellcheck source=testbed-lib.sh
. "$TESTBED_LIB"
require TIMEOUT_SECONDS RESOURCE CONDITION KUBECONFIG

# `kubectl wait` fails at once while the object does not exist yet: retry until the deadline.
case "$CONDITION" in
  jsonpath=*) FOR="$CONDITION" ;;
  *) FOR="condition=${CONDITION}" ;;
esac
condition_met() { kubectl wait --for="$FOR" --timeout=30s "$RESOURCE"; }

if ! wait_until "$TIMEOUT_SECONDS" condition_met; then
  kubectl get "$RESOURCE" -o yaml >&2 || true
  die "${RESOURCE} not ${CONDITION} after ${TIMEOUT_SECONDS}s"
fi
log "${RESOURCE} ${CONDITION}"

#!/usr/bin/env bash
# Remote step on the control node, one per worker (re-run when the worker is replaced): registers
# the worker's own bootstrap token with a short life, waits until the worker is Ready, then
# deletes the token. A failed bootstrap of the control node or of the worker ends the wait at
# once, with the failed step, the log tail and how to reach the node (testbed-lib.sh).
# Parameters: JOIN_TOKEN and SSH_PRIVATE_KEY (secrets, on stdin), NODE_IP, REGION, INSTANCE_ID,
# TTL_SECONDS, TIMEOUT_SECONDS, NODE_REACH, CONTROL_IP, CONTROL_REACH, BOOTSTRAP_LOG,
# BOOTSTRAP_STATUS, SSH_USER; KUBECONFIG, TESTBED_LIB.
set -Eeuo pipefail
# shellcheck source=testbed-lib.sh
. "$TESTBED_LIB"
require JOIN_TOKEN NODE_IP REGION INSTANCE_ID TTL_SECONDS TIMEOUT_SECONDS KUBECONFIG
require NODE_REACH CONTROL_IP CONTROL_REACH BOOTSTRAP_LOG BOOTSTRAP_STATUS SSH_USER SSH_PRIVATE_KEY
private_dir
deadline=$((SECONDS + TIMEOUT_SECONDS))
token_id=${JOIN_TOKEN%%.*}
secret=bootstrap-token-${token_id}

# stop_if_failed ROLE IP REACH: end the step at once when that node's bootstrap failed.
stop_if_failed() {
  local summary
  if summary=$(bootstrap_failed "$@"); then die "join token for ${NODE_IP}: ${summary}"; fi
}
api_ready() {
  stop_if_failed control "$CONTROL_IP" "$CONTROL_REACH"
  [ -r "$KUBECONFIG" ] && kubectl get --raw=/readyz >/dev/null 2>&1
}
wait_until $((deadline - SECONDS)) api_ready \
  || die "join token for ${NODE_IP}: the API server did not answer within ${TIMEOUT_SECONDS}s"

# What `kubeadm token create` writes: a bootstrap-token Secret (kubernetes/kubernetes@v1.34.0:
# staging/src/k8s.io/cluster-bootstrap/token/api/types.go). Built here, not by kubeadm, so the
# token is never an argument of any process: printf is a builtin, kubectl reads it from a pipe.
expiration=$(date -u -d "+${TTL_SECONDS} seconds" +%Y-%m-%dT%H:%M:%SZ)
token_data() {
  printf '%s\n' "token-id=${token_id}" "token-secret=${JOIN_TOKEN#*.}" "expiration=${expiration}" \
    usage-bootstrap-authentication=true usage-bootstrap-signing=true \
    auth-extra-groups=system:bootstrappers:kubeadm:default-node-token "description=testbed join of ${NODE_IP}"
}
kubectl -n kube-system create secret generic "$secret" --type=bootstrap.kubernetes.io/token \
  --from-env-file=<(token_data) --dry-run=client -o yaml | kubectl apply -f - >/dev/null
log "join token ${token_id} for ${NODE_IP} registered, valid until ${expiration}"

# Ready, not only registered: a replaced worker keeps its IP, and so its old Node, NotReady.
ready() {
  stop_if_failed control "$CONTROL_IP" "$CONTROL_REACH"
  stop_if_failed worker "$NODE_IP" "$NODE_REACH"
  kubectl get nodes -o jsonpath='{range .items[*]}{.status.addresses[?(@.type=="InternalIP")].address}{" "}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null \
    | grep -qxF "${NODE_IP} True"
}
if ! wait_until $((deadline - SECONDS)) ready; then
  # cloud-init copies the bootstrap output to the instance console.
  echo "node ${NODE_IP} (instance ${INSTANCE_ID}) is not Ready; its bootstrap log:" \
    "aws ec2 get-console-output --region ${REGION} --instance-id ${INSTANCE_ID} --latest --output text | tail -n 60" >&2
  die "node ${NODE_IP} did not become Ready within ${TIMEOUT_SECONDS}s; its join token expires at ${expiration}"
fi
kubectl -n kube-system delete secret "$secret" --ignore-not-found >/dev/null
log "node ${NODE_IP} joined; join token ${token_id} deleted"

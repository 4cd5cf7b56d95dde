#!/usr/bin/env bash
# Readiness gate, a remote step on the control node: every expected node is Ready and its
# bootstrap done, then cloud-init finished on the control node. A node whose bootstrap records
# a failed step stops the gate at once, with that step, its log tail and how to reach it; a
# node still running keeps it waiting until the deadline.
# Parameters (environment): TIMEOUT_SECONDS, REGION, NODES (one "ROLE IP INSTANCE_ID REACH..."
# a line, ROLE control or worker, REACH the ssh command for you), BOOTSTRAP_LOG,
# BOOTSTRAP_STATUS, SSH_USER; SSH_PRIVATE_KEY (secret, on stdin); KUBECONFIG, TESTBED_LIB.
set -Eeuo pipefail
# shellcheck source=testbed-lib.sh
. "$TESTBED_LIB"
require TIMEOUT_SECONDS REGION NODES BOOTSTRAP_LOG BOOTSTRAP_STATUS SSH_USER SSH_PRIVATE_KEY KUBECONFIG
mapfile -t expected <<<"$NODES"
private_dir
mkdir "$PRIVATE_DIR/status"
# At most this many nodes are asked over SSH at once (a t3.medium runs the gate).
PARALLEL_SSH=32

report_failure() {
  if [ -r "$KUBECONFIG" ]; then kubectl get nodes -o wide >&2 || true; fi
  echo "--- last lines of ${BOOTSTRAP_LOG} on the control node:" >&2
  tail -n 40 "${ROOT}${BOOTSTRAP_LOG}" | redact >&2 || true
  die "readiness gate: $1"
}

# One deadline for the whole gate, cloud-init included.
deadline=$((SECONDS + TIMEOUT_SECONDS))

# InternalIP -> Ready condition of every registered node, one "ip status" per line.
node_states() {
  kubectl get nodes -o jsonpath='{range .items[*]}{.status.addresses[?(@.type=="InternalIP")].address}{" "}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}'
}

# Each pending node's status into $PRIVATE_DIR/status/IP, the exit of reading it into IP.rc.
read_statuses() {
  local line role ip n=0
  for line in "$@"; do
    read -r role ip _ <<<"$line"
    {
      rc=0
      node_status "$role" "$ip" >"$PRIVATE_DIR/status/$ip" || rc=$?
      echo "$rc" >"$PRIVATE_DIR/status/$ip.rc"
    } &
    n=$((n + 1))
    [ $((n % PARALLEL_SSH)) -ne 0 ] || wait
  done
  wait
}

# A node passes once Ready with its bootstrap done (Ready without a status: a node bootstrapped
# before nodes recorded one). A failed bootstrap ends the gate.
pending=("${expected[@]}")
passed() {
  local states line role ip reach status failures=()
  cloud_init=0
  cloud-init status >/dev/null 2>&1 || cloud_init=$?
  read_statuses "${pending[@]}"
  states=$(node_states 2>/dev/null || true)
  local still=()
  for line in "${pending[@]}"; do
    read -r role ip _ reach <<<"$line"
    status=$(cat "$PRIVATE_DIR/status/$ip")
    case "$(field state <<<"$status")" in
      failed) failures+=("$(report_bootstrap_failure "$role" "$ip" "$reach" "$status")") ;;
      succeeded | "") grep -qxF "${ip} True" <<<"$states" && [ "$(cat "$PRIVATE_DIR/status/$ip.rc")" = 0 ] || still+=("$line") ;;
      *) still+=("$line") ;;
    esac
  done
  if [ "${#failures[@]}" -gt 0 ]; then
    summary=$(printf '%s; ' "${failures[@]}")
    die "readiness gate: ${summary%; }"
  fi
  # 1: a hard error in a cloud-init stage on the control node, outside the bootstrap scripts.
  [ "$cloud_init" -ne 1 ] || report_failure "cloud-init on the control node ended with status 1"
  pending=("${still[@]}")
  [ "${#pending[@]}" -eq 0 ]
}

if ! wait_until $((deadline - SECONDS)) passed; then
  states=$(node_states 2>/dev/null || true)
  late=()
  for line in "${pending[@]}"; do
    read -r role ip instance reach <<<"$line"
    late+=("$ip")
    status=$(cat "$PRIVATE_DIR/status/$ip")
    case "$(cat "$PRIVATE_DIR/status/$ip.rc"):$(field state <<<"$status")" in
      0:running) known="its bootstrap is still at $(field script <<<"$status") step \"$(field step <<<"$status")\" (since $(field time <<<"$status"))" ;;
      0:succeeded) known="its bootstrap is done ($(field time <<<"$status")) but the node is not Ready: kubelet's log is journalctl -u kubelet" ;;
      0:) known="it has no bootstrap status: its bootstrap never started" ;;
      *) known="it does not answer SSH from the control node" ;;
    esac
    grep -qxF "${ip} True" <<<"$states" && ready=Ready || ready="not Ready"
    # cloud-init copies the bootstrap output to the instance console.
    echo "$(node_label "$role" "$ip") (instance ${instance}) is ${ready}; ${known}. Reach it: ${reach};" \
      "its console: aws ec2 get-console-output --region ${REGION} --instance-id ${instance} --latest --output text | tail -n 60" >&2
  done
  report_failure "not ready after ${TIMEOUT_SECONDS}s: ${late[*]}"
fi

status=0
timeout $((deadline - SECONDS > 0 ? deadline - SECONDS : 1)) cloud-init status --wait >/dev/null || status=$?
# 2 means finished with recoverable ("degraded") errors: the bootstrap itself succeeded.
[ "$status" -eq 0 ] || [ "$status" -eq 2 ] || report_failure "cloud-init on the control node ended with status ${status}"
log "all ${#expected[@]} nodes Ready, their bootstrap done"

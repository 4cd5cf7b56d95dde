#!/usr/bin/env bash
# Helpers shared by every script the program runs on a node: the bootstrap scripts (their
# parameters arrive in /etc/testbed/bootstrap.env, written by cloud-init) and the remote steps
# (their parameters arrive as environment values on the SSH command line). Sourced, never run.

# Every host path the scripts touch is "${ROOT}/...": empty on a node (the real root), a
# sandbox directory in the tests that run the scripts against stub commands.
ROOT=${TESTBED_ROOT:-}
TESTBED_ENV=${TESTBED_ENV:-${ROOT}/etc/testbed/bootstrap.env}

# The time in UTC, into the variable named $1: bash's own strftime (printf %()T), not a `date`
# process for every line (a bootstrap logs and records a few dozen times).
utc_now() { TZ=UTC0 printf -v "$1" '%(%FT%TZ)T' -1; }

log() {
  local now
  utc_now now
  printf '%s testbed: %s\n' "$now" "$*"
}

# stop EXIT MESSAGE: the one way a script gives up; during a node's bootstrap it also records
# the failed step (see record).
stop() {
  log "FAILED: $2" >&2
  record failed "$1" "$2"
  exit 1
}

die() { stop 1 "$*"; }

# The scripts run under `set -Eeuo pipefail`: a failing command stops them, and this says which.
on_error() {
  local status=$?
  stop "$status" "${BASH_SOURCE[1]##*/} line ${BASH_LINENO[0]}: ${BASH_COMMAND} (exit ${status})"
}
trap on_error ERR

# Bootstrap progress. A node's bootstrap scripts name each step where it starts (`step`), and
# record in STATUS_FILE (BOOTSTRAP_STATUS of bootstrap.env, beside the bootstrap log; load_env
# sets it, so remote steps never record) which step runs, failed or that all are done, so the
# remote steps on the control node can report a failed node as soon as it fails. Root-only, one
# `key=value` a line, no secrets: the scripts' own step names and FAILED messages (no command
# of theirs carries a token or key), the exit status and the time.
STATUS_FILE=
STEP=start

# record STATE [EXIT MESSAGE]: STATE is running, failed or succeeded.
record() {
  [ -n "$STATUS_FILE" ] || return 0
  local message=${3:-} now
  utc_now now
  (umask 077 && printf 'state=%s\nscript=%s\nstep=%s\nexit=%s\ntime=%s\nmessage=%s\n' \
    "$1" "${0##*/}" "$STEP" "${2:-}" "$now" "${message//$'\n'/ }" >"$STATUS_FILE") \
    || log "cannot record the bootstrap status in ${STATUS_FILE}" # the log still says it all
}

# step NAME...: a step of the bootstrap starts (logged, and recorded as the running step).
step() {
  STEP=$*
  log "$STEP"
  record running
}

# finish MESSAGE...: the node's last bootstrap script succeeded.
finish() {
  log "$*"
  record succeeded
}

# retry ATTEMPTS DELAY_SECONDS COMMAND...: run COMMAND until it succeeds.
retry() {
  local attempts=$1 delay=$2 n=1
  shift 2
  until "$@"; do
    if [ "$n" -ge "$attempts" ]; then
      log "gave up after $n attempts: $*"
      return 1
    fi
    n=$((n + 1))
    sleep "$delay"
  done
}

# wait_until SECONDS COMMAND...: run COMMAND every POLL_SECONDS (default 10) until it succeeds;
# fail once SECONDS have passed. The one deadline loop of the remote steps.
wait_until() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep "${POLL_SECONDS:-10}"
  done
}

load_env() {
  [ -r "$TESTBED_ENV" ] || die "parameter file $TESTBED_ENV is missing"
  set -a
  # shellcheck source=/dev/null
  . "$TESTBED_ENV"
  set +a
  PARAMETER_SOURCE=$TESTBED_ENV
  require BOOTSTRAP_STATUS
  STATUS_FILE=${ROOT}${BOOTSTRAP_STATUS}
  record running
}

# require NAME...: every named parameter must be set and non-empty.
require() {
  local name
  for name in "$@"; do
    [ -n "${!name:-}" ] || die "parameter $name is not set in ${PARAMETER_SOURCE:-the environment of the step}"
  done
}

# redact: copy stdin to stdout with bootstrap tokens and private key blocks masked, so a
# failure message that quotes a log carries no credential.
redact() {
  sed -E \
    -e 's/\b[a-z0-9]{6}\.[a-z0-9]{16}\b/[token]/g' \
    -e '/-----BEGIN [A-Z0-9 ]*PRIVATE[ ]KEY-----/,/-----END [A-Z0-9 ]*PRIVATE[ ]KEY-----/c\[private key]'
}

# First boot races unattended-upgrades for the dpkg lock: wait for it rather than fail.
apt_get() {
  DEBIAN_FRONTEND=noninteractive retry 5 15 apt-get -o DPkg::Lock::Timeout=600 -y "$@" \
    || die "apt-get $*"
}

# add_line FILE LINE: append LINE to FILE once.
add_line() {
  touch "$1"
  grep -qxF -- "$2" "$1" || printf '%s\n' "$2" >>"$1"
}

# installed_packages PATTERN...: the installed packages whose names match (dpkg-query globs).
installed_packages() {
  { dpkg-query -W -f '${db:Status-Status} ${Package}\n' "$@" 2>/dev/null || true; } | sed -n 's/^installed //p'
}

# Remote steps that wait for nodes read their bootstrap status where it is recorded: the
# control node's own file, and a worker's over SSH from the control node as SSH_USER with the
# stack's key (SSH_PRIVATE_KEY, a secret on stdin), which every node authorizes (its EC2 key
# pair); the security group lets the nodes reach each other. Parameters: BOOTSTRAP_STATUS,
# BOOTSTRAP_LOG, SSH_USER. (The NFS share is no channel: a worker mounts it late in its
# bootstrap, root is squashed there and every job user may write it.)
FAILURE_LOG_LINES=20

# private_dir: a root-only directory for the key and what the step reads, removed on exit.
private_dir() {
  PRIVATE_DIR=$(umask 077 && mktemp -d)
  trap 'rm -rf "$PRIVATE_DIR"' EXIT
  (umask 077 && printf '%s\n' "${SSH_PRIVATE_KEY%$'\n'}" >"$PRIVATE_DIR/key")
}

# on_node ROLE IP COMMAND FILE: COMMAND FILE as root on the node (ROLE control: this one; worker:
# over SSH, exit 255 when it does not answer), its output without control characters (no
# terminal escapes from a node). A worker's host key is accepted on first use, into this step's
# own known_hosts: the node is in the VPC, just created, and only a public key is offered to it.
on_node() {
  if [ "$1" = control ]; then
    # shellcheck disable=SC2086 # COMMAND is words, e.g. "tail -n 20"
    $3 "${ROOT}$4"
  else
    ssh -F /dev/null -i "$PRIVATE_DIR/key" -o IdentitiesOnly=yes -o BatchMode=yes -o ConnectTimeout=10 \
      -o StrictHostKeyChecking=accept-new -o UserKnownHostsFile="$PRIVATE_DIR/known_hosts" -o LogLevel=ERROR \
      "${SSH_USER}@$2" "sudo $3 $(printf %q "$4")"
  fi | LC_ALL=C tr -d '\000-\010\013-\037\177'
}

# node_status ROLE IP: the node's bootstrap status, empty when it has none yet; fails only when
# a worker does not answer.
node_status() { on_node "$1" "$2" cat "$BOOTSTRAP_STATUS" 2>/dev/null || [ $? -ne 255 ]; }

# field NAME: the value of NAME in a status read on stdin.
field() { sed -n "/^$1=/{s///p;q}"; }

node_label() { if [ "$1" = control ]; then echo "control node $2"; else echo "worker $2"; fi; }

# report_bootstrap_failure ROLE IP REACH STATUS: on stderr, the failed step, the last lines of
# the node's bootstrap log (redacted) and the command that reaches the node; on stdout the
# summary for the step's FAILED line.
report_bootstrap_failure() {
  local label where
  label=$(node_label "$1" "$2")
  where="$(field script <<<"$4") step \"$(field step <<<"$4")\""
  {
    echo "--- ${label}: bootstrap FAILED at ${where} (exit $(field exit <<<"$4"), $(field time <<<"$4")):" \
      "$(field message <<<"$4")" | redact
    echo "--- last ${FAILURE_LOG_LINES} lines of ${BOOTSTRAP_LOG} on ${label} (tokens and keys redacted):"
    on_node "$1" "$2" "tail -n ${FAILURE_LOG_LINES}" "$BOOTSTRAP_LOG" 2>&1 | redact || :
    echo "--- reach it: $3"
  } >&2
  echo "${label} failed its bootstrap at ${where}"
}

# bootstrap_failed ROLE IP REACH: true, after reporting it, when the node's bootstrap failed.
bootstrap_failed() {
  local status
  status=$(node_status "$1" "$2") && [ "$(field state <<<"$status")" = failed ] || return 1
  report_bootstrap_failure "$@" "$status"
}

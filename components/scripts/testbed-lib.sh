#!/usr/bin/env bash
# Helpers shared by every script the program runs on a node: the bootstrap scripts (their
# parameters arrive in /etc/testbed/bootstrap.env, written by cloud-init) and the remote steps
# (their parameters arrive as environment values on the SSH command line). Sourced, never run.

# Every host path the scripts touch is "${ROOT}/...": empty on a node (the real root), a
# sandbox directory in the tests that run the scripts against stub commands.
ROOT=${TESTBED_ROOT:-}
TESTBED_ENV=${TESTBED_ENV:-${ROOT}/etc/testbed/bootstrap.env}

log() { printf '%s testbed: %s\n' "$(date -u +%FT%TZ)" "$*"; }

die() {
  log "FAILED: $*" >&2
  exit 1
}

# The scripts run under `set -Eeuo pipefail`: a failing command stops them, and this says which.
on_error() {
  local status=$?
  die "${BASH_SOURCE[1]##*/} line ${BASH_LINENO[0]}: ${BASH_COMMAND} (exit ${status})"
}
trap on_error ERR

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

#!/usr/bin/env bash
# Runs where `pulumi up` runs, as a local command (components/ssh_access.py): prints the SSH host
# key that instance INSTANCE_ID published on its serial console after HOST_KEY_MARKER
# (control-plane.sh), read through the EC2 API with the deployer's credentials, so every SSH
# step to that node pins it. --latest reads the console as it is now (Nitro instances, which
# every supported type is); without it EC2 serves a copy that may be minutes old.
set -Eeuo pipefail
# shellcheck source=testbed-lib.sh
. "$(dirname "$0")/testbed-lib.sh"
require INSTANCE_ID REGION TIMEOUT_SECONDS HOST_KEY_MARKER

keys=$(mktemp)
trap 'rm -f "$keys"' EXIT

published() {
  aws ec2 get-console-output --region "$REGION" --instance-id "$INSTANCE_ID" --latest \
    --query Output --output text |
    tr -d '\r' | grep -oE "${HOST_KEY_MARKER} ssh-ed25519 [A-Za-z0-9+/]+={0,2}" | cut -d ' ' -f 2,3 | sort -u >"$keys"
  [ -s "$keys" ]
}

wait_until "$TIMEOUT_SECONDS" published ||
  die "instance ${INSTANCE_ID} published no SSH host key on its console in ${TIMEOUT_SECONDS} s; its console: aws ec2 get-console-output --region ${REGION} --instance-id ${INSTANCE_ID} --latest --output text | tail -n 60"
# one instance has one host key: two mean something else wrote the console
[ "$(wc -l <"$keys")" -eq 1 ] || die "instance ${INSTANCE_ID} published $(wc -l <"$keys") different SSH host keys on its console"
cat "$keys"

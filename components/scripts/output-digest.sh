#!/usr/bin/env bash
# EpilogSlurmctld: when a job ends, record the sha256 of its --output file where only SlurmUser
# writes (under slurmctld's state directory, which no slurmd pod mounts), so `validate` can refuse
# output rewritten later. slurmctld runs it as SlurmUser after every job with SLURM_JOB_ID,
# SLURM_JOB_NAME and SLURM_JOB_STDOUT set (doc/html/prolog_epilog.shtml); on 26.05.5 STDOUT is
# the unexpanded --output pattern (tests/engines/test_output_digest.py), so the %j and %x our
# job scripts use are expanded here. Any other pattern leaves no digest: validate refuses that.
# DIGEST_DIR is core/host_layout.py's OUTPUT_DIGEST_DIR (tests/components check they agree).
set -Eeuo pipefail
DIGEST_DIR=/var/spool/slurmctld/output-digests
umask 077 # digests of whatever SlurmUser could read stay SlurmUser's
mkdir -p "$DIGEST_DIR"
out=${SLURM_JOB_STDOUT:-}
out=${out//%j/$SLURM_JOB_ID}
out=${out//%x/${SLURM_JOB_NAME:-}}
# A job whose output cannot be read leaves no digest: validate then refuses it as unrecorded.
[[ -f $out && -r $out ]] || exit 0
sum=$(sha256sum "$out")
printf '%s\n' "${sum%% *}" >"$DIGEST_DIR/$SLURM_JOB_ID.tmp"
mv "$DIGEST_DIR/$SLURM_JOB_ID.tmp" "$DIGEST_DIR/$SLURM_JOB_ID.sha256"

#!/usr/bin/env bash
# EpilogSlurmctld: when a job ends, record the sha256 of its --output file where only SlurmUser
# writes (under slurmctld's state directory, which no slurmd pod mounts), so `validate` can refuse
# output rewritten later. slurmctld runs it as SlurmUser after every job, a requeued one too, with
# SLURM_JOB_ID, SLURM_JOB_NAME, SLURM_JOB_STDOUT and SLURM_JOB_WORK_DIR set as submitted
# (SchedMD/slurm@slurm-25-11-6-1 and @slurm-26-05-0-1: src/slurmctld/job_mgr.c, the EpilogSlurmctld
# environment): STDOUT is the unexpanded --output pattern, which sbatch makes absolute against
# --chdir (src/sbatch/opt.c _fullpath), or slurmctld's default slurm-%j.out, under the work dir
# (src/common/read_config.h DEFAULT_BATCH_STDOUT_PATH); tests/engines/test_output_digest.py runs
# both. The %j and %x our job scripts use are expanded here; any other pattern leaves no digest,
# and validate refuses that.
# DIGEST_DIR is core/host_layout.py's OUTPUT_DIGEST_DIR (tests/components check they agree).
set -Eeuo pipefail
DIGEST_DIR=/var/spool/slurmctld/output-digests
umask 077 # digests of whatever SlurmUser could read stay SlurmUser's
mkdir -p "$DIGEST_DIR"
out=${SLURM_JOB_STDOUT:-}
out=${out//%j/$SLURM_JOB_ID}
out=${out//%x/${SLURM_JOB_NAME:-}}
[[ -z $out || $out == /* ]] || out=${SLURM_JOB_WORK_DIR:-}/$out
digest=$DIGEST_DIR/$SLURM_JOB_ID.sha256
# A job whose output cannot be read leaves no digest (not an earlier run's): validate refuses it.
if [[ ! -f $out || ! -r $out ]]; then
  rm -f "$digest"
  exit 0
fi
sum=$(sha256sum "$out")
printf '%s\n' "${sum%% *}" >"$digest.tmp"
mv "$digest.tmp" "$digest"

"""Job output as evidence on the real slurmctld (booted from the program's slurm.conf, with the
EpilogSlurmctld the slurm values carry): when a job ends, its output's sha256 is recorded where
only SlurmUser writes, and validate's check refuses the output once someone rewrites it."""

from __future__ import annotations

import hashlib
import secrets
import shutil

import pytest

from core import host_layout
from tests.engines.conftest import engine_marks
from validation.cluster import ClusterError, check_output_digest

pytestmark = engine_marks(__name__)
NODE = "slinky-0"
OUTPUT = "# Avg bus bandwidth    : 1.50\n"


def test_the_digest_is_recorded_at_job_end_and_a_rewritten_output_is_refused(slurm):
    # The jobs' --output in the engine root's /tmp, which slurmd and slurmctld both see (as the share).
    share = f"/tmp/share-{secrets.token_hex(4)}"
    share_dir = slurm.root / share.lstrip("/")
    share_dir.mkdir(mode=0o755)
    try:
        absolute = slurm.sbatch(f"--output={share}/%x-%j.out", "-J", "allreduce", command=f"printf '{OUTPUT}'")
        # No --output: slurmctld's slurm-%j.out, relative to the job's work dir (SLURM_JOB_WORK_DIR).
        relative = slurm.sbatch(f"--chdir={share}", "-J", "default-output", command=f"printf '{OUTPUT}'")
        slurm.start_node(NODE)

        def ended() -> bool:
            return all(slurm.show_job(j).get("JobState") == "COMPLETED" for j in (absolute, relative))

        slurm.wait_for(ended, 60, "both jobs to complete", slurm.work / "log" / "slurmctld.log")
        # StateSaveLocation's parent in the pod (/var/spool/slurmctld) is the harness's state/.
        digests = slurm.work / "state" / host_layout.OUTPUT_DIGEST_DIR.removeprefix(host_layout.SLURM_STATE_DIR + "/")
        # COMPLETED only once the EpilogSlurmctld has ended (src/slurmctld/prep_slurmctld.c
        # prep_epilog_slurmctld_callback clears COMPLETING): validate, which waits for COMPLETED,
        # never reads before the digest is there.
        for job, prefix in ((absolute, "allreduce"), (relative, "slurm")):
            recorded_file = digests / f"{job}.sha256"
            output_file = share_dir / f"{prefix}-{job}.out"
            output, recorded = output_file.read_text(), recorded_file.read_text()
            assert output == OUTPUT
            assert recorded.strip() == hashlib.sha256(OUTPUT.encode()).hexdigest()
            # Written by SlurmUser, not by the job's user (root here; a share user on the cluster).
            assert recorded_file.stat().st_uid == digests.stat().st_uid != 0
            check_output_digest(str(output_file), output, recorded)  # the untouched output is evidence

        output_file.write_text(OUTPUT.replace("1.50", "9.99"))
        with pytest.raises(ClusterError, match=f"^{output_file}: .* differs from the digest recorded when the job"):
            check_output_digest(str(output_file), output_file.read_text(), recorded)
    finally:
        shutil.rmtree(share_dir)

"""Job output as evidence on the real slurmctld (booted from the program's slurm.conf, with the
EpilogSlurmctld the slurm values carry): when a job ends, its output's sha256 is recorded where
only SlurmUser writes, and validate's check refuses the output once someone rewrites it."""

from __future__ import annotations

import hashlib
import secrets

import pytest

from core import host_layout
from tests.engines.conftest import engine_marks
from validation.cluster import ClusterError, check_output_digest

pytestmark = engine_marks(__name__)
NODE = "slinky-0"
OUTPUT = "# Avg bus bandwidth    : 1.50\n"


def test_the_digest_is_recorded_at_job_end_and_a_rewritten_output_is_refused(slurm):
    # The job's --output in the engine root's /tmp, which slurmd and slurmctld both see (as the share).
    share = f"/tmp/share-{secrets.token_hex(4)}"
    (slurm.root / share.lstrip("/")).mkdir(mode=0o755)
    job = slurm.sbatch(f"--output={share}/%x-%j.out", "-J", "allreduce", command=f"printf '{OUTPUT}'")
    slurm.start_node(NODE)
    # StateSaveLocation's parent in the pod (/var/spool/slurmctld) is the harness's state/.
    digests = slurm.work / "state" / host_layout.OUTPUT_DIGEST_DIR.removeprefix(host_layout.SLURM_STATE_DIR + "/")
    recorded_file = digests / f"{job}.sha256"
    slurm.wait_for(recorded_file.exists, 60, "the output digest", slurm.work / "log" / "slurmctld.log")
    output_file = slurm.root / share.lstrip("/") / f"allreduce-{job}.out"
    output, recorded = output_file.read_text(), recorded_file.read_text()
    assert output == OUTPUT
    assert recorded.strip() == hashlib.sha256(OUTPUT.encode()).hexdigest()
    # Written by SlurmUser, not by the job's user (root here; a share user on the cluster).
    assert recorded_file.stat().st_uid == digests.stat().st_uid != 0
    check_output_digest(str(output_file), output, recorded)  # the untouched output is evidence

    output_file.write_text(OUTPUT.replace("1.50", "9.99"))
    with pytest.raises(ClusterError, match="differs from the digest recorded when the job ended"):
        check_output_digest(str(output_file), output_file.read_text(), recorded)

"""A reference experiment whose jobs the stack's run limits would refuse is refused by `validate`
before anything is submitted: every job over a limit, one line each, exit 2."""

import math
import re

import pytest

from cli.validate import main
from validation.scenarios import JOBS_DIR, SCENARIOS, sbatch_options, time_minutes

SLURM_TIMES = {p.name: sbatch_options(p.read_text())["--time"] for p in JOBS_DIR.glob("slurm/*.sbatch")}


@pytest.mark.parametrize(
    "given, minutes",
    [
        ("90", 90),
        ("1:30", 2),  # 90 s: seconds round up to a minute
        ("01:00:00", 60),
        ("1:00:01", 61),
        ("2-0", 2880),
        ("1-2", 1560),
        ("1-2:3", 1563),
        ("1-2:3:4", 1564),
        ("INFINITE", math.inf),
        ("unlimited", math.inf),
    ],
)
def test_slurm_time_formats_read_as_minutes(given, minutes):
    assert time_minutes(given) == minutes


@pytest.mark.parametrize("given", ["", "x", "1:2:3:4", "-5", "1-", "1.5", "1-2-3"])
def test_an_unreadable_time_is_none(given):
    assert time_minutes(given) is None


def test_every_shipped_job_script_has_a_time_this_reader_understands():
    assert SLURM_TIMES and all(time_minutes(t) is not None for t in SLURM_TIMES.values()), SLURM_TIMES


def test_a_scenario_over_the_slurm_limit_is_refused_naming_each_job_once(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["--scenario", "mixed", "--dry-run", "--out", str(out), "--config", "slurmJobMaxMinutes=10"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "validate: --scenario mixed: jobs/slurm/mpi-gpu.sbatch asks --time=00:15:00 (15 min), over "
        "slurmJobMaxMinutes 10: job_submit.lua would refuse it at submit; raise slurmJobMaxMinutes to 15 or more"
    ]
    assert not out.exists()


def test_every_limit_a_scenario_breaks_is_named_at_once(capsys):
    """Both limits lowered below what mixed's jobs declare: one line per job and limit."""
    config = ["--config", "slurmJobMaxMinutes=1", "--config", "aiJobMaxMinutes=1"]
    assert main(["--scenario", "mixed", "--dry-run", *config]) == 2
    lines = capsys.readouterr().err.splitlines()
    scripts = {w.source for w in SCENARIOS["mixed"].workloads}
    slurm = [s for s in scripts if s.endswith(".sbatch")]
    kube = [s for s in scripts if not s.endswith(".sbatch")]
    assert len(lines) == len(scripts) and slurm and kube
    for source in scripts:
        (line,) = [line for line in lines if f"jobs/{source} " in line]
        assert re.search(r"raise (slurmJobMaxMinutes|aiJobMaxMinutes) to \d+ or more$", line), line


def test_a_limit_that_fits_every_job_changes_nothing():
    longest = max(time_minutes(t) or 0 for t in SLURM_TIMES.values())
    for name in SCENARIOS:
        assert main(["--scenario", name, "--dry-run", "--config", f"slurmJobMaxMinutes={longest:g}"]) == 0, name

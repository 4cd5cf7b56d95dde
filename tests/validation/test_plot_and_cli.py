"""The picture, the report files and the command line."""

from pathlib import Path

import pytest
from validation_builders import GPU_A, handoff_timeline

from cli import validate
from cli.validate import main
from validation.checks import evaluate, expectations
from validation.plot import FAIL_COLOUR, draw, handoffs, segments, verdict
from validation.scenarios import SCENARIOS
from validation.timeline import Timeline, gpu_uuids

FIXTURES = Path(__file__).parent / "fixtures"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# The tests that draw (validation/plot.py draw imports matplotlib, most of a second) on one
# worker, so the other never imports it
pytestmark = pytest.mark.xdist_group("matplotlib")


def test_segments_follow_the_owner_of_one_gpu():
    runs = [(start, end, category, label) for start, end, category, label in segments(handoff_timeline(), GPU_A)]
    # Scheduled but not running yet is reserved: slurmd at 10, the DDP master at 360.
    assert runs == [
        (0, 10, "idle", "idle"),
        (10, 20, "reserved", "slurm-worker-slinky-0"),
        (20, 30, "slurmd-idle", "slurm-worker-slinky-0"),
        (30, 40, "slurm-job", "smoke"),
        (40, 350, "slurmd-idle", "slurm-worker-slinky-0"),
        (350, 360, "idle", "idle"),
        (360, 370, "reserved", "ddp-master-0"),
        (370, 400, "kubernetes", "ddp"),
        (400, 410, "idle", "idle"),
    ]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC)
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_the_picture_is_drawn_at_130_dpi_with_the_verdict_handoffs_and_both_records(tmp_path):
    timeline = handoff_timeline()
    checks = evaluate(timeline, expectations(SCENARIOS["handoff"], [], 2))
    draw(timeline, tmp_path / "t.png", checks=checks)
    width, height = png_size(tmp_path / "t.png")
    assert width == 12 * 130 and 700 < height < 1400
    assert handoffs(timeline) == [(GPU_A, 360)]
    headline, colour = verdict(timeline, checks)
    assert headline.startswith("scenario handoff, completed | ") and "scale-up 20 s (between 10 and 30 s)" in headline
    broken = handoff_timeline()
    broken.outcome = "interrupted"
    failed, red = verdict(broken, evaluate(broken, expectations(SCENARIOS["handoff"], [], 2)))
    assert "FAILED: run completed" in failed and red == FAIL_COLOUR and colour != red


@pytest.mark.parametrize("fixture", ["handoff-timeline.json", "heavy-mixed-timeline.json"])
def test_the_plot_is_a_png_with_a_lane_per_gpu(fixture, tmp_path):
    timeline = Timeline.load(FIXTURES / fixture)
    assert len(gpu_uuids(timeline)) == 4
    draw(timeline, tmp_path / "timeline.png")
    data = (tmp_path / "timeline.png").read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


@pytest.mark.parametrize("name", SCENARIOS)
def test_dry_run_prints_submissions_and_checks_without_a_cluster(name, capsys, tmp_path):
    # slurmd may take every GPU, which leak-probe and heavy-mixed need (see the refusal test below)
    argv = ["--scenario", name, "--dry-run", "--out", str(tmp_path / "o"), "--config", "hpcBorrowsAiGpus=true"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    first, second, *_ = out.splitlines()
    assert first.startswith("stack dev: NodeSet slurm/slurm-worker-slinky, 4 GPUs, cooldown 300 s (from settings")
    assert second.startswith(f"scenario {name}: ")
    assert "no GPU UUID held by two pods at overlapping times" in out
    assert f"writes {tmp_path / 'o'}/timeline.json" in out
    assert not (tmp_path / "o").exists()  # a dry run writes nothing


def test_dry_run_of_mixed_shows_both_user_paths(capsys):
    assert main(["--scenario", "mixed", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (
        "at start: kubectl exec -i -n slurm slurm-controller-0 -c slurmctld -- sbatch --parsable "
        "--job-name=mpi-gpu-dryrun-1 < jobs/slurm/mpi-gpu.sbatch  [2 GPU]"
    ) in out
    assert "at start: create PyTorchJob default/pytorchjob-ddp-dryrun-2 from jobs/kubernetes/pytorchjob-ddp.yaml" in out
    assert "GPU demand 4 at start; the testbed has 4 GPUs" in out
    assert "queued" not in out  # 4 GPUs of demand on 4 GPUs: nothing has to wait


def test_every_reference_scenario_runs_on_the_default_stack():
    """Lend and reclaim is the default: slurmd may hold every GPU, so nothing needs other settings."""
    for name in SCENARIOS:
        assert main(["--scenario", name, "--dry-run"]) == 0, name


def test_a_scenario_that_needs_every_gpu_for_slurm_is_refused_when_slurmd_keeps_to_its_share(capsys):
    # With hpcBorrowsAiGpus false slurmd keeps to HPC's half: the leak probe would wait forever for
    # Slurm to hold every GPU, and the queueing check would see AI's idle half.
    for name in ("leak-probe", "heavy-mixed"):
        assert main(["--scenario", name, "--dry-run", "--config", "hpcBorrowsAiGpus=false"]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line == (
            f"validate: --scenario {name}: needs Slurm to be able to hold every GPU (4), but this stack "
            "lets slurmd hold 2 (HPC's share); run it on a stack with hpcBorrowsAiGpus true and kedaMaxReplicas 0"
        )
    assert main(["--scenario", "hpc-parallel", "--dry-run", "--config", "hpcBorrowsAiGpus=false"]) == 0


def test_dry_run_of_heavy_mixed_expects_queueing_and_handoff_expects_the_handoff(capsys):
    main(["--scenario", "heavy-mixed", "--dry-run", "--config", "hpcBorrowsAiGpus=true"])
    assert "work beyond the GPUs waited while every GPU was held, then ran" in capsys.readouterr().out
    main(["--scenario", "handoff", "--dry-run"])
    out = capsys.readouterr().out
    assert "once slurmd is scaled to 0: create PyTorchJob" in out and "GPU demand 1 at start, 4 later" in out
    assert "a GPU held by slurmd was later held by a Kubernetes job" in out


def test_from_timeline_writes_the_report_and_exits_by_the_checks(tmp_path):
    assert (
        main(
            [
                "--scenario",
                "handoff",
                "--from-timeline",
                str(FIXTURES / "handoff-timeline.json"),
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert {p.name for p in tmp_path.iterdir()} == {"timeline.json", "summary.txt", "timeline.png"}
    summary = (tmp_path / "summary.txt").read_text()
    assert "9 of 9 checks passed" in summary and "GPU return latency" in summary
    assert Timeline.load(tmp_path / "timeline.json") == Timeline.load(FIXTURES / "handoff-timeline.json")


def test_from_timeline_fails_when_a_check_fails(tmp_path):
    broken = Timeline.load(FIXTURES / "handoff-timeline.json")
    broken.outcome = "interrupted"
    broken.save(tmp_path / "broken.json")
    assert (
        main(["--scenario", "handoff", "--from-timeline", str(tmp_path / "broken.json"), "--out", str(tmp_path / "o")])
        == 1
    )
    (line,) = [x for x in (tmp_path / "o" / "summary.txt").read_text().splitlines() if x.startswith("run completed")]
    assert line.split()[2:5] == ["FAIL", "outcome:", "interrupted"]


@pytest.fixture
def no_cluster(monkeypatch):
    """Refused before validate asks pulumi for the kubeconfig or makes a cluster client (the
    conftest already keeps the stack's outputs from pulumi)."""

    def reached(what: str):
        def fail(*args, **kwargs):
            raise AssertionError(f"{what} for input it should have refused")

        return fail

    monkeypatch.setattr(validate.subprocess, "run", reached("a command ran"))
    monkeypatch.setattr(validate, "client_for", reached("a cluster client was made"))


@pytest.mark.parametrize(
    "argv,message",
    [
        ([], "validate: --scenario is required: one of hpc-parallel, mixed, heavy-mixed, handoff, leak-probe, nccl"),
        (
            ["--scenario", "huge"],
            'validate: --scenario: "huge" is not one of hpc-parallel, mixed, heavy-mixed, handoff, leak-probe, nccl',
        ),
        (
            ["--scenario", "mixed", "--timeout", "soon"],
            'validate: --timeout: "soon" is not allowed; expected seconds from 60 to 604800, e.g. 300 or 2.5',
        ),
        (
            ["--scenario", "mixed", "--interval", "0"],
            'validate: --interval: "0" is not allowed; expected seconds from 1 to 600, e.g. 300 or 2.5',
        ),
        # numbers that parse but mean nothing, all refused at once with the scenario
        (
            ["--scenario", "h\x1bx", "--timeout", "nan", "--interval", "inf"],
            'validate: --scenario: "h\\x1bx" is not one of hpc-parallel, mixed, heavy-mixed, handoff, leak-probe, nccl\n'
            'validate: --timeout: "nan" is not allowed; expected seconds from 60 to 604800, e.g. 300 or 2.5\n'
            'validate: --interval: "inf" is not allowed; expected seconds from 1 to 600, e.g. 300 or 2.5',
        ),
        (  # issue 31: accepted before, and the run took one sample at most
            ["--scenario", "mixed", "--timeout", "60", "--interval", "600"],
            "validate: --interval: 600 s is not shorter than --timeout 60 s; expected an interval shorter than the run",
        ),
        (
            ["--scenario", "mixed", "--interval", "1e-9"],
            'validate: --interval: "1e-9" is not allowed; expected seconds from 1 to 600, e.g. 300 or 2.5',
        ),
        (
            ["--scenario", "mixed", "--timeout=-inf"],
            'validate: --timeout: "-inf" is not allowed; expected seconds from 60 to 604800, e.g. 300 or 2.5',
        ),
        (
            ["--scenario", "mixed", "--timeout", "1e400"],
            'validate: --timeout: "1e400" is not allowed; expected seconds from 60 to 604800, e.g. 300 or 2.5',
        ),
        (
            ["--scenario", "mixed", "--timeout", "9" * 5000],
            f'validate: --timeout: "{"9" * 60}… (5000 characters)" is not allowed; expected seconds from 60 to '
            "604800, e.g. 300 or 2.5",
        ),
        (
            ["--scenario", "mixed", "--timeout", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"],
            "validate: --timeout: (value hidden: looks like a secret key or token) is not allowed; expected seconds "
            "from 60 to 604800, e.g. 300 or 2.5",
        ),
        (
            ["--scenario", "mixed", "--bogus", "ghp_aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6"],
            "validate: unrecognized arguments: --bogus (hidden: looks like a GitHub token)",
        ),
        (
            ["--scenario", "mixed", "--out", "/tmp/" + "n" * 300],
            f'validate: --out: "/tmp/{"n" * 55}… (305 characters)" has a name of 300 bytes; expected names of at '
            "most 255 bytes",
        ),
        (
            ["--scenario", "mixed", "--kubeconfig", "/nonexistent/kc"],
            'validate: --kubeconfig: "/nonexistent/kc" is not a file',
        ),
        (
            ["--scenario", "mixed", "--from-timeline", "/nonexistent.json"],
            'validate: --from-timeline: "/nonexistent.json" is not a file',
        ),
        (["--scenario", "mixed", "--bogus"], "validate: unrecognized arguments: --bogus"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, message, capsys, no_cluster):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == message + "\n" and captured.out == ""


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("clusters: " + "[" * 50_000 + "]" * 50_000 + "\n", "is not accepted YAML: line 1: nested deeper than 64"),
        ("a: &a [x, x, x]\nb: &b [*a, *a, *a]\nclusters: [*b]\n", "is not accepted YAML: line 2: the alias *a"),
        ("clusters: [a]\nclusters: [b]\n", 'line 2: the key "clusters" appears twice'),
        ("? [a]\n: 1\n", "a key that is a list or a mapping"),
        ("clusters: []\n", "is not a kubeconfig: it names no clusters"),
    ],
)
def test_a_bad_kubeconfig_file_is_one_line_before_any_cluster_call(text, fragment, tmp_path, capsys, no_cluster):
    (tmp_path / "kc").write_text(text)
    assert main(["--scenario", "mixed", "--kubeconfig", str(tmp_path / "kc"), "--out", str(tmp_path / "o")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith('validate: --kubeconfig: "') and fragment in line, line
    assert not (tmp_path / "o").exists()


def test_a_timeline_nested_past_the_json_decoders_recursion_is_one_line(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert main(["--scenario", "handoff", "--from-timeline", str(deep)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith('validate: --from-timeline: "') and '" is not a timeline.json (RecursionError' in line

"""Every bad scenario file and `simulate` option refused before the run: exit 2,
one line per problem naming the field, nothing echoed raw or secret, no traceback, the twin
never started, nothing created. What the refusals cost is benchmarks/refusals.py's."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from cli.__main__ import main
from core import user_files
from twin import scenario, sim

PRIVATE_BODY = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ"
PEM_NAME = f"-----BEGIN OPENSSH PRIVATE KEY-----\\n{PRIVATE_BODY}\\n-----END OPENSSH PRIVATE KEY-----"
NEVER_SHOWN = ("\x1b", "\x07", PRIVATE_BODY, "K7MDENG")


def job(name: str, extra: str = "", kind: str = "slurm", submit: float = 0) -> str:
    return f"  - {{name: {name}, kind: {kind}, submit: {submit}, runtime: 60{', ' + extra if extra else ''}}}\n"


def jobs(*lines: str, duration: int = 600) -> str:
    return f"duration: {duration}\njobs:\n" + "".join(lines)


# (the file's text or bytes, or a path as given; the options after it; each line's field and fragment)
ROWS: list[tuple[str | bytes | Path, list[str], list[tuple[str, str]]]] = [
    # types
    (jobs(job("a"), job("b", "after: [a]")), [], [("jobs[1] (b).after", "expected the name of another slurm job")]),
    (jobs(job("a"), job("b", "after: {a: 1}")), [], [("jobs[1] (b).after", "\"{'a': 1}\" is not allowed")]),
    (jobs(job("a", "partition: [all]")), [], [("jobs[0] (a).partition", "expected all or slinky")]),
    (jobs(job("a", "name: b")), [], [("--scenario", 'line 3: the key "name" appears twice')]),
    ("1: x\nduration: 60\n", [], [("--scenario", 'line 1: the key "1" is not text; expected text (quote it)')]),
    ("duration: 60\n? [a]\n: 1\n", [], [("--scenario", "a key that is a list or a mapping")]),
    ("duration: 60\nduration: 70\n", [], [("--scenario", 'line 2: the key "duration" appears twice')]),
    ("duration: 60\njobs: " + "[" * 10_000 + "]" * 10_000 + "\n", [], [("--scenario", "nested deeper than 64")]),
    ("d: &d [x, x]\nduration: 60\nj: *d\n", [], [("--scenario", "the alias *d is not accepted")]),
    (
        "duration: 60\njobs:\n  - <<: {name: a, kind: slurm}\n    runtime: 60\n",
        [],
        [("--scenario", "line 3: the merge")],
    ),
    (b"duration: 60\n# caf\xe9\n", [], [("--scenario", "is not UTF-8 text: byte 0xe9 at offset 18")]),
    (Path("/"), [], [("--scenario", "cannot be read (Is a directory)")]),
    (
        "duration: 60\njobs: []\nfaults: [{kind: kueue-down, start: 0, end: 9" + "9" * 5000 + "}]\n",
        [],
        [("--scenario", "a value cannot be converted")],
    ),
    # numbers and booleans that read differently in YAML 1.1 (PyYAML) and 1.2
    (jobs(job("a", "nodes: 010")), [], [("--scenario", 'line 3: "010" is a number only to YAML 1.1')]),
    ("duration: 1:30\n", [], [("--scenario", 'line 1: "1:30" is a number only to YAML 1.1')]),
    ("duration: 1_000\n", [], [("--scenario", "expected decimal digits without leading zeros")]),
    ("duration: 60\nkueue: yes\n", [], [("--scenario", 'line 2: "yes" is a boolean only to YAML 1.1')]),
    (jobs(job("a", "hold: on")), [], [("--scenario", "expected true or false, or quoted text")]),
    # --time, minutes, on Slurm jobs only
    (jobs(job("a", "time: 0")), [], [("jobs[0] (a).time", "an integer from 1 to 10080")]),
    (jobs(job("a", "time: 1.5")), [], [("jobs[0] (a).time", "an integer from 1 to 10080")]),
    (jobs(job("a", 'time: "01:00:00"')), [], [("jobs[0] (a).time", "an integer from 1 to 10080")]),
    (jobs(job("p", "time: 5", kind="pytorchjob")), [], [("jobs[0] (p).time", "no time on a pytorchjob (Slurm jobs")]),
    # references and cycles
    (jobs(job("a", "after: b"), job("b", "after: a")), [], [("jobs[0] (a).after", "(a -> b -> a would wait forever)")]),
    (
        jobs(job("a", "after: c"), job("b", "after: a"), job("c", "after: b"), job("d", "after: d")),
        [],
        [("jobs[3] (d).after", "the name of another slurm job"), ("jobs[0] (a).after", "(a -> c -> b -> a would")],
    ),
    (jobs(job("a"), job("k", "", kind="job"), job("b", "after: k")), [], [("jobs[2] (b).after", "another slurm job")]),
    # times inside the duration
    (jobs(job("a", "begin: 900")), [], [("jobs[0] (a).begin", "before the end of the run (duration 600)")]),
    (jobs(job("a", submit=600)), [], [("jobs[0] (a).submit", "before the end of the run (duration 600)")]),
    (jobs(job("a", "hold: true, release: 700")), [], [("jobs[0] (a).release", "before the end of the run")]),
    ("duration: 60\nfaults: [{kind: kueue-down, start: 60, end: 90}]\n", [], [("faults[0].start", "before the end")]),
    ("duration: .nan\n", [], [("duration", "a number from 1 to 86400")]),
    ("duration: .inf\n", [], [("duration", "a number from 1 to 86400")]),
    # sizes (docs/input-limits.md)
    (jobs(*(job(f"j{i}") for i in range(501))), [], [("jobs", "501 jobs are too many; expected at most 500")]),
    (jobs(job("a", "array: 1000"), duration=86400), [], [("duration", "24,000 task-hours to simulate")]),
    (jobs(job("a", "array: 1000"), duration=7 * 86400), [], [("duration", "a number from 1 to 86400")]),
    (
        jobs(*(job(f"j{i}", "array: 1000") for i in range(3))),
        [],
        [("jobs", "3000 tasks (jobs, array tasks, replicas) are too many")],
    ),
    (
        jobs(*(job(f"p{i}", "replicas: 1000", kind="pytorchjob") for i in range(3))),
        [],
        [("jobs", "3000 tasks (jobs, array tasks, replicas) are too many; expected at most 2000")],
    ),
    (jobs(job("p", "replicas: 1000", kind="pytorchjob"), duration=43200), [], [("duration", "12,000 task-hours")]),
    # what a problem line shows: control characters escaped, a secret-looking name hidden
    (
        jobs(job('"a\\e[31m\\a\\nb"')),
        [],
        [("jobs[0] (a\\x1b[31m\\x07\\nb).name", '"a\\x1b[31m\\x07\\nb" is not allowed')],
    ),
    (
        jobs(job(f'"{PEM_NAME}"', "nodes: 0")),
        [],
        [
            ("jobs[0] ((name hidden: looks like a private key)).name", "(value hidden: looks like a private key)"),
            ("jobs[0] ((name hidden: looks like a private key)).nodes", "an integer from 1 to 1024"),
        ],
    ),
    (
        jobs(job("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")),
        [],
        [("jobs[0] ((name hidden: looks like a secret key or token)).name", "(value hidden: looks like a secret")],
    ),
    (jobs(job("a", '"\\e]0;x\\a": 1')), [], [("jobs[0] (a).\\x1b]0;x\\x07", "a known job field")]),
    # a cycle through a secret-looking name: hidden in the chain as in the line's prefix
    (
        jobs(
            job('"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"', "after: b"),
            job("b", 'after: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"'),
        ),
        [],
        [
            ("jobs[0] ((name hidden: looks like a secret key or token)).name", "(value hidden: looks like a secret"),
            ("jobs[0] ((name hidden: looks like a secret key or token)).after", "(name hidden: looks like a secret"),
        ],
    ),
    # explicit tags the reader cannot take on that shape, and a bound on faults
    ("duration: 60\nfoo: !!set [a, b]\n", [], [("--scenario", "an explicit tag")]),
    ("duration: 60\nfoo: !!timestamp x\n", [], [("--scenario", "an explicit tag")]),
    (
        "duration: 600\nfaults:\n" + "  - {kind: restapi-down, start: 1, end: 2}\n" * 101,
        [],
        [("faults", "101 faults are too many; expected at most 100")],
    ),
    # --out, checked before the run
    (jobs(job("a")), ["--out", "{tmp}/file"], [("--out", "is a file; expected a directory")]),
    (jobs(job("a")), ["--out", "{tmp}/file/sub"], [("--out", "which is a file; expected a directory path")]),
    (
        jobs(job("a")),
        ["--out", "{tmp}/" + "n" * 300],
        [("--out", "has a name of 300 bytes; expected names of at most 255")],
    ),
    (jobs(job("a")), ["--out", "/proc/no/such/dir"], [("--out", "cannot be")]),
]


@pytest.mark.parametrize("given, options, expected", ROWS, ids=[f"{i}" for i in range(len(ROWS))])
def test_a_bad_scenario_is_refused_before_the_run_in_one_line_per_problem(
    given, options, expected, tmp_path, capsys, monkeypatch
):
    def no_run(*args, **kwargs):
        raise AssertionError("the twin started")

    monkeypatch.setattr(sim, "Run", no_run)
    (tmp_path / "file").write_text("not a directory\n")
    if isinstance(given, Path):
        path = given
    else:
        path = tmp_path / "s.yaml"
        path.write_bytes(given) if isinstance(given, bytes) else path.write_text(given)
    before = sorted(tmp_path.rglob("*"))
    code = main(["simulate", "--scenario", str(path), *(o.replace("{tmp}", str(tmp_path)) for o in options)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out, err)
    lines = err.splitlines()
    assert len(lines) == len(expected), lines
    for line, (field, fragment) in zip(lines, expected, strict=True):
        assert line.startswith(field + ": ") and fragment in line, (line, field, fragment)
        assert all(" " <= ch <= "~" or ch == "…" for ch in line) and len(line) < 400, line
    assert not any(raw in err for raw in NEVER_SHOWN), err
    assert sorted(tmp_path.rglob("*")) == before  # nothing created


class Zeros(io.RawIOBase):
    """/dev/zero that counts the bytes it hands out and ends after `cap` of them, so a reader
    without a limit fails the test instead of filling memory."""

    def __init__(self, cap: int):
        self.given, self.cap = 0, cap

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.cap - self.given)
        buffer[:n] = bytes(n)
        self.given += n
        return n


def test_an_endless_scenario_file_is_refused_having_read_no_further_than_the_limit(monkeypatch, capsys):
    zeros = Zeros(cap=16 * user_files.MAX_YAML_BYTES)
    real_open = Path.open

    def open_(path: Path, *args, **kwargs):
        return io.BufferedReader(zeros) if path == Path("/dev/zero") else real_open(path, *args, **kwargs)

    monkeypatch.setattr(Path, "open", open_)
    assert main(["simulate", "--scenario", "/dev/zero"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == '--scenario: "/dev/zero" is larger than 256 KiB, the limit for a scenario file\n'
    # one byte past the limit, which the buffered file reads up to a whole buffer beyond
    assert zeros.given <= user_files.MAX_YAML_BYTES + 1 + io.DEFAULT_BUFFER_SIZE, zeros.given


def test_parse_refuses_keys_of_any_type_without_a_traceback():
    with pytest.raises(scenario.ScenarioError) as error:
        scenario.parse({1: "x", "duration": 60, None: 2, "jobs": [{"name": "a", 2: 3, "zz": 1}]})
    assert [p.split(": ")[0] for p in error.value.problems] == [
        "scenario.?",
        "scenario.?",
        "jobs[0] (a).?",
        "jobs[0] (a).zz",
        "jobs[0] (a).kind",
        "jobs[0] (a).submit",
        "jobs[0] (a).runtime",
    ]


def test_the_shipped_scenarios_are_within_the_bounds():
    for path in sorted((Path(__file__).resolve().parents[2] / "scenarios").glob("*.yaml")):
        scenario.load(path)


def test_the_task_hours_cap_weighs_work_by_when_it_is_submitted():
    """A day of 450 tasks submitted through the day (about 5,600 task-hours open at most) is
    accepted; the same tasks all submitted at 0 (10,800) are refused: the cap follows the work the
    twin can have open, not tasks x duration."""
    day = 86400
    spread = [{"name": f"j{i}", "kind": "slurm", "submit": i * 190, "runtime": 60} for i in range(450)]
    assert len(scenario.parse({"duration": day, "jobs": spread}).jobs) == 450
    at_once = [job | {"submit": 0} for job in spread]
    with pytest.raises(scenario.ScenarioError) as refused:
        scenario.parse({"duration": day, "jobs": at_once})
    assert refused.value.problems == [
        'duration: "86400.0" with 450 tasks (jobs, array tasks, replicas) is 10,800 task-hours to simulate (each task '
        "from its submit to the end); expected at most 10,000 (a shorter duration, later submits or fewer tasks; "
        "docs/input-limits.md)"
    ]

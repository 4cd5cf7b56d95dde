"""What refusing hostile input costs (a benchmark, not a test).

    venv/bin/python benchmarks/refusals.py [--repeat 3]

Feeds the tools' readers the inputs the refusal tests use to break them (numbers of 5,000
digits, long secret-looking values, 50,000 brackets, nested aliases, a 2 MiB or endless file,
too many jobs or tasks, a timeline of 100,000 samples out of order) and prints the median seconds
each takes to be refused. The targets are the bounds those tests asserted before they moved here,
on this project's 2-core machine: a setting within 1 s, a stack file within 2 s, a scenario file
within 3 s, a kubeconfig and a timeline within 5 s. Exits 1 if one misses its target, or is not
refused at all."""

from __future__ import annotations

import argparse
import random
import statistics
import string
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core import settings, user_files
from core.settings import PROJECT
from stacks import offline
from twin import scenario
from validation import timeline

ADMIN = "81.2.69.0/28"
# ~400 bytes of nested aliases that would expand to 9^9 strings
LAUGHS = "  a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"  {n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)
RANDOM_5000 = "".join(random.Random(22).choices(string.ascii_letters + string.digits + "+/", k=5000))


def setting(key: str, value: str) -> Callable[[Path], object]:
    return lambda tmp: settings.load({f"{PROJECT}:adminCidr": ADMIN, f"{PROJECT}:{key}": value})


def stack_file(text: str) -> Callable[[Path], object]:
    def refuse(tmp: Path) -> object:
        (tmp / "Pulumi.odd.yaml").write_text(f"config:\n  {PROJECT}:adminCidr: {ADMIN}\n" + text)
        return settings.load(offline.stack_config("odd", root=tmp), stack="odd", offline=True)

    return refuse


def scenario_file(text: str) -> Callable[[Path], object]:
    def refuse(tmp: Path) -> object:
        (tmp / "s.yaml").write_text(text)
        return scenario.load(tmp / "s.yaml")

    return refuse


def kubeconfig(text: str) -> Callable[[Path], object]:
    def refuse(tmp: Path) -> object:
        (tmp / "kc").write_text(text)
        return user_files.read_kubeconfig(tmp / "kc")

    return refuse


def jobs(count: int, extra: str = "") -> str:
    lines = "".join(f"  - {{name: j{i}, kind: slurm, submit: 0, runtime: 60{extra}}}\n" for i in range(count))
    return f"duration: 600\njobs:\n{lines}"


def timeline_file(samples: int) -> Callable[[Path], object]:
    """A timeline of `samples` samples, each with a GPU pod, in reverse time order: every sample is read
    and found out of order (the schema check's worst case short of the size limit)."""

    def refuse(tmp: Path) -> object:
        pod = {"namespace": "slurm", "name": "p", "uid": "u", "node": "n", "phase": "Running", "holder": "slurmd"}
        rows = [
            {"t": float(samples - i), "nodeset_replicas": 1, "slurmd_ready": 1, "gpu_pods": [pod]}
            for i in range(samples)
        ]
        data = {"scenario": "handoff", "gpus_total": 4, "interval": 5.0, "started_at": "2026-01-01T00:00:00+00:00"}
        (tmp / "t.json").write_text(__import__("json").dumps({**data, "samples": rows, "submissions": []}))
        return timeline.read_timeline(tmp / "t.json")

    return refuse


REFUSED = (settings.SettingsError, scenario.ScenarioError, user_files.UserFileError, timeline.TimelineError)
# (what, the seconds its refusal may take, the call)
CASES: list[tuple[str, float, Callable[[Path], object]]] = [
    ("setting: a number of 5,000 digits", 1, setting("workerCount", "9" * 5000)),
    ("setting: 5,000 leading zeros", 1, setting("controlRootVolumeGb", "0" * 5000 + "40")),
    ("setting: a key line of 3,000 more characters", 1, setting("sshPublicKey", "ssh-ed25519 AAAA " + "x" * 3000)),
    ("setting: 5,000 random base64 characters", 1, setting("nodesetName", RANDOM_5000)),
    ("setting: 5,000 hex digits", 1, setting("nodesetName", "0123456789abcdef" * 312)),
    ("stack file: 50,000 brackets", 2, stack_file("  x: " + "[" * 50_000 + "]" * 50_000 + "\n")),
    ("stack file: nested aliases", 2, stack_file(LAUGHS)),
    ("stack file: 2 MiB of keys", 2, stack_file("".join(f"  key{i:07d}: v\n" for i in range(2 << 20 >> 4)))),
    ("scenario: 10,000 brackets", 3, scenario_file("duration: 60\njobs: " + "[" * 10_000 + "]" * 10_000 + "\n")),
    ("scenario: 501 jobs", 3, scenario_file(jobs(501))),
    ("scenario: three 1,000-task arrays", 3, scenario_file(jobs(3, ", array: 1000"))),
    ("scenario: /dev/zero", 3, lambda tmp: scenario.load(Path("/dev/zero"))),
    ("kubeconfig: 50,000 brackets", 5, kubeconfig("clusters: " + "[" * 50_000 + "]" * 50_000 + "\n")),
    ("timeline: 100,000 samples in reverse order", 5, timeline_file(100_000)),
    ("timeline: /dev/zero", 5, lambda tmp: timeline.read_timeline(Path("/dev/zero"))),
]


def time_refusal(call: Callable[[Path], object], repeat: int) -> float | None:
    """Median seconds over `repeat` runs; None if the input is accepted."""
    runs = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            try:
                call(Path(tmp))
                return None
            except REFUSED:
                runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="runs per input; the median is reported")
    args = parser.parse_args()
    missed = 0
    print(f"{'input':<46}  {'seconds':>7}  {'target':>6}")
    for what, target, call in CASES:
        seconds = time_refusal(call, args.repeat)
        if seconds is None:
            missed += 1
            print(f"{what:<46}  {'-':>7}  {target:>5g}s  ACCEPTED")
            continue
        slow = seconds > target
        missed += slow
        print(f"{what:<46}  {seconds:7.3f}  {target:>5g}s{'  MISSED' if slow else ''}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m stacks validate`: replay one reference experiment and check it.

Exit status: 0 when every check passed, 1 when one failed, 2 for bad input.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import yaml

from validation.checks import Expectations, describe_checks, evaluate, expectations
from validation.names import SlurmNames
from validation.scenarios import SCENARIOS, describe, plan
from validation.timeline import Timeline

GPUS_TOTAL = 4  # 4 x g4dn.xlarge, one T4 each
DEFAULT_TIMEOUT = 2700.0  # heavy-mixed queues, then waits out KEDA's 300 s cooldown


class UsageError(Exception):
    """Bad input: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        # One line and exit 2 through main(), instead of argparse's usage block.
        raise UsageError(message)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: give a number of seconds > 0")
    return value


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m stacks validate", description=__doc__)
    p.add_argument("--scenario", help="one of: " + ", ".join(SCENARIOS))
    p.add_argument("--kubeconfig", type=Path, help="default: `pulumi stack output --show-secrets kubeconfig`")
    p.add_argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT, help="seconds (default %(default)s)")
    p.add_argument("--interval", type=_seconds, default=5.0, help="seconds between samples (default %(default)s)")
    p.add_argument("--out", type=Path, help="output folder (default out/validate-<scenario>-<time>)")
    p.add_argument("--dry-run", action="store_true", help="print what would be submitted and checked; no cluster")
    p.add_argument("--from-timeline", type=Path, help="check and draw a saved timeline.json again; no cluster")
    return p


def load_kubeconfig(path: Path | None) -> dict:
    if path is not None:
        if not path.is_file():
            raise UsageError(f"--kubeconfig: {str(path)!r} is not a file")
        return yaml.safe_load(path.read_text())
    try:
        out = subprocess.run(
            ["pulumi", "stack", "output", "--show-secrets", "kubeconfig"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise UsageError(
            f"--kubeconfig not given and `pulumi stack output kubeconfig` failed ({error}); pass --kubeconfig PATH"
        ) from None
    return yaml.safe_load(out)


def write_results(timeline: Timeline, exp: Expectations, out: Path) -> bool:
    from validation.plot import draw
    from validation.report import summary

    out.mkdir(parents=True, exist_ok=True)
    checks = evaluate(timeline, exp)
    timeline.save(out / "timeline.json")
    text = summary(timeline, checks)
    (out / "summary.txt").write_text(text)
    draw(timeline, out / "timeline.png")
    print(text, end="")
    print(f"wrote {out / 'timeline.json'}, {out / 'summary.txt'}, {out / 'timeline.png'}")
    return all(c.passed for c in checks)


def main(argv: list[str]) -> int:
    try:
        return _main(argv)
    except UsageError as error:
        print(f"validate: {error}", file=sys.stderr)
        return 2


def _main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.scenario is None:
        raise UsageError(f"--scenario is required: one of {', '.join(SCENARIOS)}")
    if args.scenario not in SCENARIOS:
        raise UsageError(f"--scenario: {args.scenario!r} is not one of {', '.join(SCENARIOS)}")
    scenario = SCENARIOS[args.scenario]
    names = SlurmNames()
    now = datetime.now(UTC)
    run_id = "dryrun" if args.dry_run else now.strftime("r%m%d%H%M%S")
    planned = plan(scenario, run_id)
    exp = expectations(scenario, planned, GPUS_TOTAL)
    out = args.out or Path("out") / f"validate-{scenario.name}-{now.strftime('%Y%m%dT%H%M%SZ')}"

    if args.dry_run:
        print("\n".join(describe(scenario, planned, names, GPUS_TOTAL)))
        print(f"records every {args.interval:.0f} s until done or {args.timeout:.0f} s:")
        print(f"  NodeSet {names.namespace}/{names.nodeset} replicas; squeue in {names.controller_pod};")
        print("  every pod holding nvidia.com/gpu with its node and GPU UUID (nvidia-smi inside the pod);")
        print("  PyTorchJob and Job states")
        print("checks:")
        print("\n".join(f"  {line}" for line in describe_checks(exp)))
        print(f"writes {out}/timeline.json, summary.txt, timeline.png")
        return 0

    if args.from_timeline is not None:
        if not args.from_timeline.is_file():
            raise UsageError(f"--from-timeline: {str(args.from_timeline)!r} is not a file")
        timeline = Timeline.load(args.from_timeline)
        return 0 if write_results(timeline, exp, out) else 1

    from validation.cluster import KubeCluster, WallClock
    from validation.runner import run

    cluster = KubeCluster.from_kubeconfig(load_kubeconfig(args.kubeconfig), names)
    timeline = run(
        planned,
        cluster,
        WallClock(),
        scenario=scenario.name,
        gpus_total=GPUS_TOTAL,
        interval=args.interval,
        timeout=args.timeout,
        started_at=now.isoformat(timespec="seconds"),
    )
    return 0 if write_results(timeline, exp, out) else 1

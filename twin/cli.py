"""`python -m stacks simulate`: run a scenario through the hand-off twin.

    python -m stacks simulate --scenario FILE [--policy NAME] [--stack S] [--config KEY=VALUE ...]
                              [--json] [--out DIR]

Exit status: 0 when nothing was killed or double-held and every job that was not refused
completed; 1 otherwise; 2 for bad input (one line per problem, no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from components import slurmd_scaling
from components.names import DEFAULT_PARTITION
from stacks import offline
from stacks.settings import SettingsError, escaped, show
from stacks.settings import load as load_settings
from twin import program, scenario, sim


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise UsageError(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m stacks simulate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--scenario", required=True, type=Path, help="scenario YAML (see scenarios/)")
    p.add_argument(
        "--policy",
        default=slurmd_scaling.DEFAULT_POLICY,
        help=f"scaling policy: {', '.join(slurmd_scaling.POLICIES)} (default %(default)s)",
    )
    offline.add_stack_arguments(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--out", type=Path, help="write result.json and timeline.png here")
    return p


def timeline(run: sim.Run, name: str):
    from validation.timeline import Timeline

    data = {
        "scenario": name,
        "gpus_total": run.kube.gpus,
        "interval": sim.SAMPLE_INTERVAL,
        "started_at": "modelled",
        "samples": run.samples,
        "submissions": [
            {"name": j.name, "kind": {"slurm": "slurm", "pytorchjob": "PyTorchJob", "job": "Job"}[j.kind]}
            | {"t": j.submit, "gpus": j.gpus_wanted, "ref": j.name}
            for j in run.scenario.jobs
        ],
    }
    return Timeline.from_dict(data)


def _seconds(value: float | None) -> str:
    return "none" if value is None else f"{value:g} s"


def summary(result: dict) -> str:
    lines = [
        f"{j['name']:<16} {j['kind']:<11} {j['outcome']:<10} submitted {j['submitted']:g}"
        + (f", started {j['started']:g}" if j["started"] is not None else "")
        + (f", finished {j['finished']:g}" if j["finished"] is not None and j["outcome"] != "refused" else "")
        + (f": {j['reason']}" if "reason" in j else "")
        for j in result["jobs"]
    ]
    lat = result["latency"]
    lines.append(
        f"killed: {', '.join(result['killed']) or 'none'}; double-held GPUs: {len(result['double_held'])}; "
        f"slurmd starts: {result['slurmd_starts']}; end: {result['end']['slurmd_replicas']} replicas, "
        f"{result['end']['gpus_held_by_slurmd']} GPUs held by slurmd; "
        f"scale-up {_seconds(lat['scale_up_s'])}, GPU return {_seconds(lat['gpu_return_s'])} (modelled)"
    )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    try:
        args = parser().parse_args(argv)
    except UsageError as error:
        print(f"simulate: {escaped(str(error), limit=300)}", file=sys.stderr)
        return 2
    problems = []
    if args.policy not in slurmd_scaling.POLICIES:
        problems.append(
            f"--policy: {show(args.policy)} is not allowed; expected one of {', '.join(slurmd_scaling.POLICIES)}"
        )
    try:
        settings = load_settings(offline.stack_config(args.stack, args.config), args.stack, offline=True)
    except SettingsError as error:
        problems += error.problems
        settings = None
    try:
        partitions = (DEFAULT_PARTITION, settings.nodeset_name if settings else "slinky")
        sc = scenario.load(args.scenario, partitions)
    except scenario.ScenarioError as error:
        problems += error.problems
    if not problems and sc.workers is not None and sc.workers != settings.worker_count:
        # The scenario's `workers` is the stack's workerCount: the ScaledObject and partition limits follow.
        try:
            settings = load_settings(
                offline.stack_config(args.stack, [*args.config, f"workerCount={sc.workers}"]), args.stack, offline=True
            )
        except SettingsError as error:
            problems += [f"workers (scenario): {p}" for p in error.problems]
    if problems:
        for problem in problems:
            print(problem, file=sys.stderr)
        return 2
    run = sim.Run(program.setup(settings, args.policy), sc)
    result = run.run()
    if args.out:
        from validation.plot import draw

        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "result.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        draw(
            timeline(run, args.scenario.stem),
            args.out / "timeline.png",
            f"{args.scenario.stem}, policy {args.policy} (modelled)",
        )
    print(json.dumps(result, indent=1, sort_keys=True) if args.json else summary(result))
    return 0 if sim.ok(result) else 1

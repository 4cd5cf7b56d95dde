"""`python -m cli simulate`: run a scenario through the hand-off twin, or every shipped
scenario under every policy for the README's tables.

    python -m cli simulate --scenario NAME|FILE [--policy NAME] [--phase-set S] [--phases N]
                           [--stack S] [--config KEY=VALUE ...] [--json] [--out DIR]
    python -m cli simulate --readme-tables [README] [--stack S] [--config KEY=VALUE ...]

The scrape of each target, KEDA's poll and the HPA's sync fire at their own phases, drawn as
--phase-set S (a number; default 0, as the README's tables). --phases N runs the scenario under
the phase sets S to S+N-1 and reports its latencies as p50/p95 over them, and the sets under
which a job was killed, a GPU double-held or a job left unfinished.

On a terminal, a run longer than a few seconds shows how far it got on stderr, one line
rewritten in place and cleared at the end; never with --json or when stderr is not a terminal.

Exit status: 0 when nothing was killed or double-held and every job that was not refused
completed (under every phase set with --phases); 1 otherwise; 2 for bad input (one line per
problem, no traceback). --readme-tables prints the tables as Markdown, each between its marker
comments, or with a file rewrites what lies between those markers in it; it exits 0 (the tables
show the failures).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import NoReturn

from cli import as_typed, typed_command
from cli.progress import Progress
from components import slurmd_scaling
from core import user_files
from core.names import DEFAULT_PARTITION, Names
from core.settings import Settings, SettingsError, escaped, redacted, show
from stacks import offline
from twin import program, scenario, sim, tables

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
MAX_PHASES = 100  # a sweep of the largest scenario (about a minute each) stays within hours
# Phase sets: any number draws phases as good as any other, so a short range that is typed and
# read back without doubt; a sweep's last set stays inside it too.
MAX_PHASE_SET = 999_999


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=f"{typed_command()} simulate",
        description=as_typed(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--scenario",
        metavar="NAME|FILE",
        help="a shipped scenario's name (" + ", ".join(p.stem for p in shipped()) + ") or a scenario YAML file",
    )
    what.add_argument(
        "--readme-tables",
        nargs="?",
        const="-",
        type=Path,
        metavar="README",
        help="every shipped scenario under every policy: print the README's tables, or rewrite them in README",
    )
    p.add_argument(
        "--policy",
        help=f"scaling policy: {', '.join(slurmd_scaling.POLICIES)} (default {slurmd_scaling.DEFAULT_POLICY})",
    )
    p.add_argument(
        "--phase-set",
        default=str(sim.DEFAULT_PHASE_SET),
        metavar="S",
        help=f"which draw of the scrape, poll and sync phases, 0 to {MAX_PHASE_SET} (default %(default)s)",
    )
    p.add_argument(
        "--phases",
        metavar="N",
        help=f"run under N phase sets from --phase-set (1 to {MAX_PHASES}): p50/p95 over them",
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
        + (f", requeued {j['requeued_by_node_failure']}x: its node failed" if "requeued_by_node_failure" in j else "")
        for j in result["jobs"]
    ]
    lat = result["latency"]
    lines += side_lines(result["sides"])
    if result["failure_events"]:
        lines.append(
            "node failure: " + "; ".join(f"{what} {name} at {t:g} s" for t, what, name in result["failure_events"])
        )
    lines.append(
        f"killed: {', '.join(result['killed']) or 'none'}; double-held GPUs: {len(result['double_held'])}; "
        f"slurmd starts: {result['slurmd_starts']}; end: {result['end']['slurmd_replicas']} replicas, "
        f"{result['end']['gpus_held_by_slurmd']} GPUs held by slurmd; "
        f"scale-up {_seconds(lat['scale_up_s'])}, GPU return {_seconds(lat['gpu_return_s'])} (modelled)"
    )
    return "\n".join(lines)


SIDES = (("slurm", "HPC"), ("kubernetes", "AI"))


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f} %"


def side_lines(sides: dict) -> list[str]:
    """Per side: its share of the contended GPU time, overall and its range over the windows; its
    waits by width; the jobs that never started; the GPU time idle while its work waited."""
    lines = []
    for side, who in SIDES:
        s, w = sides[side], sides[side]["window_share"]
        windows = (
            f", {_percent(w['min'])} to {_percent(w['max'])} over {w['windows']} windows of {w['window_s'] / 3600:g} h"
            if w["windows"]
            else ""
        )
        waits = "; ".join(
            f"{width} wide: p50 {v['p50']:g} s, p95 {v['p95']:g} s, max {v['max']:g} s ({v['jobs']})"
            for width, v in s["waits_by_width"].items()
        )
        lines.append(
            f"{who}: share of contended GPU time {_percent(s['share'])}{windows}; waits {waits or 'none'}; "
            f"never started: {len(s['never_started'])}; GPU idle while its work waited "
            f"{s['idle_while_waiting_gpu_s']:g} GPU·s, held for it {s['held_for_reservation_gpu_s']:g} GPU·s"
        )
    return lines


def _spread(spread: dict | None) -> str:
    if spread is None:
        return "never"
    runs = spread["none"]
    never = f", never in {runs} run{'' if runs == 1 else 's'}" if runs else ""
    return f"p50 {spread['p50']:g} s, p95 {spread['p95']:g} s, max {spread['max']:g} s{never}"


def _by_set(by_set: dict[int, list[str]]) -> str:
    return "; ".join(f"phase set {n}: {', '.join(what)}" for n, what in by_set.items()) or "none"


def sweep_summary(swept: dict) -> str:
    sets = swept["phase_sets"]
    lines = [
        f"{len(sets)} phase sets ({sets[0]} to {sets[-1]}) of scrape, poll and sync (modelled)",
        f"scale-up: {_spread(swept['latency']['scale_up_s'])}",
        f"GPU return: {_spread(swept['latency']['gpu_return_s'])}",
    ]
    for kind, spreads in swept["returns"].items():
        if spreads["gpu_freed_s"] is not None or spreads["kube_running_s"] is not None:
            lines.append(
                f"{kind} release while Kubernetes waits: GPU freed {_spread(spreads['gpu_freed_s'])}; "
                f"waiting job running {_spread(spreads['kube_running_s'])}"
            )
    for side, who in (("slurm", "HPC"), ("kubernetes", "AI")):
        if swept["reclaim_waits"][side] is not None:
            lines.append(f"{who} waiting for its lent share: {_spread(swept['reclaim_waits'][side])}")
    for side, who in SIDES:
        s = swept["sides"][side]
        longest = ", ".join(f"{w} wide {v:g} s" for w, v in s["longest_wait_by_width"].items()) or "none"
        never = "; ".join(f"phase set {n}: {len(names)}" for n, names in s["never_started"].items()) or "none"
        lines.append(
            f"{who}: share of contended GPU time {_spread(s['share']).replace(' s', '')}, lowest over a window "
            f"{_percent(s['lowest_window_share'])}; longest wait {longest}; never started: {never}"
        )
    lines.append(f"killed: {_by_set(swept['killed'])}")
    lines.append(f"double-held GPUs: {_by_set(swept['double_held'])}")
    lines.append(f"not ok: {', '.join(f'phase set {n}' for n in swept['not_ok']) or 'none'}")
    return "\n".join(lines)


def scenario_settings(stack: str, config: list[str], sc: scenario.Scenario, base: Settings) -> Settings:
    """The stack's settings for a scenario: its `workers` is the stack's workerCount, so the
    ScaledObject and partition limits follow (raises SettingsError, each problem named)."""
    if sc.workers is None or sc.workers == base.worker_count:
        return base
    try:
        return offline.stack_settings(stack, [*config, f"workerCount={sc.workers}"])
    except SettingsError as error:
        raise SettingsError([f"workers (scenario): {p}" for p in error.problems]) from None


def main(argv: list[str]) -> int:
    try:
        args = parser().parse_args(argv)
    except UsageError as error:
        print(f"simulate: {redacted(str(error))}", file=sys.stderr)
        return 2
    problems = []
    if args.readme_tables is None and args.policy is None:
        args.policy = slurmd_scaling.DEFAULT_POLICY
    if args.policy is not None and args.policy not in slurmd_scaling.POLICIES:
        problems.append(
            f"--policy: {show(args.policy)} is not allowed; expected one of {', '.join(slurmd_scaling.POLICIES)}"
        )
    phases = whole_number(args.phases, 1, MAX_PHASES)
    if args.phases is not None and phases is None:
        problems.append(
            f"--phases: {show(args.phases)} is not allowed; expected a number of phase sets from 1 to {MAX_PHASES} "
            "in ASCII digits"
        )
    phase_set = whole_number(args.phase_set, 0, MAX_PHASE_SET)
    if phase_set is None:
        problems.append(
            f"--phase-set: {show(args.phase_set)} is not allowed; expected a whole number from 0 to {MAX_PHASE_SET} "
            "in ASCII digits"
        )
    elif phases is not None and phase_set + phases - 1 > MAX_PHASE_SET:
        problems.append(
            f"--phases: {phases} from --phase-set {phase_set} would reach phase set {phase_set + phases - 1}; "
            f"expected the last at most {MAX_PHASE_SET}"
        )
    args.phases, args.phase_set = phases, phase_set if phase_set is not None else sim.DEFAULT_PHASE_SET
    if args.phases is not None and args.out:
        problems.append("--out: not allowed with --phases, which runs the scenario once per phase set")
    if args.readme_tables is not None:
        for flag, given in (
            ("--policy", args.policy is not None),
            ("--json", args.json),
            ("--phases", args.phases is not None),
            ("--phase-set", args.phase_set != sim.DEFAULT_PHASE_SET),
        ):
            if given:
                problems.append(f"{flag}: not allowed with --readme-tables, which runs every policy")
        if args.out:
            problems.append("--out: not allowed with --readme-tables, which prints Markdown or rewrites README")
    try:
        settings = offline.stack_settings(args.stack, args.config)
    except SettingsError as error:
        problems += error.problems
        settings = None
    if args.readme_tables is not None:
        return _readme_tables(args, settings, problems)
    path = scenario_path(args.scenario)
    try:
        if isinstance(path, str):
            raise scenario.ScenarioError([path])
        partitions = (DEFAULT_PARTITION, settings.nodeset_name if settings else "slinky")
        sc = scenario.load(path, partitions)
    except scenario.ScenarioError as error:
        problems += error.problems
    if not problems and settings is not None:  # None only after a SettingsError, which is a problem
        try:
            settings = scenario_settings(args.stack, args.config, sc, settings)
            problems += scenario.node_problems(sc, Names.from_settings(settings).gpus_total)
        except SettingsError as error:
            problems += error.problems
    if args.out is not None and (problem := user_files.out_dir_problem("--out", args.out)):
        problems.append(problem)
    if not problems and args.out is not None and (problem := user_files.make_out_dir("--out", args.out)):
        problems.append(problem)  # checked before the run, which may take half a minute
    if problems or settings is None or isinstance(path, str):  # the last two come with a problem
        for problem in problems:
            print(problem, file=sys.stderr)
        return 2
    setup = program.setup(settings, args.policy)
    shown = Progress(sys.stderr, enabled=not args.json)
    if args.phases is not None:
        sets = range(args.phase_set, args.phase_set + args.phases)
        swept = sim.sweep(
            setup, sc, sets, lambda n: shown.ticker(f"{path.stem}, phase set {n} ({n - sets[0] + 1} of {len(sets)})")
        )
        shown.close()
        print(json.dumps(swept, indent=1, sort_keys=True) if args.json else sweep_summary(swept))
        return 0 if not swept["not_ok"] else 1
    run = sim.Run(setup, sc, args.phase_set)
    result = run.run(shown.ticker(path.stem))
    shown.close()
    if args.out:
        try:
            write_out(run, result, args.out, path.stem, args.policy)
        except OSError as error:
            print(f"--out: {show(str(args.out))} cannot be written ({error.strerror or error})", file=sys.stderr)
            return 2
    print(json.dumps(result, indent=1, sort_keys=True) if args.json else summary(result))
    return 0 if sim.ok(result) else 1


def whole_number(text: str | None, lo: int, hi: int) -> int | None:
    """`text` as a whole number from lo to hi in ASCII digits without leading zeros, else None:
    int() would take Arabic-Indic digits (١٠) and underscores (1_0)."""
    if text is None or not re.fullmatch(r"0|[1-9][0-9]{0,8}", text) or not lo <= int(text) <= hi:
        return None
    return int(text)


def write_out(run: sim.Run, result: dict, out: Path, name: str, policy: str) -> None:
    from validation.plot import draw

    (out / "result.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    draw(
        timeline(run, name),
        out / "timeline.png",
        f"{escaped(name)}, policy {policy}, phase set {run.phase_set} (modelled)",
        modelled=result["latency"],  # the summary's numbers: the twin knows them to the second
    )


# ------------------------------------------------------------------ the README's tables


def _readme_tables(args: argparse.Namespace, settings: Settings | None, problems: list[str]) -> int:
    """The tables of every shipped scenario under every policy: printed, or put between their
    markers in FILE, read through the one reader of user files (its size and text limits) and
    replaced whole, so a run cut short leaves the file as it was."""
    readme = None if str(args.readme_tables) == "-" else args.readme_tables
    text = ""
    if readme is not None:
        path = show(str(readme))
        try:
            text = user_files.read_text(readme, "a Markdown file")
        except user_files.UserFileError as error:
            problems.append(f"--readme-tables: {path} {error.problem}")
        else:
            problems += [f"--readme-tables: {path} {problem}" for problem in tables.splice_problems(text)]
    runs: dict[str, dict[str, sim.Run]] = {}
    if not problems and settings is not None:  # None only after a SettingsError, which is a problem
        try:
            shown = Progress(sys.stderr, enabled=True)
            try:
                runs = run_shipped(args.stack, args.config, settings, shown)
            finally:
                shown.close()
        except (scenario.ScenarioError, SettingsError) as error:
            problems += error.problems
    if problems:
        for problem in problems:
            print(problem, file=sys.stderr)
        return 2
    generated = tables.tables(runs)
    if readme is None:
        print("\n\n".join(generated.values()))
        return 0
    try:
        user_files.replace_text(readme, tables.splice(text, generated))
    except OSError as error:
        print(f"--readme-tables: {show(str(readme))} cannot be written ({error.strerror or error})", file=sys.stderr)
        return 2
    print(f"rewrote the {' and '.join(tables.TABLES)} tables in {readme}")
    return 0


def shipped() -> list[Path]:
    return sorted(SCENARIOS.glob("*.yaml"))


def scenario_path(text: str) -> Path | str:
    """--scenario's file: a path as given (one that exists, or names a folder or a .yaml/.yml
    file), else a shipped scenario by name; or the line saying neither matches, with the names."""
    given = Path(text)
    if given.exists() or "/" in text or given.suffix in (".yaml", ".yml"):
        return given
    names = [p.stem for p in shipped()]
    if text in names:
        return SCENARIOS / f"{text}.yaml"
    return f"--scenario: {show(text)} is neither a file nor a shipped scenario; expected a path or one of {', '.join(names)}"


def policy_setups(
    path: Path, stack: str, config: list[str], settings: Settings
) -> tuple[scenario.Scenario, dict[str, sim.Setup]]:
    """A shipped scenario and the stack's Setup under each policy of components.slurmd_scaling."""
    sc = scenario.load(path, (DEFAULT_PARTITION, settings.nodeset_name))
    s = scenario_settings(stack, config, sc, settings)
    return sc, {policy: program.setup(s, policy) for policy in slurmd_scaling.POLICIES}


def run_scenario(
    path: Path, stack: str, config: list[str], settings: Settings, shown: Progress | None = None
) -> dict[str, sim.Run]:
    """One shipped scenario under every policy of components.slurmd_scaling, Kueue as it says."""
    sc, setups = policy_setups(path, stack, config, settings)
    runs = {policy: sim.Run(setup, sc) for policy, setup in setups.items()}
    for policy, run in runs.items():
        run.run(shown.ticker(f"{path.stem} under {policy}") if shown else None)
    return runs


def run_shipped(
    stack: str, config: list[str], settings: Settings, shown: Progress | None = None
) -> dict[str, dict[str, sim.Run]]:
    return {path.stem: run_scenario(path, stack, config, settings, shown) for path in shipped()}

"""Offline plan and render, the validation runner, the hand-off twin, and the deployment tools.

    python -m cli plan     [--stack dev] [--config KEY=VALUE ...] [--json]
    python -m cli render   [--stack dev] [--config KEY=VALUE ...] --out DIR
    python -m cli validate --scenario NAME [--dry-run] [--kubeconfig FILE] [--timeout S] [--out DIR]
    python -m cli simulate --scenario NAME|FILE [--policy NAME] [--phase-set S] [--phases N]
                           [--stack S] [--config KEY=VALUE ...] [--json] [--out DIR]
    python -m cli simulate --readme-tables [README] [--stack S] [--config KEY=VALUE ...]
    python -m cli preflight [--stack dev] [--config KEY=VALUE ...]
    python -m cli doctor    [--stack dev] [--config KEY=VALUE ...] [--kubeconfig FILE]
    python -m cli e2e       [--stack dev] [--keep] [--out DIR]

plan and render run the real program under Pulumi's mock engine: no cloud, CLI or credentials.
The `testbed` command (`venv/bin/pip install -e .`) is the same, from any directory.
preflight reads your AWS account (read-only), doctor reads the deployed cluster, e2e runs
preflight, up, doctor, every scenario and destroy (always) through the Automation API.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from cli import as_typed, typed_command
from cli.guard import run_guarded

PROJECT = Path(__file__).resolve().parent.parent
# plan and render run the program: they import Pulumi, the stacks and the mocks when they run, the
# other commands and --help start without them (a third of a second less for each). A third-party
# module missing then is one line, exit 2 (run_guarded), as it is for every command.
PROGRAM_COMMANDS = ("plan", "render")

EXIT_BAD_SETTINGS = 2  # any bad input: settings, stack file, --out, usage
PLAN_COLUMNS = 100  # `plan`'s width when not on a terminal
MIN_COLUMNS = 40  # narrower than this, a wrapped line holds too few words to read
DESCRIPTIONS = {
    "plan": "What `pulumi up` would build for a stack, without building anything: the program runs under "
    "Pulumi's mocks (no cloud account, credentials or Pulumi CLI) and prints every resource by type, the order "
    "the cluster installs its parts in, how Kueue shares the GPUs between Slurm and AI jobs, the AI run limit, "
    "Slurm's limits and the hourly cost. Settings that cannot work are refused, one line each.",
    "render": "Every file the stack would deploy, written under --out so you can read, diff or lint it before "
    "`pulumi up`: each node's cloud-init and scripts, the Helm releases and their values, the Kubernetes "
    "objects, the patches to objects others own, and slurm.conf. The program runs under Pulumi's mocks: nothing is created, "
    "no cloud account is needed. A later render replaces the directory whole.",
}


class _OneLineParser(argparse.ArgumentParser):
    """A usage mistake exits 2 with one line (argparse would print the usage block too)."""

    def error(self, message: str):  # type: ignore[override]
        from core.settings import redacted

        self.exit(EXIT_BAD_SETTINGS, f"{self.prog}: {redacted(message)}; see {self.prog} --help\n")


def _parser(program: bool = False) -> argparse.ArgumentParser:
    """The parser; plan's and render's own arguments only when `program` (that command runs): the
    top-level help and a usage mistake need their names and one-line help only."""
    parser = _OneLineParser(
        prog=typed_command(), description=as_typed(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    if program:
        from stacks import offline
    for name, help_text in (
        ("plan", "list the resources, install order and hourly cost"),
        ("render", "write every deployed artifact to a directory"),
    ):
        p = sub.add_parser(name, help=help_text, description=DESCRIPTIONS[name])
        if not program:
            continue
        offline.add_stack_arguments(p)
        if name == "plan":
            p.add_argument("--json", action="store_true", help="one JSON array of resources")
        else:
            p.add_argument("--out", required=True, type=Path, help="directory to write")
    sub.add_parser("validate", help="replay a reference experiment on the live testbed (see --help)", add_help=False)
    sub.add_parser(
        "simulate", help="run a scenario through the hand-off twin, or the README's tables (see --help)", add_help=False
    )
    sub.add_parser("preflight", help="read-only checks of your AWS account before `pulumi up`", add_help=False)
    sub.add_parser("doctor", help="health of the deployed testbed, one line per check", add_help=False)
    sub.add_parser("e2e", help="preflight, up, doctor, every scenario, destroy (always): one report", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["validate"]:
        from cli.validate import main as validate_main

        return validate_main(argv[1:])
    if argv[:1] == ["simulate"]:
        from cli.simulate import main as simulate_main

        return simulate_main(argv[1:])
    if argv[:1] == ["preflight"]:
        from cli.preflight import main as preflight_main

        return preflight_main(argv[1:])
    if argv[:1] == ["doctor"]:
        from cli.doctor import main as doctor_main

        return doctor_main(argv[1:])
    if argv[:1] == ["e2e"]:
        from cli.e2e import main as e2e_main

        return e2e_main(argv[1:])
    args = _parser(program=bool(argv) and argv[0] in PROGRAM_COMMANDS).parse_args(argv)
    return _run_program(args)


def _run_program(args: argparse.Namespace) -> int:
    """plan or render: the program under Pulumi's mocks, then its plan or its files."""
    import pulumi

    from cli import artifacts
    from core.settings import SettingsError, escaped, show
    from stacks import offline

    problems = []
    if args.command == "render" and (problem := artifacts.out_dir_problem(args.out)):
        problems.append(problem)
    try:
        config, _ = offline.load_stack(args.stack, args.config)
        rec = offline.run(config, stack=args.stack)
    except SettingsError as error:
        problems += error.problems
    except pulumi.RunError as error:  # the program's own refusals at run time (zone offerings)
        problems += str(error).splitlines()
    if problems:
        for problem in problems:
            print(problem, file=sys.stderr)
        return EXIT_BAD_SETTINGS
    if args.command == "plan":
        if args.json:
            print(json.dumps(artifacts.plan_elements(rec), indent=2, sort_keys=True))
        else:
            # the terminal's width, $COLUMNS, else 100 columns (a pipe or a file)
            width = shutil.get_terminal_size((PLAN_COLUMNS, 24)).columns
            print(artifacts.wrap_lines(artifacts.plan_text(rec), max(width, MIN_COLUMNS)))
        return 0
    try:
        written = artifacts.render_replacing(rec, args.out)
    except OSError as error:
        print(f"--out: {show(str(args.out))} cannot be written: {error.strerror or error}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    print(f"wrote {len(written)} files under {escaped(str(args.out), limit=300)}")
    return 0


def run_as_command(argv: list[str] | None = None) -> int:
    """main(), for a shell: output cut short by a pipe's reader (`| head`) ends quietly, no
    traceback (https://docs.python.org/3/library/signal.html#note-on-sigpipe); a third-party
    module that is not installed (one a command imports when it runs) is one line, exit 2."""
    try:
        code = run_guarded(lambda: main(argv), PROJECT)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush fails otherwise
        return 1
    return code


if __name__ == "__main__":
    sys.exit(run_as_command())

"""The `testbed` command (pyproject.toml's [project.scripts]): `python -m cli` from any directory.

It finds the project: $TESTBED_HOME if set, else the current directory or a parent of it, else
the checkout this file lives in (an editable install). A project is a directory whose Pulumi.yaml
names this project. Paths given on the command line stay relative to where it was run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

PROJECT_NAME = "gpu-testbed"  # Pulumi.yaml's `name:`
HOME_VARIABLE = "TESTBED_HOME"
EXIT_BAD_INPUT = 2  # cli.guard.EXIT_BAD_INPUT; restated: the launcher runs before the checkout is on sys.path
INSTALLED_AT = Path(__file__).resolve().parent  # the checkout itself, for an editable install


def is_project(directory: Path) -> bool:
    """Whether `directory` holds this project's Pulumi.yaml (read as text: PyYAML may be missing)."""
    try:
        lines = (directory / "Pulumi.yaml").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return False
    return any(line.split("#")[0].strip() in (f"name: {PROJECT_NAME}", f"name: '{PROJECT_NAME}'") for line in lines)


def find_project(cwd: Path, environ: Mapping[str, str], installed_at: Path = INSTALLED_AT) -> Path | str:
    """The project's directory, or one line saying why there is none and how to point at it."""
    if home := environ.get(HOME_VARIABLE):
        path = Path(home).expanduser()
        if is_project(path):
            return path.resolve()
        shown = ascii(home)[1:-1][:200]
        return f"testbed: ${HOME_VARIABLE} is {shown}, which holds no Pulumi.yaml of {PROJECT_NAME}; point it at the checkout"
    for directory in (cwd, *cwd.parents, installed_at):
        if is_project(directory):
            return directory.resolve()
    return (
        f"testbed: cannot find the {PROJECT_NAME} project (no Pulumi.yaml of it here or in a parent directory); "
        f"run it inside the checkout or set {HOME_VARIABLE}=/path/to/checkout"
    )


def main(argv: list[str] | None = None) -> int:
    found = find_project(Path.cwd(), os.environ, INSTALLED_AT)
    if isinstance(found, str):
        print(found, file=sys.stderr)
        return EXIT_BAD_INPUT
    if str(found) not in sys.path:
        sys.path.insert(0, str(found))
    args = sys.argv[1:] if argv is None else argv

    # The checkout is on sys.path only now: its guard and the CLI come from there, not from a copy.
    from cli.guard import run_guarded

    def command() -> int:
        from cli.__main__ import run_as_command

        return run_as_command(args)

    return run_guarded(command, found)


if __name__ == "__main__":
    sys.exit(main())

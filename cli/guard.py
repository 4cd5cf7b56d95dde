"""The launcher's guard: a third-party module that is not installed is one line and exit 2, not a
traceback. Standard library only: it must import where nothing else is installed."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

EXIT_BAD_INPUT = 2
# The project's own top-level packages: a module missing from one of these is a bug, not a missing install.
PROJECT_PACKAGES = frozenset({"core", "components", "stacks", "twin", "validation", "cli", "testbed_cli"})


def missing_dependency(error: ModuleNotFoundError, root: Path) -> str | None:
    """One line saying what to install, for a third-party module that is not installed; None for
    the project's own modules (a bug there keeps its traceback)."""
    name = (error.name or "").split(".")[0]
    if not name or name in PROJECT_PACKAGES:
        return None
    requirements = root / "requirements.txt"
    return (
        f"testbed: the Python package {name!r} is not installed for {sys.executable}; "
        f"run: {sys.executable} -m pip install -r {requirements}"
    )


def run_guarded(command: Callable[[], int], root: Path) -> int:
    """command(), with a missing third-party module reported in one line, exit 2."""
    try:
        return command()
    except ModuleNotFoundError as error:
        line = missing_dependency(error, root)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return EXIT_BAD_INPUT

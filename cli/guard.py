"""The launcher's guard: a third-party module that is not installed is one line and exit 2, not a
traceback; SIGINT (Ctrl-C) and SIGTERM end every command with one line, after the command's own
clean-up ran (`finally` blocks, context managers: doctor's temporary key directory, validate's
partial results, e2e's destroy). Standard library only: it must import where nothing else is
installed."""

from __future__ import annotations

import signal
import sys
import threading
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


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, as Ctrl-C's KeyboardInterrupt is: the same clean-up runs."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


def interrupted_line(error: KeyboardInterrupt) -> tuple[str, int]:
    """The one line for a command a signal ended, and its exit status (128 + the signal's number)."""
    sig = signal.SIGTERM if isinstance(error, Terminated) else signal.SIGINT
    return f"testbed: stopped by {sig.name}; what the command had begun was cleaned up", 128 + sig.value


def run_guarded(command: Callable[[], int], root: Path) -> int:
    """command(), with a missing third-party module reported in one line, exit 2, and SIGINT or
    SIGTERM in one line, exit 130 or 143."""
    in_main = threading.current_thread() is threading.main_thread()  # signal handlers live only there
    previous = signal.signal(signal.SIGTERM, _terminate) if in_main else None
    try:
        return command()
    except ModuleNotFoundError as error:
        line = missing_dependency(error, root)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as error:
        line, code = interrupted_line(error)
        print(line, file=sys.stderr)
        return code
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)

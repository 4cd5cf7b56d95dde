"""The command-line tools, `python -m cli COMMAND` (or the `testbed` command): plan, render,
preflight, doctor, e2e, validate and simulate. They sit on top of every other layer."""

from __future__ import annotations

import sys
from pathlib import Path

MODULE_COMMAND = "python -m cli"
INSTALLED_COMMAND = "testbed"  # pyproject.toml's [project.scripts]


def typed_command() -> str:
    """What the user typed to run the tools: `testbed` (the installed command) or `python -m cli`."""
    return INSTALLED_COMMAND if Path(sys.argv[0]).name == INSTALLED_COMMAND else MODULE_COMMAND


def as_typed(text: str) -> str:
    """Help text with the tools' name as the user typed it."""
    return text.replace(MODULE_COMMAND, typed_command())

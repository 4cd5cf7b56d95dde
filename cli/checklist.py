"""One line per check and a verdict: the output of preflight and doctor."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import NoReturn

from core.settings import redacted

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
OK, FAIL, UNKNOWN, WARN = "ok", "FAIL", "unknown", "warn"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # OK | FAIL | UNKNOWN | WARN
    detail: str
    remedy: str = ""  # a command to run, e.g. the Service Quotas request to file
    evidence: str = ""  # e.g. a node's bootstrap log tail, printed indented under the line

    def lines(self) -> list[str]:
        out = [f"{self.status:8s}{self.name}: {self.detail}"]
        out += [f"        -> {self.remedy}"] if self.remedy else []
        return out + [f"        | {line}" for line in self.evidence.splitlines()]


def verdict(checks: list[Check], good: str) -> tuple[int, str]:
    failed = [c for c in checks if c.status == FAIL]
    unsure = [c for c in checks if c.status in (UNKNOWN, WARN)]
    if failed:
        names = ", ".join(dict.fromkeys(c.name for c in failed))
        return EXIT_FAILED, f"verdict: {len(failed)} problem(s): {names}"
    if unsure:
        return EXIT_OK, f"verdict: {good}, {len(unsure)} check(s) to confirm by hand"
    return EXIT_OK, f"verdict: {good}"


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments are one line and exit 2, like every other bad input."""

    def error(self, message: str) -> NoReturn:
        # the same line as `python -m cli` itself prints (cli/__main__.py)
        print(f"{self.prog}: {redacted(message)}; see {self.prog} --help", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)

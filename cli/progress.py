"""Progress on a terminal for runs longer than a few seconds: one line on stderr, rewritten in
place, cleared when the run ends. Nothing is written when stderr is not a terminal (a pipe, a
file, CI logs) or when the command prints JSON, so what scripts read never changes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

clock = time.monotonic  # tests put a fake clock here
AFTER_SECONDS = 3.0  # a run shorter than this shows nothing
EVERY_SECONDS = 0.25  # at most four updates a second


class Progress:
    def __init__(self, stream: TextIO, enabled: bool):
        self.stream, self.now = stream, clock
        self.enabled = enabled and stream.isatty()
        self.start = self.now()
        self.shown_at: float | None = None

    def update(self, text: Callable[[], str]) -> None:
        """Show text() if the run has lasted AFTER_SECONDS and the last update is old enough."""
        if not self.enabled:
            return
        t = self.now()
        if t - self.start < AFTER_SECONDS or (self.shown_at is not None and t - self.shown_at < EVERY_SECONDS):
            return
        self.shown_at = t
        self.stream.write(f"\r\x1b[K{text()}, {t - self.start:.0f} s")
        self.stream.flush()

    def ticker(self, label: str) -> Callable[[int, int], None]:
        """A twin run's per-second callback: `label` and the modelled second reached."""
        return lambda tick, total: self.update(lambda: f"simulate: {label}: {tick} of {total} modelled s")

    def close(self) -> None:
        """Clear the line, so what follows on the terminal starts clean."""
        if self.shown_at is not None:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown_at = None

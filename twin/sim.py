"""The hand-off twin: one-second ticks of Slurm, Prometheus, KEDA + HPA, the NodeSet controller and
Kubernetes, driven by the program's own ScaledObject and slurm chart values. A Run is the clock:
each second it advances the world (twin/world.py), counts it (twin/ledger.py) and samples it
(twin/samples.py); its result comes from twin/report.py."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from twin.ledger import Ledger
from twin.report import ok, percentile, result, summary
from twin.samples import SAMPLE_INTERVAL, Sampler
from twin.scenario import Scenario
from twin.world import DEFAULT_PHASE_SET, Phases, Setup, World, gpu_uuid

# The twin's public names, wherever they are defined.
__all__ = [
    "DEFAULT_PHASE_SET",
    "SAMPLE_INTERVAL",
    "Phases",
    "Run",
    "Setup",
    "gpu_uuid",
    "ok",
    "percentile",
    "summary",
    "sweep",
]


@dataclass
class Run(World):
    """A world with its clock, its ledger and its samples."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.ledger = Ledger(self)
        self.sampler = Sampler()
        self.samples = self.sampler.samples

    def run(self, on_tick: Callable[[int, int], None] | None = None) -> dict:
        """The whole scenario, second by second; `on_tick(second, last second)` after each."""
        last = int(self.scenario.duration)
        for tick in range(last + 1):
            self.tick(tick)
            if on_tick is not None:
                on_tick(tick, last)
        return self.result()

    def tick(self, tick: int) -> None:
        """One second: the world, then what it counts and (every SAMPLE_INTERVAL) samples."""
        now = self.advance(tick)
        self.ledger.note_ends(now)
        self.ledger.account(now)
        if tick % int(SAMPLE_INTERVAL) == 0:
            self.sampler.sample(self, now)

    def result(self) -> dict:
        return result(self, self.ledger)


def sweep(
    setup: Setup,
    scenario: Scenario,
    phase_sets: Iterable[int],
    on_tick: Callable[[int], Callable[[int, int], None] | None] = lambda phase_set: None,
) -> dict:
    """The scenario once per phase set, each with its own Phases: the latencies of `Run.result` as
    p50/p95 over the phases, each side's waits for its lent share over every wait of every set,
    and the phase sets under which a job was killed, a GPU double-held, or the run was otherwise
    not ok. `on_tick(phase set)` gives that run's per-second callback, if any."""
    return summary({n: Run(setup, scenario, n).run(on_tick(n)) for n in phase_sets})

"""One cache of twin runs for every test module and every xdist worker of a session. A run is
keyed by its content (the Setup, the Scenario, the phase set and the informer phase), so modules
that run the same pair, however they build it, share one run. A result is pickled to a folder
all workers of the session share (tests/twin/conftest.py sets it), under a lock per key: the
first worker to ask computes it, the others wait and read it. Each call returns its own copy, so
no test sees another's changes. The twin is deterministic for a given key (its only randomness is
random.Random(phase_set)), so a cached result is the one a fresh run would give."""

from __future__ import annotations

import fcntl
import hashlib
import pickle
from collections.abc import Callable
from pathlib import Path

from twin import sim
from twin.nodeset import INFORMER_PHASE
from twin.scenario import Scenario

# Set per session by tests/twin/conftest.py; None: no cache (mutmut's stats pass, which credits a
# function to the test it runs in: a cached run would credit the twin to the first test only).
shared: Path | None = None
_runs: dict[str, sim.Run] = {}  # this worker's finished runs, for tests that read more than the result


def _key(setup: sim.Setup, sc: Scenario, phase_set: int, informer_phase: float) -> str:
    return hashlib.sha256(repr((setup, sc, phase_set, informer_phase)).encode()).hexdigest()


def _fresh(setup: sim.Setup, sc: Scenario, phase_set: int, informer_phase: float) -> sim.Run:
    run = sim.Run(setup, sc, phase_set)
    run.nodeset.informer_phase = informer_phase
    run.run()
    return run


def run(
    setup: sim.Setup, sc: Scenario, phase_set: int = sim.DEFAULT_PHASE_SET, informer_phase: float = INFORMER_PHASE
) -> sim.Run:
    """The finished run itself, shared within this worker: callers only read it."""
    if shared is None:
        return _fresh(setup, sc, phase_set, informer_phase)
    key = _key(setup, sc, phase_set, informer_phase)
    if key not in _runs:
        _runs[key] = _fresh(setup, sc, phase_set, informer_phase)
        _store(key, lambda: _runs[key].result())
    return _runs[key]


def result(
    setup: sim.Setup, sc: Scenario, phase_set: int = sim.DEFAULT_PHASE_SET, informer_phase: float = INFORMER_PHASE
) -> dict:
    """`Run.run()`'s result, computed once per session; a copy of its own for each caller."""
    if shared is None:
        return _fresh(setup, sc, phase_set, informer_phase).result()
    key = _key(setup, sc, phase_set, informer_phase)
    return pickle.loads(_store(key, lambda: _fresh(setup, sc, phase_set, informer_phase).result()))


def sweep(setup: sim.Setup, sc: Scenario, phase_sets: range, informer_phases: tuple[float, ...] = ()) -> dict:
    """`sim.sweep` from cached runs; with `informer_phases`, phase set n also lists the client's
    informers at informer_phases[n % len(informer_phases)]."""
    phases = informer_phases or (INFORMER_PHASE,)
    return sim.summary({n: result(setup, sc, n, phases[n % len(phases)]) for n in phase_sets})


def _store(key: str, compute: Callable[[], dict]) -> bytes:
    assert shared is not None
    path = shared / f"{key}.pickle"
    with open(shared / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not path.exists():
            path.write_bytes(pickle.dumps(compute()))
        return path.read_bytes()

"""Prometheus scraping slurmctld's /metrics/partitions and kube-state-metrics into the twin's TSDB.

Followed: Prometheus 3's scrape loop (prometheus/prometheus scrape/scrape.go; the stack deploys
Prometheus 3 and tests/engines runs Debian's 3.5.3): each target is scraped every interval;
series that a successful scrape no longer exposes, and every series of a failed scrape, get a
staleness marker, so instant queries stop returning them at once (not after the 5 m lookback):
on the real 3.5.3 a slurmd pod gone from kube-state-metrics leaves the triggers' count at the
next scrape (tests/engines/test_handoff_loop.py).
Labels: the target adds `instance` and `job`, so one target scraped twice (a duplicate
ServiceMonitor or scrape config) gives two series per metric that differ only in `instance`.
Scrape intervals: 30 s for both (kube-prometheus-stack 80.9.2 `prometheus.prometheusSpec.scrapeInterval`
default and the slurm chart's ServiceMonitor, SlinkyProject/slurm-operator@v1.0.0:helm/slurm/values.yaml).
Phases: each target is scraped at its own offset within the interval, fixed for the target and
pinned to absolute time: `(hash(target) ^ offsetSeed) % interval`, offsetSeed from the server's
hostname and external labels (scrape/target.go Target.offset, v2.42.0 and 3.x alike). The twin
draws each target's offset from the run's phase set (twin/world.py Phases).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from twin.promql import TSDB

SCRAPE_INTERVAL = 30

Sample = tuple[dict[str, str], float]  # labels (with __name__), value


@dataclass
class Target:
    job: str
    instance: str
    collect: Callable[[float], list[Sample]]
    last: set[frozenset] = field(default_factory=set)
    offset: int = 0  # scraped at the times offset + k * interval


@dataclass
class Prometheus:
    db: TSDB = field(default_factory=TSDB)
    targets: list[Target] = field(default_factory=list)
    interval: int = SCRAPE_INTERVAL
    # Each sample's full labels and series key, by the target and the labels it exposed: a target
    # exposes the same series scrape after scrape, and building them is most of a scrape's work.
    _series_keys: dict[tuple, tuple[dict[str, str], frozenset]] = field(default_factory=dict, repr=False)

    def due(self, tick: int) -> list[Target]:
        return [t for t in self.targets if (tick - t.offset) % self.interval == 0]

    def scrape(self, now: float, targets: list[Target], down: Callable[[Target, float], bool]) -> None:
        """Scrape `targets` at `now`; `down(target, now)` says which fail."""
        keys = self._series_keys
        for target in targets:
            mine = {"job": target.job, "instance": target.instance}
            if down(target, now):  # every series of the target not yet stale is one its last scrape exposed
                self.db.mark_stale(target.last, now)
                target.last = set()
                continue
            seen = set()
            for labels, value in target.collect(now):
                exposed = (target.job, target.instance, *labels.items())
                known = keys.get(exposed)
                if known is None:
                    full = {**labels, **mine}
                    known = keys[exposed] = (full, frozenset(full.items()))
                full, key = known
                seen.add(key)
                self.db.add(full, now, value, key)
            self.db.mark_stale(target.last - seen, now)
            target.last = seen

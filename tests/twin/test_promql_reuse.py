"""The evaluator reuses what it computed before (a query's last result while nothing it reads
changed, a *_over_time window slid by one step): each answer equals what a fresh evaluator, with
nothing to reuse, computes from the same samples at the same time."""

import math
import random

import pytest

from twin.promql import TSDB, Evaluator

QUERIES = [
    "max_over_time(m[60s:20s])",
    "min_over_time(m[60s:20s])",
    "max_over_time(min_over_time(sum(m)[40s:20s])[100s:20s])",
    "(count(m) or vector(0)) + max(n)",
    "max_over_time((max(m) - max(n))[60s:20s])",
    "min_over_time((max(m) / max(m))[60s:20s])",  # NaN (0 / 0) where every m is 0
    "(count(n) > bool 0) or vector(0)",  # lend-and-reclaim's slurm_metrics: n is gone for 6 minutes
    "(max_over_time(max(n)[60s:15s])) or vector(0)",  # a Slurm trigger, 0 once its target is gone
]


def scrapes(seed: int) -> dict[int, list[tuple[dict, float]]]:
    """m{i=a,b,c} every 10 s at offset 7 from a few values (many repeats and ties); c comes and
    goes (staleness markers); n every 15 s at offset 4, gone once for a scrape and once for 6
    minutes (past the 5 m lookback)."""
    rng = random.Random(seed)
    out: dict[int, list[tuple[dict, float]]] = {}
    for t in range(7, 1500, 10):
        for i in ("a", "b", "c"):
            gone = i == "c" and (t // 200) % 2  # the target stopped exposing it: a staleness marker
            value = math.nan if gone else float(rng.choice((0, 1, 1, 2, 3)))
            out.setdefault(t, []).append(({"__name__": "m", "i": i}, value))
    for t in range(4, 1500, 15):
        if not 600 <= t < 960:
            out.setdefault(t, []).append(({"__name__": "n"}, math.nan if t == 304 else float(rng.choice((1, 2)))))
    return out


def same(a, b) -> bool:
    """Equal, NaN counting as equal to NaN."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("seed", range(3))
def test_every_answer_is_what_a_fresh_evaluation_gives(seed):
    db, plan = TSDB(), scrapes(seed)
    reusing = Evaluator(db)
    for t in range(1500):
        for labels, value in plan.get(t, []):
            if math.isnan(value):
                db.mark_stale([frozenset(labels.items())], t)
            else:
                db.add(labels, t, value)
        # Every sample up to t is written, and none before t + 1: results before either are final
        # (the twin's tick claims t + 1, twin/world.py); each is claimed on every other tick.
        reusing.final_before = t + t % 2
        for query in QUERIES:
            got, want = reusing.instant(query, t), Evaluator(db).instant(query, t)
            assert same(got, want), (query, t, got, want)

"""How the offline plan's cost grows with the worker count (a benchmark, not a test).

    venv/bin/python benchmarks/plan_scale.py [--repeat 3]

Times the whole program under the mock engine for 4, 16 and 64 workers and prints the time
per resource; a program that stays linear keeps that figure flat."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.settings import PROJECT
from stacks import offline

WORKER_COUNTS = (4, 16, 64)


def time_plan(workers: int, repeat: int) -> tuple[float, int]:
    config = {f"{PROJECT}:adminCidr": "203.0.113.7/32", f"{PROJECT}:workerCount": str(workers)}
    runs, resources = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        resources = len(offline.run(config).resources)
        runs.append(time.perf_counter() - start)
    return statistics.median(runs), resources


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="runs per size; the median is reported")
    args = parser.parse_args()
    print(f"{'workers':>7}  {'resources':>9}  {'seconds':>8}  {'ms/resource':>11}  {'vs 4 workers':>12}")
    time_plan(WORKER_COUNTS[0], 1)  # warm up imports and caches
    base = None
    for workers in WORKER_COUNTS:
        seconds, resources = time_plan(workers, args.repeat)
        base = base or seconds
        print(
            f"{workers:7d}  {resources:9d}  {seconds:8.2f}  {1000 * seconds / resources:11.1f}  {seconds / base:11.1f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

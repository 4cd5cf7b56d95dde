"""How long the fast suite takes (a benchmark, not a test): exit 1 when it passes over its budget.

    venv/bin/python benchmarks/fast_suite.py [--budget 45] [-- PYTEST ARGS...]

Runs `venv/bin/python -m pytest -m "not engine"` (the set docs/testing.md calls fast: no real
engine, no slow test) as a child and prints its wall-clock and CPU seconds. The budget is
45 s of wall clock on an idle 2-core machine; on a shared one the wall clock grows with the load
while the CPU seconds (user and system, every worker included) stay near what the suite costs,
so both are printed. Exit 0 within the budget, 1 over it or when the suite fails."""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = 45.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="wall-clock seconds allowed (default: 45)")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")
    args = parser.parse_args()
    # outside CI: under CI=true the slow tests run too (tests/conftest.py), which is not this set
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    command = [sys.executable, "-m", "pytest", "-m", "not engine", "-p", "no:cacheprovider", *args.pytest_args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    load = os.getloadavg()[0]
    print(
        f"fast suite: {wall:.1f} s wall, {cpu:.1f} s CPU on {os.cpu_count()} cores (load {load:.1f}); budget {args.budget:g} s"
    )
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        # each worker then compiles (and rewrites the asserts of) every module no earlier run left
        # a .pyc for: about 7 CPU-s more on a fresh clone than on one whose caches are written
        print("PYTHONDONTWRITEBYTECODE is set: modules without a .pyc from an earlier run are compiled every time")
    if done.returncode != 0:
        print(f"fast suite failed (pytest exit {done.returncode})")
        return 1
    if wall > args.budget:
        print(f"over budget by {wall - args.budget:.1f} s")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

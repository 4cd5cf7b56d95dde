"""The session's shared cache of twin runs (tests/twin/runs.py)."""

import os

import pytest

from tests.twin import runs


@pytest.fixture(scope="session", autouse=True)
def _shared_runs(tmp_path_factory: pytest.TempPathFactory) -> None:
    if os.environ.get("MUTANT_UNDER_TEST") == "stats":  # see runs.shared
        return
    base = tmp_path_factory.getbasetemp()
    # An xdist worker's base is <session's base>/gwN: the session's own is shared by every worker.
    runs.shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "twin-runs"
    runs.shared.mkdir(exist_ok=True)

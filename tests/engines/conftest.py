"""Real-engine tests: Slurm 26.05 and Prometheus 3 from a debootstrapped Debian root (tests/engines/
harness.py). Without the root they skip with the command that builds it; under CI=true they fail."""

from __future__ import annotations

import os

import pytest

from core.names import slurm_names
from tests.conftest import by_type
from tests.engines import harness
from tests.tokens import RELEASE


def engine_marks(module: str) -> list[pytest.MarkDecorator]:
    """Every module here starts with `pytestmark = engine_marks(__name__)`: marked, and its tests kept
    on one xdist worker (loadgroup). The modules mostly wait on Slurm's and Prometheus' clocks, so
    they run beside each other and the CPU-bound tests; each worker has its own bridge and subnet."""
    return [pytest.mark.engine, pytest.mark.xdist_group(f"engines-{module.rsplit('.', 1)[-1]}")]


@pytest.fixture(scope="session")
def engine_root():
    try:
        return harness.engine_root()
    except harness.EngineMissing as missing:
        if os.environ.get("CI") == "true":
            pytest.fail(str(missing))
        pytest.skip(str(missing))


def worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker.removeprefix("gw") or 0)


@pytest.fixture(scope="session")
def deployed_slurm_values(default_run):
    """The slurm release's values exactly as the default program registers them."""
    (release,) = [r for r in by_type(default_run, RELEASE) if r.inputs["name"] == "slurm"]
    return release.inputs["values"]


@pytest.fixture
def slurm(engine_root, tmp_path, deployed_slurm_values):
    """The default stack's slurmctld, no slurmd yet (KEDA keeps the NodeSet at 0)."""
    with harness.engines(tmp_path, deployed_slurm_values, slurm_names("slinky"), worker_index()) as e:
        yield e

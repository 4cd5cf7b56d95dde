"""The one way a chart is installed: a pinned `helm.v3.Release` with base values from
`values/<chart>.yaml` deep-merged under the values the program computes."""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from core import trusted_yaml

VALUES_DIR = Path(__file__).resolve().parent.parent / "values"
RELEASE_TIMEOUT_SECONDS = 15 * 60


@dataclass(frozen=True)
class Chart:
    release: str  # pinned: chart templates build object names from it
    namespace: str
    chart: str  # a name in `repo`, or an oci:// reference
    version: str
    repo: str | None = None

    @property
    def values_file(self) -> Path:
        return VALUES_DIR / f"{self.chart.rstrip('/').split('/')[-1]}.yaml"


def deep_merge(base: Any, override: Any) -> Any:
    """Maps merge key by key (override wins); anything else is replaced by the override."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = copy.deepcopy(base)
        for key, value in override.items():
            merged[key] = deep_merge(merged.get(key), value) if key in merged else copy.deepcopy(value)
        return merged
    return copy.deepcopy(override)


def base_values(chart: Chart) -> dict:
    """The chart's values file, a copy of its own for each caller."""
    return copy.deepcopy(_values_file(chart.values_file))


@functools.cache
def _values_file(path: Path) -> dict:
    # parsed once per process: the program, plan and the twin ask for the same few files many times
    return trusted_yaml.load(path.read_text()) or {}


def merged_values(chart: Chart, computed: dict) -> dict:
    return deep_merge(base_values(chart), computed)


def release(
    name: str,
    chart: Chart,
    values: pulumi.Input[dict],
    provider: k8s.Provider,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource] = (),
) -> k8s.helm.v3.Release:
    """Install `chart`; Helm waits for its workloads (and runs its hooks) before dependents start."""
    return k8s.helm.v3.Release(
        name,
        name=chart.release,
        namespace=chart.namespace,
        create_namespace=True,
        chart=chart.chart,
        version=chart.version,
        repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=chart.repo) if chart.repo else None,
        values=values,
        atomic=True,  # a failed install is rolled back, so the next `pulumi up` starts clean
        timeout=RELEASE_TIMEOUT_SECONDS,
        opts=pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=list(depends_on)),
    )


def upgrade_triggers(release: k8s.helm.v3.Release) -> list[pulumi.Output]:
    """What changes when `release` is upgraded: steps that prove it works run again then."""
    return [release.version, release.values]

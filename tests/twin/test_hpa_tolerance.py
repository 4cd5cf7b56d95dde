"""The HPA's 10 % tolerance on KEDA's metrics, as kubernetes/kubernetes@v1.34.0 applies it
(pkg/controller/podautoscaler/replica_calculator.go GetExternalPerPodMetricReplicas,
Tolerances.isWithin): at 10 or more slurmd pods a change of one pod is no change (issue 20)."""

import pytest

from twin.autoscale import Hpa, Keda, Modifiers, Trigger, external_per_pod_replicas
from twin.promql import TSDB, Evaluator


@pytest.mark.parametrize(
    "usage, current, want",
    [
        (11, 10, 10),  # ratio 1.1: within, both ends of the band count
        (9, 10, 10),  # ratio 0.9
        (12, 10, 12),
        (8, 10, 8),
        (21, 20, 20),  # 5 %
        (10, 9, 10),  # below 10 pods one pod is more than 10 %
        (8, 9, 8),
        (1, 1, 1),
        (3, 2, 3),
    ],
)
def test_a_change_within_ten_percent_of_the_current_count_is_no_change(usage, current, want):
    assert external_per_pod_replicas(usage * 1000, 1000, current) == want


def _keda(values: dict[str, float], formula: str | None = None) -> tuple[Keda, Evaluator]:
    """A ScaledObject whose triggers read these values (threshold 1, as the program's)."""
    db = TSDB()
    for name, value in values.items():
        db.add({"__name__": name}, 0.0, value)
    triggers = [Trigger(name, f"max({name})", 1.0, 0.0, ignore_null=False) for name in values]
    advanced = {"scalingModifiers": {"formula": formula, "target": "1"}} if formula else {}
    modifiers = Modifiers.from_advanced(advanced, list(values))
    return Keda(triggers, 1, 64, 0, 300, 30, modifiers=modifiers), Evaluator(db)


def test_ten_slurmd_pods_do_not_become_eleven_through_keda():
    """One trigger, and the program's shape: the scalingModifiers composite metric."""
    for formula in (None, "max(want, 0)"):
        k, ev = _keda({"want": 11.0}, formula)
        assert Hpa(k).sync(ev, 0.0, 10) == 10, formula
        k, ev = _keda({"want": 12.0}, formula)
        assert Hpa(k).sync(ev, 0.0, 10) == 12, formula


def test_each_trigger_is_its_own_metric_and_the_largest_proposal_wins():
    """Without scalingModifiers every trigger is an External metric: 11 keeps 10 pods, 12 asks for 12."""
    k, ev = _keda({"a": 11.0, "b": 12.0})
    assert Hpa(k).sync(ev, 0.0, 10) == 12
    k, ev = _keda({"a": 11.0, "b": 10.0})
    assert Hpa(k).sync(ev, 0.0, 10) == 10

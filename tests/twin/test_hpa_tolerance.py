"""The HPA's 10 % tolerance on KEDA's metrics, as kubernetes/kubernetes@v1.34.0 applies it
(pkg/controller/podautoscaler/replica_calculator.go GetExternalPerPodMetricReplicas,
Tolerances.isWithin): at 10 or more slurmd pods a change of one pod is no change under the
default 0.1, so the program's kubeadm config sets 0 (components/bootstrap.py HPA_TOLERANCE)."""

import dataclasses

import pytest

from components import slurmd_scaling
from stacks import offline
from twin import program, scenario, sim
from twin.autoscale import TOLERANCE, Hpa, Keda, Modifiers, Trigger, external_per_pod_replicas
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


def test_the_twin_uses_the_tolerance_the_rendered_kubeadm_config_sets(default_run):
    """kube-controller-manager's flag as the control node's user-data delivers it, not a constant."""
    from tests.components.test_api_hardening import cluster_configuration, flags

    rendered = flags(cluster_configuration(default_run)["controllerManager"])["horizontal-pod-autoscaler-tolerance"]
    setup = program.setup(offline.stack_settings())
    assert float(rendered) == setup.hpa_tolerance == 0.0


def test_at_twenty_gpus_the_eleventh_slurm_job_gets_its_pod():
    """Ten 1-node jobs at once, an eleventh 10 minutes later, on 20 GPUs nobody else wants: under
    the default tolerance the HPA keeps 10 pods (11 is within 10 % of 10) and the eleventh waits
    for a job to end; with the program's 0 it starts within the hand-off bound."""
    jobs = [{"name": f"s{i:02d}", "kind": "slurm", "submit": 0, "runtime": 3000, "nodes": 1} for i in range(10)]
    jobs.append({"name": "eleventh", "kind": "slurm", "submit": 600, "runtime": 600, "nodes": 1})
    data = {"workers": 20, "duration": 3600, "images": "warm", "jobs": jobs}
    setup = program.setup(offline.stack_settings("dev", ["workerCount=20"]))
    now = sim.Run(setup, scenario.parse(data)).run()
    before = sim.Run(dataclasses.replace(setup, hpa_tolerance=TOLERANCE), scenario.parse(data)).run()
    bound = slurmd_scaling.reclaim_bounds(30, 30, 60, 60).handoff_s

    def wait(r: dict) -> float:
        (j,) = [j for j in r["jobs"] if j["name"] == "eleventh"]
        return j["started"] - j["submitted"]

    assert wait(now) <= bound and sim.ok(now)
    assert wait(before) >= 3000 - 600, "before: it waited for the first ten to end"

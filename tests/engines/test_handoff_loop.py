"""The hand-off loop in real time on real engines: the real slurmctld and slurmd 26.05, Prometheus 3
scraping them, the program's rendered ScaledObject (triggers and formula) evaluated by the twin's
KEDA 2.16.1 and HPA model (twin/autoscale.py) over the real Prometheus, and a small stand-in for the
NodeSet controller that starts and stops dynamic slurmd as slurm-operator v1.0.0 does (drain first,
delete once drained, preStop). kube-state-metrics is a stand-in too: it serves the series the
triggers read (the restapi Deployment available, the NodeSet's pods).

Windows are shortened through the settings users have (kedaCooldownSeconds, kedaPollingSeconds,
slurmMetricsIntervalSeconds), not through code paths only the test uses."""

from __future__ import annotations

import http.server
import threading
import time
from dataclasses import dataclass, field

import yaml

from cli import doctor
from components import keda, slinky, slurmd_scaling
from core.names import Names
from stacks import offline
from tests.engines import harness
from tests.engines.conftest import engine_marks, worker_index
from twin import program
from twin.autoscale import HPA_SYNC, Hpa, Keda
from twin.promql import PromQLError

pytestmark = engine_marks(__name__)

FAST = ["kedaCooldownSeconds=10", "kedaPollingSeconds=5", "slurmMetricsIntervalSeconds=5"]
KSM_PORT = 18080
SCHED_INTERVAL = 60  # Slurm's main scheduler pass (slurm.conf SchedulerParameters sched_interval default)


def _settings(overrides: list[str]):
    return offline.stack_settings("dev", overrides)


class RealPrometheus:
    """The twin's Evaluator interface over the real Prometheus, at its own clock."""

    def __init__(self, engines: harness.Engines):
        self.engines = engines

    def instant(self, query: str, t: float) -> dict:
        try:
            return self.engines.query(query)
        except OSError as error:  # an HTTP 400 is a query KEDA would report as an error
            raise PromQLError(str(error)) from error


class KubeStateMetrics(http.server.ThreadingHTTPServer):
    """The kube-state-metrics series the triggers read, for the pods the stand-in NodeSet has."""

    def __init__(self, address: tuple[str, int], names: Names):
        self.pods: list[str] = []
        target = slurmd_scaling.scaling_target(names)
        self.namespace, self.nodeset, self.restapi = target.namespace, target.nodeset, target.restapi_deployment
        super().__init__(address, harness.MetricsHandler)

    def body(self) -> str:
        lines = [
            f'{slurmd_scaling.RESTAPI_AVAILABLE}{{namespace="{self.namespace}",deployment="{self.restapi}"}} 1',
            *(
                f'{slurmd_scaling.POD_INFO}{{namespace="{self.namespace}",pod="{pod}",'
                f'created_by_kind="NodeSet",created_by_name="{self.nodeset}"}} 1'
                for pod in list(self.pods)
            ),
        ]
        return "\n".join(lines) + "\n"


@dataclass
class NodeSetStandIn:
    """slurm-operator v1.0.0's NodeSet controller as the hand-off needs it (internal/controller/
    nodeset/nodeset_sync.go, utils/sort.go): scale-out un-drains, then starts slurmd at the lowest
    free ordinal; scale-in drains idle pods first (then the highest ordinal) and deletes a pod once
    its node is drained and runs nothing; the pod's preStop sets the node down and deletes it."""

    engines: harness.Engines
    ksm: KubeStateMetrics
    host_prefix: str
    drained_once: list[str] = field(default_factory=list)

    @property
    def pods(self) -> list[str]:
        return list(self.ksm.pods)

    def reconcile(self, replicas: int) -> None:
        states = self.engines.node_states()
        if len(self.pods) < replicas:
            for pod in self.pods:
                if "drain" in states.get(pod, ""):
                    self.engines.client("scontrol", "update", f"nodename={pod}", "state=undrain")
            while len(self.pods) < replicas:
                ordinal = min(set(range(replicas)) - {int(p.rsplit("-", 1)[1]) for p in self.pods})
                name = f"{self.host_prefix}-{ordinal}"
                self.engines.start_node(name)
                self.ksm.pods.append(name)
        elif len(self.pods) > replicas:
            idle_first = sorted(self.pods, key=lambda p: (states.get(p, "") not in ("idle", "drained"), -_ord(p)))
            for pod in idle_first[: len(self.pods) - replicas]:
                if states.get(pod) == "drained":
                    self.ksm.pods.remove(pod)
                    self.engines.stop_node(pod)
                elif "drain" not in states.get(pod, ""):
                    self.engines.client("scontrol", "update", f"nodename={pod}", "state=drain", "reason=scale-in")
                    self.drained_once.append(pod)


def _ord(pod: str) -> int:
    return int(pod.rsplit("-", 1)[1])


@dataclass
class Loop:
    engines: harness.Engines
    keda: Keda
    hpa: Hpa
    nodeset: NodeSetStandIn
    replicas: int = 0
    start: float = field(default_factory=time.monotonic)
    timeline: list[tuple[float, int, int]] = field(default_factory=list)

    def run_until(self, done, seconds: float, what: str, each=None) -> float:
        """Ticks of one second: KEDA every pollingInterval, the HPA every 15 s, the NodeSet every tick."""
        ev = RealPrometheus(self.engines)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            now = time.monotonic() - self.start
            tick = int(now)
            if tick % int(self.keda.polling) == 0:
                self.replicas = self.keda.poll(ev, now, self.replicas)
            if tick % HPA_SYNC == 0:
                self.replicas = self.hpa.sync(ev, now, self.replicas)
            self.nodeset.reconcile(self.replicas)
            self.timeline.append((round(now), self.replicas, len(self.nodeset.pods)))
            if each:
                each()
            if done():
                return now
            time.sleep(max(0.0, 1.0 - (time.monotonic() - self.start - now)))
        raise AssertionError(f"{what}: not within {seconds:g} s; (t, replicas, pods): {self.timeline[-40:]}")

    def jobs(self) -> dict[str, str]:
        out = self.engines.client("squeue", "-h", "-t", "all", "-o", "%j %T").stdout.split("\n")
        return dict(line.split() for line in out if line.strip())


def test_from_zero_and_back_twice_a_two_node_job_and_work_arriving_during_scale_in(engine_root, tmp_path):
    s = _settings(FAST)
    names = Names.from_settings(s)
    setup = program.setup(s)
    values = harness.stack_slurm_values(s, names)
    assert values["controller"]["metrics"]["serviceMonitor"]["interval"] == "5s"
    rules = {
        "slurm-metrics.yaml": yaml.safe_dump(
            {"groups": [slurmd_scaling.metrics_alert_rules(slurmd_scaling.scaling_target(names))]}
        )
    }
    with harness.engines(tmp_path, values, names.slurm, worker_index()) as e:
        ksm = KubeStateMetrics((e.bridge_ip, KSM_PORT), names)
        threading.Thread(target=ksm.serve_forever, daemon=True).start()
        try:
            e.start_prometheus(
                names.metrics_interval_seconds, rules, {"kube-state-metrics": f"{e.bridge_ip}:{KSM_PORT}"}
            )
            k = Keda.from_scaled_object(setup.scaled_object)
            loop = Loop(e, k, Hpa(k), NodeSetStandIn(e, ksm, names.slurm.nodeset))
            _loop(loop, e, s)
        finally:
            ksm.shutdown()
            ksm.server_close()


def _submit(e: harness.Engines, name: str, *args: str, seconds: int) -> None:
    done = e.client("sbatch", f"--job-name={name}", *args, "--wrap", f"sleep {seconds}")
    assert done.returncode == 0, done.stderr


def _loop(loop: Loop, e: harness.Engines, s) -> None:
    # 1. From 0: sbatch is accepted, KEDA wakes the NodeSet, the node registers, the job runs.
    _submit(e, "first", seconds=5)
    loop.run_until(lambda: loop.jobs().get("first") == "RUNNING", 60, "the first job running from 0 pods")
    loop.run_until(lambda: loop.jobs().get("first") == "COMPLETED", 30, "the first job done")
    # 2. Back to 0 once the warmth window (kedaCooldownSeconds) has passed with nothing to do.
    ended = time.monotonic()
    loop.run_until(lambda: not loop.nodeset.pods, s.keda_cooldown_seconds + 60, "back to 0 pods")
    assert time.monotonic() - ended >= s.keda_cooldown_seconds, "kept warm for the cooldown"
    # 3. sbatch works again at 0; a 2-node job submitted while 1 node is busy grows the NodeSet: to
    # busy + largest = 3 once Slurm calls the job runnable, to 2 while it still pends for
    # PartitionNodeLimit (one node registered) - which of the two depends on scrape timing.
    _submit(e, "one", seconds=10)
    loop.run_until(lambda: loop.jobs().get("one") == "RUNNING", 60, "a job from 0 again")
    _submit(e, "two-nodes", "-N", "2", seconds=5)
    loop.run_until(lambda: len(loop.nodeset.pods) >= 2, 40, "more pods for the 2-node job")
    # A job that pended for PartitionNodeLimit (one node registered) may wait for the main scheduler's
    # next pass, every sched_interval (60 s; SchedMD/slurm slurm.conf.5), after "one" ends.
    # With 3 pods it runs beside "one" and may end first.
    loop.run_until(
        lambda: loop.jobs().get("two-nodes") == loop.jobs().get("one") == "COMPLETED",
        SCHED_INTERVAL + 60,
        "the 2-node job and the one before it done",
    )
    assert max(replicas for _, replicas, _ in loop.timeline) <= 3, "never more than busy + largest"

    # 4. Work that arrives while scale-in drains a node runs, and nothing is killed.
    def late_work() -> None:
        if loop.nodeset.drained_once and "late" not in loop.jobs():
            _submit(e, "late", seconds=5)

    loop.run_until(lambda: loop.jobs().get("late") == "COMPLETED", s.keda_cooldown_seconds + 90, "late work", late_work)
    assert set(loop.jobs().values()) == {"COMPLETED"}, loop.jobs()  # nothing requeued, failed or cancelled
    # The metrics were there all along: the alert never went pending, the doctor says OK.
    assert not e.query('ALERTS{alertname="SlurmMetricsMissing"}')
    check = _doctor_prometheus(e, s)
    assert check.status == doctor.OK, check.detail


def _doctor_prometheus(e: harness.Engines, s) -> doctor.Check:
    """`doctor`'s Prometheus check, asking the real Prometheus the deployed queries."""

    class Kube:
        def prometheus(self, query: str) -> list[dict]:
            return [{"value": [0, str(v)]} for v in e.query(query).values()]

    d = doctor.Doctor(s, Kube(), None)  # type: ignore[arg-type]
    d.prometheus()
    (check,) = d.checks
    return check


def test_a_slurmctld_without_metrics_fires_the_alert_and_fails_the_doctor(engine_root, tmp_path):
    """Without MetricsType slurmctld answers /metrics/partitions with an empty body: Prometheus calls
    the target up, every Slurm trigger is empty. The shipped rule goes pending, the doctor fails."""
    s = _settings(FAST)
    names = Names.from_settings(s)
    values = slinky.slurm_values(
        s.slinky_version,
        s.slurm_image_tag,
        names.slurm,
        max_nodes=names.slurmd_max_replicas,
        metrics_interval_seconds=5,
    )
    values["controller"]["metrics"]["enabled"] = False
    rules = {
        "slurm-metrics.yaml": yaml.safe_dump(
            {"groups": [slurmd_scaling.metrics_alert_rules(slurmd_scaling.scaling_target(names))]}
        )
    }
    with harness.engines(tmp_path, values, names.slurm, worker_index()) as e:
        assert "MetricsType" not in e.files["slurm.conf"]
        e.start_prometheus(5, rules)
        e.wait_scrapes(2, 5)
        assert list(e.query('up{job="slurm"}').values()) == [1.0], "the target answers"
        assert not e.query('{__name__=~"slurm_partition_.*"}'), "with no series"
        e.wait_for(lambda: bool(e.query('ALERTS{alertname="SlurmMetricsMissing"}')), 30, "the alert to go pending")
        # lend-and-reclaim reads the loss (docs/handoff.md "One input lost"): slurm_metrics is 0 and
        # every Slurm trigger 0, not empty (an error), so the formula takes its outage branch
        triggers = {t["name"]: t["metadata"]["query"] for t in keda.triggers(names, slurmd_scaling.LEND_RECLAIM)}
        assert e.query(triggers[slurmd_scaling.SLURM_METRICS]) == {frozenset(): 0.0}
        slurm = [q for q in triggers.values() if "slurm_partition_" in q]
        assert slurm and all(e.query(q) == {frozenset(): 0.0} for q in slurm), [e.query(q) for q in slurm]
        check = _doctor_prometheus(e, s)
        assert check.status == doctor.FAIL and "MetricsType" in check.detail

"""The fair-share controller's loop (components/fair_share_loop.py) on real engines: the real
slurmctld 26.05 with a 3-node job pending and no node yet, Prometheus 3.5.3 scraping it and a
stand-in for Kueue's metrics (AI holding every GPU), the loop's own HTTP client asking the real
Prometheus API, and the in-process Kubernetes API of tests/components/test_fair_share_controller.py
taking its patches. HPC waits with none of the contended time: the loop gives it the quota for
its job. The periods' times are given, not waited for: only the scrapes are real time."""

from __future__ import annotations

import dataclasses
import http.server
import threading

from components import fair_share, fair_share_controller, fair_share_loop, kueue, slurmd_scaling
from core.names import AI_CLUSTER_QUEUE, HPC_CLUSTER_QUEUE, Names
from stacks import offline
from tests.components.test_fair_share_controller import TOKEN, FakeKubernetes
from tests.engines import harness
from tests.engines.conftest import engine_marks, worker_index

pytestmark = engine_marks(__name__)

FAST = ["slurmMetricsIntervalSeconds=5"]
KUEUE_PORT = 18443
AI_HOLDS = 4


class KueueMetrics(http.server.ThreadingHTTPServer):
    """Kueue 0.19.2's ClusterQueue series (pkg/metrics/metrics.go) for the AI queue: it holds every GPU."""

    def __init__(self, address: tuple[str, int], names: Names):
        target = slurmd_scaling.scaling_target(names)
        labels = f'cluster_queue="{target.ai_cluster_queue}",resource="{target.gpu_resource}",replica_role="leader"'
        self.text = (
            f"{slurmd_scaling.KUEUE_USAGE}{{{labels}}} {AI_HOLDS}\n"
            f"{slurmd_scaling.KUEUE_PENDING}{{{labels}}} 0\n"
            f"{slurmd_scaling.KUEUE_NOMINAL}{{{labels}}} {target.ai_share}\n"
        )
        super().__init__(address, harness.MetricsHandler)

    def body(self) -> str:
        return self.text


def test_the_loop_reads_the_real_slurmctld_through_prometheus_and_gives_hpc_its_turn(engine_root, tmp_path):
    s = offline.stack_settings("dev", FAST)
    names = Names.from_settings(s)
    values = harness.stack_slurm_values(s, names)
    data = fair_share_controller.config_map_data(names)
    config = fair_share_loop.Config.from_json(data[fair_share_controller.CONFIG_KEY])
    with harness.engines(tmp_path, values, names.slurm, worker_index()) as e:
        metrics = KueueMetrics((e.bridge_ip, KUEUE_PORT), names)
        threading.Thread(target=metrics.serve_forever, daemon=True).start()
        kube = FakeKubernetes(kueue.cluster_queues(names.shares), fair_share_controller.quota_policy(names))
        try:
            e.start_prometheus(names.metrics_interval_seconds, None, {"kueue": f"{e.bridge_ip}:{KUEUE_PORT}"})
            done = e.client("sbatch", "--job-name=wide", "-N", "3", "--wrap", "sleep 600")
            assert done.returncode == 0, done.stderr
            url = f"http://{e.hosts['slurmctld'].ip}:9090"
            config = dataclasses.replace(config, prometheus_url=url)
            lines: list[str] = []
            prometheus = fair_share_loop.Prometheus(url, lines.append)

            def read() -> fair_share.Reading:
                return fair_share.reading(prometheus.read(config.queries))

            def seen() -> bool:  # both targets scraped (each on its own phase) and the job pending
                r = read()
                return r.waiting[fair_share.HPC] == 3 and r.used[fair_share.AI] is not None

            e.wait_for(seen, 120, "Prometheus to see the pending 3-node job and Kueue's series")
            reading = read()
            assert reading.used == {fair_share.HPC: 0, fair_share.AI: AI_HOLDS}
            assert reading.waiting == {fair_share.HPC: 3, fair_share.AI: 0}, "the widest pending job's nodes"
            token = tmp_path / "token"
            token.write_text(TOKEN)
            controller = fair_share_loop.Controller(
                config, prometheus, fair_share_loop.Kubernetes(kube.server.url, str(token), None), lines.append
            )
            controller.period(0.0)  # no history yet: the split, which the queues hold
            assert kube.patches == []
            controller.period(float(config.period_s))
            # HPC's turn: its queue lends nothing meanwhile (fair_share.lending_limit)
            assert kube.nominal(HPC_CLUSTER_QUEUE) == (3, 0) and kube.nominal(AI_CLUSTER_QUEUE) == (1, 1), lines
            assert lines[-1].startswith("nominalQuota hpc 2 -> 3 (lends 0), ai 2 -> 1 (lends 1): hpc behind")
        finally:
            kube.server.close()
            metrics.shutdown()
            metrics.server_close()

import json

import pytest

from components import cert_manager, dashboard, device_plugin, helm, keda, monitoring
from core import names
from stacks.offline import is_secret, reveal
from tests import tokens
from tests.conftest import by_type, run_program


def test_dashboards_become_configmaps_the_grafana_sidecar_loads(default_run):
    stack_values = reveal(
        next(r for r in by_type(default_run, tokens.RELEASE) if r.inputs["name"] == "monitoring").inputs
    )
    sidecar = stack_values["values"]["grafana"]["sidecar"]["dashboards"]
    assert sidecar["enabled"] is True
    monitoring = default_run.named("testbed-monitoring")
    maps = [m for m in by_type(default_run, tokens.CONFIG_MAP) if m.parent == monitoring.urn]
    assert [m.inputs["metadata"]["name"] for m in maps] == [f"dashboard-{dashboard.UID}"]
    labelled = [
        m
        for m in by_type(default_run, tokens.CONFIG_MAP)
        if "grafana_dashboard" in m.inputs["metadata"].get("labels", {})
    ]
    assert labelled == maps, "no other ConfigMap is a dashboard"
    for m in maps:
        # the sidecar's default label, in Grafana's own namespace (its default search scope)
        assert m.inputs["metadata"]["labels"] == {"grafana_dashboard": "1"}
        assert m.inputs["metadata"]["namespace"] == stack_values["namespace"]
        (text,) = m.inputs["data"].values()
        assert json.loads(text)["panels"]


def test_grafana_password_is_generated_and_secret(default_run):
    (password,) = [r for r in by_type(default_run, tokens.RANDOM_PASSWORD) if "grafana" in r.name]
    stack = next(r for r in by_type(default_run, tokens.RELEASE) if r.inputs["name"] == "monitoring")
    assert is_secret(stack.inputs["values"])
    assert reveal(stack.inputs["values"])["grafana"]["adminPassword"] == password.outputs["result"]
    assert default_run.outputs["grafanaAdminPassword"] == password.outputs["result"]
    assert "grafanaAdminPassword" in default_run.secret_outputs


def test_dcgm_exporter_runs_on_gpu_workers_and_keeps_the_holder_labels():
    values = monitoring.dcgm_values("4.7.1")
    assert values["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert values["serviceMonitor"]["honorLabels"] is True
    assert values["kubernetes"]["enablePodLabels"] is True
    assert values["serviceMonitor"]["additionalLabels"] == monitoring.service_monitor_labels()


def _names(**settings_) -> names.Names:
    from core import settings
    from tests.conftest import config

    return names.Names.from_settings(settings.load(config(**settings_), offline=True))


def test_prometheus_stack_is_light_and_selects_by_release_label():
    values = monitoring.stack_values("80.9.2", _names())
    assert values["alertmanager"]["enabled"] is False and values["grafana"]["enabled"] is True
    assert values["fullnameOverride"] == names.MONITORING_RELEASE
    assert monitoring.service_monitor_labels() == {"release": names.MONITORING_RELEASE}


def test_device_plugin_never_sets_fail_on_init_error_and_toggles_feature_discovery():
    assert "failOnInitError" not in device_plugin.device_plugin_values("0.17.0", False)
    assert device_plugin.device_plugin_values("0.17.0", False)["gfd"]["enabled"] is False
    assert device_plugin.device_plugin_values("0.17.0", True)["gfd"]["enabled"] is True
    rec = run_program(gpuFeatureDiscovery=True)
    plugin = next(r for r in by_type(rec, tokens.RELEASE) if r.inputs["name"] == "nvidia-device-plugin")
    assert plugin.inputs["values"]["gfd"]["enabled"] is True
    assert plugin.inputs["namespace"] != "default"  # the chart refuses it


def test_cert_manager_installs_its_crds():
    values = helm.base_values(cert_manager.chart("v1.19.2"))
    assert values["crds"]["enabled"] is True and "installCRDs" not in values


def test_an_alert_fires_while_slurmctlds_metrics_are_missing():
    """The rule reads the partition KEDA's triggers read; the real Prometheus runs it against a
    slurmctld without MetricsType in tests/engines/test_handoff_loop.py."""
    n = _names(nodesetName="gpu")
    (group,) = monitoring.stack_values("80.9.2", n)["additionalPrometheusRulesMap"]["testbed-slurm-metrics"]["groups"]
    (rule,) = group["rules"]
    assert rule["alert"] == "SlurmMetricsMissing" and rule["for"] == "2m"
    assert rule["expr"] == 'absent(slurm_partition_jobs_pending{partition="all"})'
    triggers = [t["metadata"]["query"] for t in keda.triggers(n)]
    assert sum('slurm_partition_jobs_pending{partition="all"}' in q for q in triggers) >= 1


def _input_alerts(n: names.Names) -> dict[str, dict]:
    values = monitoring.stack_values("80.9.2", n)["additionalPrometheusRulesMap"]
    (group,) = values["testbed-handoff-inputs"]["groups"]
    return {rule["alert"]: rule for rule in group["rules"]}


def test_each_lost_input_has_an_alert_on_the_series_the_triggers_read():
    """Kueue's metrics, kube-state-metrics and slurmrestd: each alert selects a series some trigger
    of the default policy reads, so the alert is about what the scaler lost."""
    n = _names(nodesetName="gpu")
    alerts = _input_alerts(n)
    assert set(alerts) == {"KueueMetricsMissing", "KubeStateMetricsMissing", "SlurmrestdDown"}
    triggers = " ".join(t["metadata"]["query"] for t in keda.triggers(n))
    for rule in alerts.values():
        selector = rule["expr"].split("(", 1)[1].split(")", 1)[0]
        assert selector in triggers, (rule["alert"], selector)
        assert rule["for"] == "2m" and rule["labels"] == {"severity": "critical"}


def test_each_alert_names_its_outage_and_what_the_scaler_then_does():
    """The descriptions say what lend-and-reclaim does while the input is lost (docs/handoff.md "One
    input lost"): keeps the pods it has, AI at its guaranteed share, a freeze, every pod kept."""
    n = _names()
    (slurm,) = monitoring.stack_values("80.9.2", n)["additionalPrometheusRulesMap"]["testbed-slurm-metrics"]["groups"]
    said = {rule["alert"]: rule["annotations"]["description"] for rule in slurm["rules"]}
    said |= {name: rule["annotations"]["description"] for name, rule in _input_alerts(n).items()}
    assert "keeps the slurmd pods that exist, capped at what AI claims" in said["SlurmMetricsMissing"]
    assert "capped at HPC's share" in said["KueueMetricsMissing"] and "stay drained" in said["KueueMetricsMissing"]
    assert "nothing is scaled in or out" in said["KubeStateMetricsMissing"]
    assert "asks for every slurmd pod that exists" in said["SlurmrestdDown"]
    assert all("'One input lost'" in text for text in said.values())


@pytest.mark.engine
def test_promtool_fires_each_input_alert_after_two_minutes_of_its_outage(tmp_path):
    import subprocess

    from core import trusted_yaml
    from tests.engines import harness

    n = _names()
    alerts = _input_alerts(n)
    group = monitoring.stack_values("80.9.2", n)["additionalPrometheusRulesMap"]["testbed-handoff-inputs"]["groups"]
    (tmp_path / "rules.yaml").write_text(trusted_yaml.dump({"groups": group}))
    usage = alerts["KueueMetricsMissing"]["expr"].removeprefix("absent(").removesuffix(")")
    restapi = alerts["KubeStateMetricsMissing"]["expr"].removeprefix("absent(").removesuffix(")")
    # 6 samples 30 s apart (0 to 2.5 min), then none: the Kueue and kube-state-metrics series are
    # gone once the 5 min lookback has passed their last sample (7.5 min), so absent() holds from
    # then and the alert fires 2 min later; slurmrestd reads 0 from the start.
    series = [{"series": usage, "values": "1x5"}, {"series": restapi, "values": "0x5"}]

    def firing(name: str) -> list[dict]:
        """absent() carries its selector's equality matchers as labels; the others, none."""
        rule = alerts[name]
        matchers = rule["expr"].split("{", 1)[1].split("}", 1)[0] if rule["expr"].startswith("absent") else ""
        labels = dict(pair.strip().replace('"', "").split("=") for pair in matchers.split(",") if pair)
        return [{"exp_labels": {"severity": "critical", **labels}, "exp_annotations": rule["annotations"]}]

    tests = [
        {
            "interval": "30s",
            "input_series": series,
            "alert_rule_test": [
                {"eval_time": "2m", "alertname": "KueueMetricsMissing", "exp_alerts": []},
                {"eval_time": "2m", "alertname": "SlurmrestdDown", "exp_alerts": firing("SlurmrestdDown")},
                {"eval_time": "9m", "alertname": "KueueMetricsMissing", "exp_alerts": []},
                {"eval_time": "10m", "alertname": "KueueMetricsMissing", "exp_alerts": firing("KueueMetricsMissing")},
                {
                    "eval_time": "10m",
                    "alertname": "KubeStateMetricsMissing",
                    "exp_alerts": firing("KubeStateMetricsMissing"),
                },
            ],
        }
    ]
    test_file = tmp_path / "test.yaml"
    test_file.write_text(
        trusted_yaml.dump({"rule_files": ["rules.yaml"], "evaluation_interval": "30s", "tests": tests})
    )
    done = subprocess.run([harness.promtool(), "test", "rules", str(test_file)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]

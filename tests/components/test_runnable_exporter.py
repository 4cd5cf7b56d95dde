"""The runnable-jobs exporter's manifests agree with what they point at: the Token's Secret is the
one the pod mounts, the JWT key is the chart's, the partitions are the scaler's, the Service and the
ServiceMonitor select the pod and are selected by the stack's Prometheus, and the pod runs the
module as the twin runs it, restricted."""

from __future__ import annotations

import hashlib

import pytest

from components import monitoring, runnable_exporter, runnable_jobs, slurmd_scaling
from core.names import CODE_HASH_ANNOTATION, Names
from stacks import offline


@pytest.fixture(scope="module")
def rendered():
    names = Names.from_settings(offline.stack_settings("dev", []))
    objects = runnable_exporter.manifests(names, "python:3.12-slim", monitoring.service_monitor_labels())
    return names, {o["kind"]: o for o in objects}


def test_the_pod_mounts_the_secret_the_token_writes(rendered):
    _, objects = rendered
    token = objects["Token"]
    # token_keys.go SecretKey: `<name>-jwt-<username>`, key SLURM_JWT
    secret = f"{token['metadata']['name']}-jwt-{token['spec']['username']}"
    volumes = {v["name"]: v for v in objects["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    assert volumes["jwt"]["secret"]["secretName"] == secret
    assert volumes["jwt"]["secret"]["items"] == [{"key": "SLURM_JWT", "path": "SLURM_JWT"}]
    env = {e["name"]: e["value"] for e in objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[runnable_jobs.ENV_TOKEN_FILE] == f"{runnable_exporter.JWT_DIR}/SLURM_JWT"
    assert token["spec"]["username"] not in ("root", "slurm") and token["spec"]["lifetime"] == "15m"


def test_the_token_is_signed_with_the_chart_s_jwt_key_in_its_namespace(rendered):
    names, objects = rendered
    assert objects["Token"]["spec"]["jwtHs256KeyRef"] == {"name": "slurm-auth-jwths256", "key": "jwt_hs256.key"}
    assert {o["metadata"]["namespace"] for o in objects.values()} == {names.slurm.namespace}


def test_the_exporter_reports_the_partitions_the_scaler_reads(rendered):
    names, objects = rendered
    env = {e["name"]: e["value"] for e in objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    exporter, port = runnable_jobs.exporter_from_env(env)
    assert exporter.partitions == slurmd_scaling.scaling_target(names).partitions
    assert env[runnable_jobs.ENV_URL] == f"http://{names.slurm.restapi_service}.{names.slurm.namespace}:6820"
    assert port == objects["Service"]["spec"]["ports"][0]["port"]


def test_prometheus_scrapes_it(rendered):
    names, objects = rendered
    pod_labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert objects["Service"]["spec"]["selector"].items() <= pod_labels.items()
    monitor = objects["ServiceMonitor"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= objects["Service"]["metadata"]["labels"].items()
    assert monitoring.service_monitor_labels().items() <= monitor["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == objects["Service"]["spec"]["ports"][0]["name"]
    assert monitor["spec"]["endpoints"][0]["interval"] == f"{names.metrics_interval_seconds}s"


def test_the_pod_runs_the_module_the_twin_runs_restricted(rendered):
    _, objects = rendered
    spec = objects["Deployment"]["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert objects["ConfigMap"]["data"]["runnable_jobs.py"] == runnable_exporter.CODE.read_text()
    assert container["command"] == ["python", "-m", "components.runnable_jobs"]
    # a changed module rolls the pod: the template carries its hash
    annotations = objects["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations[CODE_HASH_ANNOTATION] == hashlib.sha256(runnable_exporter.CODE.read_bytes()).hexdigest()
    assert {m["mountPath"] for m in container["volumeMounts"]} == {
        f"{runnable_exporter.APP_DIR}/components",
        runnable_exporter.JWT_DIR,
    }
    assert spec["automountServiceAccountToken"] is False and spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


@pytest.mark.engine
def test_the_missing_alert_fires_when_the_series_go_and_not_before(tmp_path, rendered):
    """promtool 3.5.3 on the rule: the exporter's series present, then stale (a failed scrape)."""
    from core import trusted_yaml
    from tests.engines import harness

    names, _ = rendered
    group = runnable_exporter.alert_rules(names)
    (tmp_path / "rules.yaml").write_text(trusted_yaml.dump({"groups": [group]}))
    series = f'{runnable_jobs.RUNNABLE_JOBS}{{partition="all"}}'
    test = {
        "interval": "30s",
        "input_series": [{"series": series, "values": "1x10 stale"}],
        "alert_rule_test": [
            {"eval_time": "4m", "alertname": runnable_exporter.MISSING_ALERT, "exp_alerts": []},
            {
                "eval_time": "9m",
                "alertname": runnable_exporter.MISSING_ALERT,
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": "warning", "partition": "all"},  # absent() keeps the matcher
                        "exp_annotations": group["rules"][0]["annotations"],
                    }
                ],
            },
        ],
    }
    test_file = tmp_path / "test.yaml"
    test_file.write_text(
        trusted_yaml.dump({"rule_files": ["rules.yaml"], "evaluation_interval": "30s", "tests": [test]})
    )
    import subprocess

    done = subprocess.run([harness.promtool(), "test", "rules", str(test_file)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_the_native_objects_pass_kubernetes_strict_schemas_and_the_pod_meets_restricted(rendered):
    """The slurm namespace enforces no Pod Security level (slurmd runs there); the pod meets
    `restricted` all the same (kubernetes/pod-security-admission@v0.34.0 policy/check_*.go)."""
    import kubernetes_validate

    _, objects = rendered
    for kind in ("ConfigMap", "Deployment", "Service"):
        kubernetes_validate.validate(objects[kind], "1.34", strict=True)
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["securityContext"]["runAsUser"] != 0 and pod["securityContext"]["runAsNonRoot"]
    assert {k for v in pod["volumes"] for k in v} <= {"name", "configMap", "secret"}, "restricted's volume types"
    assert "hostNetwork" not in pod and "hostPID" not in pod and "ports" not in pod
    assert all("hostPort" not in p for p in container["ports"])

"""`python -m cli doctor` against a fake Kubernetes API and a stub `ssh` (and `pulumi`) on PATH."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError

from cli import doctor
from cli.checklist import FAIL, OK
from components import (
    ai_run_limit,
    fair_share_controller,
    fair_share_loop,
    keda,
    kueue,
    readiness_gate,
    slinky,
    slurm_config,
)
from components import slurmd_scaling as scaling
from core import host_layout, names
from core.settings import load
from stacks import offline
from tests.conftest import config
from tests.validation.test_exec_stream import NON_ZERO, SUCCESS, FakeExecServer, status

PUBLIC_IP = "198.51.100.10"
TOKEN = "abcdef.0123456789abcdef"
LOG = (
    "[testbed] kubeadm join\n"
    f"kubeadm join 10.0.0.10:6443 --token {TOKEN} --discovery-token-ca-cert-hash sha256:00\n"
    "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n"
    "FAILED step: gpu driver\n"
)


def settings(**values):
    return load(config(**values), offline=True)


class FakeKube:
    """A healthy testbed for `s`, which a test then breaks."""

    def __init__(self, s):
        self.n = names.Names.from_settings(s)
        ips = [s.control_private_ip, *s.worker_private_ips]
        self.node_list = [
            {
                "metadata": {"name": f"ip-{ip.replace('.', '-')}"},
                "status": {
                    "addresses": [{"type": "InternalIP", "address": ip}],
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "allocatable": {} if ip == s.control_private_ip else {"nvidia.com/gpu": "1"},
                },
            }
            for ip in ips
        ]
        self.pod_lists = {
            ns: [{"metadata": {"name": f"{ns}-0"}, "status": {"phase": "Running", "conditions": [_ready()]}}]
            for ns in doctor.PLATFORM_NAMESPACES
        }
        self.pod_lists[names.KEDA_NAMESPACE] = [
            _pod(f"{app}-5d8f-x", {"app": app}) for app in (names.KEDA_OPERATOR_APP, names.KEDA_METRICS_SERVER_APP)
        ]
        self.pod_lists[names.KUEUE_NAMESPACE] = [_pod(f"{names.kueue_controller_manager()}-7c9b-q", {})]
        self.refuse: set[str] = set()
        self.sinfo = (0, "".join(f"{p} up 4 idle\n" for p in self.n.slurm.partitions))
        # `scontrol show config` of a slurmctld booted from the program's slurm.conf (its last value)
        rendered = slurm_config.slurm_conf(
            slinky.slurm_values(s.slinky_version, s.slurm_image_tag, self.n.slurm), self.n.slurm
        )
        auth = slurm_config.global_setting(rendered, "AuthAltParameters", "(null)")
        self.config = (0, f"AuthAltTypes            = auth/jwt\nAuthAltParameters       = {auth}\nAuthInfo = (null)\n")
        # what components/keda.py deploys for this stack, as KEDA reports it when Slurm is idle
        self.queries = {t["name"]: t["metadata"]["query"] for t in keda.triggers(self.n)}
        self.scaled = {
            "spec": {"advanced": {"scalingModifiers": keda.scaling_modifiers(self.n)}},
            "status": {
                "conditions": [_ready(), {"type": "Active", "status": "False", "reason": "ScalerNotActive"}],
                "health": {
                    f"s{i}-prometheus": {"numberOfFailures": 0, "status": "Happy"} for i in range(len(self.queries))
                },
            },
        }
        composite = {"metric": {"name": names.KEDA_COMPOSITE_METRIC}}
        self.hpa_object = {
            "spec": {"metrics": [{"type": "External", "external": composite | {"target": {"averageValue": "1"}}}]},
            "status": {
                "currentMetrics": [{"type": "External", "external": composite | {"current": {"averageValue": "0"}}}],
                "desiredReplicas": 0,
                "conditions": [{"type": "ScalingActive", "status": "False", "reason": "ScalingDisabled"}],
            },
        }
        self.series = {name: [{"value": [0, "0"]}] for name in self.queries}
        if scaling.SLURM_METRICS in self.series:  # slurmctld's metrics are there
            self.series[scaling.SLURM_METRICS] = [{"value": [0, "1"]}]
        # Kueue's objects and the run-limit policies as the program creates them, as the API server
        # returns them: quantities as strings, conditions in status
        self.objects = {("scaledobjects", self.n.slurm.namespace, self.n.scaled_object): self.scaled}
        self.cluster_objects = {}
        for obj in kueue.objects(self.n.shares):
            live = json.loads(json.dumps(obj))
            for group in live.get("spec", {}).get("resourceGroups", []):
                for flavor in group["flavors"]:
                    for r in flavor["resources"]:
                        r.update({k: str(v) for k, v in r.items() if k != "name"})
            live["status"] = {"conditions": [{"type": "Active", "status": "True", "reason": "Ready"}]}
            plural = obj["kind"].lower() + "s"
            if obj["kind"] == "LocalQueue":
                self.objects[plural, obj["metadata"]["namespace"], obj["metadata"]["name"]] = live
            else:
                self.cluster_objects[plural, obj["metadata"]["name"]] = live
        plurals = {"ValidatingAdmissionPolicy": "validatingadmissionpolicies"}
        quota_only = (fair_share_controller.quota_policy(self.n), fair_share_controller.quota_policy_binding())
        for obj in [*ai_run_limit.stack_objects(self.n), *quota_only]:
            plural = plurals.get(obj["kind"], "validatingadmissionpolicybindings")
            self.cluster_objects[plural, obj["metadata"]["name"]] = json.loads(json.dumps(obj))
        self.calls: list[tuple] = []
        # how the API server answers the controller's dry-run patches: its quota policy enforced
        # (only GPU quota values may change), absent (anything goes), or with a rule that errors
        # at run time (failurePolicy Fail: every patch refused)
        self.quota_policy = "enforced"

    def dry_run_patch_as(self, user, path, operations, field_manager):
        self.calls.append(("dry_run_patch_as", user, path, operations, field_manager))
        policy = fair_share_controller.QUOTA_POLICY
        denied = f"ValidatingAdmissionPolicy '{policy}' with binding '{policy}' denied request: "
        quota_only = all(
            o["op"] == "test" or o["path"].endswith(("/nominalQuota", "/lendingLimit")) for o in operations
        )
        if self.quota_policy == "forbidden":  # RBAC, or the admin may not impersonate
            error = ApiException(status=403, reason="Forbidden")
            error.body = json.dumps({"message": f'clusterqueues "hpc" is forbidden: User "{user}" cannot patch'})
            raise error
        if self.quota_policy == "missing, the schema refusing" and not quota_only:
            error = ApiException(status=422, reason="Unprocessable Entity")
            error.body = json.dumps({"message": 'ClusterQueue "hpc" is invalid: spec.stopPolicy: Unsupported value'})
            raise error
        if self.quota_policy == "erroring":
            message = denied + "expression 'request.operation' resulted in error:\n no such key: x"
        elif self.quota_policy == "enforced" and not quota_only:
            message = denied + "the fair-share controller may change only the nominalQuota ..."
        else:
            return
        body = json.dumps({"kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422, "message": message})
        error = ApiException(status=422, reason="Unprocessable Entity")
        error.body = body
        raise error

    def nodes(self):
        return self.node_list

    def pods(self, namespace):
        return self.pod_lists.get(namespace, [])

    def dry_run(self, obj):
        self.calls.append(("dry_run", obj["kind"]))
        if obj["kind"] in self.refuse:
            raise ApiException(status=500, reason="Internal error occurred: failed calling webhook")

    def exec(self, namespace, pod, container, command):
        self.calls.append(("exec", namespace, pod, container, command[0]))
        return {"sinfo": self.sinfo, "scontrol": self.config}[command[0]]

    def get(self, group, version, namespace, plural, name):
        self.calls.append(("get", group, namespace, plural, name))
        return _found(self.objects.get((plural, namespace, name)))

    def get_cluster(self, group, version, plural, name):
        self.calls.append(("get_cluster", group, plural, name))
        return _found(self.cluster_objects.get((plural, name)))

    def hpa(self, namespace, name):
        self.calls.append(("hpa", namespace, name))
        return _found(self.hpa_object)

    def prometheus(self, query):
        (name,) = [n for n, q in self.queries.items() if q == query]  # only the ScaledObject's queries
        return self.series[name]


def _ready():
    return {"type": "Ready", "status": "True"}


def _pod(name, labels):
    return {"metadata": {"name": name, "labels": labels}, "status": {"phase": "Running", "conditions": [_ready()]}}


def _found(obj):
    if obj is None:
        raise ApiException(status=404, reason="Not Found")
    return obj


def by(checks, name):
    return [c for c in checks if c.name == name]


@pytest.fixture
def stub_ssh(tmp_path, monkeypatch):
    """An `ssh` on PATH that records its arguments and prints a bootstrap log with secrets."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "ssh-calls"
    script = bin_dir / "ssh"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {record}\ncat <<\'EOF\'\n{LOG}EOF\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return record


def ssh_logs(tmp_path):
    return doctor.Ssh(PUBLIC_IP, "-----BEGIN OPENSSH PRIVATE KEY-----\nx\n-----END OPENSSH PRIVATE KEY-----", tmp_path)


def test_a_healthy_testbed(tmp_path):
    s = settings()
    kube = FakeKube(s)
    checks = doctor.Doctor(s, kube, ssh_logs(tmp_path).log_tail).run()
    assert {c.status for c in checks} == {OK}, [c.lines() for c in checks]
    assert len(by(checks, "node")) == 1 + s.worker_count and len(by(checks, "pods")) == len(doctor.PLATFORM_NAMESPACES)
    assert len(by(checks, "kueue")) == 1 + 1 + 2 + 2  # pods, the dry-run Workload, two ClusterQueues, two LocalQueues
    # and the quota policy, bound, and its two dry-run trials as the controller
    assert len(by(checks, "admission")) == len(ai_run_limit.stack_objects(kube.n)) + 4
    (quota,) = [c for c in by(checks, "admission") if c.detail.startswith("ValidatingAdmissionPolicy testbed-fair")]
    assert quota.detail.endswith("may change only GPU quotas, 0 to 4"), quota.detail
    assert [c.detail.split(" admits")[0] for c in by(checks, "webhook")] == [
        "cert-manager",
        "Slinky operator",
        "Training Operator",
    ]
    assert by(checks, "scaledobject")[0].detail.startswith("slurmd Ready, not Active")
    assert by(checks, "hpa")[0].detail == f"{kube.n.keda_hpa} reads the formula: composite-metric=0; wants 0"
    shown = by(checks, "prometheus")[0].detail.removeprefix("scrapes slurmctld: ")
    assert [v.split("=")[0] for v in shown.split(", ")] == list(kube.queries)


def test_names_come_from_the_contract(tmp_path):
    s = settings(nodesetName="gpu", workerCount=2)
    n = names.Names.from_settings(s)
    kube = FakeKube(s)
    doctor.Doctor(s, kube, None).run()
    assert ("exec", n.slurm.namespace, n.slurm.controller_pod, names.SLURMCTLD_CONTAINER, "sinfo") in kube.calls
    assert ("get", "keda.sh", n.slurm.namespace, "scaledobjects", n.scaled_object) in kube.calls
    assert ("hpa", n.slurm.namespace, n.keda_hpa) in kube.calls
    assert ("dry_run", "NodeSet") in kube.calls


def test_a_missing_and_a_notready_worker_bring_their_log_tails_redacted(tmp_path, stub_ssh):
    s = settings()
    kube = FakeKube(s)
    missing_ip, notready_ip = s.worker_private_ips[0], s.worker_private_ips[1]
    kube.node_list = [n for n in kube.node_list if doctor._internal_ip(n) != missing_ip]
    next(n for n in kube.node_list if doctor._internal_ip(n) == notready_ip)["status"]["conditions"] = [
        {"type": "Ready", "status": "False"}
    ]
    checks = doctor.Doctor(s, kube, ssh_logs(tmp_path).log_tail).run()
    failed = [c for c in by(checks, "node") if c.status == FAIL]
    assert [c.detail for c in failed] == [
        f"worker {missing_ip} has not joined the cluster",
        f"worker {notready_ip} (ip-{notready_ip.replace('.', '-')}) is NotReady",
    ]
    for c in failed:
        assert c.evidence.startswith(f"tail of {host_layout.BOOTSTRAP_LOG} on ")
        assert "FAILED step: gpu driver" in c.evidence and "[redacted token]" in c.evidence
        assert TOKEN not in c.evidence and "MIIEvQ" not in c.evidence and "[redacted PEM block]" in c.evidence
    calls = stub_ssh.read_text().splitlines()
    assert len(calls) == 2
    for call, ip in zip(calls, (missing_ip, notready_ip), strict=True):
        assert f"-J {host_layout.SSH_USER}@{PUBLIC_IP} {host_layout.SSH_USER}@{ip} " in call
        assert call.endswith(f"sudo tail -n {doctor.LOG_LINES} {host_layout.BOOTSTRAP_LOG}")
    config_text = (tmp_path / "ssh_config").read_text()
    assert "BatchMode yes" in config_text and f"ConnectTimeout {doctor.SSH_CONNECT_TIMEOUT}" in config_text
    assert oct((tmp_path / "id_testbed").stat().st_mode & 0o777) == "0o600"


def test_doctor_reaches_each_node_with_the_command_the_readiness_gate_prints(tmp_path):
    s = settings()
    ssh = ssh_logs(tmp_path)
    for ip, is_control in ((s.control_private_ip, True), (s.worker_private_ips[0], False)):
        words = ssh.command(ip, is_control)
        assert words[1:3] == ["-F", str(tmp_path / "ssh_config")]
        printed = readiness_gate.ssh_command(PUBLIC_IP, None if is_control else ip)
        assert [words[0], *words[3:-1]] == printed
    assert printed == ["ssh", "-J", f"ubuntu@{PUBLIC_IP}", f"ubuntu@{s.worker_private_ips[0]}"]


def test_the_control_node_log_is_read_directly(tmp_path, stub_ssh):
    s = settings()
    kube = FakeKube(s)
    kube.node_list = kube.node_list[1:]
    (failed,) = [c for c in doctor.Doctor(s, kube, ssh_logs(tmp_path).log_tail).run() if c.status == FAIL]
    assert failed.detail == f"control node {s.control_private_ip} has not joined the cluster"
    assert "-J" not in stub_ssh.read_text() and f"{host_layout.SSH_USER}@{PUBLIC_IP} sudo tail" in stub_ssh.read_text()


def test_a_worker_without_its_gpu(tmp_path):
    s = settings()
    kube = FakeKube(s)
    kube.node_list[1]["status"]["allocatable"] = {}
    (failed,) = [c for c in doctor.Doctor(s, kube, None).run() if c.status == FAIL]
    assert "offers nvidia.com/gpu=0, expected 1" in failed.detail
    assert "not readable" in failed.evidence


def test_pods_not_ready_and_a_namespace_without_pods():
    s = settings()
    kube = FakeKube(s)
    kube.pod_lists[names.KEDA_NAMESPACE] = []
    kube.pod_lists[names.SLURM_NAMESPACE].append(
        {"metadata": {"name": "slurm-controller-0"}, "status": {"phase": "Running", "conditions": []}}
    )
    kube.pod_lists[names.MONITORING_NAMESPACE].append({"metadata": {"name": "done"}, "status": {"phase": "Succeeded"}})
    failed = {c.detail for c in doctor.Doctor(s, kube, None).run() if c.status == FAIL}
    assert failed == {
        f"namespace {names.KEDA_NAMESPACE}: no pods",
        f"KEDA {names.KEDA_OPERATOR_APP}: no pods in namespace {names.KEDA_NAMESPACE}",
        f"KEDA {names.KEDA_METRICS_SERVER_APP}: no pods in namespace {names.KEDA_NAMESPACE}",
        f"namespace {names.SLURM_NAMESPACE}: 1 of 2 not Ready: slurm-controller-0",
    }


def test_a_webhook_that_refuses():
    s = settings()
    kube = FakeKube(s)
    kube.refuse = {"PyTorchJob"}
    (failed,) = [c for c in doctor.Doctor(s, kube, None).run() if c.status == FAIL]
    assert failed.name == "webhook" and failed.detail.startswith(
        "Training Operator: a dry-run PyTorchJob was refused (500"
    )


def test_sinfo_failures():
    s = settings()
    kube = FakeKube(s)
    kube.sinfo = (0, "all up 4 idle\n")
    (failed,) = [c for c in doctor.Doctor(s, kube, None).run() if c.status == FAIL]
    assert failed.detail == f"partitions {s.nodeset_name} missing from sinfo"
    kube.sinfo = (1, "slurm_load_partitions: Unable to contact slurm controller")
    (failed,) = [c for c in doctor.Doctor(s, kube, None).run() if c.status == FAIL]
    assert "exited 1: slurm_load_partitions" in failed.detail


def test_a_slurmctld_that_mints_tokens_for_anyone():
    """The operator's AuthAltParameters in effect (the program's override lost), and scontrol failing."""
    s = settings()
    kube = FakeKube(s)
    (ok,) = [c for c in doctor.Doctor(s, kube, None).run() if c.name == "slurm-tokens"]
    assert ok.status == OK and ok.detail.endswith(f",{slinky.DISABLE_TOKEN_CREATION})")
    kube.config = (0, f"AuthAltParameters       = {slurm_config.OPERATOR_AUTH_ALT_PARAMETERS}\n")
    (failed,) = [c for c in doctor.Doctor(s, kube, None).run() if c.status == FAIL]
    assert failed.name == "slurm-tokens" and failed.detail.startswith(
        f"AuthAltParameters={slurm_config.OPERATOR_AUTH_ALT_PARAMETERS}: any Slurm user"
    )
    assert failed.remedy.startswith(f"pulumi up --refresh --stack {s.stack}")
    kube.config = (1, "slurm_load_ctl_conf error: Unable to contact slurm controller\nsecond line")
    (failed,) = [c for c in doctor.Doctor(s, kube, None).run() if c.status == FAIL]
    assert failed.name == "slurm-tokens" and "exited 1: slurm_load_ctl_conf" in failed.detail
    assert "\n" not in failed.detail  # one line, the output escaped (core.settings.escaped)


def test_scaled_object_not_ready_and_prometheus_without_slurmctld():
    s = settings()
    kube = FakeKube(s)
    kube.scaled["status"]["conditions"] = [{"type": "Ready", "status": "False", "message": "trigger error"}]
    last = list(kube.series)[-1]  # every query is asked, not only the first
    kube.series[last] = []
    failed = {c.name: c.detail for c in doctor.Doctor(s, kube, None).run() if c.status == FAIL}
    assert failed["scaledobject"] == "slurmd not Ready: Ready=False : trigger error"
    assert failed["prometheus"].startswith(f"no series for {last}:")
    assert "MetricsType=metrics/openmetrics" in failed["prometheus"], "names the cause seen on the real slurmctld"


def test_a_lost_slurm_target_that_the_default_policy_reads_as_0_still_fails_the_doctor():
    """lend-and-reclaim's Slurm triggers read 0, not empty, when slurmctld's metrics are lost; its
    slurm_metrics trigger (0) is what says so (mutation: the doctor looking at empty results only
    passes this)."""
    s = settings()
    kube = FakeKube(s)
    assert scaling.SLURM_METRICS in kube.series, "the default policy reads the loss"
    kube.series[scaling.SLURM_METRICS] = [{"value": [0, "0"]}]
    failed = {c.name: c.detail for c in doctor.Doctor(s, kube, None).run() if c.status == FAIL}
    assert failed["prometheus"].startswith(f"no series for {scaling.SLURM_METRICS}:")
    assert "SlurmMetricsMissing" in failed["prometheus"]


def test_prometheus_is_asked_the_deployed_queries_with_the_stacks_cooldown():
    s = settings(kedaCooldownSeconds="600")
    kube = FakeKube(s)
    asked = []
    answer = kube.prometheus
    kube.prometheus = lambda query: asked.append(query) or answer(query)
    checks = {c.name: c.status for c in doctor.Doctor(s, kube, None).run()}
    assert checks["prometheus"] == OK
    assert sorted(asked) == sorted(kube.queries.values()) and any("[630s:" in q for q in asked)


def test_redaction_of_a_block_the_tail_cut():
    assert doctor.redact("QUJD\n-----END CERTIFICATE-----\nok") == "[redacted PEM block]\nok"
    assert doctor.redact("a\n-----BEGIN PRIVATE KEY-----\nQUJD") == "a\n[redacted PEM block]"


def write_stub_pulumi(tmp_path, monkeypatch, outputs):
    bin_dir = tmp_path / "pbin"
    bin_dir.mkdir()
    (tmp_path / "outputs.json").write_text(json.dumps(outputs))
    script = bin_dir / "pulumi"
    script.write_text(f"#!/bin/sh\ncat {tmp_path / 'outputs.json'}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_cli_exit_codes(tmp_path, monkeypatch, capsys):
    write_stub_pulumi(tmp_path, monkeypatch, {"controlPlanePublicIp": PUBLIC_IP})
    s = settings()
    assert doctor.main(["--config", "adminCidr=203.0.113.7/32"], kube=FakeKube(s)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ok      node: control node") and out[-1] == "verdict: healthy"
    broken = FakeKube(s)
    broken.refuse = {"ClusterIssuer"}
    assert doctor.main([], kube=broken) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "verdict: 1 problem(s): webhook"

    class Unreachable(FakeKube):
        def nodes(self):
            raise MaxRetryError(None, "/api/v1/nodes")

    assert doctor.main([], kube=Unreachable(s)) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .startswith("cluster: the API server: no answer (MaxRetryError) after waiting at most 40 s per call")
    )
    assert doctor.main(["--config", "workerCount=zero"]) == 2
    assert capsys.readouterr().err.startswith('workerCount: "zero" is not allowed')
    assert doctor.main(["--kubeconfig", str(tmp_path / "nope")]) == 2
    assert "--kubeconfig:" in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("not: a kubeconfig\n")
    assert doctor.main(["--kubeconfig", str(tmp_path / "bad.yaml")]) == 2
    line = capsys.readouterr().err.strip()  # the path may be cut at 60 characters
    assert line.startswith('--kubeconfig: "') and line.endswith('" is not a kubeconfig: it names no clusters')


def test_dispatch_from_python_m_cli(tmp_path, monkeypatch, capsys):
    from cli import __main__ as cli

    write_stub_pulumi(tmp_path, monkeypatch, {})
    assert cli.main(["doctor", "--kubeconfig", str(Path(tmp_path / "missing"))]) == 2
    assert "is not a file" in capsys.readouterr().err


def test_the_real_adapter_asks_the_api_server_the_right_paths():
    from kubernetes import client

    api = client.ApiClient(client.Configuration(host="https://203.0.113.7:6443"))
    seen = []

    def call_api(resource_path, method, path_params=None, query_params=None, *args, **kwargs):
        path = resource_path
        for key, value in (path_params or {}).items():
            path = path.replace("{" + key + "}", value)
        seen.append((method, path, dict(query_params or [])))
        return ({"data": {"result": [{"value": [0, "2"]}]}}, 200, {})

    api.call_api = call_api
    n = names.Names.from_settings(settings())
    kube = doctor.KubeApi(api, n)
    from components import cert_manager, slinky

    kube.dry_run(cert_manager.webhook_probe())
    kube.dry_run(slinky.operator_webhook_probe(n.slurm))
    assert kube.prometheus("up") == [{"value": [0, "2"]}]
    kube.dry_run(kueue.workload_probe())
    kube.get_cluster("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", "p")
    assert seen[3:] == [
        ("POST", f"/apis/{names.KUEUE_GROUP_VERSION}/namespaces/{names.JOBS_NAMESPACE}/workloads", {"dryRun": "All"}),
        ("GET", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/p", {}),
    ]
    assert seen[:3] == [
        ("POST", "/apis/cert-manager.io/v1/clusterissuers", {"dryRun": "All"}),
        (
            "POST",
            f"/apis/slinky.slurm.net/v1beta1/namespaces/{names.SLINKY_OPERATOR_NAMESPACE}/nodesets",
            {"dryRun": "All"},
        ),
        (
            "GET",
            f"/api/v1/namespaces/{names.MONITORING_NAMESPACE}/services/{n.prometheus_service}:{names.PROMETHEUS_PORT}"
            "/proxy/api/v1/query",
            {"query": "up"},
        ),
    ]


def test_a_missing_object_is_a_failed_check_not_a_crash():
    s = settings()

    class HpaForbidden(FakeKube):
        def hpa(self, *args):
            raise ApiException(status=403, reason="Forbidden")

    failed = [c for c in doctor.Doctor(s, HpaForbidden(s), None).run() if c.status == FAIL]
    assert [(c.name, c.detail) for c in failed] == [("scaledobject", "API error 403 Forbidden")]


def _cq(kube, name):
    return kube.cluster_objects["clusterqueues", name]


def _lq(kube, namespace, name):
    return kube.objects["localqueues", namespace, name]


def _gpu(queue):
    return queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]


def _policy(kube, kind):
    return kube.cluster_objects[kind, f"{ai_run_limit.POLICY_PREFIX}-pytorchjobs"]


def _quota_policy(kube):
    return kube.cluster_objects["validatingadmissionpolicies", fair_share_controller.QUOTA_POLICY]


def _not_ready(pods):
    pods[0]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]


REDEPLOY = "pulumi up --refresh --stack dev"
BROKEN = {
    # Kueue
    "kueue pod not Ready": (
        lambda k: _not_ready(k.pod_lists[names.KUEUE_NAMESPACE]),
        "kueue",
        "Kueue controller and webhooks (kueue-controller-manager): 1 of 1 not Ready: kueue-controller-manager-7c9b-q",
        "kubectl -n kueue-system rollout restart deployment/kueue-controller-manager",
    ),
    "kueue webhook refuses a Workload": (
        lambda k: k.refuse.add("Workload"),
        "kueue",
        "a dry-run Workload was refused (500 Internal error occurred: failed calling webhook)",
        "kubectl -n kueue-system rollout restart",
    ),
    "ClusterQueue missing": (
        lambda k: k.cluster_objects.pop(("clusterqueues", names.AI_CLUSTER_QUEUE)),
        "kueue",
        "ClusterQueue ai is missing",
        REDEPLOY,
    ),
    "ClusterQueue quota drifted": (
        lambda k: _gpu(_cq(k, names.HPC_CLUSTER_QUEUE)).update(nominalQuota="1"),
        "kueue",
        "ClusterQueue hpc has quota nvidia.com/gpu 1 (gpu-worker, lends 2), expected nvidia.com/gpu 2 (gpu-worker, lends 2)",
        REDEPLOY,
    ),
    "ClusterQueue inactive": (
        lambda k: _cq(k, names.HPC_CLUSTER_QUEUE)["status"].update(
            conditions=[{"type": "Active", "status": "False", "reason": "FlavorNotFound", "message": "Can't admit"}]
        ),
        "kueue",
        "ClusterQueue hpc is not Active: Active=False FlavorNotFound: Can't admit",
        "kubectl describe clusterqueue hpc",
    ),
    "LocalQueue missing": (
        lambda k: k.objects.pop(("localqueues", names.JOBS_NAMESPACE, names.AI_LOCAL_QUEUE)),
        "kueue",
        "LocalQueue default/ai is missing",
        REDEPLOY,
    ),
    "LocalQueue bound elsewhere": (
        lambda k: _lq(k, names.SLURM_NAMESPACE, names.HPC_LOCAL_QUEUE)["spec"].update(clusterQueue="ai"),
        "kueue",
        "LocalQueue slurm/hpc is bound to 'ai', expected 'hpc'",
        REDEPLOY,
    ),
    "LocalQueue inactive": (
        lambda k: _lq(k, names.JOBS_NAMESPACE, names.AI_LOCAL_QUEUE)["status"].update(conditions=[]),
        "kueue",
        "LocalQueue default/ai is not Active: no Active condition",
        "kubectl describe clusterqueue ai",
    ),
    # KEDA
    "KEDA operator not Ready": (
        lambda k: _not_ready(k.pod_lists[names.KEDA_NAMESPACE]),
        "keda",
        "KEDA keda-operator: 1 of 1 not Ready: keda-operator-5d8f-x",
        "kubectl -n keda rollout restart deployment/keda-operator",
    ),
    "KEDA metrics server gone": (
        lambda k: k.pod_lists[names.KEDA_NAMESPACE].pop(),
        "keda",
        "KEDA keda-operator-metrics-apiserver: no pods in namespace keda",
        "kubectl -n keda rollout restart deployment/keda-operator-metrics-apiserver",
    ),
    "ScaledObject missing": (
        lambda k: k.objects.pop(("scaledobjects", "slurm", names.SCALED_OBJECT)),
        "scaledobject",
        "slurmd is missing",
        REDEPLOY,
    ),
    "a trigger failing": (
        lambda k: k.scaled["status"]["health"]["s1-prometheus"].update(status="Failing", numberOfFailures=4),
        "scaledobject",
        "slurmd: triggers failing: s1-prometheus (4 failures)",
        "kubectl -n keda logs deployment/keda-operator --tail=50",
    ),
    "triggers never evaluated": (
        lambda k: k.scaled["status"]["conditions"].pop(),
        "scaledobject",
        "slurmd has not evaluated its triggers: no Active condition",
        "kubectl -n slurm describe scaledobject slurmd",
    ),
    "another formula deployed": (
        lambda k: k.scaled["spec"]["advanced"]["scalingModifiers"].update(formula="1"),
        "hpa",
        "slurmd's formula is not this stack's",
        REDEPLOY,
    ),
    "HPA missing": (
        lambda k: setattr(k, "hpa_object", None),
        "hpa",
        "keda-hpa-slurmd is missing",
        "kubectl -n slurm describe scaledobject slurmd",
    ),
    "HPA reads the triggers, not the formula": (
        lambda k: k.hpa_object["spec"].update(
            metrics=[{"type": "External", "external": {"metric": {"name": "s0-prometheus"}}}]
        ),
        "hpa",
        "keda-hpa-slurmd reads s0-prometheus, expected only composite-metric (the formula)",
        REDEPLOY,
    ),
    "HPA cannot read the metric": (
        lambda k: k.hpa_object["status"].update(
            conditions=[{"type": "ScalingActive", "status": "False", "reason": "FailedGetExternalMetric"}]
        ),
        "hpa",
        "keda-hpa-slurmd cannot read the formula: ScalingActive=False FailedGetExternalMetric",
        "kubectl get apiservice/v1beta1.external.metrics.k8s.io",
    ),
    # the AI run-limit policies
    "policy missing": (
        lambda k: k.cluster_objects.pop(("validatingadmissionpolicies", f"{ai_run_limit.POLICY_PREFIX}-jobs")),
        "admission",
        f"ValidatingAdmissionPolicy {ai_run_limit.POLICY_PREFIX}-jobs is missing",
        REDEPLOY,
    ),
    "policy with another limit": (
        lambda k: _policy(k, "validatingadmissionpolicies")["spec"]["variables"][0].update(expression="7200"),
        "admission",
        f"ValidatingAdmissionPolicy {ai_run_limit.POLICY_PREFIX}-pytorchjobs allows 7200 s and 4 GPUs, expected 3600 s and 4 GPUs",
        REDEPLOY,
    ),
    "binding that only warns": (
        lambda k: _policy(k, "validatingadmissionpolicybindings")["spec"].update(validationActions=["Warn"]),
        "admission",
        f"ValidatingAdmissionPolicyBinding {ai_run_limit.POLICY_PREFIX}-pytorchjobs: validationActions ['Warn'] "
        "(expected ['Deny'])",
        REDEPLOY,
    ),
    # the fair-share controller's quota policy
    "quota policy that lets stopPolicy change": (
        lambda k: _quota_policy(k)["spec"]["validations"][2].update(expression="true"),
        "admission",
        f"ValidatingAdmissionPolicy {fair_share_controller.QUOTA_POLICY} differs from the program's in validations",
        REDEPLOY,
    ),
    "quota policy matching other queues' group": (
        lambda k: _quota_policy(k)["spec"]["matchConstraints"]["resourceRules"][0].update(apiGroups=["x"]),
        "admission",
        f"ValidatingAdmissionPolicy {fair_share_controller.QUOTA_POLICY} differs from the program's in matchConstraints",
        REDEPLOY,
    ),
    "quota binding missing": (
        lambda k: k.cluster_objects.pop(("validatingadmissionpolicybindings", fair_share_controller.QUOTA_POLICY)),
        "admission",
        f"ValidatingAdmissionPolicyBinding {fair_share_controller.QUOTA_POLICY} is missing",
        REDEPLOY,
    ),
    "binding missing": (
        lambda k: k.cluster_objects.pop(("validatingadmissionpolicybindings", f"{ai_run_limit.POLICY_PREFIX}-jobs")),
        "admission",
        f"ValidatingAdmissionPolicyBinding {ai_run_limit.POLICY_PREFIX}-jobs is missing",
        REDEPLOY,
    ),
}


USER = fair_share_controller.controller_user()
QUEUE_PATH = f"{fair_share_loop.KUEUE_API}/{names.HPC_CLUSTER_QUEUE}"


def test_the_quota_policy_is_tried_on_the_live_cluster_as_the_controller():
    """Two dry-run patches of HPC's queue as the controller: the loop's own (to the quota it holds,
    built from the queue the doctor read) admitted, a stopPolicy change refused by the policy."""
    s = settings()
    kube = FakeKube(s)
    checks = doctor.Doctor(s, kube, None).run()
    trials = [c for c in by(checks, "admission") if c.detail.startswith(f"as {USER}")]
    assert [(c.status, c.detail) for c in trials] == [
        (OK, f"as {USER}, a dry-run of the controller's own quota patch (nvidia.com/gpu 2, lends 2) is admitted"),
        (OK, f"as {USER}, a dry-run stopPolicy patch is refused by {fair_share_controller.QUOTA_POLICY}"),
    ]
    queue = _cq(kube, names.HPC_CLUSTER_QUEUE)
    own = fair_share_loop.quota_patch(queue, names.GPU_RESOURCE, 2, 2)
    assert own[1]["value"] == "2"  # tested against the quota as the API server returned it
    sent = [c[1:] for c in kube.calls if c[0] == "dry_run_patch_as"]
    assert sent == [
        (USER, QUEUE_PATH, own, fair_share_loop.FIELD_MANAGER),
        (
            USER,
            QUEUE_PATH,
            [{"op": "replace", "path": "/spec/stopPolicy", "value": "HoldAndDrain"}],
            "fair-share-controller",
        ),
    ]


def test_a_quota_policy_that_errors_on_the_api_server_fails_the_doctor():
    """A rule that errors at run time refuses the controller's every patch (failurePolicy Fail):
    the check fails with the server's message, one line, and how to look at the policy."""
    s = settings()
    kube = FakeKube(s)
    kube.quota_policy = "erroring"
    failed = [c for c in doctor.Doctor(s, kube, None).run() if c.status == FAIL]
    (own,) = failed  # the stopPolicy patch is refused too: by the same error
    assert own.detail.startswith(
        f"as {USER}, a dry-run of the controller's own quota patch was refused: 422 Unprocessable Entity "
        f"ValidatingAdmissionPolicy '{fair_share_controller.QUOTA_POLICY}' with binding"
    )
    assert "\n" not in own.detail and "resulted in error:\\n no such key" in own.detail  # escaped, one line
    assert own.remedy.startswith(f"kubectl get validatingadmissionpolicy {fair_share_controller.QUOTA_POLICY} -o yaml")


def test_a_refusal_by_rbac_is_not_the_policys_refusal():
    """Both patches refused by RBAC, not by the policy: the loop cannot patch, and the stopPolicy
    refusal proves nothing about the policy; each says so, with the server's words."""
    s = settings()
    kube = FakeKube(s)
    kube.quota_policy = "forbidden"
    own, stop = [c for c in doctor.Doctor(s, kube, None).run() if c.status == FAIL]
    assert own.detail.endswith(
        f'refused: 403 Forbidden clusterqueues \\"hpc\\" is forbidden: User \\"{USER}\\" cannot patch'
    )
    assert own.remedy.startswith(f"kubectl auth can-i patch clusterqueues/hpc --as={USER}")
    assert stop.detail.startswith(
        f"as {USER}, a dry-run stopPolicy patch was refused, but not by {fair_share_controller.QUOTA_POLICY}: 403"
    )


def test_a_quota_policy_that_does_not_hold_fails_the_doctor():
    s = settings()
    kube = FakeKube(s)
    kube.quota_policy = "missing"
    (failed,) = [c for c in doctor.Doctor(s, kube, None).run() if c.status == FAIL]
    assert failed.detail == (
        f"as {USER}, a dry-run stopPolicy patch of ClusterQueue hpc was admitted: "
        f"{fair_share_controller.QUOTA_POLICY} does not hold"
    )
    assert failed.remedy.startswith(REDEPLOY)
    kube.quota_policy = "missing, the schema refusing"  # 422 too, but not the policy's denial
    (failed,) = [c for c in doctor.Doctor(s, kube, None).run() if c.status == FAIL]
    assert failed.detail.startswith(
        f"as {USER}, a dry-run stopPolicy patch was refused, but not by {fair_share_controller.QUOTA_POLICY}: 422"
    )


def test_the_real_adapter_sends_the_dry_run_patch_as_the_controller():
    """On the wire: PATCH with dryRun=All and the loop's field manager, a JSON patch, the
    Impersonate-User header on that request only; a refusal comes back as ApiException."""
    from kubernetes import client

    api = client.ApiClient(client.Configuration(host="https://203.0.113.7:6443"))
    sent, answers = [], [(200, b"{}"), (422, b'{"message": "denied"}')]

    class Answer:
        def __init__(self, status, data):
            self.status, self.reason, self.data = status, "x", data

        def getheaders(self):
            return {}

        def getheader(self, name, default=None):
            return default

    def request(method, url, body=None, headers=None, **kwargs):
        sent.append((method, url, json.loads(body), dict(headers)))
        return Answer(*answers.pop(0))

    api.rest_client.pool_manager.request = request
    kube = doctor.KubeApi(api, names.Names.from_settings(settings()))
    ops = [{"op": "replace", "path": "/spec/stopPolicy", "value": "HoldAndDrain"}]
    kube.dry_run_patch_as(USER, QUEUE_PATH, ops, fair_share_loop.FIELD_MANAGER)
    with pytest.raises(ApiException) as refused:
        kube.dry_run_patch_as(USER, QUEUE_PATH, ops, fair_share_loop.FIELD_MANAGER)
    assert refused.value.status == 422
    method, url, body, headers = sent[0]
    assert (method, body) == ("PATCH", ops)
    assert url == f"https://203.0.113.7:6443{QUEUE_PATH}?dryRun=All&fieldManager=fair-share-controller"
    assert headers["Impersonate-User"] == USER and headers["Content-Type"] == fair_share_loop.JSON_PATCH
    assert "Impersonate-User" not in api.default_headers  # the admin's client keeps its identity


@pytest.mark.parametrize("case", list(BROKEN))
def test_each_kueue_keda_and_policy_check_fails_when_its_object_is_broken(case):
    """One broken object, one failed check, which names it and carries the command that fixes it."""
    s = settings()
    kube = FakeKube(s)
    brake, name, detail, remedy = BROKEN[case]
    brake(kube)
    # a KEDA pod is also one of its namespace's pods (the `pods` check)
    (failed,) = [c for c in doctor.Doctor(s, kube, None).run() if c.status == FAIL and c.name != "pods"]
    assert (failed.name, failed.detail[: len(detail)]) == (name, detail)
    assert failed.remedy.startswith(remedy) and "\n" not in failed.remedy


def test_the_doctor_expects_the_policies_the_program_creates(default_run):
    """The run-limit objects the doctor compares with are those the program deploys."""
    deployed = {
        (r.inputs["metadata"]["name"], r.type.rsplit(":", 1)[1]): offline.reveal(r.inputs)["spec"]
        for r in default_run.resources
        if r.type.startswith("kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy")
        and r.inputs["metadata"]["name"].startswith(ai_run_limit.POLICY_PREFIX)  # not the tenants' volume policy
    }
    expected = ai_run_limit.stack_objects(names.Names.from_settings(default_run.settings))
    assert deployed == {(o["metadata"]["name"], o["kind"]): o["spec"] for o in expected}


def test_the_real_adapter_execs_through_validations_exec_stream():
    """doctor's exec is validation's (KubeCluster.exec_in_pod), against a fake API server speaking the
    exec websocket: output and exit code come back, and a stream without an exit status is exit 1
    with why, not a crash."""
    from kubernetes import client

    servers = [
        FakeExecServer([("send", 1, "gpu* up 4 idle\n"), ("send", 2, "warn\n"), status(SUCCESS), ("close",)]),
        FakeExecServer([("send", 2, "no\n"), status(NON_ZERO), ("close",)]),
        FakeExecServer([("send", 1, "gpu"), ("close",)]),
    ]
    try:
        answers = []
        for server in servers:
            configuration = client.Configuration(host=f"http://127.0.0.1:{server.port}")
            kube = doctor.KubeApi(client.ApiClient(configuration), names.Names.from_settings(settings()))
            answers.append(kube.exec("slurm", "slurm-controller-0", "slurmctld", ["sinfo"]))
    finally:
        for server in servers:
            server.stop()
    assert answers[:2] == [(0, "gpu* up 4 idle\nwarn\n"), (3, "no\n")]
    assert answers[2][0] == 1 and answers[2][1].startswith("exec sinfo in slurm/slurm-controller-0: ")
    assert servers[0].requests[0]["path"] == "/api/v1/namespaces/slurm/pods/slurm-controller-0/exec"

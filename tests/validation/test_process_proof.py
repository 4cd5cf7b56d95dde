"""Proof from the processes: the probe's record, dcgm-exporter's record, and
the checks that fail on a GPU used by a pod not allocated it or by two pods at once."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from types import SimpleNamespace

import kubernetes_validate
from kubernetes import client
from test_runner import replay
from validation_builders import GPU_A, GPU_B, handoff_samples, handoff_timeline, proc
from validation_fakes import LEAK_POD_UID, Faults

from core import host_layout
from core.names import slurm_names
from validation import probe
from validation.checks import check_dcgm, check_processes
from validation.cluster import KubeCluster, parse_dcgm
from validation.timeline import DcgmHolding

UID = "6f1c2a3b-4d5e-4f60-8a9b-0c1d2e3f4a5b"
SYSTEMD = f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/cri-containerd-0a1b.scope\n"
CGROUPFS = f"12:devices:/kubepods/burstable/pod{UID}/0a1b2c\n"


def fake_node(tmp_path, processes: dict[int, str]) -> dict[str, str]:
    """A stand-in nvidia-smi listing `processes` and a /proc tree with their cgroup files."""
    bin_dir, proc_dir = tmp_path / "bin", tmp_path / "proc"
    bin_dir.mkdir()
    lines = "".join(f"GPU-{pid:08d}-0000-0000-0000-000000000000, {pid}\\n" for pid in processes)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        f'#!/bin/sh\n[ "$*" = "--query-compute-apps=gpu_uuid,pid --format=csv,noheader" ] || exit 9\nprintf "{lines}"\n'
    )
    smi.chmod(0o755)
    for pid, cgroup in processes.items():
        (proc_dir / str(pid)).mkdir(parents=True)
        (proc_dir / str(pid) / "cgroup").write_text(cgroup)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PROC": str(proc_dir)}


def test_the_probe_query_maps_each_gpu_process_to_its_pod(tmp_path):
    env = fake_node(tmp_path, {101: SYSTEMD, 202: CGROUPFS, 303: "0::/system.slice/ollama.service\n"})
    out = subprocess.run(probe.QUERY, env=env, capture_output=True, text=True, check=True).stdout
    found = probe.parse_processes(out + "No running processes found\n", "gpu-worker-1")
    assert [(p.pid, p.pod_uid, p.node) for p in found] == [
        (101, UID, "gpu-worker-1"),
        (202, UID, "gpu-worker-1"),
        (303, "", "gpu-worker-1"),
    ]
    assert found[0].uuid == "GPU-00000101-0000-0000-0000-000000000000"


def test_the_probe_is_a_privileged_hostpid_daemonset_on_the_gpu_nodes_that_asks_for_no_gpu():
    ds = probe.daemonset()
    kubernetes_validate.validate(ds, "1.34", strict=True)
    pod = ds["spec"]["template"]["spec"]
    key, value = host_layout.GPU_NODE_LABEL
    assert pod["nodeSelector"] == {key: value} and pod["hostPID"] is True
    (container,) = pod["containers"]
    assert container["securityContext"] == {"privileged": True}
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in container["env"]
    assert "nvidia.com/gpu" not in str(container["resources"])
    assert ":" in probe.IMAGE and not probe.IMAGE.endswith(":latest")


def test_kube_cluster_asks_every_gpu_node_and_says_when_one_did_not_answer():
    cluster = KubeCluster(client.ApiClient(), slurm_names("slinky"))
    nodes = [SimpleNamespace(metadata=SimpleNamespace(name=n)) for n in ("gpu-worker-0", "gpu-worker-1")]
    pods = [
        SimpleNamespace(
            metadata=SimpleNamespace(name="probe-a"),
            spec=SimpleNamespace(node_name="gpu-worker-0"),
            status=SimpleNamespace(phase="Running"),
        )
    ]
    asked = []
    cluster.core = SimpleNamespace(
        list_node=lambda label_selector: asked.append(label_selector) or SimpleNamespace(items=nodes),
        list_namespaced_pod=lambda ns, label_selector: SimpleNamespace(items=pods),
    )
    cluster.exec_in_pod = lambda ns, pod, container, command: (0, f"{GPU_A},77,pod{UID}\n", "")
    found, complete = cluster.gpu_processes()
    assert asked == ["nvidia.com/gpu.present=true"]
    assert [(p.uuid, p.pid, p.node, p.pod_uid) for p in found] == [(GPU_A, 77, "gpu-worker-0", UID)]
    assert complete is False  # gpu-worker-1 has no probe running yet


def test_a_pod_without_a_gpu_request_running_on_a_held_gpu_fails_the_process_check():
    """The leak the allocations cannot see: the old check passes, the process check does not."""
    _, checks, cluster, _ = replay("mixed", Faults(leak_from=100.0))
    assert checks["no GPU held twice"].passed
    failed = checks["GPU processes only in their GPU's pod"]
    assert not failed.passed and f"pod {LEAK_POD_UID} asked for no GPU (pid 4242" in failed.detail
    assert cluster.probe_calls == ["start", "stop"]


def test_a_clean_run_passes_both_records_and_removes_the_probe_even_on_ctrl_c():
    _, checks, cluster, _ = replay("heavy-mixed")
    assert checks["GPU processes only in their GPU's pod"].passed and checks["dcgm-exporter agrees"].passed
    assert cluster.probe_calls == ["start", "stop"]
    _, _, interrupted, _ = replay("heavy-mixed", Faults(interrupt_at=50))
    assert interrupted.probe_calls == ["start", "stop"]


def test_a_probe_that_never_answers_fails_the_process_check():
    _, checks, _, _ = replay("mixed", Faults(no_probe=True))
    assert (
        checks["GPU processes only in their GPU's pod"].detail == "the process probe never answered on every GPU node"
    )


def test_a_process_on_a_gpu_its_pod_was_not_allocated_fails():
    samples = handoff_samples()
    # The DDP worker (allocated GPU-b) runs a process on GPU-a, which its master holds.
    samples[8] = replace(samples[8], processes=(*samples[8].processes, proc(GPU_A, "ddp-worker-0-uid", pid=9)))
    check = check_processes(handoff_timeline(samples))
    assert not check.passed
    assert "GPU-a at 370 s: default/ddp-worker-0 was allocated GPU-b" in check.detail
    assert "GPU-a: default/ddp-master-0 [370-370 s] and default/ddp-worker-0 [370-370 s]" in check.detail


def test_a_process_outside_any_pod_fails():
    samples = handoff_samples()
    samples[3] = replace(samples[3], processes=(proc(GPU_B, "", pid=31),))
    assert "GPU-b at 30 s: pid 31 on gpu-worker-0 runs in no pod" in check_processes(handoff_timeline(samples)).detail


def test_dcgm_overlaps_or_a_disagreement_with_the_pods_own_read_fail():
    assert check_dcgm(handoff_timeline()).passed
    overlap = [*handoff_dcgm_with(DcgmHolding(GPU_A, "default/ddp-worker-0", 330, 360))]
    failed = check_dcgm(handoff_timeline(dcgm=overlap))
    assert not failed.passed
    assert "GPU-a: slurm/slurm-worker-slinky-0 [15-345 s] and default/ddp-worker-0 [330-360 s]" in failed.detail
    assert "dcgm-exporter says default/ddp-worker-0 held GPU-a; inside, it read GPU-b" in failed.detail
    assert check_dcgm(handoff_timeline(dcgm=[])).detail == "no dcgm-exporter record for the run"


def handoff_dcgm_with(extra: DcgmHolding) -> list[DcgmHolding]:
    return [*handoff_timeline().dcgm, extra]


def test_prometheus_answers_become_holdings_split_at_gaps():
    t0 = 1_767_262_500.0
    answer = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {
                    "metric": {"UUID": GPU_B, "namespace": "slurm", "pod": "slurm-worker-slinky-0"},
                    "values": [[t0 + t, "0"] for t in (10, 20, 30, 200, 210)],
                }
            ],
        },
    }
    assert parse_dcgm(answer, t0, 10) == [
        DcgmHolding(GPU_B, "slurm/slurm-worker-slinky-0", 10, 30),
        DcgmHolding(GPU_B, "slurm/slurm-worker-slinky-0", 200, 210),
    ]


def test_the_leak_probe_scenario_passes_only_if_the_pod_reached_no_gpu():
    _, checks, _, _ = replay("leak-probe")
    assert checks["no GPU without a request"].passed, checks["no GPU without a request"].detail
    assert "found no GPU while Slurm held all 4" in checks["no GPU without a request"].detail
    _, leaky, _, _ = replay("leak-probe", Faults(leaky_toolkit=True))
    assert not leaky["no GPU without a request"].passed
    assert "leak-probe-t1-2 failed: it reached a GPU" in leaky["no GPU without a request"].detail
    assert "asked for no GPU" in leaky["GPU processes only in their GPU's pod"].detail

"""validate --scenario nccl: an all-reduce across nodes on each path, planned, run against the
simulated cluster, read back and checked."""

from __future__ import annotations

import hashlib

import pytest
import yaml
from kubernetes import client
from validation_fakes import FakeClock, FakeCluster, Faults, all_reduce_output

from cli import validate as cli
from components import tenant_volumes
from core import host_layout, names, settings
from core.names import slurm_names
from tests.conftest import config
from validation.checks import check_collectives, collective_result, evaluate, expectations
from validation.cluster import KubeCluster
from validation.runner import run
from validation.scenarios import (
    AFTER_BUILD,
    JOBS_DIR,
    SCENARIOS,
    SHARE_SERVER_PLACEHOLDER,
    SLURM_OUTPUT_DIR,
    PlannedKube,
    PlannedSlurm,
    load_objects,
    plan,
    sbatch_options,
)
from validation.timeline import SUCCEEDED, job_lives

NCCL = SCENARIOS["nccl"]
CHECK = "NCCL all-reduce across nodes"
DURATIONS = {"nccl-tests": 240, "nccl-allreduce": 60, "pytorchjob-nccl-allreduce": 60}


def nccl_run(faults=None, **cluster_args):
    clock = FakeClock()
    cluster = FakeCluster(clock, durations=DURATIONS, faults=faults or Faults(), **cluster_args)
    planned = plan(NCCL, "t1", share_server="10.0.0.10")
    log: list[str] = []
    timeline = run(
        planned,
        cluster,
        clock,
        scenario="nccl",
        gpus_total=4,
        interval=5.0,
        timeout=3000.0,
        started_at="2026-01-01T00:00:00+00:00",
        log=log.append,
    )
    checks = {c.name: c for c in evaluate(timeline, expectations(NCCL, planned, 4))}
    return timeline, checks, cluster, log


def test_the_plan_builds_first_then_runs_both_paths_across_two_nodes():
    s = settings.load(config(vpcCidr="10.20.0.0/16"), offline=True)
    build, slurm, kube = plan(NCCL, "r1", share_server=s.control_private_ip)
    assert isinstance(build, PlannedKube) and build.kind == "Job" and build.gpus == 0 and not build.collective
    pod = build.obj["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "nfs" in v]
    assert volume["nfs"] == {"server": "10.20.0.10", "path": "/mnt/share"}  # the control node serves the share
    # the admin's job, outside the tenants' namespace (where NFS is refused), writing the share as
    # the one uid that owns the tools directory, and only in its last step
    assert build.obj["metadata"]["namespace"] == names.SLURM_NAMESPACE != names.JOBS_NAMESPACE
    assert names.SLURM_NAMESPACE not in tenant_volumes.TENANT_NAMESPACES
    assert isinstance(slurm, PlannedSlurm) and slurm.after == AFTER_BUILD and slurm.collective
    assert isinstance(kube, PlannedKube) and kube.kind == "PyTorchJob" and kube.collective
    # two ranks each, one GPU per worker: every all-reduce crosses nodes
    assert slurm.gpus == kube.gpus == 2
    assert "#SBATCH --nodes=2" in slurm.script and "#SBATCH --ntasks-per-node=1" in slurm.script
    # validate reads its output where the script writes it: <share>/<job name>-<job id>.out
    assert sbatch_options(slurm.script)["--output"] == f"{SLURM_OUTPUT_DIR}/%x-%j.out"
    # the Slurm side runs the binary the build Job writes, where it writes it
    (builder,) = pod["initContainers"]
    (container,) = pod["containers"]
    tools = f"{host_layout.SHARE_TOOLS_DIR}/nccl-tests"
    assert f"out={tools}\n" in container["args"][0] and f"tests={tools}\n" in slurm.script
    assert container["securityContext"]["runAsUser"] == host_layout.SHARE_TOOLS_UID
    assert {"name": volume["name"], "mountPath": "/mnt/share", "readOnly": True} in builder["volumeMounts"]
    tag = {e["name"]: e["value"] for e in builder["env"]}["NCCL_TESTS_TAG"]
    assert tag == "v2.17.7"
    # without a server the placeholder stays, and the file on disk keeps it
    (unfilled,) = [p for p in plan(NCCL, "r1") if p.name.startswith("nccl-tests")]
    (share,) = [v for v in unfilled.obj["spec"]["template"]["spec"]["volumes"] if "nfs" in v]
    assert share["nfs"]["server"] == SHARE_SERVER_PLACEHOLDER


def test_the_build_job_validates_strictly_against_kubernetes_1_34():
    import kubernetes_validate

    (obj,) = load_objects(JOBS_DIR / "build" / "nccl-tests.yaml")
    kubernetes_validate.validate(obj, "1.34", strict=True)
    pod = obj["spec"]["template"]["spec"]
    for container in pod["containers"] + pod["initContainers"]:
        assert ":" in container["image"] and not container["image"].endswith(":latest")


def test_the_slurm_side_waits_for_the_build_and_both_outputs_are_read_and_pass():
    timeline, checks, cluster, _ = nccl_run()
    lives = {life.name: life for life in job_lives(timeline)}
    build, slurm = lives["nccl-tests-t1-1"], lives["nccl-allreduce-t1-2"]
    assert build.final_phase == SUCCEEDED and slurm.submitted >= build.finished
    job_id = next(s.ref for s in timeline.submissions if s.name == slurm.name)
    assert ("slurm", "nccl-allreduce-t1-2", job_id) in cluster.output_reads
    assert ("PyTorchJob", "pytorchjob-nccl-allreduce-t1-3", "pytorchjob-nccl-allreduce-t1-3") in cluster.output_reads
    assert checks[CHECK].passed, checks[CHECK].detail
    assert checks[CHECK].detail == (
        "average bus bandwidth nccl-allreduce-t1-2 (Slurm) 1.16 GB/s, "
        "pytorchjob-nccl-allreduce-t1-3 (Kubernetes) 0.97 GB/s (functional, not a benchmark)"
    )
    assert [n for n, c in checks.items() if not c.passed] == []


def test_a_failed_build_submits_no_slurm_job_and_fails_the_check_at_once():
    timeline, checks, _, log = nccl_run(Faults(fail_jobs="nccl-tests"))
    assert "nccl-allreduce-t1-2" not in {s.name for s in timeline.submissions}
    assert any("not submitting nccl-allreduce-t1-2: the build it needs failed" in line for line in log)
    assert timeline.outcome == "completed"  # it did not wait for the timeout
    assert not checks[CHECK].passed and "nccl-allreduce-t1-2 (Slurm): no output read" in checks[CHECK].detail


@pytest.mark.parametrize(
    "output, problem",
    [
        (all_reduce_output(0.0), "bus bandwidth 0 GB/s"),
        (all_reduce_output(1.2, wrong=3), "3 wrong values"),
        (
            "NCCL WARN Connect to 10.244.1.7<43411> failed\n",
            "no nccl-tests summary in its output (did it run to the end?)",
        ),
    ],
)
def test_zero_bandwidth_wrong_values_or_no_summary_fail(output, problem):
    _, checks, _, _ = nccl_run(outputs={"nccl-allreduce": output, "pytorchjob-nccl-allreduce": all_reduce_output(1)})
    assert not checks[CHECK].passed
    assert checks[CHECK].detail == f"nccl-allreduce-t1-2 (Slurm): {problem}"


def test_the_summary_is_read_as_nccl_tests_prints_it():
    assert collective_result(all_reduce_output(12.5)) == (0, 12.5)
    assert collective_result(all_reduce_output(0.5, wrong=2)) == (2, 0.5)
    assert collective_result("# Avg bus bandwidth    : nan \n# Out of bounds values : 0 OK\n")[0] == 0
    assert collective_result("no summary") == (None, None)


def test_a_nan_bandwidth_fails():
    from validation.timeline import Submission, Timeline

    timeline = Timeline("nccl", 4, 5.0, "t", submissions=[Submission("a", "slurm", 0.0, 2, "7")])
    timeline.outputs["a"] = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : nan \n"
    assert not check_collectives(timeline, (("a", "slurm"),)).passed


def test_the_live_cluster_reads_the_slurm_output_on_the_share_and_the_masters_log():
    cluster = KubeCluster(client.ApiClient(), slurm_names("slinky"))
    calls = []
    digest = hashlib.sha256(b"out").hexdigest()
    cluster.exec_in_pod = lambda ns, pod, container, command: (
        calls.append((ns, pod, container, command)) or (0, digest if command[1].endswith(".sha256") else "out", "")
    )
    assert cluster.job_output("slurm", "nccl-allreduce-r1-2", "4242") == "out"
    assert calls == [
        ("slurm", "slurm-controller-0", "slurmctld", ["cat", "/mnt/share/slurm/nccl-allreduce-r1-2-4242.out"]),
        ("slurm", "slurm-controller-0", "slurmctld", ["cat", "/var/spool/slurmctld/output-digests/4242.sha256"]),
    ]
    logs = []
    cluster.core = type("Core", (), {"read_namespaced_pod_log": lambda self, *a, **k: logs.append((a, k)) or "log"})()
    assert cluster.job_output("PyTorchJob", "pytorchjob-nccl-allreduce-r1-3", "x") == "log"
    assert logs == [(("pytorchjob-nccl-allreduce-r1-3-master-0", "default"), {"container": "pytorch"})]


def test_dry_run_shows_both_paths_and_the_check(capsys):
    assert cli.main(["--scenario", "nccl", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "at start: create Job slurm/nccl-tests-dryrun-1 from jobs/build/nccl-tests.yaml" in out
    assert "once the build succeeded: kubectl exec -i -n slurm slurm-controller-0 -c slurmctld -- sbatch" in out
    assert "    Slurm: nccl-tests all_reduce_perf, 2 ranks with one GPU each" in out
    assert "    Kubernetes: torch.distributed, 2 ranks with one GPU each" in out
    assert "the log of pod default/pytorchjob-nccl-allreduce-dryrun-3-master-0" in out
    assert "each all-reduce reported 0 wrong values and an average bus bandwidth above 0" in out


def test_the_jobs_say_what_they_print_in_the_words_the_check_reads():
    (torch_job,) = load_objects(JOBS_DIR / "kubernetes" / "pytorchjob-nccl-allreduce.yaml")
    code = torch_job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"][0]
    assert '"# Out of bounds values : ' in code and '"# Avg bus bandwidth    : ' in code
    assert "2 * (world - 1) / world" in code  # nccl-tests' all-reduce bus bandwidth
    assert yaml.safe_load((JOBS_DIR / "build" / "nccl-tests.yaml").read_text())["kind"] == "Job"

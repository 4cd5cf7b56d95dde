"""The real cluster layer with the network cut out: the commands it runs and what it reads back."""

import hashlib
import os
import subprocess
from types import SimpleNamespace

import pytest
from kubernetes import client

from core import host_layout
from core.names import slurm_names
from validation.cluster import SQUEUE, UUID_QUERY, ClusterError, KubeCluster
from validation.scenarios import SLURM, SLURM_OUTPUT_DIR
from validation.timeline import RUNNING, SUCCEEDED, GpuPod


def cluster_with(exec_results=None):
    cluster = KubeCluster(client.ApiClient(), slurm_names("slinky"))
    calls = []

    def fake_exec(namespace, pod, container, command):
        calls.append((namespace, pod, container, command))
        return (exec_results or {}).get(command[0], (0, "", ""))

    cluster.exec_in_pod = fake_exec
    return cluster, calls


def fake_bin(tmp_path, name, body):
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}


def test_sbatch_gets_the_script_on_stdin_inside_slurmctld(tmp_path):
    cluster, calls = cluster_with({"sh": (0, "4242;slurm_slurm\n", "")})
    script = "#!/bin/bash\n#SBATCH --nodes=2\necho \"$HOME\" '%s' 100%\n"
    assert cluster.submit_slurm("mpi-gpu-r1-1", script) == "4242"
    ((namespace, pod, container, command),) = calls
    assert (namespace, pod, container) == ("slurm", "slurm-controller-0", "slurmctld")
    # Run the very command with a stand-in sbatch: the script must arrive byte for byte.
    env = fake_bin(tmp_path, "sbatch", f'printf "%s\\n" "$*" > {tmp_path}/args; cat > {tmp_path}/stdin; echo 7\n')
    subprocess.run(command, env=env, check=True)
    assert (tmp_path / "stdin").read_text() == script
    assert (tmp_path / "args").read_text() == "--parsable --job-name=mpi-gpu-r1-1\n"


def test_uuid_read_lists_the_device_plugins_mounts_in_the_pod(tmp_path):
    """volume-mounts: kubelet mounts /dev/null at <root>/<UUID> per allocated GPU."""
    assert UUID_QUERY[-1] == host_layout.DEVICE_LIST_ROOT == "/var/run/nvidia-container-devices"
    uuids = ("GPU-8b2e4d17-0a6c-4f3d-b1e5-2c9f7a3d4b02", "GPU-3f1c9a52-7d1e-4c0b-9e2a-5b8d0c6f1a01")
    for uuid in uuids:
        (tmp_path / uuid).touch()
    listed = subprocess.run([*UUID_QUERY[:-1], str(tmp_path)], capture_output=True, text=True, check=True).stdout
    cluster, calls = cluster_with({"ls": (0, listed, "")})
    pod = GpuPod("slurm", "slurm-worker-slinky-0", "u", "gpu-worker-0", "Running", "slurmd", "slinky-0", "slurmd")
    assert cluster.read_gpu_uuids(pod) == tuple(sorted(uuids))
    assert calls == [("slurm", "slurm-worker-slinky-0", "slurmd", UUID_QUERY)]


def test_a_uuid_read_that_fails_is_tried_again_later():
    cluster, _ = cluster_with({"ls": (2, "", "ls: cannot access: No such file or directory\n")})
    pod = GpuPod("default", "p", "u", "n", "Running", "kubernetes", "p", "c")
    assert cluster.read_gpu_uuids(pod) == ()

    def broken(*_):
        raise ClusterError("exec ls in default/p: the stream closed without an exit status")

    cluster.exec_in_pod = broken
    assert cluster.read_gpu_uuids(pod) == ()


def test_slurm_jobs_come_from_squeue_in_slurmctld():
    cluster, calls = cluster_with({"squeue": (0, "5|a|RUNNING|slinky-[0-1]\n", "")})
    assert [j.nodes for j in cluster.slurm_jobs()] == [("slinky-0", "slinky-1")]
    assert calls[0][3] == SQUEUE


def test_a_failing_slurmctld_command_raises_with_its_message():
    cluster, _ = cluster_with({"scancel": (1, "", "scancel: error: Invalid job id\n")})
    with pytest.raises(ClusterError, match="exited 1: scancel: error: Invalid job id"):
        cluster.cancel_slurm(["9"])


def test_nodeset_without_replicas_counts_as_zero():
    cluster, _ = cluster_with()
    asked = []
    cluster.custom = SimpleNamespace(
        get_namespaced_custom_object=lambda *a: asked.append(a) or {"kind": "NodeSet", "spec": {}, "status": {}}
    )
    assert cluster.nodeset() == (0, 0)
    assert asked == [("slinky.slurm.net", "v1beta1", "slurm", "nodesets", "slurm-worker-slinky")]


def test_job_phases_from_the_api_objects():
    cluster, _ = cluster_with()
    status = client.V1JobStatus(active=1, ready=1)
    cluster.batch = SimpleNamespace(read_namespaced_job_status=lambda name, ns: client.V1Job(status=status))
    assert cluster.kube_job_phase({"kind": "Job", "metadata": {"name": "j", "namespace": "default"}}) == RUNNING
    done = {"status": {"conditions": [{"type": "Created", "status": "True"}, {"type": "Succeeded", "status": "True"}]}}
    cluster.custom = SimpleNamespace(get_namespaced_custom_object=lambda *a: done)
    assert cluster.kube_job_phase({"kind": "PyTorchJob", "metadata": {"name": "p"}}) == SUCCEEDED


def test_gpu_pods_are_read_from_every_namespace():
    cluster, _ = cluster_with()
    gpu = client.V1Container(name="pytorch", resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"}))
    pods = [
        client.V1Pod(
            metadata=client.V1ObjectMeta(
                name="ddp-master-0", namespace="default", uid="u1", labels={"training.kubeflow.org/job-name": "ddp"}
            ),
            spec=client.V1PodSpec(containers=[gpu], node_name="gpu-worker-2"),
            status=client.V1PodStatus(phase="Running"),
        ),
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="web", namespace="default", uid="u2"),
            spec=client.V1PodSpec(containers=[client.V1Container(name="web")]),
        ),
    ]
    cluster.core = SimpleNamespace(list_pod_for_all_namespaces=lambda: client.V1PodList(items=pods))
    (found,) = cluster.gpu_pods()
    assert (found.key, found.uid, found.node, found.phase, found.owner, found.container) == (
        "default/ddp-master-0",
        "u1",
        "gpu-worker-2",
        "Running",
        "ddp",
        "pytorch",
    )


def slurm_output_cluster(files: dict[str, str]):
    """A cluster whose slurmctld `cat`s the files given (path -> text); any other path fails."""
    cluster, _ = cluster_with()

    def fake_exec(namespace, pod, container, command):
        assert command[0] == "cat" and (namespace, container) == ("slurm", "slurmctld")
        return (0, files[command[1]], "") if command[1] in files else (1, "", f"cat: {command[1]}: No such file\n")

    cluster.exec_in_pod = fake_exec
    return cluster


OUT, DIGEST = f"{SLURM_OUTPUT_DIR}/allreduce-r1-7.out", f"{host_layout.OUTPUT_DIGEST_DIR}/7.sha256"
RESULT = "# Avg bus bandwidth    : 1.50\n"


def test_slurm_output_is_evidence_only_with_the_digest_recorded_when_the_job_ended():
    recorded = hashlib.sha256(RESULT.encode()).hexdigest() + "\n"
    assert slurm_output_cluster({OUT: RESULT, DIGEST: recorded}).job_output(SLURM, "allreduce-r1", "7") == RESULT


@pytest.mark.parametrize(
    ("files", "why"),
    [
        ({OUT: RESULT.replace("1.50", "9.99"), DIGEST: hashlib.sha256(RESULT.encode()).hexdigest()}, "rewritten"),
        ({OUT: RESULT}, "no output digest recorded when the job ended"),
        ({OUT: RESULT, DIGEST: "\n"}, "no output digest recorded when the job ended"),
    ],
    ids=["rewritten", "no-digest", "empty-digest"],
)
def test_slurm_output_is_refused_in_one_line_when_rewritten_or_unrecorded(files, why):
    with pytest.raises(ClusterError, match=why) as refused:
        slurm_output_cluster(files).job_output(SLURM, "allreduce-r1", "7")
    assert str(refused.value).startswith(OUT) and "\n" not in str(refused.value)

"""The pure half of the real cluster layer: what it makes of squeue, nvidia-smi and pod objects."""

from core.names import slurm_names
from validation.cluster import classify_pod, expand_hostlist, parse_squeue, parse_uuids
from validation.timeline import KUBERNETES, SLURMD, SlurmJob


def test_expand_hostlist():
    assert expand_hostlist("slinky-0") == ("slinky-0",)
    assert expand_hostlist("slinky-[0-2,5]") == ("slinky-0", "slinky-1", "slinky-2", "slinky-5")
    assert expand_hostlist("a-[08-10],b-1") == ("a-08", "a-09", "a-10", "b-1")
    assert expand_hostlist("") == ()


def test_parse_squeue_keeps_nodes_only_for_jobs_that_have_them():
    text = "12|mpi-gpu-r1-1|RUNNING|slinky-[0-1]\n13|mpi-gpu-r1-2|PENDING|(Resources)\n\n"
    assert parse_squeue(text) == [
        SlurmJob("12", "mpi-gpu-r1-1", "RUNNING", ("slinky-0", "slinky-1")),
        SlurmJob("13", "mpi-gpu-r1-2", "PENDING", ()),
    ]


def test_parse_uuids_ignores_noise():
    assert parse_uuids("GPU-1f2e\nNo devices were found\n GPU-3a4b \n") == ("GPU-1f2e", "GPU-3a4b")


def pod(namespace, name, labels, limits, phase="Running", node="gpu-worker-1"):
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": f"{name}-uid", "labels": labels},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "sidecar"},
                {"name": "main", "resources": {"limits": limits}},
            ],
        },
        "status": {"phase": phase},
    }


def test_slurmd_pod_is_owned_by_its_slurm_node():
    labels = {"app.kubernetes.io/name": "slurmd", "nodeset.slinky.slurm.net/pod-hostname": "slinky-3"}
    found = classify_pod(pod("slurm", "slurm-worker-slinky-3", labels, {"nvidia.com/gpu": "1"}), slurm_names("slinky"))
    assert (found.holder, found.owner, found.container, found.node) == (SLURMD, "slinky-3", "main", "gpu-worker-1")


def test_training_operator_and_batch_pods_are_owned_by_their_job():
    names = slurm_names("slinky")
    ddp = classify_pod(
        pod("default", "ddp-worker-0", {"training.kubeflow.org/job-name": "ddp"}, {"nvidia.com/gpu": 1}), names
    )
    inference = classify_pod(
        pod("default", "inf-abcde", {"batch.kubernetes.io/job-name": "inf"}, {"nvidia.com/gpu": 1}), names
    )
    assert (ddp.holder, ddp.owner) == (KUBERNETES, "ddp")
    assert (inference.holder, inference.owner) == (KUBERNETES, "inf")


def test_a_slurmd_labelled_pod_elsewhere_is_not_slurm():
    found = classify_pod(
        pod("default", "x", {"app.kubernetes.io/name": "slurmd"}, {"nvidia.com/gpu": 1}), slurm_names("slinky")
    )
    assert found.holder == KUBERNETES


def test_pods_without_gpus_are_ignored():
    assert classify_pod(pod("default", "web", {}, {"cpu": "1"}), slurm_names("slinky")) is None

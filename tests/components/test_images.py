"""Images on the nodes before the stack is ready, and the PyTorchJob Worker's wait for its Master."""

from components import bootstrap, images, slinky, training_operator
from core import names, trusted_yaml
from stacks.offline import reveal
from tests.conftest import by_type


def _values(tag: str = "25.11.6-ubuntu24.04") -> dict:
    return slinky.slurm_values("1.0.0", tag, names.slurm_names("gpu"))


def test_both_images_of_the_slurmd_pod_follow_the_slurm_chart_values():
    """slurmd follows slurmImageTag; the logfile sidecar (an init container of every slurmd pod)
    is the pinned one of values/slurm.yaml, not the chart's `alpine:latest`."""
    tag = "25.11.9-ubuntu24.04"
    nodeset = _values(tag)["nodesets"]["gpu"]
    expected = [f"{c['image']['repository']}:{c['image']['tag']}" for c in (nodeset["slurmd"], nodeset["logfile"])]
    assert images.worker_images(_values(tag))[:2] == tuple(expected)
    assert expected == [f"ghcr.io/slinkyproject/slurmd:{tag}", "docker.io/library/alpine:3.22.1"]


def test_every_example_job_image_and_the_init_container_are_pulled_once():
    pulled = images.worker_images(_values())
    assert len(pulled) == len(set(pulled))
    for path in sorted(images.JOBS_DIR.glob("*.yaml")):
        text = path.read_text()
        for line in text.splitlines():
            if line.strip().startswith("image:"):
                assert line.split("image:", 1)[1].strip() in pulled, path.name
    assert training_operator.INIT_CONTAINER_IMAGE in pulled


def test_every_worker_pulls_them_in_its_user_data(default_run):
    s = default_run.settings
    values = slinky.slurm_values(s.slinky_version, s.slurm_image_tag, names.slurm_names(s.nodeset_name))
    expected = " ".join(images.worker_images(values))
    workers = [r for r in by_type(default_run, "aws:ec2/instance:Instance") if "worker" in r.name]
    assert len(workers) == default_run.settings.worker_count
    for w in workers:
        env = next(
            f for f in trusted_yaml.load(reveal(w.inputs["userData"]))["write_files"] if f["path"] == bootstrap.ENV_FILE
        )
        assert f"PREPULL_IMAGES='{expected}'" in env["content"].splitlines()


def test_a_worker_waits_for_its_master_as_long_as_any_example_job_may_run():
    for path in sorted(images.JOBS_DIR.glob("*.yaml")):
        job = trusted_yaml.load(path.read_text())
        if job["kind"] == "PyTorchJob":
            deadline = job["spec"]["runPolicy"]["activeDeadlineSeconds"]
            assert deadline <= training_operator.INIT_CONTAINER_MAX_TRIES * 2, path.name
            assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] == "Never"  # why the wait matters

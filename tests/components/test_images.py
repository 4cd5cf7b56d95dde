"""Images on the nodes before the stack is ready, and the PyTorchJob Worker's wait for its Master."""

import yaml

from components import bootstrap, images, names, slinky, training_operator
from stacks.offline import reveal
from tests.conftest import by_type


def test_slurmd_image_is_the_one_the_slurm_chart_runs():
    tag = "25.11.9-ubuntu24.04"
    slurmd = slinky.slurm_values("1.0.0", tag, names.slurm_names("gpu"), {})["nodesets"]["gpu"]["slurmd"]["image"]
    assert images.worker_images(tag)[0] == f"{slurmd['repository']}:{slurmd['tag']}"


def test_every_example_job_image_and_the_init_container_are_pulled_once():
    pulled = images.worker_images("25.11.6-ubuntu24.04")
    assert len(pulled) == len(set(pulled))
    for path in sorted(images.JOBS_DIR.glob("*.yaml")):
        text = path.read_text()
        for line in text.splitlines():
            if line.strip().startswith("image:"):
                assert line.split("image:", 1)[1].strip() in pulled, path.name
    assert training_operator.INIT_CONTAINER_IMAGE in pulled


def test_every_worker_pulls_them_in_its_user_data(default_run):
    expected = " ".join(images.worker_images(default_run.settings.slurm_image_tag))
    workers = [r for r in by_type(default_run, "aws:ec2/instance:Instance") if "worker" in r.name]
    assert len(workers) == default_run.settings.worker_count
    for w in workers:
        env = next(
            f for f in yaml.safe_load(reveal(w.inputs["userData"]))["write_files"] if f["path"] == bootstrap.ENV_FILE
        )
        assert f"PREPULL_IMAGES='{expected}'" in env["content"].splitlines()


def test_a_worker_waits_for_its_master_as_long_as_any_example_job_may_run():
    for path in sorted(images.JOBS_DIR.glob("*.yaml")):
        job = yaml.safe_load(path.read_text())
        if job["kind"] == "PyTorchJob":
            deadline = job["spec"]["runPolicy"]["activeDeadlineSeconds"]
            assert deadline <= training_operator.INIT_CONTAINER_MAX_TRIES * 2, path.name
            assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] == "Never"  # why the wait matters

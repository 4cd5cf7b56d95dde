"""Images on the nodes in the twin, from the program: `images: cold` charges a pull only for an
image the program does not pre-pull, and a Worker waits for its Master as many tries as the
program's overlay gives it (modelled)."""

import dataclasses
import functools
from pathlib import Path

import pytest

from components import images, slinky, training_operator
from components import slurmd_scaling as scaling
from core import settings, trusted_yaml
from core.names import Names
from stacks import offline
from tests.twin import runs
from twin import kube, program, scenario, sim
from twin.kube import KUBERNETES, Kubernetes, Pod

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
OWN_IMAGE = "registry.example/team/train:1.0"


@functools.cache
def dev() -> settings.Settings:
    return offline.stack_settings("dev", [])


@functools.cache
def setup() -> sim.Setup:
    return program.setup(dev(), scaling.DEFAULT_POLICY)


def raw(name: str) -> dict:
    return trusted_yaml.load((SCENARIOS / f"{name}.yaml").read_text())


def run(data: dict, images_on_nodes: str, s: sim.Setup | None = None) -> dict:
    return runs.result(s or setup(), scenario.parse({**data, "images": images_on_nodes}))


def cold_scenarios() -> list[str]:
    """The shipped `images: cold` scenarios whose jobs all run the program's images."""
    return sorted(
        p.stem
        for p in SCENARIOS.glob("*.yaml")
        if raw(p.stem).get("images") == "cold" and not any("image" in j for j in raw(p.stem)["jobs"])
    )


def test_the_twin_runs_the_programs_images_and_its_pre_pull_list():
    s, names = setup(), Names.from_settings(dev())
    values = slinky.slurm_values(dev().slinky_version, dev().slurm_image_tag, names.slurm)
    assert s.prepulled == images.worker_images(values)
    assert s.images["slurmd"] == f"{slinky.IMAGES}/slurmd:{dev().slurm_image_tag}"
    assert s.images["init"] == training_operator.INIT_CONTAINER_IMAGE
    assert set(s.images) == set(kube.IMAGE_PULL), "every role the twin charges a pull for has a reference"


# Every shipped cold scenario on the program's images, and heavy-mix (Slurm, PyTorchJobs, a Job) made cold.
@pytest.mark.parametrize("name", [*cold_scenarios(), "heavy-mix"])
def test_pre_pulled_images_cost_nothing_cold_is_warm(name):
    cold, warm = run(raw(name), "cold"), run(raw(name), "warm")
    assert cold == warm


def test_cold_start_is_in_the_parity_list():
    assert "cold-start" in cold_scenarios()


def test_the_nodes_run_exactly_the_images_the_program_pre_pulls():
    """With nothing pre-pulled, the twin's pods on cold-start (slurmd, a PyTorchJob with a Worker)
    and heavy-mix (a Job as well) run every image of the program's list and no other: so taking
    one off the list is a pull the twin charges (parity above), or a reference no pod runs."""
    bare = dataclasses.replace(setup(), prepulled=())
    pulled = set()
    for name in ("cold-start", "heavy-mix"):
        r = sim.Run(bare, scenario.parse({**raw(name), "images": "cold"}))
        r.run()
        pulled |= {reference for _, reference in r.kube.pulled}
    assert pulled == set(setup().prepulled)


def test_an_image_not_pre_pulled_still_pays_its_pull_on_each_node():
    data = raw("cold-start")
    for job in data["jobs"]:
        if job["kind"] == "pytorchjob":
            job["image"] = OWN_IMAGE
    cold, warm = run(data, "cold"), run(data, "warm")
    ddp = {r["name"]: r for r in cold["jobs"]}["ddp"], {r["name"]: r for r in warm["jobs"]}["ddp"]
    # the Master's node pulls it, then the Worker's, once its init container has found the Master
    assert ddp[0]["started"] - ddp[1]["started"] == 2 * kube.IMAGE_PULL["pytorch"]
    assert cold["latency"] == warm["latency"], "slurmd's images are still pre-pulled"


def test_the_twin_gives_a_worker_the_programs_tries():
    assert setup().init_tries == training_operator.INIT_CONTAINER_MAX_TRIES == 1800
    assert program.init_container_tries("v1.8.1") == 1800


def _late_master(tries: int) -> tuple[Pod, Pod, Kubernetes]:
    """The Worker bound first, the Master Pending behind another pod until 250 s."""
    cluster = Kubernetes(gpus=2, cold=False, init_tries=tries)
    job = cluster.submit("ddp", "pytorchjob", 2, 600, 0.0)
    master, worker = job.pods
    worker.created, master.created = 0.0, 1.0  # the scheduler takes the Worker first
    blocker = cluster.create_pod(Pod("blocker", KUBERNETES, "x", "job", 0.5))
    for t in range(300):
        if t == 250:
            cluster.pod_gone(blocker, t)
        cluster.step(t)
    return master, worker, cluster


def test_out_of_tries_the_worker_fails_its_job_with_upstreams_default():
    master, worker, cluster = _late_master(kube.INIT_TRIES_DEFAULT)
    (job,) = cluster.jobs
    assert job.failed and job.finished == kube.INIT_TRIES_DEFAULT * kube.INIT_INTERVAL  # 100 tries x 2 s
    assert worker.running_at is None and master.gpu is None and not master.live


def test_with_the_programs_tries_the_worker_waits_for_a_late_master():
    master, worker, cluster = _late_master(setup().init_tries)
    assert master.running_at == 255 and worker.running_at == 260 and not cluster.jobs[0].failed


def test_late_master_scenario_completes_and_would_fail_with_upstreams_default():
    """The shipped scenario: the Master pulls the job's own image while the Worker, on a node that
    has it, waits in its init container."""
    sc = scenario.load(SCENARIOS / "late-master.yaml")
    ok = sim.Run(setup(), sc).run()
    upstream = sim.Run(dataclasses.replace(setup(), init_tries=kube.INIT_TRIES_DEFAULT), sc).run()
    outcome = {j["name"]: j["outcome"] for j in ok["jobs"]}, {j["name"]: j["outcome"] for j in upstream["jobs"]}
    assert outcome == ({"prime": "completed", "ddp": "completed"}, {"prime": "completed", "ddp": "failed"})
    assert sim.ok(ok) and not sim.ok(upstream)
    ddp = next(j for j in ok["jobs"] if j["name"] == "ddp")
    assert ddp["started"] - ddp["submitted"] > kube.INIT_TRIES_DEFAULT * kube.INIT_INTERVAL


def test_a_scenarios_image_is_a_reference_on_a_kubernetes_job_only():
    with pytest.raises(scenario.ScenarioError) as error:
        scenario.parse(
            {
                "duration": 10,
                "jobs": [
                    {"name": "a", "kind": "job", "submit": 0, "runtime": 5, "image": "bad image"},
                    {"name": "b", "kind": "slurm", "submit": 0, "runtime": 5, "image": OWN_IMAGE},
                ],
            }
        )
    assert error.value.problems == [
        'jobs[0] (a).image: "bad image" is not allowed; expected an image reference such as '
        "registry.example/team/train:1.0",
        f'jobs[1] (b).image: "{OWN_IMAGE}" is not allowed; expected no image on a slurm job (pytorchjob and job only)',
    ]

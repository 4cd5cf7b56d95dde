import re

import pytest

from validation.scenarios import (
    AFTER_SCALE_DOWN,
    JOBS_DIR,
    SCENARIOS,
    WHILE_SLURM_HOLDS_ALL,
    PlannedKube,
    kube_gpus,
    load_objects,
    plan,
    sbatch_options,
    slurm_gpus,
)

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def test_gpu_demand_of_the_job_files():
    assert slurm_gpus((JOBS_DIR / "slurm/mpi-gpu.sbatch").read_text()) == 2
    assert slurm_gpus((JOBS_DIR / "slurm/gpu-smoke.sbatch").read_text()) == 1
    assert slurm_gpus((JOBS_DIR / "slurm/openfoam-cavity.sbatch").read_text()) == 2
    assert kube_gpus(load_objects(JOBS_DIR / "kubernetes/pytorchjob-ddp.yaml")[0]) == 2
    assert kube_gpus(load_objects(JOBS_DIR / "kubernetes/inference-job.yaml")[0]) == 1


def test_sbatch_options_read_long_short_typed_and_untyped_gres():
    script = "#!/bin/bash\n#SBATCH -N 3\n#SBATCH --gres=gpu:tesla:2,shard:4\n#SBATCH --ntasks-per-node=2 # two\necho\n"
    assert sbatch_options(script) == {"--nodes": "3", "--gres": "gpu:tesla:2,shard:4", "--ntasks-per-node": "2"}
    assert slurm_gpus(script) == 6
    assert slurm_gpus("#SBATCH --nodes=2\n#SBATCH --gres=gpu\n") == 2
    assert slurm_gpus("#SBATCH --nodes=2\n") == 0


def test_mpi_job_has_the_reference_shape():
    options = sbatch_options((JOBS_DIR / "slurm/mpi-gpu.sbatch").read_text())
    assert (options["--nodes"], options["--ntasks-per-node"], options["--gres"]) == ("2", "2", "gpu:1")


@pytest.mark.parametrize("name", SCENARIOS)
def test_planned_names_are_unique_and_valid_everywhere(name):
    planned = plan(SCENARIOS[name], "r123456")
    names = [p.name for p in planned]
    assert len(set(names)) == len(names)
    assert all(DNS_1035.match(n) and len(n) <= 63 for n in names)
    for p in planned:
        if isinstance(p, PlannedKube):
            assert p.obj["metadata"]["name"] == p.name


def test_scenario_demands():
    demand = {name: sum(p.gpus for p in plan(s, "r1")) for name, s in SCENARIOS.items()}
    assert demand == {"hpc-parallel": 4, "mixed": 4, "heavy-mixed": 9, "handoff": 5, "leak-probe": 4, "nccl": 4}


def test_leak_probe_holds_every_gpu_of_the_stack_then_probes_without_a_request():
    hold, probe = plan(SCENARIOS["leak-probe"], "r1", gpus_total=2)
    assert "#SBATCH --nodes=2" in hold.script.splitlines() and hold.gpus == 2
    assert (probe.after, probe.gpus) == (WHILE_SLURM_HOLDS_ALL, 0)
    (container,) = probe.obj["spec"]["template"]["spec"]["containers"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in container["env"]
    assert "nvidia.com/gpu" not in str(container["resources"])
    assert probe.obj["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


def test_handoff_pytorchjob_takes_every_gpu_after_scale_down():
    _, job = plan(SCENARIOS["handoff"], "r1")
    assert (job.after, job.gpus) == (AFTER_SCALE_DOWN, 4)
    specs = job.obj["spec"]["pytorchReplicaSpecs"]
    assert (specs["Master"]["replicas"], specs["Worker"]["replicas"]) == (1, 3)


def test_replica_templates_are_independent_copies():
    # The file shares one pod template through a YAML anchor; the plan must not.
    (obj,) = load_objects(JOBS_DIR / "kubernetes/pytorchjob-ddp.yaml")
    specs = obj["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["template"] == specs["Worker"]["template"]
    specs["Master"]["template"]["spec"]["containers"][0]["image"] = "changed"
    assert specs["Worker"]["template"]["spec"]["containers"][0]["image"] != "changed"

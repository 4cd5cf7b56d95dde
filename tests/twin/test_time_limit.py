"""slurmJobMaxMinutes in the twin's Slurm: the partitions' MaxTime read from the rendered slurm.conf,
a job that outlasts its time limit ended there as TIMEOUT (outcome timed_out, as a Kubernetes job
Kueue stops at its run limit: its own limit, not the hand-off), and a --time over MaxTime refused at
submit as components/job_submit.lua refuses it."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import yaml

from cli.__main__ import main
from components import slurmd_scaling as scaling
from core import settings
from stacks import offline
from twin import program, scenario, sim
from twin.scenario import JobSpec
from twin.slurm import COMPLETED, PENDING, TIMEOUT, SlurmConfig, Slurmctld

ROOT = Path(__file__).resolve().parents[2]


def dev(*config: str) -> settings.Settings:
    return offline.stack_settings("dev", list(config))


def run(
    jobs: list[dict],
    *config: str,
    policy: str = scaling.DEFAULT_POLICY,
    duration: int = 1500,
    setup: sim.Setup | None = None,
    faults: list[dict] | None = None,
) -> dict:
    """The jobs on 4 workers; under `setup` if given, else the program's for the config and policy."""
    data = {"workers": 4, "duration": duration, "jobs": jobs, "faults": faults or []}
    return sim.Run(setup or program.setup(dev(*config), policy), scenario.parse(data)).run()


def by_name(result: dict) -> dict[str, dict]:
    return {j["name"]: j for j in result["jobs"]}


def test_the_twin_reads_maxtime_from_the_rendered_slurm_conf():
    assert program.setup(dev()).slurm.max_minutes == 60  # slurmJobMaxMinutes' default
    assert program.setup(dev("slurmJobMaxMinutes=7")).slurm.max_minutes == 7
    # The older policies ran with the chart's partitions: MaxTime=UNLIMITED.
    assert program.setup(dev("slurmJobMaxMinutes=7"), scaling.PREVIOUS).slurm.max_minutes is None


def test_a_job_that_outlasts_its_limit_ends_there_as_timeout_and_frees_its_node():
    jobs = [
        {"name": "long", "kind": "slurm", "submit": 0, "runtime": 900, "nodes": 1},  # over MaxTime (5 min)
        {"name": "own", "kind": "slurm", "submit": 0, "runtime": 600, "nodes": 1, "time": 2},  # over its --time
        {"name": "fits", "kind": "slurm", "submit": 0, "runtime": 300, "nodes": 1},  # exactly MaxTime: completes
        {"name": "next", "kind": "slurm", "submit": 0, "runtime": 60, "nodes": 4},  # needs every node
    ]
    r = run(jobs, "slurmJobMaxMinutes=5")
    got = by_name(r)

    def ends_at(job: dict, limit: int) -> float:
        """slurmctld's first 30 s limit check at or after the limit, then KillWait (30 s)."""
        return math.ceil((job["started"] + limit) / 30) * 30 + 30

    assert got["long"]["outcome"] == "timed_out" and got["long"]["finished"] == ends_at(got["long"], 300)
    assert got["own"]["outcome"] == "timed_out" and got["own"]["finished"] == ends_at(got["own"], 120)
    assert got["long"]["finished"] - got["long"]["started"] > 300  # never at the limit itself
    assert got["fits"]["outcome"] == "completed" and got["fits"]["finished"] - got["fits"]["started"] == 300
    assert got["long"]["reason"] == "slurmctld ended it at its time limit, 5 min (TIMEOUT)"
    assert got["next"]["outcome"] == "completed" and got["next"]["started"] >= got["long"]["finished"]
    # Visible, and not the hand-off's doing: nothing killed; the run fails, as for a Kubernetes job
    # Kueue stopped at its run limit.
    assert r["timed_out"] == ["long", "own"] and r["killed"] == [] and not sim.ok(r)
    # The same jobs under the previous policy (MaxTime UNLIMITED) run their whole work.
    prev = by_name(run(jobs, "slurmJobMaxMinutes=5", policy=scaling.PREVIOUS, duration=2400))
    assert prev["long"]["outcome"] == "completed" and prev["long"]["finished"] - prev["long"]["started"] == 900


def test_a_time_over_maxtime_is_refused_at_submit_with_the_lua_message():
    jobs = [
        {"name": "over", "kind": "slurm", "submit": 0, "runtime": 60, "time": 61, "gpus": 2},
        {"name": "at", "kind": "slurm", "submit": 0, "runtime": 60, "time": 60},
    ]
    got = by_name(run(jobs))
    assert got["over"]["outcome"] == "refused" and got["at"]["outcome"] == "completed"
    assert got["over"]["reason"] == (
        "sbatch: error: testbed: a time limit of 61 minutes is over MaxTime=60 of partition all, the longest a "
        "Slurm job may run on this testbed (setting slurmJobMaxMinutes); ask --time=60 or less; "
        "sbatch: error: Batch job submission failed: Requested time limit is invalid (missing or exceeds some limit)"
    )


def test_without_the_lua_a_time_over_maxtime_would_pend_forever():
    """What the refusal prevents (PartitionTimeLimit under EnforcePartLimits=NO)."""
    slurm = Slurmctld(SlurmConfig("all", "slinky", job_submit_lua=False, max_minutes=60))
    slurm.register("slinky-0", 0)
    (over,) = slurm.submit(JobSpec("over", "slurm", 0, 60, time=61), 0)
    (fits,) = slurm.submit(JobSpec("fits", "slurm", 0, 60, time=60), 0)
    for t in range(200):
        slurm.step(t)
    assert over.state == PENDING and fits.state == COMPLETED
    assert slurm.partition_metrics(200)["all"]["slurm_partition_jobs_pending"] == 1


def test_array_tasks_each_run_under_the_limit():
    slurm = Slurmctld(SlurmConfig("all", "slinky", job_submit_lua=True, max_minutes=1))
    for i in range(2):
        slurm.register(f"slinky-{i}", 0)
    tasks = slurm.submit(JobSpec("a", "slurm", 0, 90, nodes=1, array=2), 0)
    for t in range(100):
        slurm.step(t)
    # the limit at 60 is a check; KillWait 30 s more
    assert [(j.state, j.finished) for j in tasks] == [(TIMEOUT, 90), (TIMEOUT, 90)]


def test_simulate_takes_the_setting_and_lists_the_timed_out_jobs(tmp_path, capsys):
    path = tmp_path / "long.yaml"
    path.write_text(
        yaml.safe_dump({"duration": 900, "jobs": [{"name": "l", "kind": "slurm", "submit": 0, "runtime": 600}]})
    )
    assert main(["simulate", "--scenario", str(path), "--json", "--config", "slurmJobMaxMinutes=3"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["timed_out"] == ["l"] and out["jobs"][0]["outcome"] == "timed_out" and out["killed"] == []
    # Its end is an end like any other: the GPU return is measured from it.
    assert out["latency"]["gpu_return_s"] is not None


def test_no_shipped_scenario_has_a_slurm_job_longer_than_the_default_limit():
    """Their results stay what they were before MaxTime: every Slurm job's work fits in 60 minutes."""
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        sc = scenario.load(path)
        assert all(j.runtime <= 60 * 60 and j.time is None for j in sc.jobs if j.kind == "slurm"), path.name


def test_a_job_after_one_that_timed_out_is_cancelled_and_slurmd_stops_cycling_for_it():
    """e depends on a (afterok), which outlasts its 1-minute --time: e can never run. With the
    rendered DependencyParameters=kill_invalid_depend slurmctld cancels it and slurmd goes for good;
    without it e pends for ever, which the runnable-jobs exporter leaves out, and with the exporter
    lost slurmd starts for it each time the stall memory runs out."""
    jobs = [
        {"name": "a", "kind": "slurm", "submit": 0, "runtime": 300, "time": 1},
        {"name": "e", "kind": "slurm", "submit": 0, "runtime": 60, "after": "a"},
    ]
    duration = 3 * 3600  # for the lost exporter's cycles below; an hour shows the rest
    setup = program.setup(dev())
    assert setup.slurm.kill_invalid_depend
    before = dataclasses.replace(setup, slurm=dataclasses.replace(setup.slurm, kill_invalid_depend=False))
    now, then = run(jobs, duration=3600), run(jobs, duration=3600, setup=before)
    assert by_name(now)["e"]["outcome"] == "cancelled" and "DependencyNeverSatisfied" in by_name(now)["e"]["reason"]
    # one pod for a; e, waiting on a, brings none (the runnable-jobs exporter reads its dependency)
    assert now["slurmd_starts"] == 1 and now["end"]["slurmd_replicas"] == 0
    assert by_name(then)["e"]["outcome"] == "unfinished"
    # pending for good (DependencyNeverSatisfied), e holds no GPU either; with the exporter lost, a
    # fresh start each time the stall memory runs out, about every 32 minutes
    assert then["slurmd_starts"] == now["slurmd_starts"]
    lost = run(
        jobs, duration=duration, setup=before, faults=[{"kind": "runnable-exporter-down", "start": 0, "end": duration}]
    )
    cycle = scaling.STALL_MEMORY_SECONDS + scaling.STALL_SECONDS
    assert lost["slurmd_starts"] >= now["slurmd_starts"] + (duration - 80) // cycle

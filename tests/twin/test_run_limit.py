"""The run limit in the twin: the program's policies refuse a Kubernetes job at submit, and Kueue
stops an admitted one at its declared limit (timed_out, not killed by the hand-off)."""

from __future__ import annotations

import pytest

from cli.__main__ import main
from components import ai_run_limit
from components import kueue as program_kueue
from components import slurmd_scaling as scaling
from core import settings
from core.names import GpuShares
from stacks import offline
from twin import kube, program, scenario, sim
from twin.kueue import Kueue


def dev(*overrides: str) -> settings.Settings:
    return offline.stack_settings("dev", list(overrides))


def run(jobs: list[dict], *overrides: str, duration: int = 3000, workers: int = 4) -> dict:
    sc = scenario.parse({"workers": workers, "duration": duration, "jobs": jobs})
    return sim.Run(program.setup(dev(*overrides, f"workerCount={workers}"), scaling.DEFAULT_POLICY), sc).run()


def by_name(result: dict) -> dict[str, dict]:
    return {j["name"]: j for j in result["jobs"]}


def test_the_twin_reads_the_limits_from_the_rendered_policies():
    setup = program.setup(dev("aiJobMaxMinutes=30", "workerCount=2"))
    assert setup.run_limit == ai_run_limit.Limits(1800, 2)
    assert setup.run_limit == ai_run_limit.limits(ai_run_limit.objects(30, 2))


def test_an_admitted_job_is_stopped_at_its_limit_and_its_gpu_goes_to_the_next():
    jobs = [
        {"name": "long", "kind": "job", "submit": 0, "runtime": 900, "gpus": 4, "limit": 300},
        {"name": "next", "kind": "job", "submit": 10, "runtime": 60, "gpus": 4},
    ]
    result = run(jobs)
    long, nxt = by_name(result)["long"], by_name(result)["next"]
    assert long["outcome"] == "timed_out" and long["finished"] == long["admitted"] + 300
    assert "300 s admitted" in long["reason"]
    assert result["killed"] == []  # the hand-off killed nothing
    assert nxt["outcome"] == "completed" and nxt["started"] > long["finished"]  # after its pods went
    assert not sim.ok(result)  # work was lost: simulate exits 1


def test_a_job_without_a_limit_declares_the_stacks_and_a_longer_setting_lets_it_finish():
    jobs = [{"name": "p", "kind": "pytorchjob", "submit": 0, "runtime": 4000, "replicas": 2}]
    (p,) = run(jobs, duration=5000)["jobs"]
    assert p["outcome"] == "timed_out" and p["finished"] == p["admitted"] + 3600
    (p,) = run(jobs, "aiJobMaxMinutes=120", duration=5000)["jobs"]
    assert p["outcome"] == "completed"


def test_a_limit_above_the_setting_or_a_job_wider_than_the_workers_is_refused_at_submit():
    jobs = [
        {"name": "late", "kind": "pytorchjob", "submit": 0, "runtime": 60, "limit": 2701},
        {"name": "wide", "kind": "pytorchjob", "submit": 0, "runtime": 60, "replicas": 3},
        {"name": "fits", "kind": "pytorchjob", "submit": 0, "runtime": 60, "replicas": 2, "limit": 2700},
    ]
    result = run(jobs, "aiJobMaxMinutes=45", workers=2)
    rows = by_name(result)
    assert rows["late"]["outcome"] == "refused" and rows["late"]["started"] is None
    assert rows["late"]["reason"] == "run limit 2701 s is above the stack's 2700 s (aiJobMaxMinutes 45)"
    assert rows["wide"]["outcome"] == "refused"
    assert rows["wide"]["reason"] == "asks for 3 GPUs; the workers have 2 (workerCount)"
    assert rows["fits"]["outcome"] == "completed"
    assert sim.ok(result)  # refused at submit, as Slurm's refusals: the user is told at once


def test_without_kueue_no_policy_applies():
    jobs = [{"name": "late", "kind": "job", "submit": 0, "runtime": 60, "limit": 99999}]
    sc = scenario.parse({"workers": 4, "duration": 600, "kueue": False, "jobs": jobs})
    (late,) = sim.Run(program.setup(dev()), sc).run()["jobs"]
    assert late["outcome"] == "completed"  # an unqueued job carries no queue label: not matched


def test_simulate_prints_the_refusal_and_the_timeout(tmp_path, capsys):
    path = tmp_path / "limits.yaml"
    path.write_text(
        "workers: 4\nduration: 900\njobs:\n"
        "  - {name: late, kind: job, submit: 0, runtime: 60, limit: 3601}\n"
        "  - {name: slow, kind: job, submit: 0, runtime: 600, limit: 120}\n"
    )
    assert main(["simulate", "--scenario", str(path)]) == 1
    out = capsys.readouterr().out
    assert "late             job         refused    submitted 0: run limit 3601 s is above the stack's 3600 s" in out
    assert "slow             job         timed_out" in out and "Kueue stopped it after 120 s admitted" in out


def test_admitted_time_adds_up_over_re_admissions():
    """Evicted by waitForPodsReady after 600 s admitted, readmitted 60 s later: a 900 s limit
    leaves 300 s (AccumulatedPastExecutionTimeSeconds), not another 900."""
    objects = program_kueue.objects(GpuShares(1, 1, True, False, False))
    q = Kueue.from_program(objects, program_kueue.manager_config("0.19.2"))
    cluster = kube.Kubernetes(gpus=1, cold=False)
    cluster.create_pod(kube.Pod("unlabelled-0", kube.KUBERNETES, "unlabelled", "job", 0.0))
    cluster.step(0.0)  # a pod outside Kueue holds the only GPU: the job's pod never runs
    job = cluster.submit("stuck", "job", 1, 60, 0.0, suspended=True)
    w = q.add(job, 1, 0.0, limit=900)
    for t in range(0, 1500):
        q.step(cluster, float(t))
        cluster.step(float(t))
    assert w.evictions == 1 and w.deactivated_at == 600 + 60 + 300
    assert job.finished == w.deactivated_at and not job.pods[0].live


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ("limit: 0", 'jobs[0] (a).limit: "0" is not allowed; expected an integer from 1 to 604800'),
        ("limit: 1.5", 'jobs[0] (a).limit: "1.5" is not allowed; expected an integer'),
    ],
)
def test_a_bad_limit_is_refused_in_the_scenario(extra, fragment):
    data = {"duration": 600, "jobs": [{"name": "a", "kind": "job", "submit": 0, "runtime": 60}]}
    key, value = extra.split(": ")
    data["jobs"][0][key] = float(value) if "." in value else int(value)
    with pytest.raises(scenario.ScenarioError) as error:
        scenario.parse(data)
    assert any(p.startswith(fragment) for p in error.value.problems), error.value.problems


def test_a_slurm_job_takes_no_limit():
    data = {"duration": 600, "jobs": [{"name": "a", "kind": "slurm", "submit": 0, "runtime": 60, "limit": 60}]}
    with pytest.raises(scenario.ScenarioError) as error:
        scenario.parse(data)
    assert error.value.problems == [
        'jobs[0] (a).limit: "60" is not allowed; expected no limit on a slurm job (pytorchjob and job only)'
    ]


def test_a_stopped_jobs_quota_stays_reserved_until_its_pods_are_gone():
    """Kueue 0.19.2 clears a stopped job's admission only once the job is no longer active
    (jobframework reconciler.go, "handle eviction"): at the limit its pod terminates (5 s) and only
    then is the GPU's quota free for the next job."""
    objects = program_kueue.objects(GpuShares(1, 1, True, False, False))
    q = Kueue.from_program(objects, program_kueue.manager_config("0.19.2"))
    cluster = kube.Kubernetes(gpus=1, cold=False)
    long = cluster.submit("long", "job", 1, 900, 0.0, suspended=True)
    w = q.add(long, 1, 0.0, limit=300)
    nxt = q.add(cluster.submit("next", "job", 1, 60, 10.0, suspended=True), 1, 10.0)
    usage = {}
    for t in range(0, 400):
        q.step(cluster, float(t))
        cluster.step(float(t))
        usage[t] = q.usage(program_kueue.AI_CLUSTER_QUEUE)
    stopped = w.deactivated_at
    assert stopped is not None and long.finished == stopped
    gone = long.pods[0].gone_at
    assert gone == stopped + kube.TERMINATION
    assert all(usage[t] == 1 for t in range(int(stopped), int(gone))), "still reserved while its pod goes"
    assert nxt.first_admitted is not None and nxt.first_admitted >= gone

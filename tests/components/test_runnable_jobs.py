"""The runnable-jobs function on job records shaped as slurmrestd 26.05.5 listed them (v0.0.44;
tests/engines/test_runnable_jobs.py reads the real ones), the metrics it serves, and the exporter's
rule that a reading it could not refresh is not served."""

from __future__ import annotations

import pytest

from components import runnable_jobs as rj

NOW = 1_000_000


def n(value: int, set_: bool = True) -> dict:
    return {"set": set_, "infinite": False, "number": value}


def job(job_id: int, reason: str = "PartitionConfig", state: str = "PENDING", **fields) -> dict:
    """A record with the fields the function reads, as the real list has them for a plain sbatch."""
    record = {
        "job_id": job_id,
        "job_state": [state],
        "state_reason": reason,
        "partition": "all",
        "node_count": n(1),
        "max_nodes": n(1),
        "start_time": n(0),
        "eligible_time": n(NOW - 10),
        "dependency": "",
        "hold": False,
        "array_job_id": n(0),
        "array_max_tasks": n(0),
        "array_task_string": "",
    }
    return record | fields


def count(*jobs: dict, partitions=("all", "slinky")) -> dict[str, rj.Runnable]:
    return rj.runnable_pending(jobs, partitions, NOW)


@pytest.mark.parametrize("reason", ["PartitionConfig", "PartitionNodeLimit", "Resources", "Priority", "None"])
def test_work_a_node_would_start_is_runnable(reason):
    assert rj.is_runnable(job(1, reason), NOW)


@pytest.mark.parametrize(
    "record",
    [
        # At submit slurmctld says PartitionConfig for these too: their fields tell.
        job(1, eligible_time=n(NOW + 60), start_time=n(NOW + 60)),
        job(2, dependency="afterok:1(unfulfilled)"),
        job(3, dependency="afterok:1(failed)", reason="DependencyNeverSatisfied"),
        job(4, "JobHeldUser", hold=True, eligible_time=n(0)),
        job(5, "JobHeldAdmin", hold=True),
        job(6, "PartitionTimeLimit"),
        job(7, "QOSMaxJobsPerUserLimit"),
        job(8, "AssocGrpGRES"),
        job(9, "BeginTime", start_time=n(NOW + 1)),
    ],
    ids=lambda r: f"{r['state_reason']} {r['dependency']}".strip(),
)
def test_work_that_waits_for_something_else_is_not(record):
    assert not rj.is_runnable(record, NOW)


def test_a_stale_reason_is_read_past_once_the_fields_say_the_wait_is_over():
    """slurmctld clears BeginTime and Dependency at its next scheduling pass; the job could start now."""
    assert rj.is_runnable(job(1, "BeginTime", start_time=n(NOW - 1), eligible_time=n(NOW - 1)), NOW)
    assert rj.is_runnable(job(2, "Dependency", dependency=""), NOW)


def test_counts_per_partition_with_the_widest_job():
    jobs = [
        job(1),
        job(2, node_count=n(2), max_nodes=n(3)),  # -N 2-3: MAX(max_nodes, min_nodes), as statistics.c
        job(3, partition="slinky", max_nodes=n(0, set_=False)),
        job(4, partition="slinky,all"),  # multi-partition: the first of its partitions listed
        job(5, partition="other"),
        job(6, state="RUNNING", reason="None"),
        job(7, "JobHeldUser", hold=True, node_count=n(4), max_nodes=n(4)),
    ]
    assert count(*jobs) == {"all": rj.Runnable(2, 3, 1), "slinky": rj.Runnable(2, 1, 1)}


def test_the_job_first_in_line_is_the_first_runnable_one_in_slurmctlds_queue_order():
    """Higher priority first, then earlier submission, then the lower job id (job_scheduler.c
    sort_job_queue2); work that is not runnable is not in line, however early."""
    wide = job(5, node_count=n(4), max_nodes=n(4), priority=n(10), submit_time=n(NOW - 50))
    narrow = [job(i, priority=n(10), submit_time=n(NOW - 10)) for i in (3, 4)]
    held_earlier = job(1, "JobHeldUser", hold=True, priority=n(0), submit_time=n(NOW - 99))
    assert count(wide, *narrow, held_earlier)["all"] == rj.Runnable(3, 4, 4)
    assert count(wide | {"submit_time": n(NOW)}, *narrow)["all"].first_job_nodes == 1
    assert count(wide | {"submit_time": n(NOW), "priority": n(11)}, *narrow)["all"].first_job_nodes == 4
    same_time = job(2, node_count=n(2), max_nodes=n(2), priority=n(10), submit_time=n(NOW - 10))
    assert count(*narrow, same_time)["all"].first_job_nodes == 2  # the lower job id


def test_an_empty_list_reads_zero_in_every_partition():
    assert count() == {"all": rj.Runnable(), "slinky": rj.Runnable()}


@pytest.mark.parametrize(
    "task_string, tasks", [("0-2%1", 3), ("1-7", 7), ("1,3,5-9:2", 5), ("4", 1), ("", 0), ("0-7%2", 8)]
)
def test_array_task_count(task_string, tasks):
    assert rj.array_task_count(task_string) == tasks


def test_an_array_counts_only_the_tasks_its_throttle_lets_start():
    """--array=0-7%3 with one task running: 2 more may start; its pending record is one entry."""
    pending = job(10, "JobArrayTaskLimit", array_job_id=n(10), array_max_tasks=n(3), array_task_string="1-7%3")
    running = job(11, "None", state="RUNNING", array_job_id=n(10), array_max_tasks=n(3))
    assert count(pending, running)["all"] == rj.Runnable(2, 1, 1)
    full = [running | {"job_id": 11 + i} for i in range(3)]
    assert count(pending, *full)["all"] == rj.Runnable()
    unthrottled = pending | {"array_max_tasks": n(0), "state_reason": "Resources"}
    assert count(unthrottled, running)["all"] == rj.Runnable(7, 1, 1)


def test_exposition_serves_every_partition_in_prometheus_text_format():
    text = rj.exposition({"all": rj.Runnable(2, 3), "slinky": rj.Runnable()})
    assert f'{rj.RUNNABLE_JOBS}{{partition="all"}} 2' in text.splitlines()
    assert f'{rj.RUNNABLE_MAX_JOB_NODES}{{partition="slinky"}} 0' in text.splitlines()
    assert f'{rj.RUNNABLE_FIRST_JOB_NODES}{{partition="all"}} 0' in text.splitlines()
    assert text.count("# TYPE") == 3


def test_the_exporter_serves_nothing_when_its_read_fails():
    """A lost slurmrestd is a lost input, never a zero: the series go stale and the rule falls back."""
    answers: list = [[job(1)]]

    def read() -> list[dict]:
        if isinstance(answers[0], Exception):
            raise answers[0]
        return answers[0]

    exporter = rj.Exporter(("all",), read, clock=lambda: NOW)
    assert f'{rj.RUNNABLE_JOBS}{{partition="all"}} 1' in exporter.metrics()
    for failure in (OSError("connection refused"), ValueError("not JSON"), RuntimeError("slurmrestd errors")):
        answers[0] = failure
        assert exporter.metrics() == ""


def test_the_exporter_reads_the_token_file_on_every_request(tmp_path, monkeypatch):
    """The Token's Secret rotates the JWT in place: each read sends the file's current token."""
    token = tmp_path / "SLURM_JWT"
    sent = []

    class Response:
        def __init__(self, body: bytes):
            self.body = body

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self) -> bytes:
            return self.body

    def urlopen(request, timeout):
        sent.append((request.full_url, request.get_header(rj.TOKEN_HEADER.capitalize())))
        return Response(b'{"jobs": [], "errors": []}')

    monkeypatch.setattr(rj.urllib.request, "urlopen", urlopen)
    env = {
        rj.ENV_URL: "http://slurm-restapi.slurm:6820",
        rj.ENV_TOKEN_FILE: str(token),
        rj.ENV_PARTITIONS: "all,slinky",
    }
    exporter, port = rj.exporter_from_env(env)
    for jwt in ("first", "rotated"):
        token.write_text(jwt + "\n")
        exporter.metrics()
    assert sent == [("http://slurm-restapi.slurm:6820/slurm/v0.0.44/jobs/", t) for t in ("first", "rotated")]
    assert exporter.partitions == ("all", "slinky") and port == 8080
    assert f'{rj.RUNNABLE_JOBS}{{partition="slinky"}} 0' in exporter.metrics()


def test_the_exporter_refuses_a_missing_setting_naming_each():
    with pytest.raises(ValueError, match=f"set {rj.ENV_URL}, {rj.ENV_TOKEN_FILE}, {rj.ENV_PARTITIONS}"):
        rj.exporter_from_env({})

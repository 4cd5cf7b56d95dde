"""components/job_submit.lua run by a real Lua 5.3 (the version the Slinky 25.11 images link: Slurm's
debian/control build-depends on liblua5.3-dev) with a stub `slurm` table shaped as slurmctld builds it
(SchedMD/slurm@slurm-25-11-0-1:src/lua/slurm_lua.c, src/plugins/job_submit/lua/job_submit_lua.c), and
against the twin's model of it (twin/slurm.py job_submit)."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess

import pytest

from components import slinky
from core import names
from twin import slurm

NO_VAL, INFINITE = 0xFFFFFFFE, 0xFFFFFFFF
# Error numbers as slurm/slurm_errno.h numbers them (ESLURM_INVALID_PARTITION_NAME = 2000, ...).
SUCCESS, ESLURM_INVALID_NODE_COUNT, ESLURM_INVALID_TIME_LIMIT, ESLURM_INVALID_GRES = 0, 2006, 2051, 2072
ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE = 2014
ESLURM_ACCESS_DENIED = 2002
# name: (flag_default, max_nodes, max_time); UNLIMITED is INFINITE in the partition record
PARTITIONS = {"all": (1, 4, 60), "slinky": (0, 4, 30), "wide": (0, INFINITE, INFINITE)}

DRIVER = r"""
local results = {}
slurm = {
  SUCCESS = 0, ERROR = -1, NO_VAL = 4294967294.0, INFINITE = 4294967295.0,
  ESLURM_INVALID_NODE_COUNT = 2006, ESLURM_INVALID_TIME_LIMIT = 2051, ESLURM_INVALID_GRES = 2072,
  ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE = 2014, ESLURM_ACCESS_DENIED = 2002,
  log_info = function(fmt, ...) string.format(fmt, ...) end,
  log_user = function(fmt, ...) results.msg = (results.msg and results.msg .. "|" or "") .. string.format(fmt, ...) end,
}
assert(dofile(SCRIPT) == slurm.SUCCESS, "the script returns SUCCESS on load")
assert(type(slurm_job_modify) == "function", "slurm_job_modify is required")
local part_list = {}
for name, p in pairs(PARTS) do
  part_list[name] = {name = name, flag_default = p[1] + 0.0, max_nodes = p[2] + 0.0, max_time = p[3] + 0.0}
end
for i, case in ipairs(CASES) do
  results = {}
  -- Unset fields as slurmctld pushes them: NO_VAL, NO_VAL16 (65534) for 16-bit ones, nil for strings.
  local job = {min_nodes = slurm.NO_VAL, max_nodes = slurm.NO_VAL, num_tasks = slurm.NO_VAL, time_limit = slurm.NO_VAL,
    min_cpus = slurm.NO_VAL, cpus_per_task = 65534.0, ntasks_per_node = 65534.0, pn_min_cpus = 65534.0,
    priority = slurm.NO_VAL}
  local rec = nil
  local uid = 1000.0
  for k, v in pairs(case) do
    if k == "uid" then
      uid = v + 0.0
    elseif k == "rec" then
      rec = {}
      for rk, rv in pairs(v) do rec[rk] = type(rv) == "number" and rv + 0.0 or rv end
    else
      job[k] = type(v) == "number" and v + 0.0 or v
    end
  end
  local rc
  if rec then rc = slurm_job_modify(job, rec, part_list, uid) else rc = slurm_job_submit(job, part_list, uid) end
  print(string.format("%d\t%d\t%d\t%s", rc, job.min_nodes, job.max_nodes, results.msg or ""))
end
"""


def _lua() -> str | None:
    found = shutil.which("lua5.3")
    if found is None and os.environ.get("CI") == "true":
        pytest.fail("lua5.3 is missing: .ci/run installs Debian's lua5.3 package")
    return found


def _literal(value) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (tuple, list)):
        return "{" + ", ".join(_literal(v) for v in value) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{_literal(k)}] = {_literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


def run_lua(cases: list[dict], tmp_path) -> list[tuple[int, int, int, str]]:
    lua = _lua()
    if lua is None:
        pytest.skip("lua5.3 not installed (apt-get install lua5.3); CI=true makes this a failure")
    driver = tmp_path / "driver.lua"
    driver.write_text(
        f"SCRIPT = {_literal(str(slinky.JOB_SUBMIT_LUA))}\nPARTS = {_literal(PARTITIONS)}\n"
        f"CASES = {_literal(cases)}\n{DRIVER}"
    )
    out = subprocess.run([lua, str(driver)], capture_output=True, text=True, timeout=10, check=True).stdout
    rows = [line.split("\t") for line in out.splitlines()]
    assert len(rows) == len(cases)
    return [(int(rc), int(lo), int(hi), msg) for rc, lo, hi, msg in rows]


def test_gpu_only_jobs_get_one_node_per_gpu_or_a_clear_refusal(tmp_path):
    cases = {
        "--gpus=2": ({"tres_per_job": "gres/gpu:2"}, (SUCCESS, 2, 2, "")),
        "--gpus=tesla:3 -p slinky": ({"tres_per_job": "gres/gpu:tesla:3", "partition": "slinky"}, (SUCCESS, 3, 3, "")),
        "--gpus-per-task=1 -n 3": ({"tres_per_task": "cpu:2,gres/gpu:1", "num_tasks": 3}, (SUCCESS, 3, 3, "")),
        "--gpus=6 -p wide (UNLIMITED)": ({"tres_per_job": "gres/gpu:6", "partition": "wide"}, (SUCCESS, 6, 6, "")),
        "--gpus=6": (
            {"tres_per_job": "gres/gpu:6"},
            (
                ESLURM_INVALID_NODE_COUNT,
                NO_VAL,
                NO_VAL,
                "6 GPUs need 6 nodes (one GPU per slurmd pod); partition all has MaxNodes=4",
            ),
        ),
        "--gpus=5 -p wide,slinky": (
            {"tres_per_job": "gres/gpu:5", "partition": "wide,slinky"},
            (ESLURM_INVALID_NODE_COUNT, NO_VAL, NO_VAL, "partition slinky has MaxNodes=4"),
        ),
        "-N 1 --gpus=2": (
            {"tres_per_job": "gres/gpu:2", "min_nodes": 1, "max_nodes": 1},
            (ESLURM_INVALID_NODE_COUNT, 1, 1, "2 GPUs on at most 1 node(s) can never run"),
        ),
        "-N 2 --gpus=2 (kept)": ({"tres_per_job": "gres/gpu:2", "min_nodes": 2, "max_nodes": 2}, (SUCCESS, 2, 2, "")),
        "--gres=gpu:2": (
            {"tres_per_node": "gres/gpu:2"},
            (ESLURM_INVALID_GRES, NO_VAL, NO_VAL, "2 GPUs per node asked, but each node (slurmd pod) has 1"),
        ),
        "--gpus-per-node=tesla:2": (
            {"tres_per_node": "gres/gpu:tesla:2"},
            (ESLURM_INVALID_GRES, NO_VAL, NO_VAL, "GPUs per node"),
        ),
        "-N 3 --gres=gpu:1 (kept)": ({"tres_per_node": "gres/gpu:1", "min_nodes": 3}, (SUCCESS, 3, NO_VAL, "")),
        "no GPUs (kept)": ({"tres_per_node": "gres/shard:2"}, (SUCCESS, NO_VAL, NO_VAL, "")),
        # 25.11 and 26.05 record --gpus-per-task with `=` (seen on the real slurmctld, tests/engines).
        "-n 2 --gpus-per-task=1": ({"tres_per_task": "gres/gpu=1", "num_tasks": 2}, (SUCCESS, 2, 2, "")),
        "-n 2 --gpus-per-task=tesla:1": ({"tres_per_task": "gres/gpu:tesla=1", "num_tasks": 2}, (SUCCESS, 2, 2, "")),
        "-n 5 --gpus-per-task=1": (
            {"tres_per_task": "gres/gpu=1", "num_tasks": 5},
            (ESLURM_INVALID_NODE_COUNT, NO_VAL, NO_VAL, "5 GPUs need 5 nodes"),
        ),
        "-N 5 (no GPUs)": (
            {"min_nodes": 5, "max_nodes": 5},
            (
                ESLURM_INVALID_NODE_COUNT,
                5,
                5,
                "-N 5 need 5 nodes (one GPU per slurmd pod); partition all has MaxNodes=4",
            ),
        ),
        "-N 5 -p wide (UNLIMITED, kept)": ({"min_nodes": 5, "max_nodes": 5, "partition": "wide"}, (SUCCESS, 5, 5, "")),
        "--gpus-per-socket=1 --sockets-per-node=2": (
            {"tres_per_socket": "gres/gpu:1", "sockets_per_node": 2},
            (ESLURM_INVALID_GRES, NO_VAL, NO_VAL, "2 GPUs per node asked"),
        ),
        "--gpus-per-socket=1 (kept)": ({"tres_per_socket": "gres/gpu:1"}, (SUCCESS, NO_VAL, NO_VAL, "")),
    }
    got = run_lua([job for job, _ in cases.values()], tmp_path)
    for (label, (_, (rc, lo, hi, msg))), (g_rc, g_lo, g_hi, g_msg) in zip(cases.items(), got, strict=True):
        assert (g_rc, g_lo, g_hi) == (rc, lo, hi), label
        assert msg in g_msg and bool(msg) == bool(g_msg), (label, g_msg)


def test_a_time_limit_over_maxtime_is_refused_naming_the_limit_and_the_setting(tmp_path):
    over = "is over MaxTime=60 of partition all, the longest a Slurm job may run on this testbed (setting "
    cases = {
        "no --time (kept: MaxTime when it starts)": ({}, (SUCCESS, NO_VAL, NO_VAL, "")),
        "--time=60 (at the limit)": ({"time_limit": 60}, (SUCCESS, NO_VAL, NO_VAL, "")),
        "--time=61": (
            {"time_limit": 61},
            (ESLURM_INVALID_TIME_LIMIT, NO_VAL, NO_VAL, f"testbed: a time limit of 61 minutes {over}"),
        ),
        "--time=UNLIMITED": (
            {"time_limit": INFINITE},
            (ESLURM_INVALID_TIME_LIMIT, NO_VAL, NO_VAL, f"no time limit (--time=0 or UNLIMITED) {over}"),
        ),
        "--time=45 -p all,slinky (over slinky's 30)": (
            {"time_limit": 45, "partition": "all,slinky"},
            (ESLURM_INVALID_TIME_LIMIT, NO_VAL, NO_VAL, "slurmJobMaxMinutes); ask --time=30 or less"),
        ),
        "--time=UNLIMITED -p wide (UNLIMITED, kept)": (
            {"time_limit": INFINITE, "partition": "wide"},
            (SUCCESS, NO_VAL, NO_VAL, ""),
        ),
        "--time=61 --gpus=2: refused before it is sized": (
            {"time_limit": 61, "tres_per_job": "gres/gpu:2"},
            (ESLURM_INVALID_TIME_LIMIT, NO_VAL, NO_VAL, "61 minutes"),
        ),
        "--time=60 --gpus=2 (sized)": ({"time_limit": 60, "tres_per_job": "gres/gpu:2"}, (SUCCESS, 2, 2, "")),
    }
    got = run_lua([job for job, _ in cases.values()], tmp_path)
    for (label, (_, (rc, lo, hi, msg))), (g_rc, g_lo, g_hi, g_msg) in zip(cases.items(), got, strict=True):
        assert (g_rc, g_lo, g_hi) == (rc, lo, hi), label
        assert msg in g_msg and bool(msg) == bool(g_msg), (label, g_msg)


def test_the_twin_models_the_lua_file(tmp_path):
    """Same cases through twin/slurm.py job_submit and the Lua: same node count, same refusal text."""
    grid = [
        (nodes, most, gpus, part, time)
        for nodes, most, gpus, part, time in itertools.product(
            (None, 1, 2, 4), (None, 4, 8), (None, 1, 2, 4, 5), ("all", "wide"), (None, 30, 60, 61)
        )
        if most is None or (nodes is not None and most > nodes)
    ]
    cases = []
    for nodes, most, gpus, part, time in grid:
        job = {"partition": part}
        if gpus is not None:
            job["tres_per_job"] = f"gres/gpu:{gpus}"
        if nodes is not None:
            job["min_nodes"], job["max_nodes"] = nodes, most or nodes
        if time is not None:
            job["time_limit"] = time
        cases.append(job)
    for case, (rc, lo, _, msg) in zip(grid, run_lua(cases, tmp_path), strict=True):
        nodes, most, gpus, part, time = case
        _, max_nodes, max_time = (None if v == INFINITE else v for v in PARTITIONS[part])
        over_time = slurm.time_refusal(time, part, max_time)
        sized, refusal = (None, over_time) if over_time else slurm.job_submit(nodes, gpus, part, max_nodes, most)
        assert refusal == msg and (rc == SUCCESS) == (not refusal), case
        assert (rc == ESLURM_INVALID_TIME_LIMIT) == bool(over_time), case
        assert lo == (sized or nodes or NO_VAL), case


def test_one_gpu_per_node_everywhere():
    lua = re.search(r"^local GPUS_PER_NODE = (\d+)$", slinky.JOB_SUBMIT_LUA.read_text(), re.M)
    assert lua and int(lua[1]) == slurm.GPUS_PER_NODE == names.GPUS_PER_WORKER


def test_the_slurm_chart_gets_the_script_and_the_plugin():
    n = names.slurm_names("slinky")
    v = slinky.slurm_values("1.0.0", "25.11.6-ubuntu24.04", n, max_nodes=4)
    assert v["configFiles"]["job_submit.lua"] == slinky.JOB_SUBMIT_LUA.read_text()
    assert "gres.conf" in v["configFiles"], "the base values' gres.conf stays"
    # NO: any other value checks each job against the nodes registered now, none at slurmd 0.
    conf = v["controller"]["extraConfMap"]
    assert (conf["EnforcePartLimits"], conf["JobSubmitPlugins"]) == ("NO", "lua")


WORKER = slinky.job_submit_parameters(names.Names.worker_instance_type)  # the script's own defaults (a test below)
SHAPE = "each node (slurmd pod on a g4dn.xlarge) has"
NODE_CONFIG = ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE


def _check(cases: dict, tmp_path) -> None:
    got = run_lua([job for job, _ in cases.values()], tmp_path)
    for (label, (_, (rc, lo, hi, msg))), (g_rc, g_lo, g_hi, g_msg) in zip(cases.items(), got, strict=True):
        assert (g_rc, g_lo, g_hi) == (rc, lo, hi), (label, g_msg)
        assert msg in g_msg and bool(msg) == bool(g_msg), (label, g_msg)


def test_shapes_no_g4dn_xlarge_node_can_hold_are_refused_naming_the_limit_and_the_setting(tmp_path):
    cpus, mem = WORKER["NODE_CPUS"], WORKER["NODE_MEMORY_MB"]
    assert (cpus, mem) == (4, 14745)
    raise_it = "(setting workerInstanceType)"
    cases = {
        "-N 1-8 (range over MaxNodes)": (
            {"min_nodes": 1, "max_nodes": 8},
            (
                ESLURM_INVALID_NODE_COUNT,
                1,
                8,
                "-N 1-8 need 8 nodes (one GPU per slurmd pod); partition all has MaxNodes=4",
            ),
        ),
        "-N 1-4 (kept)": ({"min_nodes": 1, "max_nodes": 4}, (SUCCESS, 1, 4, "")),
        "-c 8": (
            {"cpus_per_task": 8, "min_cpus": 8},
            (NODE_CONFIG, NO_VAL, NO_VAL, f"the job asks 8 CPUs on one node, but {SHAPE} 4 {raise_it}"),
        ),
        "-c 4 (kept)": ({"cpus_per_task": 4, "min_cpus": 4}, (SUCCESS, NO_VAL, NO_VAL, "")),
        "-n 8 -N 1": ({"num_tasks": 8, "min_nodes": 1, "max_nodes": 1}, (NODE_CONFIG, 1, 1, "asks 8 CPUs")),
        "-n 8 (sized to 2 nodes)": ({"num_tasks": 8}, (SUCCESS, 2, 2, "")),
        "-n 20 (5 nodes, over MaxNodes)": (
            {"num_tasks": 20},
            (ESLURM_INVALID_NODE_COUNT, NO_VAL, NO_VAL, "20 tasks need 5 nodes"),
        ),
        "-n 2 -c 2 (one node, kept)": ({"num_tasks": 2, "cpus_per_task": 2}, (SUCCESS, NO_VAL, NO_VAL, "")),
        "--ntasks-per-node=8": ({"ntasks_per_node": 8}, (NODE_CONFIG, NO_VAL, NO_VAL, "asks 8 CPUs")),
        "--mincpus=5": ({"pn_min_cpus": 5}, (NODE_CONFIG, NO_VAL, NO_VAL, "asks 5 CPUs")),
        "--mem=64G": (
            {"min_mem_per_node": 65536},
            (NODE_CONFIG, NO_VAL, NO_VAL, f"--mem asks 65536 MB on one node, but {SHAPE} 14745"),
        ),
        f"--mem={mem}M (kept)": ({"min_mem_per_node": mem}, (SUCCESS, NO_VAL, NO_VAL, "")),
        "--mem-per-cpu=8G -c 4": (
            {"min_mem_per_cpu": 8192, "cpus_per_task": 4},
            (NODE_CONFIG, NO_VAL, NO_VAL, "--mem-per-cpu times its CPUs per node asks 32768 MB"),
        ),
        "--mem-per-gpu=40G --gpus=1": (
            {"mem_per_tres": "gres/gpu:40960", "tres_per_job": "gres/gpu:1"},
            (NODE_CONFIG, NO_VAL, NO_VAL, "--mem-per-gpu asks 40960 MB"),
        ),
        "--gpus=a100:1": (
            {"tres_per_job": "gres/gpu:a100:1"},
            (
                ESLURM_INVALID_GRES,
                NO_VAL,
                NO_VAL,
                "testbed: GPU type a100: no node has it, every node's GPU is type tesla",
            ),
        ),
        "--gres=gpu:nosuchtype:1": (
            {"tres_per_node": "gres/gpu:nosuchtype:1"},
            (ESLURM_INVALID_GRES, NO_VAL, NO_VAL, "GPU type nosuchtype: no node has it"),
        ),
        "--gpus-per-task=v100:1": (
            {"tres_per_task": "gres/gpu:v100=1"},
            (ESLURM_INVALID_GRES, NO_VAL, NO_VAL, "type v100"),
        ),
        "--gpus=tesla:1 (kept)": ({"tres_per_job": "gres/gpu:tesla:1"}, (SUCCESS, 1, 1, "")),
        "--nodelist=slinky-0 (a note, kept)": (
            {"req_nodes": "slinky-0"},
            (SUCCESS, NO_VAL, NO_VAL, "exist as Slurm nodes only while running"),
        ),
        "--exclude=slinky-0 (a note, kept)": (
            {"exc_nodes": "slinky-0"},
            (SUCCESS, NO_VAL, NO_VAL, "Invalid node name specified"),
        ),
    }
    _check(cases, tmp_path)


def test_updates_get_the_same_checks_as_submissions(tmp_path):
    """slurm_job_modify: the update request's unset fields are NO_VAL or nil (job_submit_lua.c
    job_modify); the rest is read from the job record (slurm_lua.c slurm_lua_job_record_field)."""
    rec = {"min_nodes": 1, "max_nodes": 1, "partition": "all", "time_limit": 60}
    plain = {"min_nodes": 1, "max_nodes": 0, "partition": "all", "time_limit": NO_VAL}
    cases = {
        "NumNodes=8": (
            {"rec": rec, "min_nodes": 8, "max_nodes": 8},
            (ESLURM_INVALID_NODE_COUNT, 8, 8, "NumNodes=8 need 8 nodes"),
        ),
        "NumNodes=1-8": ({"rec": rec, "min_nodes": 1, "max_nodes": 8}, (ESLURM_INVALID_NODE_COUNT, 1, 8, "MaxNodes=4")),
        "NumNodes=2 (kept)": ({"rec": rec, "min_nodes": 2, "max_nodes": 2}, (SUCCESS, 2, 2, "")),
        "TimeLimit=120": (
            {"rec": rec, "time_limit": 120},
            (ESLURM_INVALID_TIME_LIMIT, NO_VAL, NO_VAL, "120 minutes is over MaxTime=60"),
        ),
        "TimeLimit=UNLIMITED": (
            {"rec": rec, "time_limit": INFINITE},
            (ESLURM_INVALID_TIME_LIMIT, NO_VAL, NO_VAL, "no time limit"),
        ),
        "TimeLimit=30 (kept)": ({"rec": rec, "time_limit": 30}, (SUCCESS, NO_VAL, NO_VAL, "")),
        "Partition=slinky with TimeLimit 60 (over slinky's 30)": (
            {"rec": rec, "partition": "slinky"},
            (ESLURM_INVALID_TIME_LIMIT, NO_VAL, NO_VAL, "MaxTime=30 of partition slinky"),
        ),
        "TresPerJob=gres/gpu:8": (
            {"rec": rec, "tres_per_job": "gres/gpu:8"},
            (ESLURM_INVALID_NODE_COUNT, NO_VAL, NO_VAL, "8 GPUs need 8 nodes"),
        ),
        "TresPerJob=gres/gpu:2 (sized to 2 nodes)": ({"rec": plain, "tres_per_job": "gres/gpu:2"}, (SUCCESS, 2, 2, "")),
        "TresPerJob=gres/gpu:a100:1": (
            {"rec": rec, "tres_per_job": "gres/gpu:a100:1"},
            (ESLURM_INVALID_GRES, NO_VAL, NO_VAL, "type a100"),
        ),
        "TresPerNode=gres/gpu:2": (
            {"rec": rec, "tres_per_node": "gres/gpu:2"},
            (ESLURM_INVALID_GRES, NO_VAL, NO_VAL, "2 GPUs per node"),
        ),
        "NumNodes=1 TresPerJob=gres/gpu:2": (
            {"rec": rec, "min_nodes": 1, "max_nodes": 1, "tres_per_job": "gres/gpu:2"},
            (ESLURM_INVALID_NODE_COUNT, 1, 1, "2 GPUs on at most 1 node(s) can never run"),
        ),
        "NumCPUs=8 on 1 node": ({"rec": rec, "min_cpus": 8}, (NODE_CONFIG, NO_VAL, NO_VAL, "NumCPUs asks 8 CPUs")),
        "MinCPUsNode=8": ({"rec": rec, "pn_min_cpus": 8}, (NODE_CONFIG, NO_VAL, NO_VAL, "asks 8 CPUs")),
        "MinMemoryNode=65536": (
            {"rec": rec, "min_mem_per_node": 65536},
            (NODE_CONFIG, NO_VAL, NO_VAL, "--mem asks 65536 MB"),
        ),
        "release (a note)": ({"rec": rec, "priority": INFINITE}, (SUCCESS, NO_VAL, NO_VAL, "testbed: released;")),
        "Comment=x (nothing to check)": ({"rec": rec, "comment": "x"}, (SUCCESS, NO_VAL, NO_VAL, "")),
    }
    _check(cases, tmp_path)


def test_the_script_defaults_are_the_default_worker_and_rendering_sets_each_parameter():
    text = slinky.JOB_SUBMIT_LUA.read_text()
    assert slinky.job_submit_script(WORKER) == text, "the file's parameter lines are g4dn.xlarge's"
    big = slinky.job_submit_parameters("g5.4xlarge")
    rendered = slinky.job_submit_script(big)
    assert "local NODE_CPUS = 16\n" in rendered and f"local NODE_MEMORY_MB = {int(64 * 1024 * 0.9)}\n" in rendered
    assert 'local WORKER_TYPE = "g5.4xlarge"' in rendered
    with pytest.raises(ValueError, match="NO_SUCH"):
        slinky.job_submit_script({"NO_SUCH": 1})


def test_the_exporter_s_token_user_may_not_submit_or_change_jobs(tmp_path):
    """A leaked exporter token (user nobody, components/runnable_exporter.py) queues nothing."""
    from components import runnable_exporter

    assert runnable_exporter.TOKEN_USER == "nobody"  # uid 65534 in the Debian-based Slurm image
    rec = {"min_nodes": 1, "max_nodes": 1, "partition": "all", "time_limit": 30}
    rows = run_lua(
        [
            {"uid": 65534},
            {"uid": 65534, "tres_per_job": "gres/gpu:1"},
            {"uid": 65534, "time_limit": 10, "rec": rec},
            {"uid": 1000},
            {"uid": 1000, "time_limit": 10, "rec": rec},
        ],
        tmp_path,
    )
    for rc, _, _, msg in rows[:3]:
        assert rc == ESLURM_ACCESS_DENIED and "user nobody only reads the job list" in msg, msg
    assert [rc for rc, *_ in rows[3:]] == [SUCCESS, SUCCESS]

"""One mocks harness for every test: the real program run under Pulumi's mock engine.

`stacks.offline.run` records every resource (type, name, parent, inputs, dependencies) and
resets Pulumi's runtime before each run, so tests share nothing but what they ask for."""

from __future__ import annotations

import fcntl
import gc
import hashlib
import json
import os
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from core import trusted_yaml
from core.settings import PROJECT
from stacks import offline

ADMIN_CIDR = "203.0.113.7/32"
# A budget, and a workspace deleted with the stack: one recording for every test that needs
# either (the program is run once per settings, see _one_recording_per_settings)
BUDGET_AND_WORKSPACE_NOT_KEPT = {
    "budgetMonthlyUsd": 250,
    "budgetEmail": "ops@example.com",
    "managedPrometheusKeep": False,
}


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """`-n auto --dist loadgroup` unless `-n` is given, where xdist is loaded: here, not in
    pytest.ini's addopts, so `-p no:xdist` runs the suite in one process instead of refusing `-n`.
    Not in a worker, which xdist starts with no `-n` and runs this hook in (xdist 3 remote.py)."""
    xdist_controller = config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput")
    if xdist_controller and config.option.numprocesses is None:
        config.option.numprocesses = "auto"
        if config.option.dist == "no":
            config.option.dist = "loadgroup"


@pytest.hookimpl(optionalhook=True)  # xdist's hook, as below
def pytest_configure_node(node: Any) -> None:
    """Tell each worker the controller distributes by group. A worker reads `--dist` from the
    command line alone (xdist 3 remote.py setup_config: `loadgroup` from the arguments), so with
    the `loadgroup` set above it left the tests' group out of their ids, and the controller then
    spread every `xdist_group` over the workers as plain `load` would."""
    node.workerinput["loadgroup"] = node.config.option.dist == "loadgroup"


@pytest.hookimpl(optionalhook=True)  # xdist's hook: unknown, and no error, under `-p no:xdist`
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker per core, and two more when the engine tests run: they mostly wait on
    Slurm's and Prometheus' clocks (a 60 s MaxTime, 5 s scrapes), and a worker waiting in one would
    otherwise leave its core idle while the CPU-bound tests queue behind it."""
    cores = len(os.sched_getaffinity(0))
    return cores if "not engine" in (config.option.markexpr or "") else cores + 2


def pytest_configure(config: pytest.Config) -> None:
    """A `-m` expression that does not name `slow` leaves the slow tests out, so the fast
    set `-m "not engine"` is fast; a plain run, `-m "... slow ..."` and every run under CI=true
    (.ci/run) keep them."""
    expression = config.option.markexpr
    if expression and "slow" not in expression and os.environ.get("CI") != "true":
        config.option.markexpr = f"({expression}) and not slow"
    gc.callbacks.append(_freeze_survivors)
    if getattr(config, "workerinput", {}).get("loadgroup"):
        config.option.loadgroup = True  # xdist's worker then suffixes each test's id with its group


def _freeze_survivors(phase: str, info: dict[str, int]) -> None:
    """After each full collection, what survived it leaves the collector's sight (gc.freeze). A
    session keeps well over a million objects alive (Pulumi's and the providers' modules, the
    shared recordings and twin runs), and every full collection walked them all again: about a
    sixth of the suite's CPU time. Garbage is still freed by reference counting, and new cycles
    by the next collections; only a cycle among objects that had survived a full collection stays
    (a few hundred MB over a whole single-process run)."""
    if phase == "stop" and info["generation"] == 2:
        gc.freeze()


def config(**settings: Any) -> dict[str, str]:
    """Project-prefixed config with the one required setting filled in."""
    values = {"adminCidr": ADMIN_CIDR, **settings}
    return {
        f"{PROJECT}:{key}": str(value).lower() if isinstance(value, bool) else str(value)
        for key, value in values.items()
    }


def run_program(**settings: Any) -> offline.Recording:
    return offline.run(config(**settings))


def _default_run_scope(fixture_name: str, config: pytest.Config) -> str:
    """Once per session; once per test while mutmut maps functions to the tests that call them
    (its stats pass credits a call to the test it happens in: a session-wide run would credit
    every function to the first test only, and mutants would run no other test)."""
    return "function" if os.environ.get("MUTANT_UNDER_TEST") == "stats" else "session"


@pytest.fixture(scope="session", autouse=True)
def _no_stack_traces_under_mocks() -> Iterator[None]:
    """Pulumi sends the engine each registration's stack trace and source position, found by
    traceback.extract_stack and a file URI per frame (pulumi 3.272.0 runtime/resource.py
    _get_stack_trace): a tenth of a mock run's CPU. Under mocks nothing reads them: neither
    MockMonitor (runtime/mocks.py) nor stacks/offline.py's RecordingMonitor looks at the
    request's stackTrace or sourcePosition. The tests' runs send an empty trace; a Pulumi that
    renames the function fails here, by name."""
    from pulumi.runtime import resource

    empty = resource.source_pb2.StackTrace()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(resource, "_get_stack_trace", lambda: empty)
        yield


def _memoised(owner: Any, name: str, key: Callable[..., str]) -> Iterator[None]:
    """`owner.name` called once per `key(*args)` for the session, each later call given the first's
    answer (one that raises is not kept: it raises every time). Not while mutmut maps functions
    to tests (see _default_run_scope): each test must call the function itself."""
    if os.environ.get("MUTANT_UNDER_TEST") == "stats":
        yield
        return
    real = getattr(owner, name)
    answers: dict[str, Any] = {}

    def memoised(*args: Any) -> Any:
        k = key(*args)
        if k not in answers:
            answers[k] = real(*args)
        return answers[k]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(owner, name, memoised)
        yield


@pytest.fixture(scope="session", autouse=True)
def _one_cloud_config_per_content() -> Iterator[None]:
    """Each node's cloud-config rendered once per content. The session runs the program many
    times with the same settings, so the same documents come back, and the YAML emitter (libyaml
    where it writes what the pure-Python one does, core/trusted_yaml.py: a changed byte of
    user-data replaces an instance) is most of what rendering costs. A real run renders each node
    once, each worker with its own join token: the cache belongs here, not in
    components/bootstrap.py. A refused document (over EC2's limit) raises every time. The emitter
    is in the key: tests/cli/test_cli.py renders once with the pure-Python one."""
    from components import bootstrap

    yield from _memoised(
        bootstrap,
        "cloud_config",
        lambda write_files, runcmd, keys: json.dumps([write_files, runcmd, keys, repr(trusted_yaml.Dumper)]),
    )


@pytest.fixture(scope="session", autouse=True)
def _one_pure_yaml_text_per_content() -> Iterator[None]:
    """Each document core/trusted_yaml.py leaves to the pure-Python emitter (one libyaml would
    fold otherwise: the scripts in render's ConfigMaps and values, most of all) written once per
    content: every render of a recording writes the same ones again, and they were most of what a
    render cost. Keyed by the documents' repr (1, 1.0, "1" and True apart), the representer, the
    options and the class."""
    yield from _memoised(
        trusted_yaml,
        "pure_dump_all",
        lambda documents, representer, options: repr(
            (documents, representer, sorted(options.items()), trusted_yaml.PureDumper)
        ),
    )


@pytest.fixture(scope="session", autouse=True)
def _one_recording_per_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every run of the program under the default mocks, with a last deployment's outputs or
    none (`run_program`, `plan`, `render` and the other commands in-process), is made once per
    session for each stack, settings and deployment, and shared by every xdist worker through a
    folder of the session's (as tests/twin/runs.py shares the twin's runs): the program is
    deterministic for them, which tests/cli/test_cli.py's two renders under different hash seeds
    check. Each call unpickles a copy of its own, so no test sees another's changes; bad settings
    raise as before and are not kept. Runs with other mocks (a subclass of TestbedMocks), and
    mutmut's stats pass (see _default_run_scope), run afresh."""
    if os.environ.get("MUTANT_UNDER_TEST") == "stats":
        yield
        return
    base = tmp_path_factory.getbasetemp()
    # An xdist worker's base is <session's base>/gwN: the session's own is shared by every worker.
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "offline-runs"
    folder.mkdir(exist_ok=True)
    fresh = offline.run

    def shared_run(config: dict[str, str], stack: str = "dev", mocks: offline.TestbedMocks | None = None):
        # the default mocks, given a last deployment's outputs or none, answer alike every time;
        # a subclass, or mocks that already answered, may not: run afresh
        if mocks is not None and (type(mocks) is not offline.TestbedMocks or mocks.invokes):
            return fresh(config, stack, mocks)
        deployed = mocks.deployed_outputs if mocks else {}
        # keyed by the settings the program reads (its one reader), not their spelling: `{}`,
        # `workerCount=4` and the stack file's defaults are one run; bad settings raise here
        settings = offline.settings_mod.load(config, stack=stack, offline=True)
        # and by the YAML classes (tests/cli/test_cli.py renders once with the pure-Python ones)
        yaml_classes = (trusted_yaml.Loader, trusted_yaml.Dumper)
        key = hashlib.sha256(repr((settings, stack, deployed, yaml_classes)).encode()).hexdigest()
        path = folder / f"{key}.pickle"
        with open(folder / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the first asks, the others wait and read; released on close
            if not path.exists():
                path.write_bytes(pickle.dumps(fresh(config, stack, offline.TestbedMocks(deployed))))
            recording = pickle.loads(path.read_bytes())
        if mocks:  # the caller's mocks hold what they answered, as after a run of their own
            mocks.region = recording.settings.region
            mocks.invokes.extend(recording.invokes)
            mocks.invoke_args.update(recording.invoke_args)
            recording.invokes, recording.invoke_args = mocks.invokes, mocks.invoke_args
        return recording

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(offline, "run", shared_run)
        yield


@pytest.fixture(scope=_default_run_scope)
def default_run() -> offline.Recording:
    """The default testbed, recorded once: tests must not mutate it."""
    return run_program()


@pytest.fixture(scope="session")
def spot_run() -> offline.Recording:
    """The testbed with spot workers, recorded once: tests must not mutate it."""
    return run_program(spotWorkers=True)


def deployed_outputs(**changes: str) -> dict[str, Any]:
    """The stack outputs of a last deployment with the default settings, but for `changes`."""
    from stacks import infrastructure

    s = offline.settings_mod.load(config(), offline=True)
    return {
        infrastructure.CONTROL_PLANE_SETTINGS_OUTPUT: {**infrastructure.control_plane_settings(s), **changes},
        infrastructure.WORKER_IPS_OUTPUT: list(s.worker_private_ips),
    }


@pytest.fixture(scope="session")
def deployed_run() -> offline.Recording:
    """The default testbed's next `pulumi up` on a deployed stack whose control node stays (the last
    deployment's outputs mocked), recorded once: tests must not mutate it."""
    return offline.run(config(), mocks=offline.TestbedMocks(deployed_outputs()))


def by_type(rec: offline.Recording, token: str) -> list[offline.RecordedResource]:
    found = rec.of_type(token)
    assert found, f"no {token} registered"
    return found


def depends(rec: offline.Recording, resource: offline.RecordedResource, on: offline.RecordedResource) -> bool:
    """`resource` waits for `on`, directly or through its dependencies (and so, on destroy,
    goes before it)."""
    by_urn = {r.urn: r for r in rec.resources}
    seen, todo = set(), list(resource.depends_on)
    while todo:
        urn = todo.pop()
        if urn == on.urn:
            return True
        if urn not in seen and urn in by_urn:
            seen.add(urn)
            todo.extend(by_urn[urn].depends_on)
    return False


def step_args(rec: offline.Recording, name: str, which: str = "create") -> dict[str, str]:
    """The arguments, by name, that remote step `name` runs its script with (or deletes with)."""
    from cli.artifacts import step_arguments

    return step_arguments(rec.named(name), which)


def step_secrets(rec: offline.Recording, name: str) -> dict[str, str]:
    """The secret arguments remote step `name` gets on stdin, ahead of its script, by name."""
    import shlex

    from components import remote_script

    stdin = offline.reveal(rec.named(name).inputs["stdin"])
    words = shlex.split(stdin[: len(stdin) - len(remote_script.script_of(stdin))])
    assert words[::2] == ["readonly"] * (len(words) // 2), words[::2]
    return dict(word.split("=", 1) for word in words[1::2])


def write_kubeconfig(path, server: str = "https://198.51.100.7:6443"):
    """A one-cluster, token-user kubeconfig at `path` (a documentation address by default)."""
    import yaml

    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "t", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "x"}}],
                "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}],
                "current-context": "t",
            }
        )
    )
    return path

"""The mutation-testing configuration names what exists (the runs themselves are by hand)."""

import configparser
import importlib.util
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def mutmut_config() -> dict[str, list[str]]:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    return {key: [v for v in value.split("\n") if v] for key, value in parser["mutmut"].items()}


def shell_runner():
    spec = importlib.util.spec_from_file_location("mutate_scripts", ROOT / "tools" / "mutate_scripts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mutmut_mutates_existing_modules_inside_its_source_paths():
    cfg = mutmut_config()
    assert cfg["only_mutate"] and all((ROOT / m).is_file() for m in cfg["only_mutate"]), cfg["only_mutate"]
    assert all(any(m.startswith(src + "/") for src in cfg["source_paths"]) for m in cfg["only_mutate"])
    assert all((ROOT / p).exists() for p in cfg["source_paths"] + cfg["also_copy"])
    assert "/mutants/" in (ROOT / ".gitignore").read_text().splitlines()


def test_mutmut_runs_the_tests_in_its_own_process():
    # The suite runs xdist workers unless -n is given; mutmut's stats pass sees only calls made
    # in its own process ("could not find any test case for any mutant" otherwise).
    from types import SimpleNamespace

    from tests import conftest

    def workers(numprocesses):
        config = SimpleNamespace(
            pluginmanager=SimpleNamespace(hasplugin=lambda name: name == "xdist"),
            option=SimpleNamespace(numprocesses=numprocesses, dist="no"),
        )
        conftest.pytest_cmdline_main(config)
        return config.option.numprocesses, config.option.dist

    assert workers(None) == ("auto", "loadgroup")
    assert "--numprocesses=0" in mutmut_config()["pytest_add_cli_args"]
    assert workers(0) == (0, "no")


def test_mutmut_copies_every_top_level_entry_the_tests_read():
    # mutmut runs the tests inside mutants/, a copy of what setup.cfg names (plus tests/ and
    # setup.cfg itself): a package left out fails every run's collection, not one mutant.
    cfg = mutmut_config()
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    top = {path.split("/")[0] for path in tracked.splitlines()}
    assert top - set(cfg["source_paths"]) - set(cfg["also_copy"]) - {"tests", "setup.cfg"} == set()


def test_the_shell_runner_names_existing_scripts_and_tests_and_finds_their_commands():
    runner = shell_runner()
    assert all((ROOT / "components" / "scripts" / s).is_file() for s in runner.SCRIPTS)
    assert all((ROOT / t).is_file() for t in runner.TESTS)
    text = (ROOT / "components" / "scripts" / "node-common.sh").read_text()
    lines = text.splitlines()
    found = [" ".join(lines[a:b]) for a, b in runner.commands(text)]
    assert "swapoff -a" in found and "systemctl restart containerd" in found
    (sysctl,) = [c for c in found if "99-testbed-k8s.conf" in c]  # a heredoc is one command
    assert "net.ipv4.ip_forward = 1" in sysctl
    assert not [c for c in found if c.startswith(("#", "log ", "set -"))]


def test_scores_without_results_say_there_are_none_and_how_to_produce_them(tmp_path, monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("mutation", ROOT / "tools" / "mutation.py")
    mutation = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mutation)
    monkeypatch.setattr(mutation, "ROOT", tmp_path)  # a checkout where mutmut never ran: no mutants/
    assert mutation.main(["--scores"]) == 1
    out, err = capsys.readouterr()
    (line,) = err.splitlines()
    assert out == "" and "no mutation results under" in line and "tools/mutation.py MODULE" in line

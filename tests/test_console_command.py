"""The `testbed` console command (pyproject.toml -> testbed_cli.main): finds the project from any
directory, says in one line how to point at it, and names what to install when a package is missing.
Nothing is installed here: the entry function is called directly, or in a fresh interpreter."""

import json
import subprocess
import sys
from pathlib import Path

import testbed_cli

ROOT = Path(__file__).resolve().parent.parent


def test_pyproject_declares_the_command_at_the_entry_function():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    module, function = project["scripts"]["testbed"].split(":")
    assert (module, function) == ("testbed_cli", "main")
    assert project["requires-python"] == ">=3.11"


def test_the_command_runs_plan_from_another_directory(tmp_path, monkeypatch, capsys):
    """Run from a directory outside the checkout, with nothing pointing at it: the checkout the
    launcher lives in (an editable install) is found, and the plan reads its Pulumi.dev.yaml."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(testbed_cli.HOME_VARIABLE, raising=False)
    assert testbed_cli.main(["plan", "--json"]) == 0
    resources = json.loads(capsys.readouterr().out)
    assert any(r["type"] == "aws:ec2/vpc:Vpc" for r in resources)


def test_the_project_is_found_from_a_subdirectory_or_by_the_variable(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (tmp_path / "checkout" / "deep" / "er").mkdir(parents=True)
    elsewhere.mkdir()
    (tmp_path / "checkout" / "Pulumi.yaml").write_text("name: gpu-testbed\nruntime: python\n")
    (elsewhere / "Pulumi.yaml").write_text("name: some-other-project\n")
    assert testbed_cli.find_project(tmp_path / "checkout" / "deep" / "er", {}, elsewhere) == tmp_path / "checkout"
    home = {testbed_cli.HOME_VARIABLE: str(tmp_path / "checkout")}
    assert testbed_cli.find_project(elsewhere, home, elsewhere) == tmp_path / "checkout"


def test_no_project_found_says_in_one_line_how_to_point_at_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(testbed_cli.HOME_VARIABLE, raising=False)
    monkeypatch.setattr(testbed_cli, "INSTALLED_AT", tmp_path)  # a copy installed into site-packages
    assert testbed_cli.main(["plan"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot find the gpu-testbed project" in err
    assert "TESTBED_HOME=/path/to/checkout" in err


def test_a_variable_pointing_nowhere_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(testbed_cli.HOME_VARIABLE, str(tmp_path / "no\x1b[2Jpe"))
    assert testbed_cli.main(["plan"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "$TESTBED_HOME is " in err and "\x1b" not in err


def _without_pulumi(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """A fresh interpreter in which `import pulumi` fails as it does where it is not installed."""
    hide = "import sys; sys.modules['pulumi'] = None; "  # import then raises ModuleNotFoundError
    return subprocess.run(
        [sys.executable, "-c", hide + code],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_missing_package_is_one_line_saying_what_to_run(tmp_path):
    done = _without_pulumi("import testbed_cli; sys.exit(testbed_cli.main(['plan']))", tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1
    assert "'pulumi' is not installed" in done.stderr
    assert f"-m pip install -r {ROOT / 'requirements.txt'}" in done.stderr


def test_python_m_cli_without_its_packages_is_one_line_too(tmp_path):
    """plan imports Pulumi when it runs: missing, that is one line, exit 2. --help needs no Pulumi
    and still shows: only the commands that run the program import it."""
    run = "import runpy; sys.argv[1:] = {}; runpy.run_module('cli', run_name='__main__')"
    done = _without_pulumi(run.format(["plan"]), tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1
    assert "'pulumi' is not installed" in done.stderr
    helped = _without_pulumi(run.format(["--help"]), tmp_path)
    assert helped.returncode == 0 and helped.stderr == "", helped.stderr
    assert helped.stdout.startswith("usage: python -m cli") and "plan" in helped.stdout


def test_the_installed_command_names_itself_in_its_help(tmp_path):
    """A script as pip writes for [project.scripts] (argv[0] is the script's path): the help says
    `testbed`, as the user typed it, not `python -m cli`; the top level's and, through the launcher's
    hand-over, a command's (e2e's, the lightest to start: each command's own parser under that
    argv[0] is tests/cli/test_help_text.py's, in-process)."""
    script = tmp_path / "bin" / "testbed"
    script.parent.mkdir()
    script.write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom testbed_cli import main\nsys.exit(main())\n"
    )
    for argv in (["--help"], ["e2e", "--help"]):
        done = subprocess.run(
            [sys.executable, str(script), *argv], capture_output=True, text=True, cwd=tmp_path, timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.startswith(f"usage: testbed {argv[0] if len(argv) == 2 else ''}".rstrip()), argv
        assert "python -m cli" not in done.stdout, argv

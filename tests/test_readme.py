"""The README and docs/ stay true: a short landing page, links that resolve, every offline command
run as written, CI runs the test command (the settings table: tests/core/test_settings_declaration.py)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 300


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_is_a_landing_page():
    assert len(README.splitlines()) <= README_MAX_LINES
    for section in ("## Cost and time", "## Prerequisites", "## Quickstart", "## Tear down", "## Troubleshooting"):
        assert section in README, section
    assert "you pay until" in README and "PULUMI_CONFIG_PASSPHRASE" in README.split("## Tear down")[1]


def test_every_relative_link_resolves_to_a_file_and_heading():
    for page in PAGES:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path = (page.parent / target) if target else page
            assert path.exists(), f"{page.name}: {target}"
            if anchor and path.suffix == ".md":
                headings = {_slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M)}
                assert anchor in headings, f"{page.name}: {target}#{anchor}"


def test_ci_runs_the_readme_test_command_in_a_fresh_venv():
    ci = (ROOT / ".ci" / "run").read_text()
    for command in (
        "python3 -m venv venv",
        "venv/bin/pip install",
        "-r requirements-dev.txt",
        "venv/bin/python -m pytest",
    ):
        assert command in README and command in ci
    # requirements-dev.txt adds the tests' and tools' packages to exactly what deploying installs
    dev = (ROOT / "requirements-dev.txt").read_text().splitlines()
    assert dev[[line.startswith("-r") for line in dev].index(True)] == "-r requirements.txt"


def test_readme_pictures_exist():
    for page in PAGES:
        for picture in re.findall(r"\]\(([^)]+\.png)\)", page.read_text()):
            assert (page.parent / picture).is_file(), (page.name, picture)


# Commands that need no AWS, cluster or CLI: the README's every such line is run as written.
OFFLINE = re.compile(r"venv/bin/python -m cli (plan|render|simulate|validate\b.*(--dry-run|--from-timeline))\b")


def bash_lines() -> list[str]:
    """Every command line of the bash blocks of the README and docs/, continuations joined."""
    lines = []
    for page in PAGES:
        for block in re.findall(r"^```bash\n(.*?)^```", page.read_text(), re.M | re.S):
            lines += [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    return lines


def test_one_way_to_run_the_tools_throughout():
    for line in bash_lines():
        bare = re.search(r"(^|[;&|(]\s*)(python3?|pip3?|pytest)\b", line)
        assert not bare or line.startswith("python3 -m venv "), line
    for page in PAGES:
        prose = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
        assert not re.findall(r"`(?:python3?|pip3?|pytest) (?!-m venv)", prose), page.name


def test_every_offline_command_runs_as_written(monkeypatch, capsys, tmp_path):
    """Each offline line, word for word, through the entry point `python -m cli` runs
    (in-process: a fresh interpreter per line would cost seconds each); one line also runs
    as a real `venv/bin/python -m cli` process. The working directory is the repository
    root's twin (every top-level entry linked, but a fresh `out/`), so what earlier runs left
    in `out/` cannot fail or be overwritten by the test."""
    import shlex
    import subprocess
    import sys

    from cli import __main__ as cli

    commands = list(dict.fromkeys(line for line in bash_lines() if OFFLINE.match(line)))
    assert len(commands) >= 4, commands  # plan, render, validate --dry-run, validate --from-timeline
    for entry in ROOT.iterdir():
        if entry.name != "out":
            (tmp_path / entry.name).symlink_to(entry)
    monkeypatch.chdir(tmp_path)
    for command in commands:
        words = shlex.split(command, comments=True)
        assert words[:3] == ["venv/bin/python", "-m", "cli"], command
        # a line that fails on purpose (a finding of the model, such as a killed job, or a refusal
        # the page shows) says so, with its exit status
        on_purpose = re.search(r"#.*\bexits? (\d) on purpose\b", command)
        expected = int(on_purpose[1]) if on_purpose else 0
        assert cli.main(words[3:]) == expected, f"{command}\n{capsys.readouterr().err[-2000:]}"
    capsys.readouterr()
    dry_run = next(c for c in commands if "--dry-run" in c)  # the first; each ran in-process above
    python = "venv/bin/python" if (ROOT / "venv" / "bin" / "python").exists() else sys.executable
    done = subprocess.run(
        ["bash", "-c", dry_run.replace("venv/bin/python", python, 1)], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_layout_paragraph_names_every_top_level_folder():
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    folders = {path.split("/", 1)[0] for path in tracked.splitlines() if "/" in path}
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    (layout,) = re.findall(r"^Layout: .*?(?=\n\n|\Z)", architecture, re.M | re.S)
    for folder in folders - {".ci"}:
        assert f"`{folder}/`" in layout, folder
    assert "`.ci/run`" in layout


def _comment_before(command: str) -> str:
    """The comment lines just above `command` in the README, as one line."""
    above = README.split(command, 1)[0].rstrip("\n").splitlines()
    comments = []
    while above and above[-1].startswith("#"):
        comments.insert(0, above.pop().lstrip("# "))
    return " ".join(comments)


def test_the_test_line_says_what_the_engine_tests_need_and_how_to_build_it():
    from tests.engines import harness

    tests = README.split("To check it yourself", 1)[1]
    build = f"sudo {harness.BUILD}"  # the command the engine tests' skip line names
    assert f"\n{build} " in tests, "the command that builds the engine root, as a line of its own"
    assert tests.index(build) < tests.index("venv/bin/python -m pytest")
    said = " ".join(tests.split("```", 2)[2].split())
    assert "need root, `lua5.3`" in said and build in said and "skipped" in said


def test_the_ai_contract_stands_beside_the_first_pytorchjob():
    """The three labels, with the queue, priority classes and limit of the default stack, just
    above the first `kubectl create` of a PyTorchJob, and the example carries them."""
    import yaml

    from core import names
    from core.settings import SETTINGS

    first = re.search(r"^kubectl --kubeconfig \S+ create -f (jobs/kubernetes/\S+)", README, re.M)
    assert first and first[1] == "jobs/kubernetes/pytorchjob-ddp.yaml"
    said = _comment_before(first[0])
    max_seconds = int(next(s.default for s in SETTINGS if s.key == "aiJobMaxMinutes")) * 60
    assert f"{names.QUEUE_NAME_LABEL}: {names.AI_LOCAL_QUEUE}" in said
    assert f"{names.PRIORITY_CLASS_LABEL}: {' or '.join(names.AI_PRIORITY_CLASSES)}" in said
    assert f"{names.MAX_EXEC_TIME_LABEL}: at most {max_seconds} (aiJobMaxMinutes x 60) or it is refused" in said
    labels = yaml.safe_load((ROOT / first[1]).read_text())["metadata"]["labels"]
    assert labels[names.QUEUE_NAME_LABEL] == names.AI_LOCAL_QUEUE
    assert labels[names.PRIORITY_CLASS_LABEL] in names.AI_PRIORITY_CLASSES
    assert 1 <= int(labels[names.MAX_EXEC_TIME_LABEL]) <= max_seconds


def test_the_hpc_output_path_stands_beside_the_first_sbatch():
    """Where the first sbatch's output lands (its --output, %x its job name, %j the job id) and
    the command that reads it, through slurmctld, which mounts /mnt/share."""
    from core import host_layout, names
    from validation.scenarios import sbatch_options

    first = re.search(r"^kubectl --kubeconfig \S+ exec -i .* -- sbatch < (jobs/slurm/\S+)", README, re.M)
    assert first
    options = sbatch_options((ROOT / first[1]).read_text())
    path = options["--output"].replace("%x", options["--job-name"]).replace("%j", "<jobid>")
    assert path.startswith(host_layout.SHARE_DIR + "/")
    assert f"Output lands in {path}" in _comment_before(first[0])
    slurm = names.slurm_names("slinky")
    every = path.replace("<jobid>", "*")  # `<jobid>` would be a redirection to bash: the glob runs as written
    # with the HPC users' kubeconfig, whose context is slurmctld's namespace
    kubeconfig = names.hpc_user_role(slurm).kubeconfig_file
    read = f"kubectl --kubeconfig {kubeconfig} exec {slurm.controller_pod} -c {names.SLURMCTLD_CONTAINER} -- sh -c 'cat {every}'"
    block = README.split(first[0], 1)[1].split("\n\n", 1)[0]
    assert read in block.splitlines()

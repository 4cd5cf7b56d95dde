"""Secrets stay out of git: the files the README and the outputs tell users
to write are ignored, the SSH key is 0600 from its first byte, a render directory ignores itself."""

import os
import re
import shutil
import subprocess
from pathlib import Path

from cli import artifacts
from stacks import workloads

ROOT = Path(__file__).resolve().parents[2]
# What the README and docs/ tell users to run
README = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def _ignored(path: str, cwd: Path) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", path], cwd=cwd).returncode == 0


def test_every_secret_file_users_are_told_to_write_is_ignored_by_git():
    written = set(re.findall(r"pulumi stack output --show-secrets \w+ > ([\w./-]+)", README))
    written |= {workloads.KUBECONFIG_FILE, workloads.SSH_KEY_FILE}
    assert {"kubeconfig.yaml", "testbed.pem", "hpc.kubeconfig", "ai.kubeconfig"} <= written
    assert shutil.which("git"), "git is needed to check .gitignore"
    for name in sorted(written):
        assert _ignored(name, ROOT), f"{name} is not in .gitignore"


def test_the_ssh_command_writes_the_key_0600_from_its_first_byte(default_run, tmp_path):
    """Run the sshCommand output in bash with stand-ins for pulumi and ssh: the key file is
    0600 while pulumi writes it (umask) and after (an older 0644 file is tightened too)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pulumi").write_text('#!/bin/bash\nstat -L -c %a /proc/$$/fd/1 > "$MODE_LOG"\necho KEY\n')
    (bin_dir / "ssh").write_text('#!/bin/bash\nstat -c %a testbed.pem >> "$MODE_LOG"\n')
    for tool in ("pulumi", "ssh"):
        (bin_dir / tool).chmod(0o755)
    command = default_run.outputs["sshCommand"]
    for existing in (False, True):
        work = tmp_path / f"work-{existing}"
        work.mkdir()
        if existing:
            (work / workloads.SSH_KEY_FILE).write_text("old")
            (work / workloads.SSH_KEY_FILE).chmod(0o644)
        log = work / "modes"
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "MODE_LOG": str(log)}
        subprocess.run(["bash", "-c", f"umask 022; {command}"], cwd=work, env=env, check=True)
        modes = log.read_text().split()
        assert modes == (["644", "600"] if existing else ["600", "600"]), modes
        assert (work / workloads.SSH_KEY_FILE).read_text() == "KEY\n"


def test_a_render_directory_is_ignored_by_git_wherever_it_is(default_run, tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    artifacts.render_replacing(default_run, tmp_path / "render")
    assert _ignored("render/cloud-init/testbed-control.yaml", tmp_path)
    status = subprocess.run(["git", "status", "--porcelain"], cwd=tmp_path, capture_output=True, text=True)
    assert status.stdout == ""

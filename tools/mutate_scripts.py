"""Shell mutation runner: delete one command of a node script at a time, run the sandbox tests.

    venv/bin/python tools/mutate_scripts.py [SCRIPT ...]     (default: the three node scripts)

A command is one logical line (continuation lines and heredoc bodies belong to it). A
deletion that leaves the script unparsable (`bash -n`) is no mutant and is not counted;
comments, blank lines, progress messages (`log`), the strict-mode and sourcing preamble and bare block keywords are
not commands. Each mutant runs in a copy of the tree, so the working tree is never changed.
Prints one line per surviving mutant and a killed/total line per script; exits 1 if any
mutant survived."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ("node-common.sh", "gpu-worker.sh", "control-plane.sh")
TESTS = (
    "tests/components/test_bootstrap_idempotent.py",
    "tests/components/test_bootstrap.py",
    "tests/components/test_gpu_enforcement.py",  # the toolkit settings, the package holds
    "tests/components/test_host_key.py",  # control-plane.sh's host key on the console, its step
)
COPY: tuple[str, ...] = ("core", "components", "stacks", "cli", "tests", "validation", "values", "jobs", "docs")
COPY += ("pytest.ini", "README.md", "Pulumi.yaml", "Pulumi.dev.yaml", "__main__.py")
NOT_COMMANDS = re.compile(
    r"^\s*(#.*|log .*|set -[A-Za-z]+.*|\. .*testbed-lib\.sh.*|then|else|fi|do|done|\}|\{|esac|;;)?\s*$"
)


def commands(text: str) -> list[tuple[int, int]]:
    """(first line, line after the last) of every command in the script."""
    lines = text.splitlines()
    found, i = [], 0
    while i < len(lines):
        start = i
        heredoc = re.search(r"<<-?'?(\w+)'?", lines[i])
        while lines[i].endswith("\\") and i + 1 < len(lines):
            i += 1
        if heredoc:
            while i + 1 < len(lines) and lines[i].strip() != heredoc.group(1):
                i += 1
        i += 1
        if not NOT_COMMANDS.fullmatch(lines[start]):
            found.append((start, i))
    return found


def parses(text: str) -> bool:
    return subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True).returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scripts", nargs="*", default=list(SCRIPTS))
    args = parser.parse_args(argv)
    survived_any = False
    with tempfile.TemporaryDirectory(prefix="shell-mutants-") as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        for name in COPY:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
            elif source.exists():
                shutil.copy2(source, tree / name)
        for script in args.scripts:
            path = tree / "components" / "scripts" / script
            original = path.read_text()
            lines = original.splitlines(keepends=True)
            killed = total = 0
            for start, end in commands(original):
                mutant = "".join(lines[:start] + lines[end:])
                if not parses(mutant):
                    continue
                total += 1
                path.write_text(mutant)
                result = subprocess.run(
                    [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *TESTS],
                    cwd=tree,
                    capture_output=True,
                    text=True,
                )
                if result.returncode == 0:
                    survived_any = True
                    deleted = " ".join(line.strip() for line in lines[start:end])[:100]
                    print(f"survived: {script}:{start + 1}: {deleted}")
                else:
                    killed += 1
            path.write_text(original)
            print(f"{script}: {killed}/{total} killed")
    return 1 if survived_any else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The README stays true: every setting documented with its default, CI runs its test command."""

import re
from pathlib import Path

from stacks.settings import SETTINGS

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_every_setting_is_in_the_readme_table_with_its_default():
    rows = {m[1]: m[2] for m in re.finditer(r"^\| `(\w+)` \| \w+ \| ([^|]+) \|", README, re.M)}
    assert set(rows) == {s.key for s in SETTINGS}
    for s in SETTINGS:
        if s.default is None:
            assert rows[s.key].strip() == "(required)"
        elif s.default != "":
            shown = str(s.default).lower() if isinstance(s.default, bool) else str(s.default)
            assert rows[s.key].strip() == f"`{shown}`", s.key


def test_the_readme_says_what_each_setting_accepts():
    rows = {m[1]: m[2].strip() for m in re.finditer(r"^\| `(\w+)` \| \w+ \| [^|]+ \| ([^|]+) \|", README, re.M)}
    assert rows == {s.key: s.accepted for s in SETTINGS}


def test_ci_runs_the_readme_test_command_in_a_fresh_venv():
    ci = (ROOT / ".ci" / "run").read_text()
    for command in ("python3 -m venv venv", "venv/bin/pip install", "-r requirements.txt", "venv/bin/python -m pytest"):
        assert command in README and command in ci


def test_readme_pictures_exist():
    for picture in re.findall(r"\]\(([^)]+\.png)\)", README):
        assert (ROOT / picture).is_file(), picture

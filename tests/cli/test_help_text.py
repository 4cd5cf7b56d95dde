"""What users read from the command line speaks of the product: no issue numbers, no internal
design-document sections, no "seed" but as the name of a scaling policy."""

import re
import sys

import pytest

from cli import __main__ as cli
from components import slurmd_scaling

COMMANDS = ["plan", "render", "validate", "simulate", "preflight", "doctor", "e2e"]
INTERNAL = re.compile(r"\bissues? ?#?\d+|#\d+\b|\bDESIGN\b|\bsection \d+|\bseed\b", re.I)


def internal_words(text: str) -> list[str]:
    text = " ".join(text.split())  # argparse wraps help; the policy list may span lines
    text = text.replace(", ".join(slurmd_scaling.POLICIES), "")  # "seed" as a policy's name
    return INTERNAL.findall(text)


@pytest.mark.parametrize("argv", [["--help"]] + [[c, "--help"] for c in COMMANDS])
def test_help_speaks_of_the_product(argv, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "usage:" in out
    assert internal_words(out) == []


def test_the_check_finds_what_it_looks_for():
    assert internal_words("plan (DESIGN section 4), see issue 12 and the seed article") == [
        "DESIGN",
        "section 4",
        "issue 12",
        "seed",
    ]
    assert internal_words("--policy: " + ", ".join(slurmd_scaling.POLICIES)) == []


@pytest.mark.parametrize(
    ("argv0", "typed"),
    [("/home/u/venv/bin/testbed", "testbed"), ("/home/u/gpu-testbed/cli/__main__.py", "python -m cli")],
)
def test_help_names_the_tools_as_the_user_typed_them(argv0, typed, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [argv0])
    for argv in [["--help"]] + [[c, "--help"] for c in COMMANDS]:
        with pytest.raises(SystemExit):
            cli.main(argv)
        out = capsys.readouterr().out
        assert out.startswith(f"usage: {typed} {argv[0] if len(argv) == 2 else ''}".rstrip()), argv
        if typed == "testbed":
            assert "python -m cli" not in out, argv


@pytest.mark.parametrize("command", ["plan", "render"])
def test_plan_and_render_help_say_what_the_command_does(command, capsys):
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    out = capsys.readouterr().out
    description = " ".join(out.split("\n\n", 1)[1].split("options:", 1)[0].split())
    assert description == cli.DESCRIPTIONS[command] and "`pulumi up`" in description
    assert "nothing is created" in description.lower() or "without building anything" in description


def test_e2e_help_does_not_offer_the_config_it_refuses(capsys):
    with pytest.raises(SystemExit):
        cli.main(["e2e", "--help"])
    assert "--config" not in capsys.readouterr().out

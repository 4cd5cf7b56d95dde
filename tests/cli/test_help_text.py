"""What users read from the command line speaks of the product: no issue numbers, no internal
design-document sections, no "seed" but as the name of a scaling policy."""

import re

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

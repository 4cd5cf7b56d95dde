"""README's twin tables are the generator's (`python -m cli simulate --readme-tables`): every
shipped scenario under every policy of components.slurmd_scaling, Kueue as the scenario says.
One test per scenario (so the runs spread over the workers) checks its rows; one checks the
layout around them, so together they compare the whole tables."""

import functools
import re
from pathlib import Path

import pytest

from cli import simulate as cli
from cli.__main__ import main
from components import slurmd_scaling
from core import settings
from stacks import offline
from tests.twin import runs as cached
from twin import kube, scenario, tables

ROOT = Path(__file__).resolve().parents[2]
STALE = f"README's twin tables differ from what the twin gives; regenerate them: {tables.REGENERATE}"


@functools.cache
def dev() -> settings.Settings:
    return offline.stack_settings("dev", [])


def block(name: str, text: str | None = None) -> str:
    text = (ROOT / "docs" / "handoff.md").read_text() if text is None else text
    assert text.count(tables.begin(name)) == 1 and text.count(tables.end(name)) == 1, f"markers of {name}: {STALE}"
    return text[text.index(tables.begin(name)) : text.index(tables.end(name)) + len(tables.end(name))]


def rows(name: str) -> list[str]:
    return [line for line in block(name).splitlines() if re.match(r"\| `", line)]


def with_kubernetes() -> list[str]:
    return [p.stem for p in cli.shipped() if tables.has_kubernetes_jobs(scenario.load(p))]


@pytest.mark.slow
@pytest.mark.parametrize("path", cli.shipped(), ids=lambda p: p.stem)
def test_each_scenarios_rows_are_the_twins(path):
    sc, setups = cli.policy_setups(path, "dev", [], dev())  # as cli.run_scenario runs them
    runs = {policy: cached.run(setup, sc) for policy, setup in setups.items()}
    assert tables.policy_row(path.stem, runs) in rows("policies"), STALE
    expected = tables.kueue_rows(path.stem, runs) if path.stem in with_kubernetes() else []
    assert [r for r in rows("kueue") if r.startswith(f"| `{path.stem}`, ")] == expected, STALE


def test_the_tables_have_one_row_per_scenario_and_policy_around_the_generators_layout():
    policies, kueue = rows("policies"), rows("kueue")
    assert [r.split("`")[1] for r in policies] == [f"{p.stem}.yaml" for p in cli.shipped()], STALE
    assert [r.split(" | ")[0] for r in kueue] == [
        f"| `{name}`, {policy}" for name in with_kubernetes() for policy in slurmd_scaling.POLICIES
    ], STALE
    assert block("policies") == tables.blocks(policies, kueue)["policies"], STALE
    assert block("kueue") == tables.blocks(policies, kueue)["kueue"], STALE


def test_the_figures_are_labelled_modelled_with_the_twins_assumptions():
    for name in tables.TABLES:
        assert "Modelled by the twin, not measured. Its assumptions: container start 5 s" in block(name)
        for role, seconds in kube.IMAGE_PULL.items():
            assert f"{role} {seconds:g} s" in block(name)


def test_readme_tables_rewrites_between_the_markers_and_prints_without_a_file(tmp_path, monkeypatch, capsys):
    """With the shipped scenarios cut to one (cheap), the command's two modes."""
    one = [p for p in cli.shipped() if p.stem == "other-partition"]
    monkeypatch.setattr(cli, "shipped", lambda: one)
    readme = tmp_path / "README.md"
    readme.write_text(
        f"intro\n{tables.begin('policies')}\nold\n{tables.end('policies')}\nmiddle\n{block('kueue')}\nend\n"
    )
    assert main(["simulate", "--readme-tables", str(readme)]) == 0
    fresh = tables.tables(cli.run_shipped("dev", [], dev()))
    assert readme.read_text() == f"intro\n{fresh['policies']}\nmiddle\n{fresh['kueue']}\nend\n"
    capsys.readouterr()
    assert main(["simulate", "--readme-tables"]) == 0
    assert capsys.readouterr().out == f"{fresh['policies']}\n\n{fresh['kueue']}\n"


def test_readme_tables_bad_input_one_line_each(tmp_path, capsys):
    bare = tmp_path / "bare.md"
    bare.write_text("no markers\n")
    assert main(["simulate", "--readme-tables", str(bare), "--policy", "reference-triggers", "--json"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[:2] == [
        "--policy: not allowed with --readme-tables, which runs every policy",
        "--json: not allowed with --readme-tables, which runs every policy",
    ]
    assert [line.split(" lacks the markers ")[1] for line in lines[2:]] == [
        f"{tables.begin(n)} ... {tables.end(n)}, once each" for n in tables.TABLES
    ]
    assert main(["simulate", "--readme-tables", "--scenario", "x.yaml"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


def _file(tmp_path, text_or_bytes):
    path = tmp_path / "doc.md"
    (path.write_bytes if isinstance(text_or_bytes, bytes) else path.write_text)(text_or_bytes)
    return path


B, E = tables.begin, tables.end
# issue 31: markers out of order duplicated sections and exited 0; a FIFO hung, /dev/zero ran out
# of memory and Latin-1 was a traceback: now the one reader of user files and its limits
BAD_FILES = [
    (
        lambda t: _file(t, f"{E('policies')}\n{B('policies')}\n{B('kueue')}\n{E('kueue')}\n"),
        "has the end marker of policies before its begin marker",
    ),
    (
        lambda t: _file(t, f"{B('policies')}\n{B('kueue')}\n{E('kueue')}\n{E('policies')}\n"),
        "has the kueue markers inside the policies table",
    ),
    (
        lambda t: _file(t, f"{B('policies')}\n{B('kueue')}\n{E('policies')}\n{E('kueue')}\n"),
        "has the kueue markers inside the policies table",
    ),
    (
        lambda t: _file(t, f"{B('policies')}{B('policies')}\n{E('policies')}\n{B('kueue')}\n{E('kueue')}\n"),
        "lacks the markers",
    ),
    (lambda t: _file(t, "caf\xe9\n".encode("latin-1")), "is not UTF-8 text: byte 0xe9 at offset 3"),
    (lambda t: Path("/dev/zero"), "is larger than 256 KiB"),
    (lambda t: (__import__("os").mkfifo(t / "fifo"), t / "fifo")[1], "is a named pipe or a socket"),
    (lambda t: t, "cannot be read"),
]


@pytest.mark.parametrize("make, fragment", BAD_FILES, ids=[str(i) for i in range(len(BAD_FILES))])
def test_readme_tables_refuses_a_file_it_cannot_rewrite_in_one_line_and_leaves_it(
    make, fragment, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(cli, "run_shipped", lambda *a: pytest.fail("the scenarios ran for a file that is refused"))
    path = make(tmp_path)
    before = path.read_bytes() if path.is_file() else None
    assert main(["simulate", "--readme-tables", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and fragment in err and err.startswith("--readme-tables: "), err
    assert all(line.startswith("--readme-tables: ") for line in err.splitlines())
    if before is not None:
        assert path.read_bytes() == before

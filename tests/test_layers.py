"""The folders show the layers: a module imports its own layer and the layers below it, never one
above it nor one beside it (imports inside functions count too), the ground layer imports no
Pulumi, and docs/architecture.md draws the same layers in the same order."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Bottom to top: each layer with the project's top-level packages and modules it is made of.
# Layers in one row stand side by side: neither imports the other.
LAYERS: tuple[dict[str, set[str]], ...] = (
    {"ground": {"core"}},  # the settings and the names contract: no Pulumi
    {"components": {"components"}},
    {"stacks": {"stacks", "__main__"}},  # the Pulumi program and its offline engine; __main__.py: Pulumi's entry
    {"twin": {"twin"}, "validation": {"validation"}},
    {"tools": {"cli", "testbed_cli"}},  # testbed_cli.py: the launcher of the `testbed` command
    {"development": {"benchmarks", "tools"}},  # plan timing, mutation testing: not shipped
)
RANK = {layer: rank for rank, row in enumerate(LAYERS) for layer in row}
LAYER_OF = {name: layer for row in LAYERS for layer, names in row.items() for name in names}
GROUND = "ground"


def imported(node: ast.Import | ast.ImportFrom, own: str) -> list[str]:
    """The top-level names an import statement reaches; `own` for a relative import."""
    if isinstance(node, ast.Import):
        return [alias.name.split(".")[0] for alias in node.names]
    return [own] if node.level else [(node.module or "").split(".")[0]]


def violations(path: str, text: str) -> list[str]:
    """One line per import of `path` (relative to the root) that breaks the layering."""
    own = path.split("/")[0].removesuffix(".py")
    layer = LAYER_OF[own]
    found = []
    for node in ast.walk(ast.parse(text, path)):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        for name in imported(node, own):
            if layer == GROUND and (name == "pulumi" or name.startswith("pulumi_")):
                found.append(f"{where(path, text, node)}: the ground layer ({own}) imports Pulumi")
            elif name == "tests":
                found.append(f"{where(path, text, node)}: {layer} ({own}) imports the tests")
            elif (target := LAYER_OF.get(name)) is not None and target != layer:
                if RANK[target] > RANK[layer]:
                    found.append(
                        f"{where(path, text, node)}: {layer} ({own}) imports {target} ({name}), a layer above it"
                    )
                elif RANK[target] == RANK[layer]:
                    found.append(
                        f"{where(path, text, node)}: {layer} ({own}) imports {target} ({name}), a layer beside it"
                    )
    return found


def where(path: str, text: str, node: ast.Import | ast.ImportFrom) -> str:
    """The file, line and statement of an import that breaks the layering: only for those, as
    ast.get_source_segment splits the whole file again at each call (a second of the suite's CPU
    when it ran for every import)."""
    statement = ast.get_source_segment(text, node) or ast.unparse(node)
    return f"{path}:{node.lineno}: `{' '.join(statement.split())}`"


def layered_files() -> list[Path]:
    """Every Python file of the layers (found on disk, so files not yet in git count too)."""
    files = []
    for name in LAYER_OF:
        if (ROOT / name).is_dir():
            files += sorted((ROOT / name).rglob("*.py"))
        elif (ROOT / f"{name}.py").is_file():
            files.append(ROOT / f"{name}.py")
    return files


def test_no_import_runs_up_or_across_the_layers_and_the_ground_has_no_pulumi():
    files = layered_files()
    assert ROOT / "core" / "settings.py" in files and ROOT / "cli" / "__main__.py" in files
    found = [line for f in files for line in violations(f.relative_to(ROOT).as_posix(), f.read_text())]
    assert not found, "\n".join(found)


def test_every_top_level_package_and_module_has_a_layer():
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    tops = {path.split("/")[0].removesuffix(".py") for path in tracked}
    assert tops - set(LAYER_OF) - {"tests"} == set()


def test_the_check_sees_lazy_relative_sideways_and_pulumi_imports():
    text = (
        "import pulumi_aws\n"
        "from core import names\n"
        "def later():\n"
        "    from cli import offline\n"
        "    import tests.conftest\n"
    )
    assert violations("core/settings.py", text) == [
        "core/settings.py:1: `import pulumi_aws`: the ground layer (core) imports Pulumi",
        "core/settings.py:4: `from cli import offline`: ground (core) imports tools (cli), a layer above it",
        "core/settings.py:5: `import tests.conftest`: ground (core) imports the tests",
    ]
    assert violations("twin/sim.py", "from validation import timeline\nfrom . import kube\n") == [
        "twin/sim.py:1: `from validation import timeline`: twin (twin) imports validation (validation), "
        "a layer beside it"
    ]
    assert violations("cli/doctor.py", "from components import keda\nfrom testbed_cli import main\n") == []


def test_the_architecture_page_draws_the_same_layers():
    """The picture under "## Layout" in docs/architecture.md: one line per row of LAYERS, top
    first, naming its packages (`core/`) and modules (`__main__.py`)."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    (picture,) = re.findall(r"^## Layout\n.*?^```\n(.*?)^```", page, re.M | re.S)
    rows = []
    for line in picture.splitlines():
        # a top-level name: not part of a longer path (`stacks/testbed.py` names program only as text)
        names = set(re.findall(r"(?<![\w/.])(\w+)(?:/(?![\w])|\.py\b)", line))
        if names:
            rows.append(names)
    assert rows[::-1] == [set().union(*row.values()) for row in LAYERS]


def module_of(path: Path) -> str:
    """`components/keda.py` -> `components.keda`; a package's `__init__.py` -> the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(module: str, text: str, known: set[str]) -> set[str]:
    """The project modules one file imports (inside functions too): `from components import keda`
    reaches components.keda when that is a module, else the package."""
    package = module if module in {m.rsplit(".", 1)[0] for m in known if "." in m} else module.rpartition(".")[0]
    reached = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            reached |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package if node.level else (node.module or "")
            if node.level and node.module:
                base = f"{base}.{node.module}"
            for alias in node.names:
                reached.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {name for name in reached if name in known and name != module}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module: each is a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for after in sorted(graph[node]):
            if after not in index:
                visit(after)
                low[node] = min(low[node], low[after])
            elif after in stack:
                low[node] = min(low[node], index[after])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_no_circles_between_modules_even_inside_one_layer():
    files = layered_files()
    known = {module_of(f) for f in files}
    graph = {module_of(f): module_imports(module_of(f), f.read_text(), known) for f in files}
    assert import_circles(graph) == []


def test_the_circle_check_finds_a_circle_inside_one_layer():
    known = {"components.keda", "components.monitoring", "components.helm"}
    graph = {
        "components.keda": module_imports("components.keda", "from components import monitoring, helm\n", known),
        "components.monitoring": module_imports("components.monitoring", "def f():\n    from . import keda\n", known),
        "components.helm": set(),
    }
    assert import_circles(graph) == [["components.keda", "components.monitoring"]]


def test_mypy_checks_every_product_package():
    """mypy.ini's `files` (what .ci/run's bare `venv/bin/mypy` checks) is every layer's packages and
    root modules but the benchmarks: a new package is typed from its first commit."""
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "mypy.ini")
    checked = {f.strip().removesuffix(".py") for f in config["mypy"]["files"].split(",")}
    product = set(LAYER_OF) - {"benchmarks"}
    assert checked == product, (
        f"not checked: {sorted(product - checked)}; not a product package: {sorted(checked - product)}"
    )

"""mutmut, one module at a time, against the tests that belong to that module.

    venv/bin/python tools/mutation.py MODULE [...]   e.g. components.network validation.checks
    venv/bin/python tools/mutation.py MUTANT [...]   names as `mutmut results` prints them
    venv/bin/python tools/mutation.py --scores       killed/total per module from the last runs
                                                     (exit 1 and one line when there are none yet)

mutmut credits each function with every test that calls it; under the mock engine that is
every test that runs the program, so one surviving mutant would cost the whole suite. Here
each module's mutants run only the test files in RELEVANT (the ones that assert what the
module renders), which is also what the scores in docs/mutation-scores.md mean.

A function that runs only while its module is imported (core.settings' rule factories build
the settings table) is called by no test, so mutmut would leave its mutants untested. Each
mutant therefore runs in a process that imports the project afresh with the mutant active
(mutmut's fork server, warmed up with third-party modules only: tools/mutation-preload.txt),
and such a function is credited with every test file of its module. The configuration
(modules, copied files, isolation) is [mutmut] in setup.cfg."""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = "tests/stacks/test_components.py"  # every component's type and children
RELEVANT = {
    "components.cluster_identity": ("tests/stacks/test_cluster.py", "tests/components/test_bootstrap.py", TREE),
    "components.network": (
        "tests/components/test_network.py",
        "tests/stacks/test_security.py",
        "tests/stacks/test_infrastructure.py",
        TREE,
    ),
    "components.bootstrap": (
        "tests/components/test_bootstrap.py",
        "tests/components/test_bootstrap_idempotent.py",
        "tests/cli/test_artifacts.py",
        "tests/stacks/test_infrastructure.py",  # the SSH key in every node's user-data
        "tests/components/test_api_hardening.py",  # the control node's API server files
    ),
    "components.ec2": (
        "tests/stacks/test_infrastructure.py",
        "tests/stacks/test_security.py",
        "tests/stacks/test_day2.py",  # the rolling replacement's depends_on, the rebuild trigger
        TREE,
    ),
    "components.slinky": ("tests/components/test_slinky.py", "tests/stacks/test_platform.py", TREE),
    "components.keda": ("tests/stacks/test_platform.py", "tests/components/test_slurmd_scaling.py", TREE),
    "components.slurmd_scaling": ("tests/components/test_slurmd_scaling.py", "tests/stacks/test_platform.py"),
    "core.settings": (
        "tests/core/test_settings.py",
        "tests/core/test_settings_refusals.py",
        "tests/cli/test_cli.py",
        "tests/core/test_settings_declaration.py",  # Pulumi.yaml, docs/settings.md and the refusal table
    ),
    "validation.checks": (
        "tests/validation/test_checks.py",
        "tests/validation/test_runner.py",
        "tests/validation/test_process_proof.py",  # the process, leak-probe and dcgm checks
    ),
}


def module_of(function_key: str) -> str:
    return function_key.rsplit(".", 1)[0]


def run(modules: list[str]) -> None:
    import mutmut.__main__ as mutmut_main
    from mutmut.state import state

    collect = mutmut_main.collect_or_load_stats

    def collect_then_restrict(*args, **kwargs):
        collect(*args, **kwargs)
        by_function = state().tests_by_mangled_function_name
        every_test = set(state().duration_by_test)  # every test the stats pass ran, calls or not
        for key, tests in by_function.items():
            files = RELEVANT.get(module_of(key), ())
            by_function[key] = {t for t in tests if t.split("::")[0] in files}
        for key in mutated_functions():
            files = RELEVANT.get(module_of(key), ())
            if not by_function.get(key):  # called only at import time, or never
                by_function[key] = {t for t in every_test if t.split("::")[0] in files}

    mutmut_main.collect_or_load_stats = collect_then_restrict
    mutmut_main.cli(["run", "--max-children", "2", *(f"{m}.*" if m in RELEVANT else m for m in modules)])


def mutated_functions() -> set[str]:
    return {
        key.split("__mutmut_")[0]
        for meta in (ROOT / "mutants").rglob("*.py.meta")
        for key in json.loads(meta.read_text())["exit_code_by_key"]
    }


def scores() -> dict[str, collections.Counter]:
    from mutmut.stats import status_by_exit_code

    found: dict[str, collections.Counter] = {}
    for meta in sorted((ROOT / "mutants").rglob("*.py.meta")):
        for key, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if code is not None:
                found.setdefault(module_of(key.split("__mutmut_")[0]), collections.Counter())[
                    status_by_exit_code[code]
                ] += 1
    return found


def main(argv: list[str]) -> int:
    if argv == ["--scores"]:
        found = scores()
        if not found:
            print(
                f"tools/mutation.py: no mutation results under {ROOT / 'mutants'}; produce them with "
                "`venv/bin/python tools/mutation.py MODULE` (e.g. components.network)",
                file=sys.stderr,
            )
            return 1
        for module, counts in found.items():
            print(f"{module}: {counts['killed']}/{sum(counts.values())} killed {dict(counts)}")
        return 0
    # a module runs all its mutants; a mutant's name (as `mutmut results` prints it) runs that one
    unknown = [m for m in argv if m not in RELEVANT and module_of(m.split("__mutmut_")[0]) not in RELEVANT]
    if not argv or unknown:
        print(f"tools/mutation.py: modules {unknown or '(none)'} not allowed; expected some of: {', '.join(RELEVANT)}")
        return 2
    run(argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

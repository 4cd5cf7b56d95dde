"""Each setting is declared once, as a field of `core.settings.Settings`; everything else that
lists the settings is checked against that declaration, and a drift names the setting.

Pulumi.yaml's config block (what `pulumi config` knows), docs/settings.md's table (what a user
reads) and the refusal table in test_settings_refusals.py (that each setting is refused on bad
input) are compared key by key with `settings.SETTINGS`, the table derived from the fields."""

import re
from pathlib import Path

import yaml

from core import settings
from tests.core.test_settings_refusals import ROWS, WHOLE_LINES

ROOT = Path(__file__).resolve().parents[2]
PULUMI_TYPES = {str: "string", int: "integer", bool: "boolean"}


def _drifting(expected: dict, found: dict) -> list[str]:
    """The keys whose entries differ, are missing or are extra; or every key if only the order differs."""
    keys = [k for k in {**expected, **found} if expected.get(k) != found.get(k)]
    return keys or ([] if list(expected) == list(found) else ["(order) " + ", ".join(found)])


def pulumi_config_block() -> dict[str, dict]:
    """Pulumi.yaml's `config:` as the declaration implies it (a required setting has no default)."""
    block = {}
    for s in settings.SETTINGS:
        entry = {"type": PULUMI_TYPES[s.kind], "description": s.description}
        block[s.key] = entry if s.default is None else {**entry, "default": s.default}
    return block


def docs_row(s: settings.Setting) -> str:
    if s.default is None:
        default = "(required)"
    else:
        default = "`" + (str(s.default).lower() if s.kind is bool else str(s.default) or '""') + "`"
    return f"| `{s.key}` | {s.kind.__name__} | {default} | {s.accepted} | {s.description} |"


def test_every_setting_is_a_str_int_or_bool_field_with_a_camel_case_key():
    odd = [s.key for s in settings.SETTINGS if s.kind not in PULUMI_TYPES or not re.fullmatch("[a-z][A-Za-z]*", s.key)]
    assert not odd, f"settings of another type or an odd key: {odd}"
    fields = [f for f in settings.Settings.__dataclass_fields__ if f != "stack"]
    assert fields == [s.attribute for s in settings.SETTINGS]


def test_pulumi_yaml_declares_each_setting_as_the_declaration_does():
    declared = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["config"]
    drifting = _drifting(pulumi_config_block(), declared)
    assert not drifting, f"Pulumi.yaml's config block differs from core/settings.py for: {drifting}"


def test_docs_settings_table_shows_each_setting_as_the_declaration_does():
    page = (ROOT / "docs" / "settings.md").read_text()
    rows = {m[1]: m[0] for m in re.finditer(r"^\| `(\w+)` \|.*\|$", page, re.M)}
    drifting = _drifting({s.key: docs_row(s) for s in settings.SETTINGS}, rows)
    assert not drifting, f"docs/settings.md's table differs from core/settings.py for: {drifting}"


def test_the_refusal_table_refuses_every_setting():
    refused = {key for _, key, _ in ROWS} | {line.split(": ")[0] for _, line in WHOLE_LINES}
    missing = [s.key for s in settings.SETTINGS if s.key not in refused]
    assert not missing, f"no row of tests/core/test_settings_refusals.py refuses: {missing}"

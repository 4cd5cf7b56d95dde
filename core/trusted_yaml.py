"""YAML the project itself makes or ships, read and written by libyaml where PyYAML has it.

Trusted text only: what the program renders (cloud-config, chart values, manifests), the charts'
values files and manifests we ship, and render's output read back. A user's file goes through
core/user_files.py, whose guarded pure-Python loader refuses anchors, duplicate keys and odd
characters with the line they are on.

libyaml (PyYAML's C classes, yaml/cyaml.py at PyYAML 6.0.3) parses and emits about ten times as
fast as the pure-Python classes. It parses our text to the same data, and it writes the same text
but for one style: a double-quoted string longer than the line is folded at other places (PyYAML's
emitter.py write_double_quoted also breaks after an escape, libyaml's emitter.c only at a space).
The emitter double-quotes only a string with a line break, a tab, a control or non-ASCII character
(analyze_scalar); a document holding one is written by the pure classes, every other by libyaml,
so the text is what the pure classes write, byte for byte. tests/cli/test_cli.py's two renders run
one with each path and compare every byte; tests/core/test_trusted_yaml.py the strings at the edge.

PyYAML's manylinux wheels link libyaml in; where it is missing (a source build without it) the
pure classes stand in. `Loader`, `Dumper` and `PureDumper` are read at each call, so a test can
point them at the pure classes."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import yaml

Loader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
Dumper: type = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
PureDumper: type = yaml.SafeDumper  # for a document libyaml would fold otherwise

Representer = Callable[[Any, Any], yaml.Node]


def load(text: str) -> Any:
    """`yaml.safe_load(text)`."""
    return yaml.load(text, Loader=Loader)


def load_all(text: str) -> list[Any]:
    """`list(yaml.safe_load_all(text))`."""
    return list(yaml.load_all(text, Loader=Loader))


def literal_blocks(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    """A `str_representer` writing each multi-line string as a literal block (`|`), so a script
    stays readable where it is embedded (cloud-config); the one representer libyaml may write with."""
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


def dump(data: Any, *, str_representer: Representer | None = None, **options: Any) -> str:
    """`yaml.safe_dump(data, **options)`; `str_representer`, when given, writes every string."""
    return dump_all([data], str_representer=str_representer, **options)


def dump_all(documents: Iterable[Any], *, str_representer: Representer | None = None, **options: Any) -> str:
    """`yaml.safe_dump_all(documents, **options)`; `str_representer` as in `dump`. Another
    representer than `literal_blocks` is left to the pure classes: what it asks is not vetted."""
    documents = list(documents)
    if (
        set(options) <= VETTED_OPTIONS
        and _width_alike(options.get("width"))
        and str_representer in (None, literal_blocks)
        and _written_alike(documents, literal_blocks=str_representer is literal_blocks)
    ):
        return yaml.dump_all(documents, Dumper=_dumper(Dumper, str_representer), **options)
    return pure_dump_all(documents, str_representer, options)


def pure_dump_all(documents: list[Any], str_representer: Representer | None, options: dict[str, Any]) -> str:
    """`documents` as the pure classes write them (the tests keep each text: tests/conftest.py)."""
    return yaml.dump_all(documents, Dumper=_dumper(PureDumper, str_representer), **options)


def _dumper(base: type, str_representer: Representer | None) -> type:
    return _with_str_representer(base, str_representer) if str_representer else base


VETTED_OPTIONS = {"sort_keys", "width", "explicit_start"}  # others (flow style, indent, unicode...): pure
# PyYAML takes a width above twice the indent (emitter.py __init__), libyaml the same but a
# negative one as no limit (emitter.c yaml_emitter_emit_stream_start); a C long holds the value
WIDTH_RANGE = range(5, 2**31)
SIMPLE_KEY_CHARACTERS = 122  # longer, a "? " key to PyYAML (with its 5-character tag: 128 or more) and not to libyaml


def _written_alike(documents: list[Any], literal_blocks: bool) -> bool:
    """Whether libyaml writes `documents` as the pure emitter does (PyYAML 6.0.3 emitter.py against
    libyaml 0.2.5 emitter.c, which the wheel links). Each document must be a mapping or a list: a
    bare scalar ends with "..." from one and not the other. No string may be double-quoted, which
    they fold at different places: one of printable ASCII never is (a plain or single-quoted scalar,
    which both fold alike); with `literal_blocks` (a representer asking `|` for every multi-line
    string), nor is a multi-line value of printable ASCII whose lines end in no space, written as a
    literal block (analyze_scalar: a space before a break or at the end rules the block out). A key
    must be short: PyYAML counts the implicit tag (`!!str`) in a simple key's 128 characters,
    libyaml does not. Any other type (bytes, dates, objects) is left to the pure classes."""
    if not all(isinstance(d, dict | list) for d in documents):
        return False
    todo: list[Any] = list(documents)
    while todo:
        value = todo.pop()
        if isinstance(value, str):
            if not (value.isascii() and value.isprintable()) and not (literal_blocks and _literal_block(value)):
                return False
        elif isinstance(value, dict):
            if not all(_short_key(key) for key in value):
                return False
            todo.extend(value.values())
        elif isinstance(value, list | tuple):
            todo.extend(value)
        elif not (value is None or isinstance(value, int | float)):  # bool is an int
            return False
    return True


def _width_alike(width: Any) -> bool:
    return width is None or (type(width) is int and width in WIDTH_RANGE)


def _short_key(key: Any) -> bool:
    if isinstance(key, str):  # "" is a "? " key to PyYAML (check_simple_key: an empty scalar), not to libyaml
        return key.isascii() and key.isprintable() and 0 < len(key) <= SIMPLE_KEY_CHARACTERS
    return (key is None or isinstance(key, int | float)) and len(repr(key)) <= SIMPLE_KEY_CHARACTERS


def _literal_block(text: str) -> bool:
    """A literal block both write alike: not one kept with its trailing line breaks (`|+`, for a
    text ending in two, or a lone break), after which libyaml 0.2.5 ends the document with "..."."""
    return (
        text.isascii()
        and text.replace("\n", "").isprintable()
        and " \n" not in text
        and not text.endswith((" ", "\n\n"))
        and text != "\n"
    )


@functools.cache
def _with_str_representer(base: type, representer: Representer) -> type:
    dumper: Any = type(f"{base.__name__}WithStrings", (base,), {})
    dumper.add_representer(str, representer)
    return dumper

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


def dump(data: Any, *, str_representer: Representer | None = None, **options: Any) -> str:
    """`yaml.safe_dump(data, **options)`; `str_representer`, when given, writes every string."""
    return dump_all([data], str_representer=str_representer, **options)


def dump_all(documents: Iterable[Any], *, str_representer: Representer | None = None, **options: Any) -> str:
    """`yaml.safe_dump_all(documents, **options)`; `str_representer` as in `dump`."""
    documents = list(documents)
    base = Dumper if _written_alike(documents, literal_blocks=str_representer is not None) else PureDumper
    dumper = _with_str_representer(base, str_representer) if str_representer else base
    return yaml.dump_all(documents, Dumper=dumper, **options)


def _written_alike(documents: list[Any], literal_blocks: bool) -> bool:
    """Whether libyaml writes `documents` as the pure emitter does: no string in them may be
    double-quoted. One of printable ASCII never is (a plain or single-quoted scalar, which both fold
    alike). With `literal_blocks` (a representer asking `|` for every multi-line string), nor is a
    multi-line value of printable ASCII whose lines end in no space: it is written as a literal
    block, never folded (emitter.py analyze_scalar: a space before a break or at the end rules the
    block out)."""
    todo: list[Any] = list(documents)
    while todo:
        value = todo.pop()
        if isinstance(value, str):
            if not (value.isascii() and value.isprintable()) and not (literal_blocks and _literal_block(value)):
                return False
        elif isinstance(value, dict):
            if any(isinstance(key, str) and not (key.isascii() and key.isprintable()) for key in value):
                return False  # a key is a simple key: never a block
            todo.extend(value.values())
        elif isinstance(value, list | tuple):
            todo.extend(value)
    return True


def _literal_block(text: str) -> bool:
    return text.isascii() and text.replace("\n", "").isprintable() and " \n" not in text and not text.endswith(" ")


@functools.cache
def _with_str_representer(base: type, representer: Representer) -> type:
    dumper: Any = type(f"{base.__name__}WithStrings", (base,), {})
    dumper.add_representer(str, representer)
    return dumper

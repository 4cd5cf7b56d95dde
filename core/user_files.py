"""Files users give the tools: the one YAML reader for all of them (stack files, scenario files,
kubeconfigs), and output directories checked before any work starts.

The reader bounds what a file can cost before it is parsed: its size is read with a limit (so
`/dev/zero` is a refusal, not an exhausted memory), nesting is cut at a depth far below Python's
recursion limit (50,000 brackets are refused at the 65th), aliases are refused (a few hundred
bytes of nested aliases expand to 10^8 nodes: "billion laughs"), a key given twice is refused
as Pulumi's own reader refuses it, and every key must be text. Each refusal is one line. The
limits are documented in docs/input-limits.md.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from core.settings import escaped, show

# The largest shipped file is a few KiB, a kubeconfig with certificates ~10 KiB; PyYAML parses
# about 100 KiB a second here (a 1 MiB stack file took 11 s), so this answers within ~3 s.
MAX_YAML_BYTES = 256 * 1024
MAX_YAML_DEPTH = 64  # mappings and lists inside each other; a scenario needs 4
NAME_MAX = 255  # bytes in one file name (Linux NAME_MAX)
PATH_MAX = 4096  # bytes in a whole path (Linux PATH_MAX)


class UserFileError(Exception):
    """One line: what is wrong with a file the user gave, without the file's name (the caller
    prefixes the flag or file it came from)."""

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem


class _Refused(yaml.YAMLError):
    """A refusal raised while composing or constructing (carries its line number in its text)."""


class _Guarded:
    """Mixed into a PyYAML loader: depth counted where nodes are composed (the only recursion),
    aliases refused, mapping keys text and given once."""

    _depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):  # type: ignore[attr-defined]
            event = self.peek_event()  # type: ignore[attr-defined]
            raise _Refused(
                f"line {event.start_mark.line + 1}: the alias *{escaped(event.anchor or '', 40)} is not accepted "
                "(aliases can multiply a small file without bound); write the value out"
            )
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[attr-defined]
                raise _Refused(f"line {mark.line + 1}: nested deeper than {MAX_YAML_DEPTH} levels")
            return super().compose_node(parent, index)  # type: ignore[misc]
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise _Refused(f"line {line}: the merge key << is not accepted; write the keys out")
            if not isinstance(key_node, yaml.ScalarNode):
                raise _Refused(f"line {line}: a key that is a list or a mapping; expected text")
            key = self.construct_object(key_node, deep=True)  # type: ignore[attr-defined]
            if not isinstance(key, str):
                raise _Refused(f"line {line}: the key {show(key)} is not text; expected text (quote it)")
            if key in seen:
                raise _Refused(f"line {line}: the key {show(key)} appears twice; expected each key once")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc]


class _TextLoader(_Guarded, yaml.BaseLoader):
    """Every scalar as its text (no YAML 1.1 yes/no booleans, octals or sexagesimals): as Pulumi
    passes a stack file's values to the program."""


class _TypedLoader(_Guarded, yaml.SafeLoader):
    """YAML's plain types: text, numbers, booleans, null; numbers and booleans only as YAML 1.2
    writes them. PyYAML reads YAML 1.1, where 010 is 8, 0x10 16, 1_000 1000, 1:30 90, and yes,
    on and y are true: numbers that look like others are refused, not guessed."""

    def construct_yaml_int(self, node):
        if not re.fullmatch(r"[-+]?(0|[1-9][0-9]*)", node.value):
            raise _Refused(_ambiguous(node, "a number", "decimal digits without leading zeros, e.g. 10"))
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node):
        if "_" in node.value or ":" in node.value:
            raise _Refused(_ambiguous(node, "a number", "decimal digits, e.g. 1.5"))
        return super().construct_yaml_float(node)

    def construct_yaml_bool(self, node):
        if node.value not in ("true", "false", "True", "False", "TRUE", "FALSE"):
            raise _Refused(_ambiguous(node, "a boolean", "true or false"))
        return super().construct_yaml_bool(node)


def _ambiguous(node, what: str, expected: str) -> str:
    return (
        f"line {node.start_mark.line + 1}: {show(node.value)} is {what} only to YAML 1.1 and reads "
        f"differently elsewhere; expected {expected}, or quoted text"
    )


for _tag, _construct in (
    ("int", _TypedLoader.construct_yaml_int),
    ("float", _TypedLoader.construct_yaml_float),
    ("bool", _TypedLoader.construct_yaml_bool),
):
    _TypedLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _construct)


def read_text(path: Path, what: str) -> str:
    """The file's text, at most MAX_YAML_BYTES of UTF-8, or UserFileError: a named pipe is refused
    before it is opened (opening one waits for a writer), /dev/zero at the limit, Latin-1 by its
    first byte that is not UTF-8."""
    try:
        if stat.S_ISFIFO(path.stat().st_mode) or stat.S_ISSOCK(path.stat().st_mode):
            raise UserFileError("is a named pipe or a socket; expected a file")
        with path.open("rb") as f:
            data = f.read(MAX_YAML_BYTES + 1)
    except OSError as error:
        raise UserFileError(f"cannot be read ({error.strerror or error.__class__.__name__})") from None
    if len(data) > MAX_YAML_BYTES:
        raise UserFileError(f"is larger than {MAX_YAML_BYTES // 1024} KiB, the limit for {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UserFileError(
            f"is not UTF-8 text: byte 0x{data[error.start]:02x} at offset {error.start} cannot be decoded"
        ) from None


def replace_text(path: Path, text: str) -> None:
    """Write `text` in place of `path`'s content whole: into a temporary file beside it, then
    renamed over it, so a run cut short (a signal, a full disk) leaves the old file. OSError as raised."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text, encoding="utf-8")
        if path.exists():
            temporary.chmod(stat.S_IMODE(path.stat().st_mode))
        temporary.replace(path)
    finally:
        temporary.unlink(missing_ok=True)


def parse_yaml(text: str, *, typed: bool) -> Any:
    """One YAML document under the guards above; `typed` False reads every scalar as text."""
    return copy.deepcopy(_parsed(text, typed))


@functools.lru_cache(maxsize=64)
def _parsed(text: str, typed: bool) -> Any:
    # parsed once per text: the tools and tests read the same stack and scenario files many times
    # (a copy for each caller); a refusal is not kept, and is raised again on each read
    loader = None
    try:
        loader = (_TypedLoader if typed else _TextLoader)(text)  # the reader checks every character here
        return loader.get_single_data()
    except _Refused as error:
        raise UserFileError(f"is not accepted YAML: {error}") from None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        reason = " ".join(": ".join(filter(None, (error.context, error.problem))).split())
        raise UserFileError(f"is not readable YAML{where}: {escaped(reason, 160)}") from None
    except yaml.reader.ReaderError as error:
        raise UserFileError(
            f"is not readable YAML: the character {escaped(chr(error.character))} at offset {error.position} is not "
            "allowed in YAML text"
        ) from None
    except ValueError as error:  # a scalar the constructor cannot convert (an int of 5,000 digits, a bad date)
        raise UserFileError(f"is not readable YAML: a value cannot be converted ({escaped(str(error), 100)})") from None
    except (TypeError, AttributeError):  # an explicit tag on a node its constructor cannot take (!!set [a])
        raise UserFileError(
            "is not readable YAML: an explicit tag (!!set, !!map, !!int, !!timestamp, ...) on a value of another "
            "shape; expected plain values without tags"
        ) from None
    finally:
        if loader is not None:
            loader.dispose()


def read_yaml(path: Path, what: str, *, typed: bool) -> Any:
    """Read a user's YAML file (`what` names the kind of file in the size refusal)."""
    return parse_yaml(read_text(path, what), typed=typed)


def kubeconfig_file(given: Path | None, environ: Mapping[str, str] = os.environ) -> tuple[str, Path] | None:
    """The kubeconfig a cluster command reads, with the name its problems go under: --kubeconfig,
    else $KUBECONFIG as kubectl reads it; None when neither is set (the stack's kubeconfig output).
    UserFileError for a $KUBECONFIG listing several files, which kubectl merges and this does not."""
    if given is not None:
        return "--kubeconfig", given
    listed = [entry for entry in environ.get("KUBECONFIG", "").split(os.pathsep) if entry]
    if len(listed) > 1:
        raise UserFileError(
            f"$KUBECONFIG: lists {len(listed)} files, which kubectl merges; name the one to use with --kubeconfig FILE"
        )
    return ("$KUBECONFIG", Path(listed[0]).expanduser()) if listed else None


def read_kubeconfig(given: Path | None, environ: Mapping[str, str] = os.environ) -> dict | None:
    """The kubeconfig of --kubeconfig or $KUBECONFIG (`kubeconfig_file`), read and checked; None when
    neither is set (the caller reads the stack's output). UserFileError with the whole line."""
    chosen = kubeconfig_file(given, environ)
    if chosen is None:
        return None
    flag, path = chosen
    shown = show(str(path))
    if not path.is_file():
        raise UserFileError(f"{flag}: {shown} is not a file")
    try:
        config = read_yaml(path, "a kubeconfig", typed=True)
    except UserFileError as error:
        raise UserFileError(f"{flag}: {shown} {error.problem}") from None
    if not isinstance(config, dict) or not config.get("clusters"):
        raise UserFileError(f"{flag}: {shown} is not a kubeconfig: it names no clusters")
    return config


def names_problem(flag: str, out: Path, reserve: int = 0) -> str | None:
    """A name or a path too long for the file system, `reserve` bytes kept for a temporary name
    beside it (else the first look at `out` ends in `OSError: File name too long`), or None."""
    for part in out.parts:
        size = len(os.fsencode(part))
        if size > NAME_MAX - reserve:
            return (
                f"{flag}: {show(str(out))} has a name of {size} bytes; expected names of at most "
                f"{NAME_MAX - reserve} bytes"
            )
    if len(os.fsencode(str(out.absolute()))) >= PATH_MAX - reserve:
        return f"{flag}: {show(str(out))} is a path of {PATH_MAX - reserve} bytes or more; expected a shorter one"
    return None


def out_dir_problem(flag: str, out: Path, reserve: int = 0) -> str | None:
    """Why `out` cannot become a directory of results, or None: checked before any work, so a long
    run does not end in a traceback. Every name must fit, and `out` must be a directory or lie
    under a writable one."""
    shown = show(str(out))
    if problem := names_problem(flag, out, reserve):
        return problem
    try:
        if out.is_dir():
            writable = os.access(out, os.W_OK | os.X_OK)
            return None if writable else f"{flag}: {shown} is a directory this user cannot write to"
        if out.exists() or out.is_symlink():
            return f"{flag}: {shown} is a file; expected a directory (new or existing)"
        ancestor = out.absolute().parent
        while not ancestor.exists():
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            return f"{flag}: {shown} lies under {show(str(ancestor))}, which is a file; expected a directory path"
        if not os.access(ancestor, os.W_OK | os.X_OK):
            return f"{flag}: {shown} cannot be made: this user cannot write to {show(str(ancestor))}"
    except OSError as error:
        return f"{flag}: {shown} cannot be used ({error.strerror or error.__class__.__name__})"
    return None


def make_out_dir(flag: str, out: Path) -> str | None:
    """Make `out` (after out_dir_problem passed and before the work): why it cannot be, or None.
    Some places pass every check but still refuse (/proc, a read-only mount)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return f"{flag}: {show(str(out))} cannot be made ({error.strerror or error.__class__.__name__})"
    return None

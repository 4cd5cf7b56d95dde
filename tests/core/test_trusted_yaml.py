"""core/trusted_yaml.py writes what PyYAML's pure-Python classes write, byte for byte, on the strings
where libyaml folds otherwise (the whole render is compared in tests/cli/test_cli.py)."""

import pytest
import yaml

from core import trusted_yaml

LONG = "word " * 30
# Each of these is double-quoted by the emitter, and folded by libyaml at other places when long.
EDGES = [
    "a\tb" + LONG,  # a tab
    "x\n  y\n" + LONG,  # a line break followed by a space
    "é" + LONG,  # non-ASCII, escaped
    "a \nb\n" + LONG,  # a space before a line break
    LONG + "\n\n",
    " lead\n" + LONG + "\n",
    "\ttab\n" * 30,
    "  indented\n" * 30,
    "line\n" + LONG,  # a literal block is ruled out by the trailing space
    # literal blocks keeping their trailing breaks (|+): libyaml ends the document with "..." after them
    "x\n\n",
    "line\n\n\n",
    "\n",
]
# ...and these are written alike by both: libyaml writes them.
ALIKE = [
    "k" * 122,
    "x" * 200,
    "a" * 100 + " " + "b" * 100,
    LONG,
    "abc def\n" * 40,
    "  abc def\n" * 40,
    "",
    "key: value",
]


class _PureLiteral(yaml.SafeDumper):
    pass


_PureLiteral.add_representer(str, trusted_yaml.literal_blocks)


def test_the_pinned_pyyaml_has_libyaml():
    """requirements.txt's PyYAML wheel links libyaml: the fast path is the one CI runs."""
    assert yaml.__with_libyaml__ and trusted_yaml.Dumper is yaml.CSafeDumper
    assert trusted_yaml.Loader is yaml.CSafeLoader


@pytest.mark.parametrize("text", EDGES + ALIKE)
@pytest.mark.parametrize("width", [80, 4096])
def test_every_string_is_written_as_the_pure_classes_write_it(text, width):
    data = {"k": text, "l": [text, {"n": text}], "z": 1}  # z: something after the last string
    assert trusted_yaml.dump(data, width=width) == yaml.safe_dump(data, width=width)
    assert trusted_yaml.dump_all([data, data], sort_keys=False) == yaml.safe_dump_all([data, data], sort_keys=False)
    literal = trusted_yaml.dump(data, str_representer=trusted_yaml.literal_blocks, width=width)
    assert literal == yaml.dump(data, Dumper=_PureLiteral, width=width)
    assert trusted_yaml.load(literal) == data and trusted_yaml.load_all(literal) == [data]


def test_the_edges_are_ones_libyaml_folds_otherwise():
    """Without the pure path for them, libyaml's text differs: the cases above can fail."""

    class CLiteral(yaml.CSafeDumper):
        pass

    CLiteral.add_representer(str, trusted_yaml.literal_blocks)
    for text in EDGES:
        data = {"k": text, "z": 1}
        plain_differs = yaml.dump(data, Dumper=yaml.CSafeDumper) != yaml.safe_dump(data)
        literal_differs = yaml.dump(data, Dumper=CLiteral) != yaml.dump(data, Dumper=_PureLiteral)
        assert plain_differs or literal_differs, text


@pytest.mark.parametrize(
    "document",
    [
        "text",  # a bare scalar: "...\n" after it from PyYAML, not from libyaml 0.2.5
        5,
        None,
        {"k" * 123: 1},  # a "? " key to PyYAML (its !!str tag counted), a simple one to libyaml
        {"k" * 127: 1},
        {"k" * 128: ["v"]},
        {"": 1},  # an empty key: "? ''" to PyYAML, a simple key to libyaml
        {"é" * 70: 1},  # a non-ASCII key: double-quoted "? " to libyaml, simple to PyYAML
        {10**124: 1},  # a long key that is not text
        {"a": {"x é " * 40}},  # a type the walk does not vouch for (a set)
    ],
    ids=repr,
)
def test_documents_libyaml_writes_otherwise_are_written_by_the_pure_classes(document):
    assert trusted_yaml.dump(document) == yaml.safe_dump(document)


def test_options_not_vetted_go_to_the_pure_classes(monkeypatch):
    """Flow style, indents and the like change how the emitters differ: only vetted options use libyaml."""
    data = {"k": ["v"]}
    expected = yaml.safe_dump(data, default_flow_style=None, indent=4)
    used = []
    real = yaml.dump_all

    def spy(documents, *args, **options):
        used.append(options["Dumper"])
        return real(documents, *args, **options)

    monkeypatch.setattr(yaml, "dump_all", spy)
    assert trusted_yaml.dump(data, default_flow_style=None, indent=4) == expected
    assert trusted_yaml.dump(data, sort_keys=False, width=100, explicit_start=True) == "---\nk:\n- v\n"
    assert used == [yaml.SafeDumper, yaml.CSafeDumper]


@pytest.mark.parametrize("width", [-1, 2**31, 80.0, True])
def test_a_width_libyaml_takes_otherwise_goes_to_the_pure_classes(width):
    """No limit to libyaml at -1 (80 to PyYAML); a float, bool or a value past a C long: not vetted."""
    data = {"k": "word " * 40}
    assert trusted_yaml.dump(data, width=width) == yaml.safe_dump(data, width=width)


def test_another_representer_than_literal_blocks_goes_to_the_pure_classes():
    """What another representer asks (here: every string double-quoted, which the emitters fold
    at other places) is not vetted, even for a string the walk passes."""

    def double_quoted(dumper, value):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')

    class PureQuoted(yaml.SafeDumper):
        pass

    PureQuoted.add_representer(str, double_quoted)
    data = {"k": "word, " * 30}
    expected = yaml.dump(data, Dumper=PureQuoted, width=40)
    assert trusted_yaml.dump(data, str_representer=double_quoted, width=40) == expected

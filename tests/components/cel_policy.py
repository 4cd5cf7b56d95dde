"""ValidatingAdmissionPolicies run by a real CEL engine: cel-python (celpy, pinned in
requirements-dev.txt), with the few Kubernetes CEL library functions the policies use supplied
here, and the way a v1.34 API server applies a policy (conditions, variables, validations,
failurePolicy Fail) following kubernetes/kubernetes@v1.34.0 staging/src/k8s.io/apiserver/pkg/
admission/plugin/policy/validating/validator.go.

Supplied (celpy has none of them; kubernetes@v1.34.0 staging/src/k8s.io/apiserver/pkg/cel/library):
* `quantity(string)` and a quantity's `isInteger()` and `asApproximateFloat()` (quantity.go), over
  resource.Quantity's grammar (staging/src/k8s.io/apimachinery/pkg/api/resource/quantity.go);
* a list's `sum()` and `max()` (lists.go);
* a list of strings' `join(separator)` (cel-go's strings extension, ext/strings.go, which
  staging/src/k8s.io/apiserver/pkg/cel/environment/base.go adds);
* `string(double)` as cel-go writes it (strconv.FormatFloat 'g' -1: "6", not celpy's "6.0").
What celpy does not do that the API server does: type-check an expression against the schema
(cel-go's checker, e.g. for `+` across Container and EphemeralContainer lists); cost limits.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import celpy
from celpy import celtypes

# resource.Quantity: a signed decimal number, then a binary suffix, a decimal suffix or an exponent
QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
SUFFIX = {
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), None: Decimal(1)},
    **{s: Decimal(10) ** (3 * (i + 1)) for i, s in enumerate(("k", "M", "G", "T", "P", "E"))},
}


@dataclass(frozen=True)
class Quantity:
    value: Decimal


def quantity(text: Any) -> Quantity:
    match = QUANTITY.match(str(text))
    if not match:
        raise ValueError(f"quantities must match the regular expression: {text!r}")
    number, suffix = match.groups()
    try:
        if suffix and suffix[0] in "eE":
            return Quantity(Decimal(number) * Decimal(10) ** int(suffix[1:]))
        return Quantity(Decimal(number) * SUFFIX[suffix])
    except InvalidOperation as error:
        raise ValueError(str(error)) from error


def is_integer(q: Quantity) -> celtypes.BoolType:
    # quantity.go isInteger: representable as an int64 without loss
    return celtypes.BoolType(q.value == q.value.to_integral_value() and -(2**63) <= q.value < 2**63)


def as_approximate_float(q: Quantity) -> celtypes.DoubleType:
    return celtypes.DoubleType(float(q.value))


def list_sum(items: celtypes.ListType) -> Any:
    if not items:
        return celtypes.IntType(0)
    kind = type(items[0])
    if any(type(item) is not kind for item in items):
        raise TypeError(f"no such overload: sum() over mixed {sorted({type(i).__name__ for i in items})}")
    return kind(sum(items[1:], items[0]))


def list_max(items: celtypes.ListType) -> Any:
    if not items:
        raise ValueError("max called on empty list")
    return max(items)


def join(items: celtypes.ListType, separator: str = "") -> celtypes.StringType:
    if not all(isinstance(item, str) for item in items):
        raise TypeError("no such overload: join() over a list that is not all strings")
    return celtypes.StringType(separator.join(items))


def cel_string(value: Any) -> celtypes.StringType:
    if isinstance(value, float):  # a DoubleType, or the float celpy's arithmetic returns
        text = repr(float(value))
        return celtypes.StringType(text[:-2] if text.endswith(".0") else text)
    return celtypes.StringType(value)


FUNCTIONS = {
    "quantity": quantity,
    "isInteger": is_integer,
    "asApproximateFloat": as_approximate_float,
    "sum": list_sum,
    "max": list_max,
    "join": join,
    "string": cel_string,
}
ENV = celpy.Environment()


@functools.cache
def compile_expression(expression: str):
    """Parse an expression, or raise celpy's CELParseError. Once per expression: a policy's few
    expressions are evaluated for every request the tests make, and a compiled program keeps no
    state between evaluations (each `evaluate` builds its own activation)."""
    return ENV.program(ENV.compile(expression), functions=FUNCTIONS)


def run(expression: str, activation: dict) -> Any:
    """The value, or a celpy.CELEvalError as a value (CEL's errors are values)."""
    try:
        return compile_expression(expression).evaluate(activation)
    except celpy.CELEvalError as error:
        return error


# CEL is pure: an expression's value depends only on the parts of the activation it reads. The
# tests send the same documents again and again (the same queue before a patch, the same request,
# the same policy variables), so values are kept under the expression and an identity, for each
# input it reads, of the parts it reads: evaluating in celpy's tree-walking interpreter costs
# milliseconds, a look-up does not. A part is a chain of field selections from a name
# (`object.metadata`, `variables.declared`); a name read any other way is read whole.
WHOLE: tuple[str, ...] = ()
VALUES: dict[tuple, Any] = {}
CONVERTED: dict[str, Any] = {}


@functools.cache
def reads(expression: str) -> dict[str, frozenset[tuple[str, ...]]]:
    """For each word of the expression (a superset of the names it can read), the field paths it
    reads from that name: a name appears as an `ident` primary, and each `member_dot` that selects
    from it adds a field; any other occurrence of the word is a read of the whole value."""
    tree = compile_expression(expression).ast
    parent = {id(child): node for node in tree.iter_subtrees() for child in node.children}
    paths: dict[str, set[tuple[str, ...]]] = {}
    for node in tree.iter_subtrees():
        for child in node.children:
            if not isinstance(child, str):  # a subtree; the words are lark Tokens, strings
                continue
            path = WHOLE
            if node.data == "ident" and parent[id(node)].data == "primary":
                member = parent[id(parent[id(node)])]
                while (select := parent.get(id(member))) is not None and select.data == "member_dot":
                    path += (str(select.children[1]),)
                    member = parent[id(select)]
            paths.setdefault(str(child), set()).add(path)
    return {word: frozenset(p) for word, p in paths.items()}


def walked(doc: Any, path: tuple[str, ...]) -> tuple[int, Any]:
    """How many of the path's fields `doc` has, one inside the other, and the value there: what
    selecting the path from it gives, a value or the error of a missing field."""
    for depth, field in enumerate(path):
        if not isinstance(doc, dict) or field not in doc:
            return depth, doc
        doc = doc[field]
    return len(path), doc


@dataclass(frozen=True, eq=False)
class Document:
    """A JSON document as an input, converted by celpy.json_to_cel once per distinct text. The
    text names it only where reading the text back gives the document (no tuples, no non-string
    keys, no NaN, nothing json cannot write), so equal texts give CEL values of equal types; any
    other document is converted every time and is its own identity."""

    doc: Any
    text: str | None
    value: Any

    @classmethod
    def of(cls, doc: Any) -> Document:
        try:
            text = json.dumps(doc)
            exact = json.loads(text) == doc
        except (TypeError, ValueError):
            exact = False
        if not exact:
            return cls(doc, None, celpy.json_to_cel(doc))
        if text not in CONVERTED:
            CONVERTED[text] = celpy.json_to_cel(doc)
        return cls(doc, text, CONVERTED[text])

    def identity(self, paths: frozenset[tuple[str, ...]]) -> Any:
        if self.text is None:
            return self
        if WHOLE in paths:
            return self.text
        return tuple(
            (path, depth, json.dumps(part)) for path in sorted(paths) for depth, part in [walked(self.doc, path)]
        )


@dataclass(frozen=True, eq=False)
class Variables:
    """The policy's variables so far, each named by the identity it was computed under."""

    value: Any
    identities: tuple[tuple[str, Any], ...] = ()

    def identity(self, paths: frozenset[tuple[str, ...]]) -> Any:
        named = dict(self.identities)
        if any(path == WHOLE or path[0] not in named for path in paths):
            return self.identities
        return tuple(sorted((path[0], named[path[0]]) for path in paths))

    def with_value(self, name: str, identity: Any, value: Any) -> Variables:
        return Variables(
            celtypes.MapType({**self.value, celtypes.StringType(name): value}), (*self.identities, (name, identity))
        )


def evaluate(expression: str, inputs: dict[str, Document | Variables]) -> tuple[Any, Any]:
    """`run` over the inputs' values once per expression and identities of what it reads of
    them; returns that key, which names the value, with the value."""
    read = reads(expression)
    key = (expression, tuple((name, inputs[name].identity(read[name])) for name in sorted(read.keys() & inputs.keys())))
    if key not in VALUES:
        VALUES[key] = run(expression, {name: i.value for name, i in inputs.items()})
    value = VALUES[key]
    # a map or list may be part of a kept document (`self.spec.l`): the caller gets its own copy
    return key, copy.deepcopy(value) if isinstance(value, dict | list) else value


def run_on(expression: str, **docs: Any) -> Any:
    """`run` with each keyword's JSON document as that name's value."""
    return evaluate(expression, {name: Document.of(doc) for name, doc in docs.items()})[1]


@dataclass(frozen=True)
class Decision:
    evaluated: bool  # the match conditions held (or errored: failurePolicy Fail refuses)
    denials: tuple[str, ...]  # one message per failed or errored validation

    @property
    def allowed(self) -> bool:
        return not self.denials


def admit(policy: dict, operation: str, obj: dict | None, old: dict | None = None, user: str | None = None) -> Decision:
    """What the API server decides for a request the policy's matchConstraints already matched,
    made by `user` (request.userInfo.username) if given; `obj` is null on a DELETE."""
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    request = {"operation": operation} | ({"userInfo": {"username": user}} if user is not None else {})
    base: dict[str, Document | Variables] = {
        "object": Document.of(obj),
        "oldObject": Document.of(old),
        "request": Document.of(request),
    }
    results = [evaluate(c["expression"], base)[1] for c in spec.get("matchConditions", [])]
    if any(r is not None and not isinstance(r, celpy.CELEvalError) and r == celtypes.BoolType(False) for r in results):
        return Decision(False, ())
    errors = [r for r in results if isinstance(r, celpy.CELEvalError)]
    if errors:
        return Decision(True, (f"expression error: {errors[0]}",))
    # Variables are evaluated in order, each seeing the ones before; an error is kept as the
    # variable's value and surfaces only in the expressions that use it (lazy in the API server).
    variables = Variables(celtypes.MapType())
    for variable in spec.get("variables", []):
        identity, value = evaluate(variable["expression"], {**base, "variables": variables})
        variables = variables.with_value(variable["name"], identity, value)
    inputs = {**base, "variables": variables}
    denials = []
    for validation in spec["validations"]:
        ok = evaluate(validation["expression"], inputs)[1]
        if isinstance(ok, celpy.CELEvalError):
            denials.append(f"expression error: {ok}")
            continue
        if ok == celtypes.BoolType(True):
            continue
        message = ""
        if "messageExpression" in validation:
            value = evaluate(validation["messageExpression"], inputs)[1]
            message = value.strip() if isinstance(value, str) and "\n" not in value else ""
        denials.append(message or validation.get("message") or f"failed expression: {validation['expression']}")
    return Decision(True, tuple(denials))

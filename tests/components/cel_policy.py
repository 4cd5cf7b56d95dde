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

import functools
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
    base = {
        "object": celpy.json_to_cel(obj),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel(request),
    }
    results = [run(c["expression"], base) for c in spec.get("matchConditions", [])]
    if any(r is not None and not isinstance(r, celpy.CELEvalError) and r == celtypes.BoolType(False) for r in results):
        return Decision(False, ())
    errors = [r for r in results if isinstance(r, celpy.CELEvalError)]
    if errors:
        return Decision(True, (f"expression error: {errors[0]}",))
    # Variables are evaluated in order, each seeing the ones before; an error is kept as the
    # variable's value and surfaces only in the expressions that use it (lazy in the API server).
    variables = celtypes.MapType()
    for variable in spec.get("variables", []):
        variables[celtypes.StringType(variable["name"])] = run(variable["expression"], {**base, "variables": variables})
    activation = {**base, "variables": variables}
    denials = []
    for validation in spec["validations"]:
        ok = run(validation["expression"], activation)
        if isinstance(ok, celpy.CELEvalError):
            denials.append(f"expression error: {ok}")
            continue
        if ok == celtypes.BoolType(True):
            continue
        message = ""
        if "messageExpression" in validation:
            value = run(validation["messageExpression"], activation)
            message = value.strip() if isinstance(value, str) and "\n" not in value else ""
        denials.append(message or validation.get("message") or f"failed expression: {validation['expression']}")
    return Decision(True, tuple(denials))

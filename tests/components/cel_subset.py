"""A small evaluator for the subset of CEL the run-limit policies use, and the way a v1.34 API
server applies a ValidatingAdmissionPolicy, so their expressions run against sample jobs here.

Not Kubernetes' CEL: no registry offers that engine. It follows the CEL spec and cel-go for what
the policies use (operators and precedence, `has`, the `map`/`all` macros, errors absorbed by
`&&`/`||` when the other side decides, no arithmetic across int and double, comparisons across
them allowed) and the Kubernetes libraries' functions (`quantity`, lists `sum`/`max`, `matches`);
and kubernetes/kubernetes@v1.34.0 staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/
validating/validator.go for how conditions, errors and messages decide (failurePolicy Fail).
Anything outside the subset is a syntax error, so a policy that strays from it fails the tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


class CelError(Exception):
    pass


TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+\.\d+|\d+)|(?P<str>'(?:[^'\\]|\\.)*')|(?P<id>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op>&&|\|\||==|!=|<=|>=|[-+*/%<>!?:.,()\[\]]))"
)
BINARY = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 3, "<=": 3, ">": 3, ">=": 3, "in": 3, "+": 4, "-": 4, "*": 5}


def tokens(text: str) -> list[tuple[str, Any]]:
    out, pos = [], 0
    while pos < len(text.rstrip()):
        m = TOKEN.match(text, pos)
        if not m:
            raise SyntaxError(f"unexpected {text[pos : pos + 10]!r}")
        pos = m.end()
        kind = m.lastgroup
        value = m.group(kind)
        if kind == "num":
            out.append(("lit", float(value) if "." in value else int(value)))
        elif kind == "str":
            out.append(("lit", re.sub(r"\\(.)", r"\1", value[1:-1])))
        elif kind == "id" and value in ("true", "false"):
            out.append(("lit", value == "true"))
        elif kind == "id" and value == "in":
            out.append(("op", "in"))
        else:
            out.append((kind, value))
    return out


class Parser:
    """Pratt parser into nested tuples."""

    def __init__(self, text: str):
        self.toks = tokens(text)
        self.i = 0

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else ("end", None)

    def take(self, value=None):
        tok = self.peek()
        if value is not None and tok[1] != value:
            raise SyntaxError(f"expected {value!r}, found {tok[1]!r}")
        self.i += 1
        return tok

    def parse(self):
        node = self.expr()
        if self.peek()[0] != "end":
            raise SyntaxError(f"trailing {self.peek()[1]!r}")
        return node

    def expr(self):
        cond = self.binary(1)
        if self.peek()[1] == "?":
            self.take("?")
            yes = self.expr()
            self.take(":")
            return ("cond", cond, yes, self.expr())
        return cond

    def binary(self, level):
        left = self.unary()
        while (op := self.peek()[1]) in BINARY and BINARY[op] >= level and self.peek()[0] == "op":
            self.take()
            left = (op, left, self.binary(BINARY[op] + 1))
        return left

    def unary(self):
        if self.peek()[1] == "!":
            self.take()
            return ("!", self.unary())
        if self.peek()[1] == "-":
            self.take()
            return ("neg", self.unary())
        return self.postfix(self.primary())

    def args(self):
        self.take("(")
        out = []
        while self.peek()[1] != ")":
            out.append(self.expr())
            if self.peek()[1] == ",":
                self.take()
        self.take(")")
        return out

    def primary(self):
        kind, value = self.take()
        if kind == "lit":
            return ("lit", value)
        if value == "(":
            node = self.expr()
            self.take(")")
            return node
        if value == "[":
            items = []
            while self.peek()[1] != "]":
                items.append(self.expr())
                if self.peek()[1] == ",":
                    self.take()
            self.take("]")
            return ("list", items)
        if kind == "id":
            if self.peek()[1] == "(":
                return ("call", value, self.args())
            return ("var", value)
        raise SyntaxError(f"unexpected {value!r}")

    def postfix(self, node):
        while self.peek()[1] in (".", "["):
            if self.take()[1] == "[":
                index = self.expr()
                self.take("]")
                node = ("index", node, index)
                continue
            name = self.take()[1]
            node = ("method", node, name, self.args()) if self.peek()[1] == "(" else ("select", node, name)
        return node


@dataclass(frozen=True)
class Quantity:
    value: float


QUANTITY = re.compile(r"^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
SUFFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
SUFFIX |= {f"{p}i": 1024.0**i for i, p in enumerate("KMGTPE", start=1)}


def quantity(text: str) -> Quantity:
    m = QUANTITY.match(text)
    if not m:
        raise CelError(f"quantities must match the regular expression: {text!r}")
    number, suffix = m.groups()
    scale = 10.0 ** int(suffix[1:]) if suffix and suffix[0] in "eE" else SUFFIX.get(suffix or "", 1.0)
    return Quantity(float(number) * scale)


def _num(v):
    return isinstance(v, int | float) and not isinstance(v, bool)


def _same(a, b, op):
    if type(a) is not type(b) or isinstance(a, bool):
        raise CelError(f"no such overload: {type(a).__name__} {op} {type(b).__name__}")


def _string(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        text = repr(v)  # cel-go: strconv.FormatFloat(f, 'g', -1, 64)
        return text[:-2] if text.endswith(".0") else text
    if isinstance(v, int | str):
        return str(v)
    raise CelError(f"no such overload: string({type(v).__name__})")


class Env:
    def __init__(self, bindings: dict):
        self.bindings = bindings

    def run(self, text: str):
        return self.eval(Parser(text).parse(), {})

    def eval(self, node, scope):
        kind = node[0]
        if kind == "lit":
            return node[1]
        if kind == "var":
            if node[1] in scope:
                return scope[node[1]]
            if node[1] not in self.bindings:
                raise CelError(f"undeclared reference to {node[1]!r}")
            value = self.bindings[node[1]]
            return value() if callable(value) else value
        if kind == "list":
            return [self.eval(n, scope) for n in node[1]]
        if kind in ("||", "&&"):
            decides = kind == "||"
            results = []
            for side in node[1:]:
                try:
                    value = self.eval(side, scope)
                except CelError as error:
                    results.append(error)
                    continue
                if not isinstance(value, bool):
                    raise CelError(f"no such overload: {kind} on {type(value).__name__}")
                if value is decides:
                    return decides
                results.append(value)
            for r in results:
                if isinstance(r, CelError):
                    raise r
            return not decides
        if kind == "cond":
            test = self.eval(node[1], scope)
            if not isinstance(test, bool):
                raise CelError("no such overload: ?: on a non-bool")
            return self.eval(node[2] if test else node[3], scope)
        if kind == "!":
            value = self.eval(node[1], scope)
            if not isinstance(value, bool):
                raise CelError("no such overload: !")
            return not value
        if kind == "neg":
            value = self.eval(node[1], scope)
            if not _num(value):
                raise CelError("no such overload: -")
            return -value
        if kind == "select":
            target = self.eval(node[1], scope)
            if not isinstance(target, dict) or node[2] not in target:
                raise CelError(f"no such key: {node[2]}")
            value = target[node[2]]
            return value.compute() if isinstance(value, LazyValue) else value
        if kind == "index":
            target, key = self.eval(node[1], scope), self.eval(node[2], scope)
            if isinstance(target, list) and isinstance(key, int) and not isinstance(key, bool):
                if not 0 <= key < len(target):
                    raise CelError("index out of range")
                return target[key]
            if isinstance(target, dict) and key in target:
                return target[key]
            raise CelError(f"no such key: {key}")
        if kind == "call":
            return self.call(node[1], node[2], scope)
        if kind == "method":
            return self.method(node[1], node[2], node[3], scope)
        return self.binary(kind, self.eval(node[1], scope), self.eval(node[2], scope))

    def binary(self, op, a, b):
        if op == "in":
            if isinstance(b, dict | list):
                return a in b
            raise CelError("no such overload: in")
        if op in ("==", "!="):
            return (a == b) is (op == "==")
        if op in ("<", "<=", ">", ">="):
            if not ((_num(a) and _num(b)) or (isinstance(a, str) and isinstance(b, str))):
                raise CelError(f"no such overload: {op}")
            return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
        _same(a, b, op)
        if op == "+" and isinstance(a, str | int | float | list):
            return a + b
        if op in ("-", "*") and _num(a):
            return a - b if op == "-" else a * b
        raise CelError(f"no such overload: {op}")

    def call(self, name, args, scope):
        if name == "has":
            (arg,) = args
            if arg[0] != "select":
                raise SyntaxError("has() takes a field selection")
            target = self.eval(arg[1], scope)
            if not isinstance(target, dict):
                raise CelError("has() on a non-map")
            return arg[2] in target
        values = [self.eval(a, scope) for a in args]
        (v,) = values
        if name == "int":
            if isinstance(v, str):
                if not re.fullmatch(r"[+-]?[0-9]+", v) or not -(2**63) <= int(v) < 2**63:
                    raise CelError(f"cannot convert {v!r} to int")
                return int(v)
            if isinstance(v, float) or (isinstance(v, int) and not isinstance(v, bool)):
                return int(v)
        if name == "double" and _num(v):
            return float(v)
        if name == "string":
            return _string(v)
        if name == "quantity" and isinstance(v, str):
            return quantity(v)
        raise CelError(f"no such overload: {name}({type(v).__name__})")

    def method(self, target_node, name, args, scope):
        target = self.eval(target_node, scope)
        if name in ("map", "all"):
            if args[0][0] != "var":
                raise SyntaxError(f"{name}() takes a variable name first")
            var, body = args[0][1], args[1]
            items = list(target) if isinstance(target, dict | list) else None
            if items is None:
                raise CelError(f"no such overload: {name}")
            if name == "map":
                return [self.eval(body, {**scope, var: item}) for item in items]
            errors = []
            for item in items:
                try:
                    value = self.eval(body, {**scope, var: item})
                except CelError as error:
                    errors.append(error)
                    continue
                if value is False:
                    return False
            if errors:
                raise errors[0]
            return True
        values = [self.eval(a, scope) for a in args]
        if name == "matches" and isinstance(target, str):
            return re.search(values[0], target) is not None
        if name == "sum" and isinstance(target, list):
            if not target:
                return 0
            total = target[0]
            for item in target[1:]:
                total = self.binary("+", total, item)
            return total
        if name == "max" and isinstance(target, list):
            if not target:
                raise CelError("max called on empty list")
            return max(target)
        if name == "asApproximateFloat" and isinstance(target, Quantity):
            return target.value
        raise CelError(f"no such overload: {name}")


@dataclass(frozen=True)
class Decision:
    evaluated: bool  # the match conditions held (or errored: failurePolicy Fail refuses)
    denials: tuple[str, ...]  # one message per failed or errored validation

    @property
    def allowed(self) -> bool:
        return not self.denials


def admit(policy: dict, operation: str, obj: dict, old: dict | None = None) -> Decision:
    """What the API server decides for a request the policy's matchConstraints already matched."""
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    request = {"operation": operation}
    base = {"object": obj, "oldObject": old, "request": request}
    results = []
    for condition in spec.get("matchConditions", []):
        try:
            results.append(Env(base).run(condition["expression"]))
        except CelError as error:
            results.append(error)
    if False in results:
        return Decision(False, ())
    errors = [r for r in results if isinstance(r, CelError)]
    if errors:
        return Decision(True, (str(errors[0]),))
    bound: dict[str, Any] = {}
    variables: dict[str, Any] = {}
    env = Env({**base, "variables": variables})

    def lazy(expression):
        def value():
            if expression not in bound:
                try:
                    bound[expression] = env.run(expression)
                except CelError as error:
                    bound[expression] = error
            if isinstance(bound[expression], CelError):
                raise bound[expression]
            return bound[expression]

        return value

    for variable in spec.get("variables", []):
        variables[variable["name"]] = LazyValue(lazy(variable["expression"]))
    denials = []
    for validation in spec["validations"]:
        try:
            ok = env.run(validation["expression"])
        except CelError as error:
            denials.append(f"expression error: {error}")
            continue
        if ok is True:
            continue
        message = ""
        if "messageExpression" in validation:
            try:
                value = env.run(validation["messageExpression"])
            except CelError:
                value = ""
            message = value.strip() if isinstance(value, str) and "\n" not in value else ""
        denials.append(message or validation.get("message") or f"failed expression: {validation['expression']}")
    return Decision(True, tuple(denials))


class LazyValue:
    """A policy variable: evaluated on first use (`variables.name`), its value or error kept."""

    def __init__(self, compute):
        self.compute = compute

"""A small PromQL evaluator for exactly what the trigger queries use, over the twin's own TSDB.

Supported: selectors with `=` matchers, `sum|max|min|count [by (l, ...)] (e)`, `+ - *`,
comparisons with and without `bool`, `and`/`or` (optionally `on()`), numbers, `vector(n)`,
`clamp_min`/`clamp_max`, and `min_over_time`/`max_over_time` of a subquery `(e)[R:S]`.
Anything else is refused at parse time, so a new query shape fails loudly in the tests,
which cross-check this evaluator against a real `promtool test rules`.

Semantics followed (Prometheus 3, the major version kube-prometheus-stack 80.9.2 deploys; checked
against Prometheus 3.5.3's promtool, tests/engines): promql/engine.go (instant selectors look back
5 m, left-open, and stop at a staleness marker; vector matching is one-to-one on the label set
without `__name__`; `on()` matches on no labels; comparisons filter unless `bool`; subquery steps
are multiples of the step within (t-R, t], left-open since Prometheus 3), promql/functions.go
(vector, clamp_*, *_over_time), promql/aggregations in engine.go.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

LOOKBACK = 300.0  # promql/engine.go defaultLookbackDelta (5m)
STALE = float("nan")  # a staleness marker (model/value/value.go StaleNaN); any NaN here is one

Labels = frozenset  # of (name, value) pairs, without __name__ once selected
Vector = dict  # Labels -> float


class PromQLError(ValueError):
    pass


@dataclass
class Series:
    labels: dict[str, str]
    times: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    key: Labels = field(init=False)  # the labels an instant selector returns it under: built once

    def __post_init__(self) -> None:
        self.key = frozenset((k, v) for k, v in self.labels.items() if k != "__name__")


class TSDB:
    """Append-only samples, one Series per full label set (as the scrape writes them). For the
    Evaluator's result cache it counts, per metric name, the samples that can change a query's
    result (see _write), keeps the latest sample time, and the series whose last sample is not a
    staleness marker (live)."""

    def __init__(self) -> None:
        self.series: dict[frozenset, Series] = {}
        self.by_name: dict[str, list[Series]] = {}
        self.changes: dict[str, int] = {}
        self.latest = -math.inf
        self.live: dict[str, dict[frozenset, Series]] = {}
        self._writes = 0  # samples written so far: visible_until's answers hold until the next one
        self.version = 0  # the sum of `changes`: while it stands, no name's count has moved
        self._visible: dict[tuple[str, ...], tuple[int, float]] = {}

    def add(self, labels: dict[str, str], t: float, value: float, key: frozenset | None = None) -> None:
        """`key`: frozenset(labels.items()), when the caller has made it already."""
        if key is None:
            key = frozenset(labels.items())
        name = labels["__name__"]
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = Series(dict(labels))
            self.by_name.setdefault(name, []).append(s)
        self._write(name, s, t, value)
        live = self.live.setdefault(name, {})
        if math.isnan(value):
            live.pop(key, None)
        else:
            live[key] = s

    def _write(self, name: str, s: Series, t: float, value: float) -> None:
        """A sample that repeats its series' last value (not a staleness marker) changes no query
        at or after it, and extends the series' lookback: not a change. Anything else is."""
        last = s.values[-1] if s.values else STALE
        if math.isnan(last) or last != value:
            self.changes[name] = self.changes.get(name, 0) + 1
            self.version += 1
        s.times.append(t)
        s.values.append(value)
        if t > self.latest:
            self.latest = t
        self._writes += 1

    def visible_until(self, names: tuple[str, ...]) -> float:
        """Past this time an instant query at or after the latest sample may lose a series of these
        names to the lookback, though nothing more is written: the earliest last sample of their
        live series, plus the lookback."""
        known = self._visible.get(names)
        if known is not None and known[0] == self._writes:
            return known[1]
        until = min((s.times[-1] + LOOKBACK for n in names for s in self.live.get(n, {}).values()), default=math.inf)
        self._visible[names] = (self._writes, until)
        return until

    def mark_stale(self, keys: Iterable[frozenset], t: float) -> None:
        """A scrape that fails, or a target that goes away, ends its series (by full label set) with
        a staleness marker (scrape/scrape.go: staleness markers on a failed scrape and on target removal)."""
        for key in keys:
            s = self.series.get(key)
            if s is not None and s.values and not math.isnan(s.values[-1]):
                name = s.labels["__name__"]
                self._write(name, s, t, STALE)
                self.live[name].pop(key)


# ------------------------------------------------------------------ parser

_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d+)?)|(?P<dur>\[\s*\d+[smh]\s*:\s*\d+[smh]\s*\])|(?P<str>\"[^\"]*\")"
    r"|(?P<op>>=|<=|==|!=|[-+*/(){},<>=])|(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*))"
)
_AGGS = {"sum", "max", "min", "count"}
_FUNCS = {"vector", "clamp_min", "clamp_max", "min_over_time", "max_over_time"}
_CMP = {">=", "<=", ">", "<", "==", "!="}
_PREC = {"or": 1, "and": 2, **dict.fromkeys(_CMP, 3), "+": 4, "-": 4, "*": 5, "/": 5}


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos or m.lastgroup is None:
            raise PromQLError(f"unsupported PromQL near {text[pos : pos + 20]!r}")
        out.append(m.group(m.lastgroup))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


def _seconds(d: str) -> float:
    return float(d[:-1]) * {"s": 1, "m": 60, "h": 3600}[d[-1]]


class _Parser:
    def __init__(self, text: str):
        self.toks = _tokens(text)
        self.i = 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            raise PromQLError(f"expected {want or 'more'} at token {self.i}, got {tok!r}")
        self.i += 1
        return tok

    def parse(self) -> tuple:
        node = self.expr(0)
        if self.peek() is not None:
            raise PromQLError(f"unexpected {self.peek()!r}")
        return node

    def expr(self, min_prec: int) -> tuple:
        left = self.unary()
        while (op := self.peek()) in _PREC and _PREC[op] > min_prec:
            self.take()
            use_bool = on = False
            if op in _CMP and self.peek() == "bool":
                self.take()
                use_bool = True
            if self.peek() == "on":
                self.take()
                self.take("(")
                self.take(")")  # only on(): match ignoring every label
                on = True
            right = self.expr(_PREC[op])
            left = ("bin", op, left, right, use_bool, on)
        return left

    def unary(self) -> tuple:
        node = self.primary()
        if (token := self.peek()) and token.startswith("["):
            d = self.take().strip("[] ").split(":")
            node = ("subquery", node, _seconds(d[0].strip()), _seconds(d[1].strip()))
        return node

    def primary(self) -> tuple:
        tok = self.take()
        if tok == "(":
            node = self.expr(0)
            self.take(")")
            return node
        if re.fullmatch(r"\d+(\.\d+)?", tok):
            return ("num", float(tok))
        if tok in _AGGS:
            by: tuple[str, ...] = ()
            if self.peek() == "by":
                self.take()
                self.take("(")
                names = []
                while self.peek() != ")":
                    names.append(self.take())
                    if self.peek() == ",":
                        self.take()
                self.take(")")
                by = tuple(names)
            self.take("(")
            inner = self.expr(0)
            self.take(")")
            return ("agg", tok, by, inner)
        if tok in _FUNCS:
            self.take("(")
            args = [self.expr(0)]
            while self.peek() == ",":
                self.take()
                args.append(self.expr(0))
            self.take(")")
            return ("func", tok, tuple(args))
        if re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", tok):
            matchers = []
            if self.peek() == "{":
                self.take()
                while self.peek() != "}":
                    name = self.take()
                    self.take("=")
                    value = self.take()
                    if not value.startswith('"'):
                        raise PromQLError(f"label value must be quoted: {value!r}")
                    matchers.append((name, value[1:-1]))
                    if self.peek() == ",":
                        self.take()
                self.take("}")
            return ("sel", tok, tuple(matchers))
        raise PromQLError(f"unsupported token {tok!r}")


_CACHE: dict[str, tuple] = {}
_INTERN: dict[tuple, tuple] = {}


def _intern(node):
    """One object per distinct subtree, so a subexpression shared by several queries is memoised once."""
    if not isinstance(node, tuple):
        return node
    node = tuple(_intern(part) for part in node)
    return _INTERN.setdefault(node, node)


def parse(query: str) -> tuple:
    if query not in _CACHE:
        _CACHE[query] = _intern(_Parser(query).parse())
    return _CACHE[query]


# ------------------------------------------------------------------ evaluation


def _cmp(op: str, a: float, b: float) -> bool:
    return {">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b, "==": a == b, "!=": a != b}[op]


def _arith(op: str, a: float, b: float) -> float:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b if b else math.copysign(math.inf, a) if a else math.nan


_REUSED = ("bin", "func")  # inside a query, the nodes whose last result is worth keeping (Evaluator._reused)


class Evaluator:
    def __init__(self, db: TSDB):
        self.db = db
        # Results at times before this are final (every scrape up to it is written): memoised.
        self._final_before = -math.inf
        self._memo: dict[tuple[int, float], Vector | float] = {}
        self._now_memo: dict[tuple[int, float], Vector | float] = {}  # until new samples arrive
        # *_over_time results by their steps, once every step is final: evaluations at different
        # times within one step (a KEDA poll, an HPA sync) share them.
        self._windows: dict[tuple[str, int, float, int], Vector] = {}
        # Each query's and operator's last result, and what it was computed from (see instant): the
        # TSDB's version it was last checked at, its names' change counts, its windows' steps, from
        # when to when it holds.
        self._results: dict[int, tuple[int, tuple, tuple, float, float, Vector | float]] = {}
        self._steps_at: dict[tuple[float, float, float], tuple[float, int]] = {}  # _steps, by (t, range, step)
        # Each selector's matching series, in the TSDB's order, and how many of its name's it has seen.
        self._matching: dict[tuple[str, tuple], tuple[int, list[Series]]] = {}

    @property
    def final_before(self) -> float:
        return self._final_before

    @final_before.setter
    def final_before(self, t: float) -> None:
        self._final_before = t
        self._now_memo = {}

    def instant(self, query: str, t: float) -> Vector | float:
        """The query at t. A query's result at t is its last one while no sample written since
        changes a metric it selects (TSDB._write), each of its outermost subqueries has the same
        steps, and no series it saw has passed the lookback: it is the same result, not an
        approximation (a KEDA poll and an HPA sync between two scrapes, or after scrapes that
        read the same values). Kept only when computed at or after the latest sample, so every
        sample after it was counted."""
        return self._reused(parse(query), t)

    def _reused(self, node: tuple, t: float) -> Vector | float:
        """The expression at t, its last result while it is the same (see instant): for a whole
        query, and for each operator and function inside one, so that a query re-evaluated
        because one of its metrics changed reuses its parts that read others."""
        names, windows = _INPUTS.get(id(node)) or _inputs(node)
        db = self.db
        steps = self._window_steps(windows, t) if windows else ()
        last = self._results.get(id(node))
        counts = None
        if last is not None and last[3] <= t < last[4] and last[2] == steps:
            if last[0] == db.version:  # no name's count moved since it was checked
                return last[5]
            # a name never written counts as None: only equality with the next key matters
            counts = tuple(map(db.changes.get, names))
            if last[1] == counts:
                self._results[id(node)] = (db.version, *last[1:])
                return last[5]
        value = self._eval_node(node, t)
        if t >= db.latest:
            if counts is None:
                counts = tuple(map(db.changes.get, names))
            self._results[id(node)] = (db.version, counts, steps, t, db.visible_until(names), value)
        return value

    def _window_steps(self, windows: tuple[tuple[float, float], ...], t: float) -> tuple:
        out = []
        for rng, step in windows:
            key = (t, rng, step)
            found = self._steps_at.get(key)
            if found is None:
                found = self._steps_at[key] = _steps(t, rng, step)
            out.append(found)
        return tuple(out)

    def _select(self, name: str, matchers: tuple, t: float) -> Vector:
        out: Vector = {}
        for s in self._series(name, matchers):
            times = s.times
            i = bisect.bisect_right(times, t) - 1
            if i < 0 or times[i] <= t - LOOKBACK or math.isnan(s.values[i]):
                continue
            out[s.key] = s.values[i]
        return out

    def _series(self, name: str, matchers: tuple) -> list[Series]:
        """The series a selector matches, in the TSDB's order: a name's series are only ever
        appended, so only the ones added since the last call are matched."""
        every = self.db.by_name.get(name, ())
        seen, found = self._matching.get((name, matchers), (0, []))
        if seen < len(every):
            found = found + [s for s in every[seen:] if all(s.labels.get(k) == v for k, v in matchers)]
            self._matching[(name, matchers)] = (len(every), found)
        return found

    def _eval(self, node: tuple, t: float):
        key = (id(node), t)
        memo = self._memo if t < self._final_before else self._now_memo
        value = memo.get(key)
        if value is None:
            value = memo[key] = self._reused(node, t) if node[0] in _REUSED else self._eval_node(node, t)
        return value

    def _eval_node(self, node: tuple, t: float):
        kind = node[0]
        if kind == "num":
            return node[1]
        if kind == "sel":
            return self._select(node[1], node[2], t)
        if kind == "agg":
            return self._agg(node[1], node[2], self._vector(self._eval(node[3], t)))
        if kind == "func":
            return self._func(node[1], node[2], t)
        if kind == "bin":
            return self._bin(node, t)
        raise PromQLError(f"a subquery must be the argument of *_over_time: {node!r}")

    @staticmethod
    def _vector(v) -> Vector:
        if not isinstance(v, dict):
            raise PromQLError("expected an instant vector")
        return v

    @staticmethod
    def _agg(op: str, by: tuple[str, ...], v: Vector) -> Vector:
        groups: dict[frozenset, list[float]] = {}
        for labels, value in v.items():
            groups.setdefault(frozenset((k, x) for k, x in labels if k in by), []).append(value)
        fns: dict[str, Callable[[list[float]], float]] = {"sum": sum, "max": max, "min": min, "count": len}
        fn = fns[op]
        return {k: float(fn(vals)) for k, vals in groups.items()}

    def _func(self, name: str, args: list, t: float):
        if name == "vector":
            return {frozenset(): float(self._eval(args[0], t))}
        if name in ("clamp_min", "clamp_max"):
            v, bound = self._vector(self._eval(args[0], t)), float(self._eval(args[1], t))
            pick = max if name == "clamp_min" else min
            return {k: pick(x, bound) for k, x in v.items()}
        sub = args[0]
        if sub[0] != "subquery":
            raise PromQLError(f"{name} needs a subquery argument")
        _, inner, rng, step = sub
        first, steps = _steps(t, rng, step)
        final = first + (steps - 1) * step < self._final_before
        key = (name, id(inner), first, steps)
        if final and key in self._windows:
            return self._windows[key]
        acc = self._slid(name, inner, first, steps, step) if final else None
        if acc is None:
            acc = self._whole(name == "min_over_time", inner, first, steps, step)
        if final:
            self._windows[key] = acc
        return acc

    def _whole(self, lowest: bool, inner: tuple, first: float, steps: int, step: float) -> Vector:
        """A window's min (`lowest`) or max, step by step: each series keeps its first value until a
        later one is below (above) it, as builtins.min (max) of the two does, NaN included."""
        acc: Vector = {}
        memo, final_before, inner_id = self._memo, self._final_before, id(inner)
        for k in range(steps):
            t = first + k * step
            v = memo.get((inner_id, t)) if t < final_before else None  # as _step
            if not isinstance(v, dict):
                v = self._vector(self._eval(inner, t))
            for labels, value in v.items():
                if labels not in acc or (value < acc[labels] if lowest else value > acc[labels]):
                    acc[labels] = value
        return acc

    def _slid(self, name: str, inner: tuple, first: float, steps: int, step: float) -> Vector | None:
        """A final window from the one a step earlier (an evaluation every step or so sees each of
        them): drop that one's first step, take in this one's last. None (compute it whole) when
        there is no such window, a value is NaN, or the dropped step held a series' extreme (the
        runner-up is not kept)."""
        before = self._windows.get((name, id(inner), first - step, steps))
        if before is None:
            return None
        dropped, added = self._step(inner, first - step), self._step(inner, first + (steps - 1) * step)
        values = [*before.values(), *dropped.values(), *added.values()]
        if any(math.isnan(v) for v in values) or any(v == before[labels] for labels, v in dropped.items()):
            return None
        acc, pick = dict(before), min if name == "min_over_time" else max
        for labels, value in added.items():
            acc[labels] = pick(acc[labels], value) if labels in acc else value
        return acc

    def _step(self, inner: tuple, t: float) -> Vector:
        # a final step's vector straight from the memo: a window slides one step at a time, so all
        # but its newest step were evaluated before
        v = self._memo.get((id(inner), t)) if t < self._final_before else None
        return v if isinstance(v, dict) else self._vector(self._eval(inner, t))

    def _bin(self, node: tuple, t: float):
        _, op, left_node, right_node, use_bool, on = node
        left, right = self._eval(left_node, t), self._eval(right_node, t)
        if op in ("and", "or"):
            left, right = self._vector(left), self._vector(right)
            key = (lambda labels: frozenset()) if on else (lambda labels: labels)
            right_keys = {key(k) for k in right}
            if op == "and":
                return {k: v for k, v in left.items() if key(k) in right_keys}
            left_keys = {key(k) for k in left}
            return {**left, **{k: v for k, v in right.items() if key(k) not in left_keys}}
        lv, rv = isinstance(left, dict), isinstance(right, dict)
        if not lv and not rv:
            return float(_cmp(op, left, right)) if op in _CMP else _arith(op, left, right)
        pairs: list[tuple[frozenset, float, float]] = []
        if lv and rv:
            if on:
                if len(left) > 1 or len(right) > 1:
                    raise PromQLError("on() matching needs one series on each side")
                pairs = [(frozenset(), a, b) for a in left.values() for b in right.values()]
            else:
                pairs = [(k, a, right[k]) for k, a in left.items() if k in right]
        elif lv:
            pairs = [(k, a, right) for k, a in left.items()]
        else:
            pairs = [(k, left, b) for k, b in right.items()]
        out: Vector = {}
        for k, a, b in pairs:
            if op in _CMP:
                ok = _cmp(op, a, b)
                if use_bool:
                    out[k] = float(ok)
                elif ok:
                    out[k] = a if lv else b
            else:
                out[k] = _arith(op, a, b)
        return out


def _steps(t: float, rng: float, step: float) -> tuple[float, int]:
    """A subquery's first step and number of steps at t: multiples of the step within (t - R, t]."""
    first = (math.floor((t - rng) / step + 1e-9) + 1) * step  # left-open: never the step at t - R
    return first, math.floor((t - first) / step + 1e-9) + 1  # never a step after t


_INPUTS: dict[int, tuple[tuple[str, ...], tuple[tuple[float, float], ...]]] = {}


def _inputs(node: tuple) -> tuple[tuple[str, ...], tuple[tuple[float, float], ...]]:
    """The metric names a parsed query selects, and the (range, step) of each subquery evaluated at
    the query's own time (not inside another subquery, whose steps follow from the outer one's)."""
    if id(node) not in _INPUTS:
        names: set[str] = set()
        windows: list[tuple[float, float]] = []

        def walk(n: tuple, outermost: bool) -> None:
            kind = n[0]
            if kind == "sel":
                names.add(n[1])
            elif kind == "agg":
                walk(n[3], outermost)
            elif kind == "func":
                for arg in n[2]:
                    walk(arg, outermost)
            elif kind == "bin":
                walk(n[2], outermost)
                walk(n[3], outermost)
            elif kind == "subquery":
                if outermost:
                    windows.append((n[2], n[3]))
                walk(n[1], False)

        walk(node, True)
        _INPUTS[id(node)] = (tuple(sorted(names)), tuple(windows))
    return _INPUTS[id(node)]


def scalar_result(v: Vector | float) -> float | None:
    """What KEDA's Prometheus scaler reads from a query result: None when empty (it is an error with
    ignoreNullValues "false"); more than one series is an error too
    (kedacore/keda@v2.20.2:pkg/scalers/prometheus_scaler.go ExecutePromQuery)."""
    if not isinstance(v, dict):
        return v
    if len(v) > 1:
        raise PromQLError("prometheus query returned multiple elements")
    return next(iter(v.values())) if v else None

"""KEDA 2.20.2 and the HPA it creates, driven by the ScaledObject the program renders (the
article's 2.16.1 differs where named).

Followed:
* kedacore/keda@v2.20.2:pkg/scaling/scale_handler.go (getScaledObjectState): every trigger is
  queried each pollingInterval; active if any value > activationThreshold, in error if any errs.
* pkg/scaling/executor/scale_scaledobjects.go (RequestScale): active and below minReplicaCount
  (idle mode) -> set minReplicaCount; active without error -> refresh the last-active time;
  inactive with an error and no fallback -> no change; inactive, above idleReplicaCount ->
  idleReplicaCount once last-active + cooldownPeriod has passed.
* pkg/scalers/prometheus_scaler.go: empty result -> 0, or an error with ignoreNullValues "false";
  more than one series -> error; +-Inf and NaN -> 0 or error (2.16.1 passed NaN on).
* controllers/keda/hpa.go: HPA min = max(1, minReplicaCount), max = maxReplicaCount, behavior from
  `advanced.horizontalPodAutoscalerConfig` (none -> the Kubernetes defaults); with
  `advanced.scalingModifiers` the HPA gets one composite External metric (target, metricType).
* pkg/scaling/modifiers/formula.go and scale_handler.go: the formula (expr-lang/expr v1.17.8; a
  result that is not a float is an error, which 2.16.1's expr.AsFloat64() converted instead: no
  composite metric, and an inactive ScaledObject) runs over the triggers' values by trigger name; the composite value is set
  in milli-units (truncated); activation is the formula's value > activationTarget; any trigger
  error makes the ScaledObject inactive-with-error and the composite metric an error for the HPA.
* kubernetes/kubernetes@v1.34.0:pkg/controller/podautoscaler/horizontal.go and
  replica_calculator.go: sync every 15 s; External AverageValue -> ceil(value / target), kept at
  the current count within the 0.1 tolerance (external_per_pod_replicas); the largest of several metrics; no change when every
  metric is invalid or some are and the rest would scale down; scale to 0 replicas disables the
  HPA; behavior (pkg/apis/autoscaling/v2/defaults.go fills what is unset): scale-down keeps the
  highest recommendation of its stabilizationWindowSeconds (unset: 300 s), scale-up the lowest of
  its window (0 s), at most max(2x, +4) per 15 s; the default policies only (others are refused).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from twin.promql import Evaluator, PromQLError, scalar_result

HPA_SYNC = 15
TOLERANCE = 0.1  # --horizontal-pod-autoscaler-tolerance's default; the program sets its own (Setup)
DOWNSCALE_WINDOW = 300.0
SCALE_UP_PODS, SCALE_UP_PERCENT = 4, 100


@dataclass
class Trigger:
    name: str
    query: str
    threshold: float
    activation: float
    ignore_null: bool

    @classmethod
    def from_manifest(cls, t: dict) -> Trigger:
        md = t["metadata"]
        return cls(
            name=t["name"],
            query=md["query"],
            threshold=float(md["threshold"]),
            activation=float(md.get("activationThreshold", "0")),
            ignore_null=md.get("ignoreNullValues", "true").lower() == "true",
        )

    def value(self, ev: Evaluator, now: float) -> float:
        """Raises PromQLError for what KEDA's Prometheus scaler treats as an error."""
        v = scalar_result(ev.instant(self.query, now))
        # NaN as Inf since 2.20.0 (kedacore/keda@v2.20.2:pkg/scalers/prometheus_scaler.go
        # ExecutePromQuery); the article's 2.16.1 passed a NaN on to the formula.
        if v is None or math.isinf(v) or math.isnan(v):
            if self.ignore_null:
                return 0.0
            raise PromQLError("prometheus metrics 'prometheus' target may be lost, the result is empty")
        return v


# ------------------------------------------------------------------ the formula (expr-lang subset)

_EXPR_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d+)?)|(?P<op>>=|<=|==|!=|&&|\|\||[-+*/(),?:<>])|(?P<id>[A-Za-z_]\w*))"
)
_EXPR_FUNCS: dict[str, Callable[..., Any]] = {"max": max, "min": min, "float": float}


class FormulaResultError(ValueError):
    """The formula gave an int: KEDA 2.20 compiles it without expr.AsFloat64() and refuses any
    result but a float64 (kedacore/keda@v2.20.2:pkg/scaling/modifiers/formula.go
    calculateScalingModifiersFormula; 2.16.1 converted it, @v2.16.1:apis/keda/v1alpha1/
    scaledobject_webhook.go)."""


class Formula:
    """What the program's formulas use of expr-lang v1.17.8 (docs/language-definition.md): numbers,
    trigger names, + - * /, comparisons, && ||, `c ? a : b`, and the builtins max, min, float.
    Anything else is refused, so a new formula shape fails loudly in the tests. The text is parsed
    once into closures (KEDA compiles it once too, kedacore/keda@v2.20.2:pkg/scaling/modifiers):
    the HPA and KEDA evaluate it on every sync and poll. Types as expr-lang keeps them: a literal
    without a point is an int, trigger values are floats, int op int stays int but `/` gives a
    float, and min/max return the argument they pick, the first of equals
    (expr-lang/expr@v1.17.8:builtin/lib.go minMax), as Python's do."""

    def __init__(self, text: str):
        self.tokens, pos = [], 0
        while pos < len(text.rstrip()):
            m = _EXPR_TOKEN.match(text, pos)
            if m is None or m.end() == pos or m.lastgroup is None:
                raise ValueError(f"formula: cannot read {text[pos : pos + 20]!r}")
            self.tokens.append(m.group(m.lastgroup))
            pos = m.end()
        self.text = text
        self._i = 0
        self._compiled = self._ternary()
        if self._i != len(self.tokens):
            raise ValueError(f"formula: unexpected {self.tokens[self._i]!r} in {self.text!r}")

    def __call__(self, env: dict[str, float]) -> float:
        out = self._compiled(env)
        if not isinstance(out, float):
            raise FormulaResultError(f"formula returned non-float result {type(out).__name__} ({out})")
        return out

    def run(self, env: dict[str, float]) -> Any:
        """expr.Run: the result whatever its type (KEDA's validation runs it so)."""
        return self._compiled(env)

    def _peek(self) -> str | None:
        return self.tokens[self._i] if self._i < len(self.tokens) else None

    def _take(self, want: str | None = None) -> str:
        tok = self._peek()
        if tok is None or (want is not None and tok != want):
            raise ValueError(f"formula: expected {want or 'more'} in {self.text!r}")
        self._i += 1
        return tok

    def _ternary(self) -> Callable[[dict], Any]:
        cond = self._binary(0)
        if self._peek() != "?":
            return cond
        self._take("?")
        yes = self._ternary()
        self._take(":")
        no = self._ternary()
        return lambda env: yes(env) if cond(env) else no(env)

    _LEVELS: ClassVar[tuple] = (("||",), ("&&",), ("==", "!=", "<", ">", "<=", ">="), ("+", "-"), ("*", "/"))
    _OPS: ClassVar[dict] = {
        "||": lambda a, b: a or b,
        "&&": lambda a, b: a and b,
        "==": lambda a, b: a == b,
        "!=": lambda a, b: a != b,
        "<": lambda a, b: a < b,
        ">": lambda a, b: a > b,
        "<=": lambda a, b: a <= b,
        ">=": lambda a, b: a >= b,
        "+": lambda a, b: a + b,
        "-": lambda a, b: a - b,
        "*": lambda a, b: a * b,
        "/": lambda a, b: a / b,
    }

    def _binary(self, level: int) -> Callable[[dict], Any]:
        if level == len(self._LEVELS):
            return self._unary()
        left = self._binary(level + 1)
        while self._peek() in self._LEVELS[level]:
            op = self._OPS[self._take()]
            left = _binary(op, left, self._binary(level + 1))
        return left

    def _unary(self) -> Callable[[dict], Any]:
        if self._peek() == "-":
            self._take()
            inner = self._unary()
            return lambda env: -inner(env)
        return self._primary()

    def _primary(self) -> Callable[[dict], Any]:
        tok = self._take()
        if tok == "(":
            inner = self._ternary()
            self._take(")")
            return inner
        if tok[0].isdigit():
            constant: int | float = float(tok) if "." in tok else int(tok)
            return lambda env: constant
        if tok in _EXPR_FUNCS and self._peek() == "(":
            self._take("(")
            args = [self._ternary()]
            while self._peek() == ",":
                self._take(",")
                args.append(self._ternary())
            self._take(")")
            fn = _EXPR_FUNCS[tok]
            return lambda env: fn(*(a(env) for a in args))
        if tok[0].isalpha() or tok[0] == "_":
            return lambda env: _name(env, tok)
        raise ValueError(f"formula: unexpected {tok!r} in {self.text!r}")


def _binary(op: Callable[[Any, Any], Any], left: Callable[[dict], Any], right: Callable[[dict], Any]):
    return lambda env: op(left(env), right(env))


def _name(env: dict[str, float], name: str) -> float:
    if name not in env:
        raise ValueError(f"formula: unknown name {name!r}")
    return env[name]


@dataclass(frozen=True)
class Modifiers:
    formula: Formula
    target: float
    activation: float
    # Each result by the trigger values it came from: the formula is pure, and between scrapes the
    # HPA's syncs and KEDA's polls read the same values again and again.
    _milli: dict[tuple, int] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_advanced(cls, advanced: dict, trigger_names: list[str]) -> Modifiers | None:
        sm = advanced.get("scalingModifiers") or {}
        if not sm:
            return None
        if sm.get("metricType", "AverageValue") != "AverageValue":
            raise ValueError("the twin models scalingModifiers with metricType AverageValue only")
        f = Formula(sm["formula"])
        f.run({name: -1.0 for name in trigger_names})  # KEDA's validation: run once with dummy values
        return cls(f, float(sm["target"]), float(sm.get("activationTarget") or 0))

    def milli(self, values: dict[str, float]) -> int:
        key = tuple((name, repr(v)) for name, v in values.items())  # repr: 0.0 apart from -0.0, 1 from 1.0
        if key not in self._milli:
            self._milli[key] = math.trunc(self.formula(values) * 1000)  # Quantity.SetMilli(int64(out * 1000))
        return self._milli[key]

    def value(self, values: dict[str, float]) -> float:
        return self.milli(values) / 1000


@dataclass(frozen=True)
class Behavior:
    down_window: float = DOWNSCALE_WINDOW
    up_window: float = 0.0

    @classmethod
    def from_advanced(cls, advanced: dict) -> Behavior:
        behavior = (advanced.get("horizontalPodAutoscalerConfig") or {}).get("behavior") or {}
        for direction in ("scaleUp", "scaleDown"):
            if {"policies", "selectPolicy", "tolerance"} & set(behavior.get(direction) or {}):
                raise ValueError(f"the twin models only the default HPA {direction} policies")
        down = (behavior.get("scaleDown") or {}).get("stabilizationWindowSeconds")
        up = (behavior.get("scaleUp") or {}).get("stabilizationWindowSeconds")
        return cls(DOWNSCALE_WINDOW if down is None else float(down), 0.0 if up is None else float(up))


def _milli(value: float) -> int:
    """int64(value * 1000): how KEDA hands a value to the HPA (pkg/scalers/scaler.go
    GenerateMetricInMili, and GetMetricTargetMili for a target)."""
    return math.trunc(value * 1000)


@dataclass(frozen=True)
class Metric:
    """One External metric of the HPA: the value KEDA's activation compares, the milli-value and
    AverageValue target (milli) the HPA reads; milli None for NaN, which the HPA calls invalid."""

    value: float
    milli: int | None
    target: int
    activation: float

    @classmethod
    def of(cls, value: float, threshold: float, activation: float) -> Metric:
        return cls(value, None if math.isnan(value) else _milli(value), _milli(threshold), activation)


@dataclass
class Keda:
    triggers: list[Trigger]
    min_replicas: int
    max_replicas: int
    idle_replicas: int | None
    cooldown: float
    polling: float
    fallback: int | None = None
    modifiers: Modifiers | None = None
    behavior: Behavior = field(default_factory=Behavior)
    last_active: float | None = None
    errors: int = 0

    @classmethod
    def from_scaled_object(cls, so: dict) -> Keda:
        spec = so["spec"]
        fallback = (spec.get("fallback") or {}).get("replicas")
        triggers = [Trigger.from_manifest(t) for t in spec["triggers"]]
        advanced = spec.get("advanced") or {}
        return cls(
            triggers=triggers,
            min_replicas=int(spec.get("minReplicaCount", 0)),
            max_replicas=int(spec.get("maxReplicaCount", 100)),
            idle_replicas=spec.get("idleReplicaCount"),
            cooldown=float(spec.get("cooldownPeriod", 300)),
            polling=float(spec.get("pollingInterval", 30)),
            fallback=fallback,
            modifiers=Modifiers.from_advanced(advanced, [t.name for t in triggers]),
            behavior=Behavior.from_advanced(advanced),
        )

    def metrics(self, ev: Evaluator, now: float) -> tuple[list[Metric], bool]:
        """Each External metric the HPA sees, and whether any trigger erred. Without
        scalingModifiers, one per trigger (controllers/keda/hpa.go getScaledObjectMetricSpecs); with
        them, the one composite metric (its target and metricType from scalingModifiers), and none
        when a trigger errs."""
        values, error = {}, False
        for t in self.triggers:
            try:
                values[t.name] = t.value(ev, now)
            except PromQLError:
                error = True
        if self.modifiers is None:
            by_name = {t.name: t for t in self.triggers}
            return [Metric.of(v, by_name[n].threshold, by_name[n].activation) for n, v in values.items()], error
        if error:
            return [], True
        m = self.modifiers
        try:
            milli = m.milli(values)
        except FormulaResultError:
            # logged, no composite metric: the HPA has none, and KEDA reads the ScaledObject as
            # inactive, not in error (kedacore/keda@v2.20.2:pkg/scaling/modifiers/formula.go
            # HandleScalingModifiers, pkg/scaling/scale_handler.go getScaledObjectState)
            return [], False
        return [Metric(milli / 1000, milli, _milli(m.target), m.activation)], False

    def poll(self, ev: Evaluator, now: float, current: int) -> int:
        metrics, error = self.metrics(ev, now)
        active = any(m.value > m.activation for m in metrics)  # NaN is never active
        self.errors += error
        if active:
            if (self.idle_replicas is not None and current < self.min_replicas) or current == 0:
                self.last_active = now
                return max(self.min_replicas, 1)
            if not error:
                self.last_active = now
            return current
        if error:
            return self.fallback if self.fallback else current
        idle = self.idle_replicas if self.idle_replicas is not None else 0
        if current > idle and (self.last_active is None or now >= self.last_active + self.cooldown):
            return idle
        return current


def external_per_pod_replicas(usage: int, target: int, current: int, tolerance: float = TOLERANCE) -> int:
    """An External metric with an AverageValue target, in milli-units, as kubernetes/kubernetes@v1.34.0:
    pkg/controller/podautoscaler/replica_calculator.go GetExternalPerPodMetricReplicas computes it:
    the current count while usage / (target * current) lies within [1 - 0.1, 1 + 0.1]
    (Tolerances.isWithin, both ends included, with the controller's default
    --horizontal-pod-autoscaler-tolerance 0.1), else ceil(usage / target). So from 10 pods on, a
    change of one pod (a ratio of 1.1 or 0.9) is no change under the default; the program's
    kubeadm config sets 0 (components/bootstrap.py HPA_TOLERANCE). Upstream the current count is the
    scale's status replicas (the pods that exist), the twin passes the NodeSet's replicas: for a
    whole-number metric below 10 pods both give ceil(usage / target), as within the tolerance the
    usage is then the count itself."""
    ratio = usage / (target * current)
    if 1.0 - tolerance <= ratio <= 1.0 + tolerance:
        return current
    return math.ceil(usage / target)


@dataclass
class Hpa:
    keda: Keda
    tolerance: float = TOLERANCE
    recommendations: list[tuple[float, int]] = field(default_factory=list)

    @property
    def min_replicas(self) -> int:
        return max(1, self.keda.min_replicas)

    def sync(self, ev: Evaluator, now: float, current: int) -> int:
        if current == 0:
            return 0  # ScalingDisabled while the target has 0 replicas
        metrics, _ = self.keda.metrics(ev, now)
        expected = 1 if self.keda.modifiers is not None else len(self.keda.triggers)
        proposals, invalid = [], expected - len(metrics)
        for m in metrics:
            if m.milli is None:
                invalid += 1
                continue
            proposals.append(external_per_pod_replicas(m.milli, m.target, current, self.tolerance))
        desired = max(proposals, default=0)
        if invalid == expected or (invalid and desired < current):
            return current
        desired = min(self.keda.max_replicas, max(self.min_replicas, desired))
        b = self.keda.behavior
        keep = max(b.down_window, b.up_window)
        self.recommendations = [(t, r) for t, r in self.recommendations if t > now - keep]
        self.recommendations.append((now, desired))
        stabilized = current
        up = min([r for t, r in self.recommendations if t > now - b.up_window] + [desired])
        if stabilized < up:
            stabilized = up
        down = max([r for t, r in self.recommendations if t > now - b.down_window] + [desired])
        if stabilized > down:
            stabilized = down
        if stabilized > current:
            limit = max(current + SCALE_UP_PODS, current * (100 + SCALE_UP_PERCENT) // 100)
            stabilized = min(stabilized, limit)
        return min(self.keda.max_replicas, max(self.min_replicas, stabilized))

"""KEDA 2.16.1 and the HPA it creates, driven by the ScaledObject the program renders.

Followed:
* kedacore/keda@v2.16.1:pkg/scaling/scale_handler.go (getScaledObjectState): every trigger is
  queried each pollingInterval; active if any value > activationThreshold, in error if any errs.
* pkg/scaling/executor/scale_scaledobjects.go (RequestScale): active and below minReplicaCount
  (idle mode) -> set minReplicaCount; active without error -> refresh the last-active time;
  inactive with an error and no fallback -> no change; inactive, above idleReplicaCount ->
  idleReplicaCount once last-active + cooldownPeriod has passed.
* pkg/scalers/prometheus_scaler.go: empty result -> 0, or an error with ignoreNullValues "false";
  more than one series -> error; +-Inf -> 0 or error.
* controllers/keda/hpa.go: HPA min = max(1, minReplicaCount), max = maxReplicaCount, behavior from
  `advanced` (nil here -> the Kubernetes defaults).
* kubernetes/kubernetes@v1.34.0:pkg/controller/podautoscaler/horizontal.go and
  replica_calculator.go: sync every 15 s; External AverageValue -> ceil(value / target), kept at
  the current count within the 0.1 tolerance; the largest of several metrics; no change when every
  metric is invalid or some are and the rest would scale down; scale to 0 replicas disables the
  HPA; default behavior: scale-down keeps the highest recommendation of the last 300 s, scale-up
  at most max(2x, +4) per 15 s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from twin.promql import Evaluator, PromQLError, scalar_result

HPA_SYNC = 15
TOLERANCE = 0.1
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
        if v is None or math.isinf(v):
            if self.ignore_null:
                return 0.0
            raise PromQLError("prometheus metrics 'prometheus' target may be lost, the result is empty")
        return v


@dataclass
class Keda:
    triggers: list[Trigger]
    min_replicas: int
    max_replicas: int
    idle_replicas: int | None
    cooldown: float
    polling: float
    fallback: int | None = None
    last_active: float | None = None
    errors: int = 0

    @classmethod
    def from_scaled_object(cls, so: dict) -> Keda:
        spec = so["spec"]
        fallback = (spec.get("fallback") or {}).get("replicas")
        return cls(
            triggers=[Trigger.from_manifest(t) for t in spec["triggers"]],
            min_replicas=int(spec.get("minReplicaCount", 0)),
            max_replicas=int(spec.get("maxReplicaCount", 100)),
            idle_replicas=spec.get("idleReplicaCount"),
            cooldown=float(spec.get("cooldownPeriod", 300)),
            polling=float(spec.get("pollingInterval", 30)),
            fallback=fallback,
        )

    def poll(self, ev: Evaluator, now: float, current: int) -> int:
        active = error = False
        for t in self.triggers:
            try:
                v = t.value(ev, now)
            except PromQLError:
                error = True
                continue
            active = active or v > t.activation  # NaN is never active
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


@dataclass
class Hpa:
    keda: Keda
    recommendations: list[tuple[float, int]] = field(default_factory=list)

    @property
    def min_replicas(self) -> int:
        return max(1, self.keda.min_replicas)

    def sync(self, ev: Evaluator, now: float, current: int) -> int:
        if current == 0:
            return 0  # ScalingDisabled while the target has 0 replicas
        proposals, invalid = [], 0
        for t in self.keda.triggers:
            try:
                v = t.value(ev, now)
            except PromQLError:
                invalid += 1
                continue
            if math.isnan(v):
                invalid += 1
                continue
            ratio = v / (t.threshold * current)
            proposals.append(current if abs(ratio - 1.0) <= TOLERANCE else math.ceil(v / t.threshold))
        desired = max(proposals, default=0)
        if invalid == len(self.keda.triggers) or (invalid and desired < current):
            return current
        desired = min(self.keda.max_replicas, max(self.min_replicas, desired))
        self.recommendations = [(t, r) for t, r in self.recommendations if t > now - DOWNSCALE_WINDOW]
        self.recommendations.append((now, desired))
        stabilized = current
        if stabilized < desired:
            stabilized = desired
        down = max(r for _, r in self.recommendations)
        if stabilized > down:
            stabilized = down
        if stabilized > current:
            limit = max(current + SCALE_UP_PODS, current * (100 + SCALE_UP_PERCENT) // 100)
            stabilized = min(stabilized, limit)
        return min(self.keda.max_replicas, max(self.min_replicas, stabilized))

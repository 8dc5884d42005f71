"""The verdict per hypothesis clause: expected vs observed, from what the drill measured.

A clause is ``metric`` (for a region, a model) ``op`` ``value``, written before the drill. Each
metric's observed value is defined once, here:

* ``time_to_slo_s``: T0 → the region's users (with ``region``; all users without) served within
  SLO after the traffic moved, held (``rto.SloTracker``); ``rto_s``: the measured RTO;
* ``ttft_p99_s``: the worst rolling 5-minute TTFT p99 in the region after T0 (all regions: the
  worst of them); ``kv_usage_max``: the highest cell KV-cache usage in the region after T0;
* ``error_ratio`` / ``paid_5xx_ratio``: the worst rolling 5-minute 5xx ratio after T0 in the
  region (all regions without); the twin spreads failures evenly over tenants, so the paid tier's
  ratio is the pool's;
* ``unsigned_admitted``: replicas created from a digest that is not signed and attested;
* ``p2p_hit_rate``, ``origin_errors``, ``peak_gbps_per_node``, ``first_ready_s``: the hydrate
  measurement of the region (``drill.recovery.hydrate_stats``); ``hydrate_s``: the region's
  scale-out start → enough ready replicas;
* ``nodes_drained`` / ``replicas_ejected``: what the remediation controller did after T0;
* ``survivor_digest_attested``: 1 when every survivor kept serving signed and attested weights and
  no digest reached a survivor before it landed there (the ready-gate held), else 0;
* ``expr``: the PromQL-subset expression at the end (a vector gives its largest sample).

An observed value that could not be measured (None, NaN) fails the clause: an unproven claim is
not a held one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from firedrill.drill import expr
from firedrill.drill.observe import Observer
from firedrill.drill.spec import Comparison, HypothesisClause

ROLLING_WINDOW_S = 300.0


def compare(observed: float | None, op: Comparison, value: float) -> bool:
    if observed is None or math.isnan(observed):
        return False
    return {
        "<": observed < value,
        "<=": observed <= value,
        "==": observed == value,
        "!=": observed != value,
        ">=": observed >= value,
        ">": observed > value,
    }[op]


@dataclass
class Measurements:
    """Everything a clause can be judged on, gathered by the runner at the end of the run."""

    observer: Observer
    t0_s: float
    end_s: float
    rto_s: float | None
    time_to_slo: Callable[[str | None], float | None]
    hydrate: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # region -> stats
    hydrate_s: Mapping[str, float | None] = field(default_factory=dict)
    unsigned_admitted: int | None = None
    nodes_drained: int = 0
    replicas_ejected: int = 0
    survivor_digest_attested: bool | None = None
    # services whose users sit across the blackhole's cut (None: the drill cut no region)
    crossing_services: Sequence[str] | None = None
    evaluate_expr: Callable[[str], float] | None = None

    def _steps_after_t0(self) -> list[float]:
        return [t for t in self.observer.times if t > self.t0_s + 1e-9]

    def worst_ttft(self, region: str | None) -> float | None:
        regions = self.observer.regions if region is None else [region]
        worst: float | None = None
        for t in self._steps_after_t0():
            for r in regions:
                v = self.observer.ttft_p99(r, ROLLING_WINDOW_S, end_s=t)
                if not math.isnan(v):
                    worst = v if worst is None else max(worst, v)
        return worst

    def worst_ratio(self, region: str | None) -> float | None:
        worst: float | None = None
        for t in self._steps_after_t0():
            v = self.observer.error_ratio(region, ROLLING_WINDOW_S, end_s=t)
            if not math.isnan(v):
                worst = v if worst is None else max(worst, v)
        return worst

    def kv_max(self, region: str | None) -> float | None:
        obs = self.observer
        idx = [obs.region_index(region)] if region is not None else list(range(len(obs.regions)))
        vals = [float(s.kv_max[i]) for s in obs.samples if s.t_s > self.t0_s + 1e-9 for i in idx]
        return max(vals) if vals else None


def observe(clause: HypothesisClause, m: Measurements) -> float | None:
    """The observed value of a clause's metric (None when it could not be measured)."""
    region = clause.region
    match clause.metric:
        case "time_to_slo_s":
            return m.time_to_slo(region)
        case "rto_s":
            return m.rto_s
        case "ttft_p99_s":
            return m.worst_ttft(region)
        case "kv_usage_max":
            return m.kv_max(region)
        case "error_ratio" | "paid_5xx_ratio":
            return m.worst_ratio(region)
        case "unsigned_admitted":
            return None if m.unsigned_admitted is None else float(m.unsigned_admitted)
        case "p2p_hit_rate" | "origin_errors" | "peak_gbps_per_node" | "first_ready_s":
            stats = m.hydrate.get(region or "", {}) if region else _only(m.hydrate)
            v = stats.get(clause.metric)
            return float(v) if isinstance(v, int | float) else None
        case "hydrate_s":
            return m.hydrate_s.get(region or "") if region else _only_value(m.hydrate_s)
        case "nodes_drained":
            return float(m.nodes_drained)
        case "replicas_ejected":
            return float(m.replicas_ejected)
        case "survivor_digest_attested":
            ok = m.survivor_digest_attested
            return None if ok is None else (1.0 if ok else 0.0)
        case "hidden_dependencies":
            if m.crossing_services is None:
                return None  # no region was cut: nothing was tried
            names = [s for s in m.crossing_services if clause.service in (None, s)]
            return float(len(names))
        case "expr":
            if m.evaluate_expr is None or clause.expr is None:
                return None
            try:
                return m.evaluate_expr(clause.expr)
            except expr.ExprError:
                return None
    return None


def _only(stats: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    return next(iter(stats.values())) if stats else {}


def _only_value(values: Mapping[str, float | None]) -> float | None:
    return next(iter(values.values())) if values else None


def expected(clause: HypothesisClause) -> str:
    return f"{clause.op} {clause.value:g}"


def judge(clause: HypothesisClause, m: Measurements) -> dict[str, Any]:
    """One row of the verdict table."""
    seen = observe(clause, m)
    if seen is not None and math.isnan(seen):
        seen = None
    return {
        "clause": clause.clause,
        "metric": clause.metric,
        "region": clause.region,
        "op": clause.op,
        "value": clause.value,
        "expected": expected(clause),
        "observed": None if seen is None else round(seen, 6),
        "passed": compare(seen, clause.op, clause.value),
    }

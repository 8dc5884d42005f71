"""The PromQL toolbox: the pieces of Prometheus's semantics every in-process evaluator shares.

The twin raises alerts and a drill measures its clauses without a Prometheus server, so each
must compute what Prometheus 2.x computes, to the bit where promtool is the judge
(``tests/detect``). Written once here, used by ``detect`` (burn-rate, cause, quality,
prefill/decode and security alerts) and ``drill`` (clause expressions, recovery checks):

* ``prom_increase`` / ``series_increase``: ``increase()`` with Prometheus's extrapolation to the
  range edges (below 1.1 average sample intervals, else half an interval) and the zero-crossing
  limit for counters; ``rate`` is ``increase / range``;
* ``bucket_quantile`` / ``bucket_quantiles``: ``histogram_quantile`` over cumulative buckets,
  one histogram or many at once;
* ``fdiv``: division as Go divides (x / 0 is ±Inf, 0 / 0 is NaN);
* ``AlertState``: an alerting rule's ``for:`` state machine. An alert is pending from the first
  evaluation that returns its labels, fires once it has been returned at every evaluation for
  ``for:`` (at once without one), and resolves at the first evaluation that does not return it;
  a pending alert that drops out is forgotten.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from firedrill.model.series import Labels

__all__ = [
    "AlertEvent",
    "AlertState",
    "bucket_quantile",
    "bucket_quantiles",
    "fdiv",
    "prom_increase",
    "series_increase",
]

F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]
MS = 1000  # alert state is kept in integer milliseconds, as Prometheus timestamps are


@dataclass(frozen=True)
class AlertEvent:
    """An alert changing state at an evaluation."""

    at_s: float
    alertname: str
    state: str  # firing | resolved (| pending, in listings of alerts waiting out ``for:``)
    labels: Labels
    value: float

    def label(self, key: str) -> str:
        return dict(self.labels).get(key, "")


# -- increase and rate ---------------------------------------------------------------------------


def _extrapolated(
    delta: F64,
    first: F64,
    t_first: F64 | float,
    t_last: float,
    n: npt.NDArray[np.int64] | int,
    start: F64 | float,
    end: float,
) -> F64:
    """Extrapolate a counter's ``delta`` between its first and last samples to [start, end]."""
    t_first_a = np.asarray(t_first, dtype=np.float64)
    n_a = np.asarray(n)
    sampled = t_last - t_first_a
    with np.errstate(divide="ignore", invalid="ignore"):
        avg = sampled / (n_a - 1)
        to_start = np.broadcast_to(t_first_a - np.asarray(start), delta.shape)
        to_zero = np.where(delta > 0, sampled * (first / delta), np.inf)  # as Prometheus rounds
        to_start = np.where((delta > 0) & (first >= 0), np.minimum(to_start, to_zero), to_start)
        to_end = end - t_last
        threshold = avg * 1.1
        span = sampled + np.where(to_start < threshold, to_start, avg / 2)
        span = span + np.where(to_end < threshold, to_end, avg / 2)
        result = delta * (span / sampled)
    out: F64 = np.where((n_a >= 2) & (sampled > 0), result, np.nan)
    return out


def prom_increase(
    first: F64,
    last: F64,
    t_first: F64 | float,
    t_last: float,
    n: npt.NDArray[np.int64] | int,
    start: F64 | float,
    end: float,
) -> F64:
    """Prometheus 2.x ``increase()`` of counters over [start, end] from first/last samples
    (``last`` with any counter resets already added back).

    Broadcasts: ``first`` may be [windows, cells] with ``t_first``, ``n`` and ``start`` given
    per window as [windows, 1]. Fewer than two samples gives NaN, as Prometheus gives no value.
    """
    return _extrapolated(last - first, first, t_first, t_last, n, start, end)


def series_increase(
    times: Sequence[float], values: Sequence[float], start: float, end: float
) -> float:
    """``increase`` of one counter's samples over [start, end]: non-finite samples skipped, each
    counter reset (a drop) adds back the value before it; NaN with fewer than two samples."""
    pts = [(t, v) for t, v in zip(times, values, strict=True) if math.isfinite(v)]
    if len(pts) < 2:
        return math.nan
    t0, v0 = pts[0]
    t1 = pts[-1][0]
    delta = pts[-1][1] - v0
    for (_, a), (_, b) in itertools.pairwise(pts):
        if b < a:
            delta += a  # a reset: the counter went back to zero and grew to b
    if t1 - t0 <= 0:
        return math.nan
    out = _extrapolated(np.array([delta]), np.array([v0]), t0, t1, len(pts), start, end)
    return float(out[0])


# -- division and quantiles ----------------------------------------------------------------------


def fdiv(num: float, den: float) -> float:
    """IEEE division, as Go divides: x / 0 is ±Inf, 0 / 0 is NaN."""
    if den == 0.0:
        if num == 0.0 or math.isnan(num):
            return math.nan
        return math.copysign(math.inf, num) * math.copysign(1.0, den)
    return num / den


def bucket_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """``histogram_quantile`` over (upper bound, cumulative count) pairs, as Prometheus 2.42."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = sorted(buckets, key=lambda b: b[0])
    if not ordered or not math.isinf(ordered[-1][0]) or ordered[-1][0] < 0:
        return math.nan
    merged: list[list[float]] = []
    for bound, count in ordered:  # coalesce equal bounds
        if merged and merged[-1][0] == bound:
            merged[-1][1] += count
        else:
            merged.append([bound, count])
    top = merged[0][1]
    for b in merged[1:]:  # force monotonic counts
        if b[1] > top:
            top = b[1]
        elif b[1] < top:
            b[1] = top
    if len(merged) < 2:
        return math.nan
    observations = merged[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    i = next((k for k in range(len(merged) - 1) if merged[k][1] >= rank), len(merged) - 1)
    if i == len(merged) - 1:
        return merged[-2][0]
    if i == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start, end, count = 0.0, merged[i][0], merged[i][1]
    if i > 0:
        start = merged[i - 1][0]
        count -= merged[i - 1][1]
        rank -= merged[i - 1][1]
    return start + (end - start) * fdiv(rank, count)


def bucket_quantiles(q: float, bounds: F64, counts: F64, present: B) -> F64:
    """``bucket_quantile`` for many histograms at once: rows of ``counts`` over the sorted
    distinct ``bounds``; a row missing a bucket (or holding a NaN) takes the scalar path."""
    out = np.full(counts.shape[0], np.nan)
    whole = np.asarray(present.all(axis=1) & ~np.isnan(counts).any(axis=1), dtype=bool)
    if bounds.size < 2 or not np.isposinf(bounds[-1]) or not 0 <= q <= 1:
        whole[:] = False  # the edge cases, row by row
    for i in np.flatnonzero(~whole & present.any(axis=1)).tolist():
        m = present[i]
        pairs = zip(bounds[m].tolist(), counts[i, m].tolist(), strict=True)
        out[i] = bucket_quantile(q, list(pairs))
    if not whole.any():
        return out
    c = np.maximum.accumulate(counts[whole], axis=1)  # monotonic, as Prometheus forces it
    observations = c[:, -1]
    rank = q * observations
    reached = c[:, :-1] >= rank[:, None]
    b = np.where(reached.any(axis=1), reached.argmax(axis=1), bounds.size - 1)
    rows = np.arange(c.shape[0])
    below = np.maximum(b - 1, 0)
    start = np.where(b > 0, bounds[below], 0.0)
    end = bounds[np.minimum(b, bounds.size - 2)]
    count = np.where(b > 0, c[rows, b] - c[rows, below], c[rows, b])
    rank = np.where(b > 0, rank - c[rows, below], rank)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = start + (end - start) * (rank / count)
    value = np.where((b == 0) & (bounds[0] <= 0), bounds[0], value)
    value = np.where(b == bounds.size - 1, bounds[-2], value)
    out[whole] = np.where(observations == 0, np.nan, value)
    return out


# -- for: pending -> firing -> resolved ----------------------------------------------------------


@dataclass
class _Active:
    labels: Labels
    active_ms: int  # first evaluation that returned it
    value: float  # its latest value
    fired_ms: int | None = None


@dataclass
class AlertState:
    """One alerting rule's alerts between evaluations: which are pending, which fire."""

    alertname: str
    for_ms: int  # the rule's ``for:``, in milliseconds (0: fires at once)
    static: Mapping[str, str] = field(default_factory=dict)  # the rule's static labels
    active: dict[Labels, _Active] = field(default_factory=dict)

    def alert_labels(self, sample: Labels) -> Labels:
        """An alert's label set: the sample's labels, the rule's labels and ``alertname``."""
        return tuple(sorted({**dict(sample), **self.static, "alertname": self.alertname}.items()))

    def step(self, samples: Mapping[Labels, float], *, now_ms: int, t_s: float) -> list[AlertEvent]:
        """Evaluate the rule's result at ``now_ms``; the alerts that resolved, then those that
        fired (each in label order)."""
        seen: set[Labels] = set()
        for sample, value in sorted(samples.items()):
            key = self.alert_labels(sample)
            seen.add(key)
            alert = self.active.get(key)
            if alert is None:
                self.active[key] = _Active(key, now_ms, value)
            else:
                alert.value = value
        out: list[AlertEvent] = []
        for key in sorted(set(self.active) - seen):
            gone = self.active.pop(key)
            if gone.fired_ms is not None:
                out.append(AlertEvent(t_s, self.alertname, "resolved", key, gone.value))
        for key in sorted(seen):
            alert = self.active[key]
            if alert.fired_ms is None and now_ms - alert.active_ms >= self.for_ms:
                alert.fired_ms = now_ms
                out.append(AlertEvent(t_s, self.alertname, "firing", key, alert.value))
        return out

    def firing(self) -> list[AlertEvent]:
        """Every alert firing now: when it fired, its labels, its latest value."""
        return [
            AlertEvent(a.fired_ms / MS, self.alertname, "firing", a.labels, a.value)
            for a in sorted(self.active.values(), key=lambda a: a.labels)
            if a.fired_ms is not None
        ]

    def pending(self) -> list[AlertEvent]:
        """Every alert waiting out its ``for:``: since when, its labels, its latest value."""
        return [
            AlertEvent(a.active_ms / MS, self.alertname, "pending", a.labels, a.value)
            for a in sorted(self.active.values(), key=lambda a: a.labels)
            if a.fired_ms is None
        ]

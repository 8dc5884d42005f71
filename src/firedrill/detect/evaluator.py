"""In-process evaluation of the SLO burn-rate alerts, on the twin's simulated clock.

It computes exactly what the generated rules ask Prometheus to compute, so an alert that fires
here fires there at the same evaluation (``tests/detect/test_promtool_equivalence.py`` proves it
with the real rule engine): ``rate()`` with Prometheus 2.x's extrapolation (left-closed range,
extrapolation to the range edges below 1.1 average intervals, the zero-crossing limit for
counters), ratios of sums by (cell, region), ``and`` on equal label sets.

Incremental: each evaluation reads one instant sample per counter through the ``Signals`` port and
appends it to a per-objective history, so a step costs O(windows × cells), independent of how
long the run has been going.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from firedrill.detect.rules import alert_name
from firedrill.detect.slo import BurnTier, Objective, SloSpec, duration_s
from firedrill.model.series import Labels, labels_of
from firedrill.ports import Signals

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class AlertEvent:
    """An alert changing state at an evaluation."""

    at_s: float
    alertname: str
    state: str  # firing | resolved
    labels: Labels
    value: float

    def label(self, key: str) -> str:
        return dict(self.labels).get(key, "")


def prom_increase(
    first: F64,
    last: F64,
    t_first: F64 | float,
    t_last: float,
    n: npt.NDArray[np.int64] | int,
    start: F64 | float,
    end: float,
) -> F64:
    """Prometheus 2.x ``increase()`` of counters over [start, end] from first/last samples.

    Broadcasts: ``first`` may be [windows, cells] with ``t_first``, ``n`` and ``start`` given
    per window as [windows, 1]. Fewer than two samples gives NaN, as Prometheus gives no value.
    """
    t_first_a = np.asarray(t_first, dtype=np.float64)
    n_a = np.asarray(n)
    delta = last - first
    sampled = t_last - t_first_a
    with np.errstate(divide="ignore", invalid="ignore"):
        avg = sampled / (n_a - 1)
        to_start = np.broadcast_to(t_first_a - np.asarray(start), delta.shape)
        to_zero = np.where(delta > 0, sampled * first / delta, np.inf)
        to_start = np.where((delta > 0) & (first >= 0), np.minimum(to_start, to_zero), to_start)
        to_end = end - t_last
        threshold = avg * 1.1
        span = sampled + np.where(to_start < threshold, to_start, avg / 2)
        span = span + np.where(to_end < threshold, to_end, avg / 2)
        result = delta * (span / sampled)
    out: F64 = np.where((n_a >= 2) & (sampled > 0), result, np.nan)
    return out


@dataclass
class _History:
    """Evaluation times and the two counters per cell, in arrays that grow by doubling."""

    n: int = 0
    t: F64 = field(default_factory=lambda: np.zeros(256))
    good: F64 = field(default_factory=lambda: np.zeros((256, 0)))  # numerator counter per cell
    total: F64 = field(default_factory=lambda: np.zeros((256, 0)))  # denominator counter per cell

    def append(self, t: float, good: F64, total: F64) -> None:
        if self.n and self.t[self.n - 1] == t:
            self.n -= 1  # re-evaluated at the same instant: the newer sample replaces it
        width = max(good.size, self.good.shape[1])
        if self.n == self.t.size or width > self.good.shape[1]:
            cap = self.t.size * 2 if self.n == self.t.size else self.t.size
            t_new = np.zeros(cap)
            t_new[: self.n] = self.t[: self.n]
            g_new = np.zeros((cap, width))
            n_new = np.zeros((cap, width))
            g_new[: self.n, : self.good.shape[1]] = self.good[: self.n]
            n_new[: self.n, : self.total.shape[1]] = self.total[: self.n]
            self.t, self.good, self.total = t_new, g_new, n_new
        self.t[self.n] = t
        self.good[self.n, : good.size] = good
        self.total[self.n, : total.size] = total
        self.n += 1

    def first_in(self, start: float) -> int:
        """Index of the first sample at or after ``start`` (Prometheus 2.x: left-closed)."""
        return int(np.searchsorted(self.t[: self.n], start - 1e-9, side="left"))


@dataclass
class _Selection:
    name: str
    matchers: dict[str, str]
    group: npt.NDArray[np.int64] | None = None  # series index -> cell index


class BurnRateEvaluator:
    """Evaluates every objective's burn tiers per cell at each call of ``evaluate``."""

    def __init__(self, spec: SloSpec, signals: Signals) -> None:
        self.spec = spec
        self.signals = signals
        self.cells: list[tuple[str, str]] = []  # (cell, region), discovered from the series
        self._cell_index: dict[tuple[str, str], int] = {}
        self.history = {o.name: _History() for o in spec.objectives}
        self.firing: dict[tuple[str, str, str], bool] = {}  # (objective, tier, cell)
        self.events: list[AlertEvent] = []
        self._sel: dict[str, tuple[_Selection, _Selection, _Selection | None]] = {}
        for o in spec.objectives:
            le = repr(float(o.ttft_threshold_s))
            bucket = _Selection(
                "vllm:time_to_first_token_seconds_bucket", {"model_name": o.model, "le": le}
            )
            if o.sli == "ttft":
                count = _Selection(
                    "vllm:time_to_first_token_seconds_count", {"model_name": o.model}
                )
                self._sel[o.name] = (bucket, count, None)
            elif o.sli == "availability":
                bad = _Selection("http_requests_total", {"model_name": o.model, "status": "5xx"})
                ok = _Selection("http_requests_total", {"model_name": o.model, "status": "2xx"})
                self._sel[o.name] = (bad, ok, bad)
            else:
                ok = _Selection("http_requests_total", {"model_name": o.model, "status": "2xx"})
                bad = _Selection("http_requests_total", {"model_name": o.model, "status": "5xx"})
                self._sel[o.name] = (bucket, ok, bad)
        self._windows = {w: duration_s(w) for w in spec.windows()}
        self._window_s = np.array(list(self._windows.values()))

    def _read(self, sel: _Selection) -> tuple[float, F64]:
        t, labels, values = self.signals.instant(sel.name, sel.matchers)
        if sel.group is None or sel.group.size != len(labels):
            idx = []
            for lab in labels:
                d = dict(lab)
                key = (d.get("cell", ""), d.get("region", ""))
                if key not in self._cell_index:
                    self._cell_index[key] = len(self.cells)
                    self.cells.append(key)
                idx.append(self._cell_index[key])
            sel.group = np.array(idx, dtype=np.int64)
        out = np.zeros(len(self.cells))
        np.add.at(out, sel.group, np.nan_to_num(values))
        return t, out

    @property
    def started(self) -> bool:
        return any(h.n for h in self.history.values())

    def evaluate(self) -> list[AlertEvent]:
        """Read the latest samples and evaluate every alert; return the state changes."""
        changes: list[AlertEvent] = []
        for o in self.spec.objectives:
            a, b, c = self._sel[o.name]
            t, va = self._read(a)
            _, vb = self._read(b)
            h = self.history[o.name]
            if o.sli == "ttft":
                good, total = va, vb
            elif o.sli == "availability":
                good, total = va, va + vb  # "good" holds the bad count here: ratio is bad/total
            else:
                assert c is not None
                _, vc = self._read(c)
                good, total = va, vb + vc
            h.append(t, good, total)
            changes.extend(self._evaluate_objective(o, h))
        self.events.extend(changes)
        return changes

    def _increase(self, h: _History, series: F64, windows_s: F64) -> F64:
        """Increase per window (rows) and cell (columns) at the latest evaluation."""
        last = h.n - 1
        t = float(h.t[last])
        start = t - windows_s
        i = np.searchsorted(h.t[: h.n], start - 1e-9, side="left")
        return prom_increase(
            series[i],
            series[last],
            h.t[i][:, None],
            t,
            (last - i + 1)[:, None],
            start[:, None],
            t,
        )

    def _ratios(self, o: Objective, h: _History, windows_s: F64) -> F64:
        inc_g = self._increase(h, h.good, windows_s)
        inc_t = self._increase(h, h.total, windows_s)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = inc_g / inc_t
        out: F64 = ratio if o.sli == "availability" else 1.0 - ratio
        return out

    def error_ratio(self, o: Objective, window_s: float) -> F64:
        """The SLI error ratio per cell over ``window_s`` at the latest evaluation."""
        out: F64 = self._ratios(o, self.history[o.name], np.array([window_s]))[0]
        return out

    def events_per_hour(self, o: Objective) -> F64:
        """Events of the SLI's denominator over the last hour (the min-events guard)."""
        h = self.history[o.name]
        out: F64 = self._increase(h, h.total, np.array([3600.0]))[0]
        return out

    def _evaluate_objective(self, o: Objective, h: _History) -> list[AlertEvent]:
        all_r = self._ratios(o, h, self._window_s)
        ratios = {w: all_r[i] for i, w in enumerate(self._windows)}
        t = float(h.t[h.n - 1])
        events = self.events_per_hour(o)
        out: list[AlertEvent] = []
        for tier in self.spec.tiers:
            threshold = tier.factor * o.budget
            long_r, short_r = ratios[tier.long], ratios[tier.short]
            cond = (long_r > threshold) & (short_r > threshold) & (events >= o.min_events_per_hour)
            for ci, (cell, region) in enumerate(self.cells):
                key = (o.name, tier.tier, cell)
                now = bool(cond[ci])
                was = self.firing.get(key, False)
                if now != was:
                    self.firing[key] = now
                    out.append(
                        AlertEvent(
                            at_s=t,
                            alertname=alert_name(o, tier),
                            state="firing" if now else "resolved",
                            labels=self._labels(o, tier, cell, region),
                            value=float(long_r[ci]),
                        )
                    )
        return out

    def _labels(self, o: Objective, tier: BurnTier, cell: str, region: str) -> Labels:
        return labels_of(
            alertname=alert_name(o, tier),
            severity=tier.severity,
            team="inference",
            burn_tier=tier.tier,
            slo=o.name,
            model_name=o.model,
            product=o.product,
            cell=cell,
            region=region,
        )

    def active(self) -> Sequence[tuple[str, str, str]]:
        """(objective, tier, cell) of every alert firing now."""
        return sorted(k for k, v in self.firing.items() if v)

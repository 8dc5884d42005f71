"""In-process evaluation of ``ModelQualityBurn`` (``detect/quality.py``) on the twin's clock.

It computes what the generated rules ask Prometheus 2.x to compute, as ``detect/causes.py`` does
for the cause tickets: ``increase()`` with Prometheus's extrapolation over the samples in
[t - window, t] (both ends included), ``sum by (cell, region, model_name, digest)`` over the
series that have a value, the ratio, the comparison with the threshold as the rule text writes
it, ``and`` on equal label sets, and ``for:`` (``promql.AlertState``: pending from the first
evaluation that returns an alert's labels, firing once returned at every evaluation for
``hold``, resolved at the first that does not return it).

A digest's counter series is read as 0 before it first appears, as the twin exports it (a
counter published from start-up); the promtool test feeds the same series to the real engine.

Incremental: it keeps one row per evaluation over the window (plus one interval) and one column
per series, so a step costs O(series × window / interval).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from firedrill.detect.promql import AlertEvent, AlertState, prom_increase
from firedrill.detect.quality import ALERT, BY, SERIES, QualityAlerting, tier_labels
from firedrill.detect.slo import duration_s
from firedrill.model.series import Labels
from firedrill.ports import Signals

F64 = npt.NDArray[np.float64]

_MS = 1000


class QualityEvaluator:
    """Evaluates every ``ModelQualityBurn`` tier at each call of ``evaluate``."""

    def __init__(self, spec: QualityAlerting, signals: Signals) -> None:
        self.spec = spec
        self.signals = signals
        self.events: list[AlertEvent] = []
        self.evaluations = 0
        self._window_ms = round(duration_s(spec.window) * _MS)
        self._columns: dict[Labels, int] = {}
        self._labels: list[Labels] = []
        self._t_ms: list[int] = []
        self._rows: list[F64] = []
        self._now_ms = -1
        self._thresholds = [spec.fail_ratio_threshold(t) for t in spec.tiers]
        hold_ms = round(duration_s(spec.hold) * _MS)
        self._states = [AlertState(ALERT, hold_ms, tier_labels(spec, t)) for t in spec.tiers]

    @property
    def started(self) -> bool:
        return self.evaluations > 0

    def evaluate(self) -> list[AlertEvent]:
        """Read the latest golden-set counters and evaluate every tier; return state changes."""
        t_s, labels, values = self.signals.instant(SERIES)
        now_ms = round(t_s * _MS)
        if now_ms <= self._now_ms:
            return []
        self._now_ms = now_ms
        for lab in labels:
            if lab not in self._columns:
                self._columns[lab] = len(self._labels)
                self._labels.append(lab)
        row = np.zeros(len(self._labels))
        idx = np.array([self._columns[lab] for lab in labels], dtype=np.int64)
        if idx.size:
            row[idx] = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=0.0)
        self._t_ms.append(now_ms)
        self._rows.append(row)
        keep_from = now_ms - self._window_ms - 60 * _MS
        while len(self._t_ms) > 2 and self._t_ms[1] < keep_from:
            self._t_ms.pop(0)
            self._rows.pop(0)
        self.evaluations += 1
        fails, probes = self._sums()
        out: list[AlertEvent] = []
        for ti, state in enumerate(self._states):
            out += state.step(self._matches(ti, fails, probes), now_ms=now_ms, t_s=t_s)
        self.events.extend(out)
        return out

    # -- the expression ------------------------------------------------------------------------
    def _sums(self) -> tuple[dict[Labels, float], dict[Labels, float]]:
        """``sum by (...) (increase(fail[w]))`` and ``sum by (...) (increase(all[w]))``."""
        end_ms = self._now_ms
        start_ms = end_ms - self._window_ms
        t = np.array(self._t_ms)
        first = int(np.searchsorted(t, start_ms, side="left"))
        n = len(t) - first
        fails: dict[Labels, float] = {}
        probes: dict[Labels, float] = {}
        if n < 2:
            return fails, probes
        width = len(self._labels)
        a = self._rows[first]
        b = self._rows[-1]
        a = np.concatenate([a, np.zeros(width - a.size)])  # absent before: 0
        inc = prom_increase(a, b, t[first] / _MS, t[-1] / _MS, n, start_ms / _MS, end_ms / _MS)
        for lab, v in sorted(zip(self._labels, inc.tolist(), strict=True)):
            if not np.isfinite(v):
                continue
            d = dict(lab)
            key = tuple((k, d.get(k, "")) for k in sorted(BY))
            probes[key] = probes.get(key, 0.0) + v
            if d.get("result") == "fail":
                fails[key] = fails.get(key, 0.0) + v
        return fails, probes

    def _matches(
        self, ti: int, fails: dict[Labels, float], probes: dict[Labels, float]
    ) -> dict[Labels, float]:
        thr = self._thresholds[ti]
        out: dict[Labels, float] = {}
        for key, f in fails.items():
            total = probes.get(key, 0.0)
            ratio = f / total if total > 0 else float("nan")
            if ratio > thr and total >= self.spec.min_probes:
                out[key] = ratio
        return out

    def firing(self) -> list[AlertEvent]:
        """Every quality alert firing now: when it fired, its labels, its latest value."""
        return [e for state in self._states for e in state.firing()]

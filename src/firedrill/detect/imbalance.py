"""In-process evaluation of ``PrefillDecodeImbalance`` (``detect/disagg.py``) on the twin's clock.

Mirrors the rule: ``max by (cell, model_name, region)`` of each role's utilisation, the saturated
role above ``saturated`` and the other below ``idle`` (``and`` on equal label sets, the alert's
value the saturated role's utilisation), held for ``hold`` before it fires; resolved at the
first evaluation that does not return it. A fleet with no disaggregated model has no
``firedrill_pd_utilization`` series and costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from firedrill.detect.disagg import ALERT, BY, ROLE_PAIRS, SERIES, PdImbalanceAlerting
from firedrill.detect.evaluator import AlertEvent
from firedrill.detect.slo import duration_s
from firedrill.model.series import Labels
from firedrill.ports import Signals

_MS = 1000


@dataclass
class _Alert:
    labels: Labels
    active_ms: int
    value: float
    fired_ms: int | None = None


class PdImbalanceEvaluator:
    """Evaluates both ``PrefillDecodeImbalance`` rules at each call of ``evaluate``."""

    def __init__(self, spec: PdImbalanceAlerting, signals: Signals) -> None:
        self.spec = spec
        self.signals = signals
        self.events: list[AlertEvent] = []
        self._hold_ms = round(duration_s(spec.hold) * _MS)
        self._now_ms = -1
        self._active: dict[str, dict[Labels, _Alert]] = {"prefill": {}, "decode": {}}
        self._enabled = SERIES in signals.series_names()

    def evaluate(self) -> list[AlertEvent]:
        """Read the latest utilisation per role and evaluate both rules; return state changes."""
        if not self._enabled:
            return []
        by_role: dict[str, dict[Labels, float]] = {}
        t_s = 0.0
        for role in ("prefill", "decode"):
            t_s, labels, values = self.signals.instant(SERIES, {"role": role})
            out: dict[Labels, float] = {}
            for lab, v in zip(labels, values.tolist(), strict=True):
                d = dict(lab)
                key = tuple((k, d.get(k, "")) for k in BY)
                if key not in out or out[key] < v:
                    out[key] = v
            by_role[role] = out
        now_ms = round(t_s * _MS)
        if now_ms <= self._now_ms:
            return []
        self._now_ms = now_ms
        events: list[AlertEvent] = []
        for hot, cold in ROLE_PAIRS:
            samples = {
                k: v
                for k, v in by_role[hot].items()
                if v > self.spec.saturated and by_role[cold].get(k, 1.0) < self.spec.idle
            }
            events += self._step(hot, samples, t_s)
        self.events.extend(events)
        return events

    def _step(self, hot: str, samples: dict[Labels, float], t_s: float) -> list[AlertEvent]:
        active = self._active[hot]
        static = {"severity": "ticket", "team": "inference", "saturated": hot, "alertname": ALERT}
        seen: set[Labels] = set()
        for sample, value in sorted(samples.items()):
            key = tuple(sorted({**dict(sample), **static}.items()))
            seen.add(key)
            if key in active:
                active[key].value = value
            else:
                active[key] = _Alert(key, self._now_ms, value)
        out: list[AlertEvent] = []
        for key in sorted(set(active) - seen):
            gone = active.pop(key)
            if gone.fired_ms is not None:
                out.append(AlertEvent(t_s, ALERT, "resolved", key, gone.value))
        for key in sorted(seen):
            alert = active[key]
            if alert.fired_ms is None and self._now_ms - alert.active_ms >= self._hold_ms:
                alert.fired_ms = self._now_ms
                out.append(AlertEvent(t_s, ALERT, "firing", key, alert.value))
        return out

"""In-process evaluation of ``PrefillDecodeImbalance`` (``detect/disagg.py``) on the twin's clock.

Mirrors the rule: ``max by (cell, model_name, region)`` of each role's utilisation, the saturated
role above ``saturated`` and the other below ``idle`` (``and`` on equal label sets, the alert's
value the saturated role's utilisation), held for ``hold`` before it fires; resolved at the
first evaluation that does not return it (``promql.AlertState``). A fleet with no disaggregated
model has no ``firedrill_pd_utilization`` series and costs nothing.
"""

from __future__ import annotations

from firedrill.detect.disagg import ALERT, BY, ROLE_PAIRS, SERIES, PdImbalanceAlerting
from firedrill.detect.promql import AlertEvent, AlertState
from firedrill.detect.slo import duration_s
from firedrill.model.series import Labels
from firedrill.ports import Signals

_MS = 1000


class PdImbalanceEvaluator:
    """Evaluates both ``PrefillDecodeImbalance`` rules at each call of ``evaluate``."""

    def __init__(self, spec: PdImbalanceAlerting, signals: Signals) -> None:
        self.spec = spec
        self.signals = signals
        self.events: list[AlertEvent] = []
        hold_ms = round(duration_s(spec.hold) * _MS)
        self._now_ms = -1
        self._states = {
            hot: AlertState(
                ALERT, hold_ms, {"severity": "ticket", "team": "inference", "saturated": hot}
            )
            for hot in ("prefill", "decode")
        }
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
            events += self._states[hot].step(samples, now_ms=now_ms, t_s=t_s)
        self.events.extend(events)
        return events

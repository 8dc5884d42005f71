"""Stop conditions: alarms that abort a drill on the simulated clock, without a human.

Each condition is evaluated at every evaluation step, from the same readings the rest of the
drill uses (``Observer``, the alerts firing now, the world's series for PromQL-subset
expressions). A condition with a ``hold`` must stay true that long before it fires. The first
one that fires aborts the drill: the runner reverts every injection through its inverse.

The same conditions are checked before T0: a drill whose stop condition is already true would
abort at once, so it is refused instead (``already_true``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from firedrill.drill import expr
from firedrill.drill.observe import Observer
from firedrill.drill.spec import (
    AlertStop,
    ErrorRatioStop,
    ExprStop,
    KvUsageStop,
    Paid5xxStop,
    StopCondition,
    TtftStop,
)
from firedrill.model.series import Labels
from firedrill.ports import Signals

MIN_REQUESTS = 100  # a ratio over fewer requests is noise, not a reason to abort


@dataclass
class StopState:
    """One stop condition's state during a run."""

    condition: StopCondition
    true_since_s: float | None = None
    fired_at_s: float | None = None
    value: float | None = None  # the reading when it fired (or last evaluated)

    @property
    def name(self) -> str:
        return self.condition.name

    def to_json(self) -> dict[str, object]:
        c = self.condition
        return {
            "name": c.name,
            "kind": c.kind,
            "threshold": _threshold(c),
            "fired": self.fired_at_s is not None,
            "at_s": self.fired_at_s,
            "value": None if self.value is None or math.isnan(self.value) else self.value,
        }


def _threshold(c: StopCondition) -> float | None:
    match c:
        case Paid5xxStop(threshold=t) | ErrorRatioStop(threshold=t) | KvUsageStop(threshold=t):
            return t
        case TtftStop(threshold_s=t):
            return t
    return None


class StopConditions:
    """Evaluates a drill's stop conditions; ``check`` returns the one that fired, if any."""

    def __init__(
        self,
        conditions: Sequence[StopCondition],
        observer: Observer,
        signals: Signals,
        now_s: Callable[[], float],
        firing: Callable[[], Sequence[Labels]],
    ) -> None:
        self.states = [StopState(c) for c in conditions]
        self.observer = observer
        self.signals = signals
        self.now_s = now_s
        self.firing = firing
        self._parsed = {
            i: expr.parse(c.expr) for i, c in enumerate(conditions) if isinstance(c, ExprStop)
        }

    def reading(self, i: int) -> tuple[bool, float]:
        """Whether condition ``i`` is true now, and the value it read."""
        c = self.states[i].condition
        obs = self.observer
        match c:
            case AlertStop(alertname=name, matchers=matchers):
                for labels in self.firing():
                    d = dict(labels)
                    if d.get("alertname") == name and all(
                        d.get(k) == v for k, v in matchers.items()
                    ):
                        return True, 1.0
                return False, 0.0
            case (
                Paid5xxStop(threshold=t, window_s=w, region=r)
                | ErrorRatioStop(threshold=t, window_s=w, region=r)
            ):
                ratio = obs.error_ratio(r, w)
                enough = (
                    sum(obs.requests(x, w) for x in obs.regions)
                    if r is None
                    else obs.requests(r, w)
                ) >= MIN_REQUESTS
                return (enough and not math.isnan(ratio) and ratio > t), ratio
            case TtftStop(threshold_s=t, region=r, window_s=w):
                p99 = obs.ttft_p99(r, w)
                return (not math.isnan(p99) and p99 > t), p99
            case KvUsageStop(threshold=t, region=r):
                last = obs.latest()
                kv = float(last.kv_max[obs.region_index(r)]) if last is not None else math.nan
                return (not math.isnan(kv) and kv > t), kv
            case ExprStop():
                value = expr.Evaluator(self.signals, self.now_s).evaluate(self._parsed[i])
                return expr.fires(value), expr.scalar_of(value)
        return False, math.nan

    def already_true(self) -> list[tuple[str, float]]:
        """Conditions true right now (the steady-state check before T0)."""
        return [
            (s.name, v) for i, s in enumerate(self.states) for hit, v in [self.reading(i)] if hit
        ]

    def check(self, now_s: float) -> StopState | None:
        """Evaluate every condition at ``now_s``; the first that fires (in spec order), if any."""
        fired: StopState | None = None
        for i, s in enumerate(self.states):
            if s.fired_at_s is not None:
                continue
            hit, value = self.reading(i)
            s.value = value
            if not hit:
                s.true_since_s = None
                continue
            if s.true_since_s is None:
                s.true_since_s = now_s
            if now_s - s.true_since_s + 1e-9 >= s.condition.hold_s and fired is None:
                s.fired_at_s = now_s
                fired = s
        return fired

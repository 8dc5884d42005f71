"""RTO measured to users served within SLO, and its decomposition into five terms.

"Time until traffic moved" is not the RTO; the RTO ends when users are *served within SLO*:
the model's error ratio back within the availability SLO and every region serving it back under
the TTFT threshold, over a window, held for ``slo_hold``. The terms are the segments of the path
from T0 (the fault) to that moment, so they add up to the measured RTO:

* **detect**: T0 → the first page for the target model in the target region;
* **decide**: that page → the first lever applied (modelled decision and approval time);
* **shift**: the first lever → the last traffic-shift step;
* **hydrate**: the last shift step → the survivors have the replicas they scaled out for (only the
  part of the scale-out that users waited on: capacity that arrives after users are served
  within SLO is not on the critical path);
* **time_to_slo**: the rest, until users are served within SLO and it holds.

A hydrate term that alone exceeds the budget is a *posture* problem (pilot light pretending to be
warm standby), not a tuning problem.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from firedrill.drill.observe import Observer

TERMS = ("detect_s", "decide_s", "shift_s", "hydrate_s", "time_to_slo_s")


@dataclass
class _Streak:
    start_s: float | None = None
    achieved_s: float | None = None


@dataclass
class SloTracker:
    """When users (all, or one region's) are served within SLO, held for ``hold_s``.

    ``update(now, floor)`` is called every step; ``floor`` is the earliest the recovery can count
    from (the last shift step of a failover, or T0), None while it cannot count yet. A clean
    window ending at ``t`` means users were served within SLO since ``t - window``.
    """

    observer: Observer
    regions: Sequence[str]
    ttft_threshold_s: float
    allowed_error_ratio: float
    window_s: float = 60.0
    hold_s: float = 120.0
    streaks: dict[str | None, _Streak] = field(default_factory=dict)

    def _clean(self, region: str | None) -> bool:
        obs = self.observer
        regions = list(self.regions) if region is None else [region]
        err = obs.error_ratio(region, self.window_s)
        if math.isnan(err) or err > self.allowed_error_ratio:
            return False
        served = False
        for r in regions:
            if obs.requests(r, self.window_s) <= 0:
                continue
            p99 = obs.ttft_p99(r, self.window_s)
            if math.isnan(p99) or p99 > self.ttft_threshold_s:
                return False
            served = True
        return served

    def update(self, now_s: float, floor_s: float | None, keys: Sequence[str | None]) -> None:
        for key in keys:
            s = self.streaks.setdefault(key, _Streak())
            if s.achieved_s is not None:
                continue
            if not self._clean(key):
                s.start_s = None
                continue
            if s.start_s is None:
                s.start_s = now_s
            if floor_s is not None and now_s - s.start_s + 1e-9 >= self.hold_s:
                s.achieved_s = max(s.start_s - self.window_s, floor_s)

    def achieved(self, key: str | None) -> float | None:
        s = self.streaks.get(key)
        return None if s is None else s.achieved_s


@dataclass(frozen=True)
class RtoMarks:
    """The moments the terms are cut at (seconds since the drill started)."""

    t0_s: float
    page_s: float | None
    first_lever_s: float | None
    last_shift_s: float | None
    scale_out_s: float | None
    hydrated_s: float | None
    users_s: float | None


def terms(m: RtoMarks) -> dict[str, float | None]:
    """The five terms; they add up to ``users_s - t0_s`` when a failover ran end to end."""
    out: dict[str, float | None] = dict.fromkeys(TERMS)
    detect_end = m.page_s
    if detect_end is not None:
        out["detect_s"] = max(detect_end - m.t0_s, 0.0)
    if m.first_lever_s is not None and m.page_s is not None:
        out["decide_s"] = max(m.first_lever_s - m.page_s, 0.0)
    if m.last_shift_s is not None and m.first_lever_s is not None:
        out["shift_s"] = max(m.last_shift_s - m.first_lever_s, 0.0)
    if m.users_s is None:
        return out
    base = m.last_shift_s if m.last_shift_s is not None else m.t0_s
    hydrate = 0.0
    if m.scale_out_s is not None and m.scale_out_s < m.users_s:
        end = min(m.hydrated_s if m.hydrated_s is not None else math.inf, m.users_s)
        hydrate = max(end - max(base, m.scale_out_s), 0.0)
    out["hydrate_s"] = hydrate
    out["time_to_slo_s"] = max(m.users_s - base - hydrate, 0.0)
    return out


def measured_s(m: RtoMarks) -> float | None:
    return None if m.users_s is None else max(m.users_s - m.t0_s, 0.0)


@dataclass
class HydrateWatch:
    """Scale-out start and completion in a set of regions (the survivors, or a storm's region)."""

    observer: Observer
    regions: Sequence[str]
    after_s: float
    scale_out_s: float | None = None
    hydrated_s: float | None = None
    first_ready_s: float | None = None
    _desired0: float | None = None
    _ready0: float | None = None

    def update(self, now_s: float) -> None:
        s = self.observer.latest()
        if s is None or now_s < self.after_s:
            return
        idx = [self.observer.region_index(r) for r in self.regions]
        desired = float(sum(s.desired[i] for i in idx))
        ready = float(sum(s.ready[i] for i in idx))
        if self._desired0 is None:
            self._desired0, self._ready0 = desired, ready
            return
        if self.scale_out_s is None and desired > self._desired0:
            self.scale_out_s = now_s
        if self.scale_out_s is None:
            self._desired0 = min(self._desired0, desired)
            self._ready0 = ready
            return
        if self.first_ready_s is None and self._ready0 is not None and ready > self._ready0:
            self.first_ready_s = now_s
        if self.hydrated_s is None and ready >= desired:
            self.hydrated_s = now_s

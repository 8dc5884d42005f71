"""The Clock port on real time, for a control plane that watches a live fleet.

The core never reads time itself; on the embedded twin the clock is simulated and steps. On a
live fleet it is one of these:

- ``WallClock``: seconds since ``epoch_unix_s`` (0 by default: Unix seconds, the time base
  Prometheus and Alertmanager speak); ``advance`` sleeps.
- ``ScaledClock``: the time of a fleet whose seconds run ``speed`` times faster than the wall's
  (``firedrill twin serve --speed S``), through a ``TimeMap``. A run against a twin served at
  60x speaks the twin's seconds, so its timeline, RTO terms and windows read the same as the
  embedded run's; ``advance(s)`` sleeps ``s / speed`` wall seconds, and time stands still for
  the control plane between two ``advance`` calls, as on the twin.

``TimeMap`` is the one place that converts: it is anchored once, from a reading of the fleet's
own time bracketed by two wall readings (``TimeMap.anchored``), and is linear afterwards, which
is exactly how ``twin serve`` runs (its time is ``(monotonic - start) * speed``, floored to its
step). The anchor's error is half the reading's round trip times ``speed`` plus one twin step; a
map read afresh on every ``now_s`` would add that round trip to every call and make the run's
own clock jitter, so it is read once and checked against the fleet later (``drift_s``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ScaledClock", "TimeMap", "WallClock"]


class WallClock:
    """Real time since ``epoch_unix_s``; ``advance`` sleeps."""

    def __init__(
        self,
        epoch_unix_s: float = 0.0,
        *,
        time_fn: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.epoch_unix_s = epoch_unix_s
        self._time = time_fn
        self._sleep = sleep

    def now_s(self) -> float:
        return self._time() - self.epoch_unix_s

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time only moves forward")
        if seconds > 0:
            self._sleep(seconds)


@dataclass(frozen=True)
class TimeMap:
    """Run seconds (the fleet's) and wall Unix seconds, on a fleet running ``speed`` x the wall.

    ``run_s(u) = anchor_run_s + (u - anchor_unix_s) * speed`` and its inverse ``unix_s``. With
    ``speed`` 1 and ``anchor_run_s`` 0 it is ``WallClock``'s mapping.
    """

    anchor_unix_s: float
    anchor_run_s: float = 0.0
    speed: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.anchor_unix_s) and math.isfinite(self.anchor_run_s)):
            raise ValueError("a time map's anchor is finite")
        if not (math.isfinite(self.speed) and self.speed > 0):
            raise ValueError(f"a time map's speed is a finite number > 0, got {self.speed}")

    @classmethod
    def anchored(
        cls,
        read_run_s: Callable[[], float],
        *,
        speed: float = 1.0,
        time_fn: Callable[[], float] = time.time,
    ) -> tuple[TimeMap, float]:
        """Anchor on one reading of the fleet's time, taken between two wall readings; the map
        and the anchor's uncertainty in run seconds (half the round trip, scaled)."""
        before = time_fn()
        run_s = read_run_s()
        after = time_fn()
        if after < before:
            raise ValueError("the wall clock went backwards while the fleet's time was read")
        return cls((before + after) / 2.0, float(run_s), speed), (after - before) / 2.0 * speed

    @property
    def epoch_unix_s(self) -> float:
        """The Unix second at which the run's time was 0."""
        return self.unix_s(0.0)

    def run_s(self, unix_s: float) -> float:
        """The run's seconds at wall Unix second ``unix_s`` (a Prometheus sample's time)."""
        return self.anchor_run_s + (unix_s - self.anchor_unix_s) * self.speed

    def unix_s(self, run_s: float) -> float:
        """The wall Unix second at which the run reaches ``run_s``."""
        return self.anchor_unix_s + (run_s - self.anchor_run_s) / self.speed

    def wall_s(self, run_seconds: float) -> float:
        """Wall seconds that ``run_seconds`` of the run's time take."""
        return run_seconds / self.speed


class ScaledClock:
    """The Clock port on a fleet that runs ``time_map.speed`` times the wall clock.

    The control plane observes the fleet at instants, as it does the twin, whose time stands
    still between two ``advance`` calls: ``now_s`` is the instant ``advance`` moved to (or the
    clock started at, ``start_s``, default the fleet's now), to the millisecond, so every read of
    one evaluation step is of the same instant (a Prometheus is queried *at* it) and an alert
    evaluated during the step is not later than the step itself. ``live_s`` is the fleet's time.

    ``advance(s)`` sleeps until the wall reaches ``now_s + s`` (mapped) and moves ``now_s`` there.
    On a live fleet time passes by itself while the control plane works, so that instant may be
    past already: it then sleeps nothing rather than raising. A step that ran late by at most
    ``max_lag_s`` stays on its instant (reads of it are still of that instant; only what the step
    applies reaches the fleet late); later than that, ``now_s`` catches up with the fleet, so a
    control plane slower than the fleet never falls further behind. ``max_late_s`` says how late
    a step ran at worst.
    """

    def __init__(
        self,
        time_map: TimeMap,
        *,
        start_s: float | None = None,
        max_lag_s: float = 0.0,
        time_fn: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not (max_lag_s >= 0):
            raise ValueError("max_lag_s is >= 0")
        self.time_map = time_map
        self.max_lag_s = max_lag_s
        self._time = time_fn
        self._sleep = sleep
        self._now_s = _ms(self.live_s() if start_s is None else start_s)
        self.max_late_s = 0.0  # the furthest behind the fleet an ``advance`` found a step
        self.caught_up = 0  # steps that ran later than ``max_lag_s`` and caught up

    def live_s(self) -> float:
        """The fleet's time now (the wall clock's, mapped)."""
        return self.time_map.run_s(self._time())

    def now_s(self) -> float:
        return self._now_s

    def advance(self, seconds: float) -> None:
        if math.isnan(seconds):
            raise ValueError("cannot advance by NaN seconds")
        target = self._now_s + max(seconds, 0.0)
        late = self.live_s() - target
        if late < 0:
            self._sleep(self.time_map.wall_s(-late))
            self._now_s = _ms(target)
            return
        self.max_late_s = max(self.max_late_s, late)
        if late <= self.max_lag_s:
            self._now_s = _ms(target)
        else:
            self.caught_up += 1
            self._now_s = _ms(self.live_s())


def _ms(run_s: float) -> float:
    """An instant to the millisecond: the run's times read (and round) the same everywhere."""
    return round(run_s, 3)

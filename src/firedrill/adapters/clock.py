"""``WallClock``: the Clock port on real time, for a control plane that watches a real fleet.

The core never reads time itself; on the twin the clock is simulated and steps, in production
it is this one. ``now_s`` is seconds since ``epoch_unix_s`` (0 by default: Unix seconds, the
time base Prometheus and Alertmanager speak), and ``advance`` sleeps.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["WallClock"]


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

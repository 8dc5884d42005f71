"""The ``Clock`` port: time is injected, never read from the wall inside the control plane."""

from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    def now_s(self) -> float:
        """Seconds since the run's epoch."""
        ...

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` of time pass (the twin steps; a wall clock sleeps)."""
        ...

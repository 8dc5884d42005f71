"""The three ports the control plane talks to: Fleet, Signals, Clock.

The control plane (detection, remediation, incident command, drills) depends only on these
Protocols. The twin implements all three in-process on a simulated clock; the real adapters use
the Kubernetes API, the Prometheus HTTP API and the wall clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from firedrill.model.changes import ChangeEvent
from firedrill.model.operations import Operation
from firedrill.model.series import Labels, Series
from firedrill.model.state import CellView, NodeView


class Clock(Protocol):
    def now_s(self) -> float:
        """Seconds since the run's epoch."""
        ...

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` of time pass (the twin steps; a wall clock sleeps)."""
        ...


class Fleet(Protocol):
    def apply(self, op: Operation) -> Operation:
        """Apply a typed operation; return its inverse. Unknown targets raise."""
        ...

    def inverse_of(self, op: Operation) -> Operation:
        """The inverse ``op`` would have if applied now: validates targets, changes nothing."""
        ...

    def node(self, name: str) -> NodeView: ...

    def node_views(self, *, cell: str | None = None) -> Sequence[NodeView]: ...

    def pods_on(self, node: str, gpu: int | None = None) -> Sequence[str]:
        """Serving pods bound to a node (to one GPU of it when ``gpu`` is given)."""
        ...

    def burn_in_result(self, node: str) -> tuple[float, bool, str] | None:
        """The latest burn-in of a node: (finished at, passed, detail), or None."""
        ...

    def cells(self) -> Sequence[CellView]: ...

    def changes(self, *, since_s: float, cell: str | None = None) -> Sequence[ChangeEvent]: ...


class Signals(Protocol):
    def series_names(self) -> Sequence[str]: ...

    def query(
        self,
        name: str,
        matchers: Mapping[str, str] | None = None,
        *,
        start_s: float,
        end_s: float,
    ) -> Sequence[Series]:
        """Series with this name whose labels equal ``matchers``, sampled in [start, end]."""
        ...

    def instant(
        self, name: str, matchers: Mapping[str, str] | None = None
    ) -> tuple[float, Sequence[Labels], npt.NDArray[np.float64]]:
        """The latest sample of each matching series: (time, labels, values). Cheap to repeat."""
        ...

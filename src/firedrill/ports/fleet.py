"""The ``Fleet`` port (read state, apply typed operations) and ``FleetHistory`` (what happened).

``Fleet`` is what every lever and injection goes through: each operation's inverse is computed
from the fleet's state before it is applied. ``FleetHistory`` is the record a real fleet keeps in
its events (GPU faults from DCGM, pod lifecycle events): chain tracing reads it to say where a
detection-to-ready chain broke, on the twin and on a real fleet alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from firedrill.model.changes import ChangeEvent
from firedrill.model.operations import Operation
from firedrill.model.state import CellView, FaultRecord, NodeView, ReplicaTransition


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


class FleetHistory(Protocol):
    """Faults and replica lifecycle events since a time, oldest first."""

    def fault_events(self, *, since_s: float = 0.0) -> Sequence[FaultRecord]:
        """GPU and node faults (injected or not) at or after ``since_s``."""
        ...

    def replica_transitions(self, *, since_s: float = 0.0) -> Sequence[ReplicaTransition]:
        """Every replica state change at or after ``since_s``, creations included."""
        ...

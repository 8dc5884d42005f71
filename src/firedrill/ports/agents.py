"""The ``Sandboxes`` port: agent sandboxes' audit trail, as a security incident's evidence needs it.

An agent's tool calls and egress go through a proxy and a tool gateway that keep audit records;
containment quarantines pods instead of deleting them. Evidence bundles and the security checks
read those records here: from the twin's sandbox simulation, or from a real gateway's log store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from firedrill.model.sandbox import CompensationRecord, EgressRecord, ToolCallRecord


class Sandboxes(Protocol):
    def egress_records(
        self, *, start_s: float, end_s: float, tenant: str | None = None
    ) -> Sequence[EgressRecord]:
        """Egress-proxy audit records in [start_s, end_s], oldest first."""
        ...

    def tool_records(
        self, *, start_s: float, end_s: float, tenant: str | None = None
    ) -> Sequence[ToolCallRecord]:
        """Tool-gateway audit records in [start_s, end_s], oldest first."""
        ...

    def compensations(self, *, tenant: str | None = None) -> Sequence[CompensationRecord]: ...

    def complete_since_s(self) -> float:
        """Audit records from this time on are all still held (older ones may have rolled off)."""
        ...

    def warm_pool(self, tenant: str) -> int:
        """Warm sandboxes the tenant keeps ready."""
        ...

    def has_pod(self, pod: str) -> bool:
        """A sandbox pod that exists: its session runs, or it is retained under quarantine."""
        ...

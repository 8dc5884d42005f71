"""The worlds a drill and a scenario run against, as compositions of the narrow ports.

A drill runs on a ``DrillWorld``: the embedded twin (``firedrill.twin.world.TwinWorld``) and a
served one reached over HTTP (``firedrill.adapters.remote_twin.RemoteTwin``) both implement it,
which a typed module checks statically (``firedrill.adapters.worlds``). Which world a run gets is
chosen at the edge (the CLI and its use cases) and handed in as a ``WorldFactory``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

from firedrill.model.operations import Applied
from firedrill.model.release import RolloutView
from firedrill.model.sandbox import EgressRecord, ToolCallRecord
from firedrill.model.spec import FleetSpec
from firedrill.ports.agents import Sandboxes
from firedrill.ports.capacity import Capacity
from firedrill.ports.clock import Clock
from firedrill.ports.digests import Digests
from firedrill.ports.fleet import Fleet, FleetHistory
from firedrill.ports.signals import Signals
from firedrill.ports.training import Training

_T = TypeVar("_T")


class DrillWorld(Fleet, FleetHistory, Signals, Clock, Capacity, Digests, Protocol):
    """Everything a game day reads and acts through."""

    def settle(self) -> None:
        """Publish what was observed since the last scrape (the end of a run reads it).
        A world whose scrapes are real has nothing to do."""
        ...


WorldFactory = Callable[[FleetSpec, int, float], DrillWorld]
"""A fresh world for (fleet, seed, hours it will run): the embedded twin, typically."""


class ScenarioWorld(DrillWorld, Training, Protocol):
    """What a scenario (``firedrill respond``) reads beyond a drill: JobSets, the operations
    applied and their inverses, flags, quarantines and the agents' audit trail."""

    def rollout_view(self, model: str) -> RolloutView: ...

    def egress_records(
        self, *, start_s: float, end_s: float, tenant: str | None = None
    ) -> Sequence[EgressRecord]:
        """The egress proxy's audit records (the security runbook reads them off the fleet)."""
        ...

    def tool_records(
        self, *, start_s: float, end_s: float, tenant: str | None = None
    ) -> Sequence[ToolCallRecord]:
        """The tool gateway's audit records."""
        ...

    def operations(self) -> Sequence[Applied]:
        """Every operation applied, in order, with its inverse (the fleet's change journal)."""
        ...

    def flags(self) -> Mapping[str, str]:
        """Feature flags and kill switches now set."""
        ...

    def quarantined_pods(self) -> frozenset[str]: ...

    def quarantine_actions(self) -> Mapping[str, int]:
        """Quarantine taints applied per node since the start (``gpu_quarantine_actions_total``)."""
        ...

    def fleet_spec(self) -> FleetSpec:
        """The fleet as specified (tenants' declared sandboxes, products)."""
        ...

    @property
    def sandbox(self) -> Sandboxes: ...


ScenarioWorldFactory = Callable[[FleetSpec, int, float], ScenarioWorld]
"""A fresh world for a scenario: (fleet, seed, hours it will run)."""


class WorldEnsemble(Protocol):
    """R worlds that advance together: one body per world, run in lockstep.

    ``run`` calls body ``k`` with world ``k``; a body's ``advance`` waits until every body still
    running has asked for time, then the worlds step together (the per-step cost is paid once
    for all of them). A body that returns drops out. Each world keeps its own random streams, so
    body ``k`` sees exactly what it would see alone on a fresh world of the same fleet and seed.
    Returns the bodies' results in order; an exception in a body stops the others and is raised.
    """

    def run(self, bodies: Sequence[Callable[[DrillWorld], _T]]) -> list[_T]: ...


EnsembleFactory = Callable[[Sequence[tuple[FleetSpec, int]], float], WorldEnsemble]
"""Fresh worlds for [(fleet, seed)] that run ``hours`` in lockstep (the twin's ensemble)."""

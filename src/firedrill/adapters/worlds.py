"""Where a run's world is chosen: the embedded twin, a twin served by ``twin serve``, or a live
fleet (control through the served twin's API, signals from a real Prometheus, the wall clock).

The control plane takes its world (or a factory for one) from the caller and never names an
implementation; this module is where the CLI and its use cases pick one. It is also the static
proof that all three implement the ports a game day needs: mypy checks the assignments in
``_satisfies``, so a method missing on either side (or with another signature) fails the type
check, not a drill against a served twin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from firedrill.adapters.remote_twin import RemoteTwin, load_token
from firedrill.ports import (
    DrillWorld,
    EnsembleFactory,
    ScenarioWorld,
    ScenarioWorldFactory,
    WorldEnsemble,
    WorldFactory,
)
from firedrill.twin.ensemble import TwinEnsemble, embedded_ensemble
from firedrill.twin.world import TwinWorld, embedded_world

if TYPE_CHECKING:  # httpx and the Prometheus client load only for a live run
    from firedrill.adapters.live_world import LiveWorld

__all__ = [
    "EMBEDDED",
    "EMBEDDED_ENSEMBLE",
    "EMBEDDED_SCENARIO",
    "live",
    "load_token",
    "remote",
    "remote_scenario",
]

EMBEDDED: WorldFactory = embedded_world
"""A fresh in-process twin per run (drills, sweeps, plans)."""

EMBEDDED_ENSEMBLE: EnsembleFactory = embedded_ensemble
"""Fresh in-process twins stepped in lockstep, one per run of a sweep's batch (``--batch``)."""

EMBEDDED_SCENARIO: ScenarioWorldFactory = embedded_world
"""A fresh in-process twin per scenario (``firedrill respond``)."""


def remote(url: str, token: str) -> DrillWorld:
    """The twin served at ``url`` (``twin serve``), driven with the control ``token``."""
    return RemoteTwin(url, token)


def remote_scenario(url: str, token: str) -> ScenarioWorld:
    """The twin served at ``url``, as a scenario's world (``firedrill respond --target``)."""
    return RemoteTwin(url, token)


def live(url: str, token: str, prometheus_url: str, *, speed: float = 1.0) -> LiveWorld:
    """A live fleet: controlled through the twin served at ``url``, watched through the
    Prometheus at ``prometheus_url``, on the wall clock scaled by the twin's ``speed``."""
    from firedrill.adapters.live_world import LiveWorld

    return LiveWorld.open(RemoteTwin(url, token), prometheus_url, speed=speed)


def _satisfies(
    embedded: TwinWorld, served: RemoteTwin, live_world: LiveWorld, ensemble: TwinEnsemble
) -> tuple[DrillWorld, DrillWorld, DrillWorld, ScenarioWorld, WorldEnsemble]:
    """The twins and the live fleet are drill worlds and scenario worlds (checked by mypy)."""
    drill_world: DrillWorld = embedded
    remote_world: DrillWorld = served
    on_live: DrillWorld = live_world
    scenario_world: ScenarioWorld = embedded
    assert scenario_world is drill_world
    remote_scenario: ScenarioWorld = served
    live_scenario: ScenarioWorld = live_world
    assert live_scenario is on_live
    lockstep: WorldEnsemble = ensemble
    return drill_world, remote_world, on_live, remote_scenario, lockstep

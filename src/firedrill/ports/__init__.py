"""The ports: the only door between the control plane and a world.

The control plane (detection, remediation, incident command, scenarios, drills, reports) depends
only on these Protocols, each narrow and semantic (``max_rps_per_replica(model, cell)``, not an
array laid out the way one simulator keeps it):

* ``Fleet`` (read state, apply typed operations) and ``FleetHistory`` (faults, replica events);
* ``Signals`` (series and instant vectors under the real exporters' names);
* ``Clock`` (now, let time pass);
* ``Capacity`` (saturation throughput, cold-cache penalty, refused nodes);
* ``Digests`` (published digests, what replicas run, unsigned admissions);
* ``Training`` (JobSets and their flight recorders);
* ``IntentJournal`` (inverses recorded before operations apply), ``JournalStore`` (where
  recovery finds interrupted drills' journals) and ``Executor`` (where a sweep's runs execute);
* ``Sandboxes`` (agents' audit trail);
* ``DrillWorld`` and ``ScenarioWorld``: what a game day and a scenario run against.

The twin implements the world ports in-process on a simulated clock (``firedrill.twin.world``);
the adapters implement them over HTTP (a served twin), and later the Kubernetes API, the
Prometheus HTTP API and the wall clock.
"""

from __future__ import annotations

from firedrill.ports.agents import Sandboxes
from firedrill.ports.capacity import Capacity
from firedrill.ports.clock import Clock
from firedrill.ports.digests import Digests
from firedrill.ports.executor import Executor, Task
from firedrill.ports.fleet import Fleet, FleetHistory
from firedrill.ports.journal import IntentJournal, JournalStore, ReopenedJournal
from firedrill.ports.signals import Signals
from firedrill.ports.training import JobSetLike, RankRecordLike, Training, TrainingReader
from firedrill.ports.world import (
    DrillWorld,
    EnsembleFactory,
    ScenarioWorld,
    ScenarioWorldFactory,
    WorldEnsemble,
    WorldFactory,
)

__all__ = [
    "Capacity",
    "Clock",
    "Digests",
    "DrillWorld",
    "EnsembleFactory",
    "Executor",
    "Fleet",
    "FleetHistory",
    "IntentJournal",
    "JobSetLike",
    "JournalStore",
    "RankRecordLike",
    "ReopenedJournal",
    "Sandboxes",
    "ScenarioWorld",
    "ScenarioWorldFactory",
    "Signals",
    "Task",
    "Training",
    "TrainingReader",
    "WorldEnsemble",
    "WorldFactory",
]

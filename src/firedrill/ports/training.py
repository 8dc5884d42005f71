"""The ``Training`` port: JobSets and their NCCL flight recorders, as the hang runbook reads them.

A hung training job does not crash: its ranks wait in a collective. The runbook names the hung
rank from the flight recorder's dump and acts on the JobSet (suspend, exclude the node, resume).
The twin simulates JobSets; a real fleet reads the JobSet API and the recorder's dumps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class RankRecordLike(Protocol):
    """One flight-recorder entry (the twin's ``RankRecord``, or a parsed dump)."""

    @property
    def rank(self) -> int: ...

    @property
    def node(self) -> str: ...

    @property
    def gpu(self) -> int: ...

    @property
    def last_collective(self) -> str: ...

    @property
    def seq(self) -> int: ...


class JobSetLike(Protocol):
    """What the runbook reads of a JobSet (the twin's ``JobSetView``)."""

    @property
    def name(self) -> str: ...

    @property
    def cell(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def nodes(self) -> tuple[str, ...]: ...

    @property
    def ranks(self) -> int: ...

    @property
    def step(self) -> float: ...

    @property
    def checkpoint_step(self) -> int: ...

    @property
    def restart_cost_s(self) -> float: ...

    @property
    def gpu_hours_stalled(self) -> float: ...

    @property
    def gpu_hours_redone(self) -> float: ...

    @property
    def gpu_hours_slowed(self) -> float: ...


class TrainingReader(Protocol):
    def jobset(self, name: str) -> JobSetLike:
        """The JobSet's current state; unknown names raise ``UnknownTargetError``."""
        ...


class Training(TrainingReader, Protocol):
    def flight_recorder(self, jobset: str) -> Sequence[RankRecordLike]:
        """The last collective each rank of the JobSet entered (the NCCL flight recorder dump)."""
        ...

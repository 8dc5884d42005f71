"""The ``Executor`` port: where the runs of a sweep execute (this process, a pool, a cluster).

A sweep hands the executor its job once and then ``(index, seed)`` tasks; the executor calls
``done`` as each run finishes and returns every outcome (in any order: the summary sorts them).
Processes, signals and cluster clients live in the adapters that implement it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

Task = tuple[int, int]  # (run index, seed)
JobT = TypeVar("JobT", contravariant=True)
OutcomeT = TypeVar("OutcomeT")


class Executor(Protocol[JobT, OutcomeT]):
    def run(
        self, job: JobT, tasks: Sequence[Task], done: Callable[[OutcomeT], None]
    ) -> list[OutcomeT]: ...

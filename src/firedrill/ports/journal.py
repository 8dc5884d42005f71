"""The ``IntentJournal`` port: every operation's inverse is durable before the operation applies.

A drill process can die between applying an injection and reverting it. The runner writes each
operation with its inverse *before* applying it, marks it applied, and marks it reverted after
the undo, so ``gameday recover`` can find and undo whatever is still applied. Where and how that
record is kept (a file with ``fsync`` and a lock, a database) is an adapter's business.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from firedrill.model.journal import JournalState
from firedrill.model.operations import Operation


class IntentJournal(Protocol):
    def intend(self, op: Operation, inverse: Operation, at_s: float) -> int:
        """Record (durably) that ``op`` is about to apply with ``inverse``; its key."""
        ...

    def applied(self, key: int, at_s: float) -> None: ...

    def reverted(self, key: int, at_s: float) -> None: ...

    def finish(self, verdict: str) -> None:
        """The drill ended with ``verdict``: nothing of it is left to recover."""
        ...


class ReopenedJournal(Protocol):
    """An unfinished journal re-opened by recovery to record what it reverted."""

    def reverted(self, key: int, at_s: float) -> None: ...

    def finish(self, verdict: str) -> None: ...

    def __enter__(self) -> ReopenedJournal: ...

    def __exit__(self, *exc: object) -> None: ...


class JournalStore(Protocol):
    """Where interrupted drills' journals are found and re-opened."""

    def unfinished(self, paths: Sequence[Path] | None = None) -> Sequence[JournalState]:
        """Journals never finished (live ones included: ``JournalState.live`` tells), oldest
        first; only those of ``paths`` when given."""
        ...

    def reopen(self, path: Path) -> ReopenedJournal:
        """Re-open an unfinished, unlocked journal to append (``JournalError`` otherwise)."""
        ...

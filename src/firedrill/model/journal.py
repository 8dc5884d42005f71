"""What a drill journal holds, as read back: its header and each intended operation's fate.

The journal's records themselves are written and read by an adapter (a file with ``fsync`` and a
lock); recovery (``drill/recover.py``) works on these values.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from firedrill.model.operations import Operation

__all__ = ["Intent", "JournalHeader", "JournalState"]


@dataclass(frozen=True)
class JournalHeader:
    drill: str
    spec_sha256: str
    seed: int
    run_by: str
    target: str  # "embedded" or the remote twin's base URL
    pid: int
    started: str  # wall clock, ISO 8601 UTC


@dataclass(frozen=True)
class Intent:
    """One intended operation and what became of it."""

    key: int
    op: Operation
    inverse: Operation
    at_s: float
    applied: bool
    reverted: bool


@dataclass(frozen=True)
class JournalState:
    """A journal file as read back."""

    path: Path
    header: JournalHeader
    intents: tuple[Intent, ...]
    verdict: str | None  # None: never finished
    live: bool  # an open Journal (a running drill) holds the file's lock
    torn_tail: bool  # the last line was cut short by a crash and ignored

    @property
    def finished(self) -> bool:
        return self.verdict is not None

    @property
    def unreverted(self) -> tuple[Intent, ...]:
        """Intents not yet reverted, newest first: the order recovery undoes them in."""
        return tuple(i for i in reversed(self.intents) if not i.reverted)

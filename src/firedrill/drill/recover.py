"""Revert whatever an interrupted drill left injected: ``firedrill gameday recover``.

A drill journals every operation's inverse before applying it (``drill/journal.py``). When the
drill process dies (Ctrl-C, a crash, ``kill -9``) its journal stays unfinished. Recovery applies
the inverses of the intents that were never marked reverted, newest first, through the world the
journal names, marks each reverted, and finishes the journal as ``recovered``. It runs on demand
and at the start of every ``gameday run``.

Choices:

- Intents that were written but never marked applied are reverted too: the process may have died
  between applying the operation and writing ``applied``. Inverses set state to what it was
  (Heal, ResumeReplication, AllowCapacity, ClearDcgmField to the old value, the old route
  weights), so applying one whose operation never happened changes nothing. If the world refuses
  such an inverse, the intent is marked reverted all the same (nothing of it was left).
- If the world refuses the inverse of an *applied* intent, recovery goes on with the older ones
  (the more is undone the better), reports the failure, and leaves the journal unfinished so the
  next recovery tries again.
- Re-applying an inverse that was applied just before a crash (and not yet marked) is harmless
  for the same reason, so recovery is idempotent: a second run finds nothing to do.
- A journal of an embedded twin is finished without reverting anything: that twin lived inside
  the dead process, and so did everything injected into it.
- A journal still locked by a running drill is left alone.
- A journal never chooses where the control token goes: recovery talks only to the target the
  user names (``--target``), never to the URL a journal's header holds, since anyone who can
  write a file in the journal directory could name a server of their own there
  (``target_for``). Without a named target, a journal of a remote twin stays unfinished with a
  note saying which ``--target`` would recover it. Before a ``gameday run``, a journal is
  recovered only through the run's own ``--target`` and only when it names that same twin.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from firedrill.errors import (
    FiredrillError,
    JournalError,
    OperationError,
    RemoteWorldError,
    UnknownTargetError,
)
from firedrill.model import operations as ops
from firedrill.model.journal import JournalHeader, JournalState
from firedrill.model.operations import Operation
from firedrill.ports import JournalStore, ReopenedJournal

__all__ = [
    "EMBEDDED",
    "IntentOutcome",
    "JournalRecovery",
    "RecoveryReport",
    "RevertWorld",
    "recover",
    "same_target",
    "target_for",
]

EMBEDDED = "embedded"

Outcome = Literal["reverted", "nothing_to_revert", "not_applied", "failed"]


class RevertWorld(Protocol):
    """What recovery needs of a world: apply an operation (Fleet) and tell the time (Clock)."""

    def apply(self, op: Operation) -> Operation: ...

    def now_s(self) -> float: ...


@dataclass(frozen=True)
class IntentOutcome:
    key: int
    op: Operation
    inverse: Operation
    outcome: Outcome
    detail: str = ""
    unreachable: bool = False  # failed because the world could not be reached


@dataclass(frozen=True)
class JournalRecovery:
    """What recovery did with one unfinished journal."""

    path: Path
    header: JournalHeader
    intents: tuple[IntentOutcome, ...]
    finished: bool  # the journal is now finished as "recovered"
    note: str = ""  # why nothing was reverted, or why the journal stays unfinished

    @property
    def failed(self) -> bool:
        return not self.finished


@dataclass(frozen=True)
class RecoveryReport:
    journals: tuple[JournalRecovery, ...]
    live: tuple[JournalState, ...] = field(default=())  # running drills, left alone

    @property
    def ok(self) -> bool:
        return all(j.finished for j in self.journals)

    @property
    def reverted(self) -> int:
        return sum(1 for j in self.journals for i in j.intents if i.outcome == "reverted")


_URL = re.compile(
    r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?:[^@/?#]*@)?"
    r"(?P<host>\[[^\]]*\]|[^:/?#]*)(?::(?P<port>[0-9]*))?(?P<path>[^?#]*)"
)


def _canonical_url(url: str) -> tuple[str, str, int | None, str]:
    m = _URL.match(url.strip())
    if m is None:
        return ("", url.strip(), None, "")
    scheme = m["scheme"].lower()
    port = int(m["port"]) if m["port"] and len(m["port"]) <= 5 else None
    if port is None:
        port = {"http": 80, "https": 443}.get(scheme)
    return (scheme, m["host"].strip("[]").lower(), port, m["path"].rstrip("/"))


def same_target(a: str, b: str) -> bool:
    """Whether two twin URLs name the same twin (scheme, host and port compared canonically)."""
    return _canonical_url(a) == _canonical_url(b)


def target_for(header: JournalHeader, named: str | None, *, must_match: bool = False) -> str:
    """The URL to revert ``header``'s journal through: only ever the one the user named.

    ``named`` is the ``--target`` the user gave (``None``: none). With ``must_match`` (the
    recovery before a ``gameday run``) the journal must name that same twin. Raises
    ``JournalError`` with what to do otherwise; the journal's own URL is never used.
    """
    if named is None:
        raise JournalError(
            f"the journal names the remote twin {header.target!r}; recovery sends the control "
            "token only to a twin you name: if that twin is yours, run `firedrill gameday "
            f"recover --target {header.target}`"
        )
    if must_match and not same_target(named, header.target):
        raise JournalError(
            f"the journal names the remote twin {header.target!r}, not this run's target "
            f"{named!r}; if that twin is yours, run `firedrill gameday recover --target "
            f"{header.target}`"
        )
    return named


def _recover_one(
    journals: JournalStore,
    state: JournalState,
    world_for: Callable[[JournalHeader], RevertWorld | None],
) -> JournalRecovery:
    header = state.header
    try:
        journal = journals.reopen(state.path)
    except JournalError as exc:
        return JournalRecovery(state.path, header, (), finished=False, note=str(exc))
    with journal:
        todo = state.unreverted
        if header.target == EMBEDDED:
            journal.finish("recovered")
            note = (
                "embedded twin: it died with the drill's process, and so did what was injected "
                f"into it; nothing to revert ({len(todo)} intents were open)"
            )
            return JournalRecovery(state.path, header, (), finished=True, note=note)
        try:
            world = world_for(header)
        except FiredrillError as exc:
            return JournalRecovery(state.path, header, (), finished=False, note=str(exc))
        if world is None:
            note = f"no world to revert through for target {header.target}"
            return JournalRecovery(state.path, header, (), finished=False, note=note)
        outcomes: list[IntentOutcome] = []
        for intent in todo:
            outcome = _revert(journal, world, intent.key, intent.op, intent.inverse, intent.applied)
            outcomes.append(outcome)
            if outcome.unreachable:
                break  # the world is gone: no point trying the rest now
        ok = all(o.outcome != "failed" for o in outcomes) and len(outcomes) == len(todo)
        if ok:
            journal.finish("recovered")
            return JournalRecovery(state.path, header, tuple(outcomes), finished=True)
        failed = sum(1 for o in outcomes if o.outcome == "failed")
        note = f"{failed} inverse(s) failed; the journal stays open for the next recovery"
        return JournalRecovery(state.path, header, tuple(outcomes), finished=False, note=note)


def _revert(
    journal: ReopenedJournal,
    world: RevertWorld,
    key: int,
    op: Operation,
    inverse: Operation,
    applied: bool,
) -> IntentOutcome:
    if isinstance(inverse, ops.Noop):
        journal.reverted(key, _now(world))
        return IntentOutcome(key, op, inverse, "nothing_to_revert", inverse.reason)
    try:
        world.apply(inverse)
    except RemoteWorldError as exc:  # the world did not answer, or refused us: try again later
        return IntentOutcome(key, op, inverse, "failed", str(exc), unreachable=exc.status is None)
    except (OperationError, UnknownTargetError) as exc:  # the world refused the inverse
        if not applied:
            journal.reverted(key, _now(world))
            return IntentOutcome(key, op, inverse, "not_applied", f"never applied ({exc})")
        return IntentOutcome(key, op, inverse, "failed", str(exc))
    journal.reverted(key, _now(world))
    return IntentOutcome(key, op, inverse, "reverted", "" if applied else "intended, unconfirmed")


def _now(world: RevertWorld) -> float:
    try:
        return world.now_s()
    except FiredrillError:
        return 0.0


def recover(
    journals: JournalStore,
    world_for: Callable[[JournalHeader], RevertWorld | None],
    *,
    paths: Sequence[Path] | None = None,
) -> RecoveryReport:
    """Recover every unfinished, unlocked journal of ``journals`` (or just ``paths``)."""
    states = journals.unfinished(paths)
    live = tuple(s for s in states if s.live)
    done = tuple(_recover_one(journals, s, world_for) for s in states if not s.live)
    return RecoveryReport(journals=done, live=live)

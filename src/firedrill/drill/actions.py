"""Findings as tracked action items: one stable identity per gap, a history across runs.

"Findings become structure" (reference 001): a finding is not done when the report is written;
it is an action item with an owner and a due date that someone closes. A later run that finds the
same gap must land on the same item (not a new one each Tuesday), so the identity of an item is
derived from *what* the gap is, never from this run's numbers: the drill it was found in and the
finding's ``key`` (``chain:ecc_dbe:health_condition``, ``dependency:probe-idp``,
``rto_term:detect_s``, ... — see `firedrill.drill.findings`). ``identity`` hashes the two into a
short, URL-safe id (``FND-`` and 12 hex digits).

The lifecycle is a pure function over the item and one event: a run raises the item (new), raises
it again (seen again: still open, or *reopened* when it had been closed — the fix did not hold),
or a person closes it (with a note). Every event is kept as history. The store applies these
transitions; the ladder reads the open items per model and rung.

Due dates: a finding gets ``DUE_DAYS`` for its kind from the run that first raised it (admission
and security findings are the most urgent).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Literal

__all__ = [
    "DUE_DAYS",
    "ActionEvent",
    "ItemStatus",
    "Raised",
    "due_date",
    "identity",
    "raised_from_report",
    "transition",
]

ItemStatus = Literal["open", "closed"]
EventKind = Literal["raised", "raised_again", "reopened", "closed"]

# days from the first run that raised a finding to its due date, by kind
DUE_DAYS: Mapping[str, int] = {
    "admission_policy": 7,
    "alert": 14,
    "release_gate": 14,
    "runbook_step": 30,
}
DEFAULT_DUE_DAYS = 30
IDENTITY_PREFIX = "FND-"


def identity(drill: str, key: str) -> str:
    """The stable id of the gap ``key`` found by drill ``drill``: same inputs, same id."""
    digest = hashlib.sha256(f"{drill}\x00{key}".encode()).hexdigest()
    return IDENTITY_PREFIX + digest[:12]


def due_date(kind: str, raised_on: date) -> date:
    return raised_on + timedelta(days=DUE_DAYS.get(kind, DEFAULT_DUE_DAYS))


@dataclass(frozen=True)
class Raised:
    """One finding of one run, ready to be tracked."""

    identity: str
    key: str
    drill: str
    model: str
    rung: int
    kind: str
    owner: str
    text: str


def raised_from_report(
    findings: Iterable[Mapping[str, object]], *, drill: str, model: str, rung: int
) -> list[Raised]:
    """The trackable findings of a run's report (its ``findings`` list), in report order.

    A finding without a ``key`` (a report written before findings had one) is tracked by its
    kind and text, which is stable only as long as the text is.
    """
    out: list[Raised] = []
    seen: set[str] = set()
    for f in findings:
        kind = str(f.get("kind", "runbook_step"))
        text = str(f.get("text", ""))
        key = str(f.get("key") or f"text:{kind}:{text}")
        ident = identity(drill, key)
        if ident in seen:
            continue
        seen.add(ident)
        out.append(
            Raised(
                identity=ident,
                key=key,
                drill=drill,
                model=model,
                rung=rung,
                kind=kind,
                owner=str(f.get("owner") or "unowned"),
                text=text,
            )
        )
    return out


@dataclass(frozen=True)
class ActionEvent:
    """What happened to an item: the new status and the history line to keep."""

    status: ItemStatus
    event: EventKind
    note: str


def transition(
    current: ItemStatus | None, *, event: Literal["raise", "close"], at: datetime, by: str = ""
) -> ActionEvent:
    """The next status of an item (``current`` None: it does not exist yet) and its history."""
    when = at.isoformat()
    if event == "raise":
        if current is None:
            return ActionEvent("open", "raised", f"raised by a run at {when}")
        if current == "closed":
            return ActionEvent(
                "open",
                "reopened",
                f"found again at {when} after it was closed: the fix did not hold",
            )
        return ActionEvent("open", "raised_again", f"found again at {when}")
    if current is None:
        raise ValueError("cannot close an item that does not exist")
    if current == "closed":
        raise ValueError("the item is already closed")
    who = by.strip()
    if not who:
        raise ValueError("closing an item needs who closes it")
    return ActionEvent("closed", "closed", f"closed by {who} at {when}")

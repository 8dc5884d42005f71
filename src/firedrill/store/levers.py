"""The lever journal: every lever proposed, applied or refused, with its inverse and approvers.

The store refuses the two records that would break the reference's rules for levers: an applied
lever with no inverse (the inverse is recorded before the lever is applied, so it can always be
undone) and a refusal with no reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from firedrill.errors import StoreError
from firedrill.store import incidents, validate
from firedrill.store.db import mapped_errors, writing
from firedrill.store.models import JsonValue, LeverEntry, LeverStatus


def record(
    *,
    session: Session,
    incident_id: str,
    kind: str,
    scope: str,
    op: Mapping[str, JsonValue],
    inverse: Mapping[str, JsonValue] | None,
    status: LeverStatus | str,
    at_s: float,
    reason: str = "",
    approvers: Iterable[str] = (),
) -> LeverEntry:
    """Journal a lever decision."""
    the_status = validate.one_of(LeverStatus, status, "status")
    row = LeverEntry(
        incident_id=incident_id,
        kind=validate.name(kind, "kind"),
        scope=validate.name(scope, "scope"),
        op=validate.json_object(op, "op"),
        inverse=None if inverse is None else validate.json_object(inverse, "inverse"),
        status=the_status,
        reason=validate.text(reason, "reason"),
        approvers=validate.names(approvers, "approvers"),
        at_s=validate.seconds(at_s, "at_s"),
    )
    if the_status is LeverStatus.applied and row.inverse is None:
        raise StoreError("an applied lever needs its inverse recorded (it must be reversible)")
    if the_status is LeverStatus.refused and not row.reason.strip():
        raise StoreError("a refused lever needs the reason it was refused")
    incidents.require(session=session, incident_id=incident_id)
    with writing(session, f"cannot journal a lever on {incident_id}"):
        session.add(row)
    return row


def get(*, session: Session, journal_id: int) -> LeverEntry | None:
    """One journal entry, or None."""
    with mapped_errors(f"cannot read lever {journal_id}"):
        return session.get(LeverEntry, journal_id)


def list(  # shadows the builtin on purpose: callers write levers.list(...)
    *, session: Session, incident_id: str, status: LeverStatus | str | None = None
) -> Sequence[LeverEntry]:
    """The incident's journal in time order."""
    query = (
        select(LeverEntry)
        .where(LeverEntry.incident_id == incident_id)
        .order_by(LeverEntry.at_s, LeverEntry.id)
    )
    if status is not None:
        query = query.where(LeverEntry.status == validate.one_of(LeverStatus, status, "status"))
    with mapped_errors(f"cannot read the lever journal of {incident_id}"):
        return session.scalars(query).all()

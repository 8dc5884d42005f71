"""The incident timeline: every observation, decision and message, with who and when.

Events are only ever added. The postmortem's TTD/TTM/TTR and the handoff summary are read off it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from firedrill.store import incidents, validate
from firedrill.store.db import mapped_errors, writing
from firedrill.store.models import JsonValue, TimelineEvent


def add(
    *,
    session: Session,
    incident_id: str,
    at_s: float,
    kind: str,
    actor: str,
    text: str,
    data: Mapping[str, JsonValue] | None = None,
) -> TimelineEvent:
    """Add an event to the incident's timeline."""
    row = TimelineEvent(
        incident_id=incident_id,
        at_s=validate.seconds(at_s, "at_s"),
        kind=validate.name(kind, "kind"),
        actor=validate.name(actor, "actor"),
        text=validate.prose(text, "text"),
        data=validate.json_object({} if data is None else data, "data"),
    )
    incidents.require(session=session, incident_id=incident_id)
    with writing(session, f"cannot add to the timeline of {incident_id}"):
        session.add(row)
    return row


def list(  # shadows the builtin on purpose: callers write timeline.list(...)
    *, session: Session, incident_id: str, kind: str | None = None
) -> Sequence[TimelineEvent]:
    """The incident's events in time order (ties in the order they were added)."""
    query = (
        select(TimelineEvent)
        .where(TimelineEvent.incident_id == incident_id)
        .order_by(TimelineEvent.at_s, TimelineEvent.id)
    )
    if kind is not None:
        query = query.where(TimelineEvent.kind == kind)
    with mapped_errors(f"cannot read the timeline of {incident_id}"):
        return session.scalars(query).all()

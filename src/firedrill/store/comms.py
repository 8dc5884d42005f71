"""Comms: updates posted to the status page and the incident channel, with when each was due.

Keeping ``due_s`` next to ``at_s`` lets a report show late updates (the first one is due at most
15 minutes after a SEV1/2 is declared) without recomputing the schedule.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from firedrill.store import incidents, validate
from firedrill.store.db import mapped_errors, writing
from firedrill.store.models import Channel, CommsUpdate


def post(
    *,
    session: Session,
    incident_id: str,
    channel: Channel | str,
    text: str,
    at_s: float,
    due_s: float | None = None,
) -> CommsUpdate:
    """Record an update posted to ``channel``."""
    row = CommsUpdate(
        incident_id=incident_id,
        channel=validate.one_of(Channel, channel, "channel"),
        text=validate.prose(text, "text"),
        at_s=validate.seconds(at_s, "at_s"),
        due_s=None if due_s is None else validate.seconds(due_s, "due_s"),
    )
    incidents.require(session=session, incident_id=incident_id)
    with writing(session, f"cannot record an update on {incident_id}"):
        session.add(row)
    return row


def list(  # shadows the builtin on purpose: callers write comms.list(...)
    *, session: Session, incident_id: str, channel: Channel | str | None = None
) -> Sequence[CommsUpdate]:
    """The incident's updates in time order."""
    query = (
        select(CommsUpdate)
        .where(CommsUpdate.incident_id == incident_id)
        .order_by(CommsUpdate.at_s, CommsUpdate.id)
    )
    if channel is not None:
        query = query.where(CommsUpdate.channel == validate.one_of(Channel, channel, "channel"))
    with mapped_errors(f"cannot read the updates of {incident_id}"):
        return session.scalars(query).all()

"""What the incident board shows beside each incident, read for many incidents in two queries.

The board lists up to a thousand open incidents; asking the roles and comms services once per
incident would be two thousand round trips. ``facts`` reads the incident commanders and the
incident-channel updates of all of them at once.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from firedrill.store.db import mapped_errors
from firedrill.store.models import Channel, CommsUpdate, Role, RoleAssignment

__all__ = ["BoardFacts", "facts"]


@dataclass
class BoardFacts:
    """The current incident commander and the incident-channel updates (time, text), in order."""

    commander: str | None = None
    updates: list[tuple[float, str]] = field(default_factory=list)


def facts(*, session: Session, incident_ids: Collection[str]) -> dict[str, BoardFacts]:
    """Facts for each of ``incident_ids`` (an id with none gets an empty record)."""
    out = {i: BoardFacts() for i in incident_ids}
    if not out:
        return out
    ids = list(out)
    with mapped_errors("cannot read the incident board"):
        for chunk in (ids[i : i + 500] for i in range(0, len(ids), 500)):
            ics = session.execute(
                select(RoleAssignment.incident_id, RoleAssignment.person)
                .where(RoleAssignment.incident_id.in_(chunk))
                .where(RoleAssignment.role == Role.incident_commander)
                .order_by(RoleAssignment.since_s, RoleAssignment.id)
            ).all()
            for incident_id, person in ics:
                out[incident_id].commander = person  # the latest assignment wins
            posts = session.execute(
                select(CommsUpdate.incident_id, CommsUpdate.at_s, CommsUpdate.text)
                .where(CommsUpdate.incident_id.in_(chunk))
                .where(CommsUpdate.channel == Channel.incident_channel)
                .order_by(CommsUpdate.at_s, CommsUpdate.id)
            ).all()
            for incident_id, at_s, text in posts:
                out[incident_id].updates.append((at_s, text))
    return out

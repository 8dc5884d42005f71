"""Incident roles and their handoffs.

Every assignment is a new row (the history is the record of who was in charge when); the current
holder of a role is its latest assignment. A handoff is said on the call as one sentence,
"IC handing to Bo at 04:00 UTC; open threads A, B; next update 04:30", and stored with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from firedrill.errors import StoreError
from firedrill.store import incidents, validate
from firedrill.store.db import mapped_errors, writing
from firedrill.store.models import Handoff, Role, RoleAssignment

SHORT: dict[Role, str] = {
    Role.incident_commander: "IC",
    Role.operations_lead: "Ops lead",
    Role.communications_lead: "Comms lead",
    Role.scribe: "Scribe",
    Role.model_owner: "Model owner",
    Role.capacity_lead: "Capacity lead",
    Role.security_lead: "Security lead",
}

DAY_S = 86_400.0


def clock(at_s: float) -> str:
    """``HH:MM`` of a time in seconds since the epoch, UTC (on the twin: since its midnight)."""
    minutes = int(at_s % DAY_S) // 60
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def handoff_text(
    role: Role, to_person: str, at_s: float, open_threads: Iterable[str], next_update_s: float
) -> str:
    """The sentence said on the call, e.g. "IC handing to X at 04:00 UTC; open threads A, B; next
    update 04:30"."""
    threads = ", ".join(open_threads) or "none"
    return (
        f"{SHORT[role]} handing to {to_person} at {clock(at_s)} UTC; "
        f"open threads {threads}; next update {clock(next_update_s)}"
    )


def assign(
    *, session: Session, incident_id: str, role: Role | str, person: str, since_s: float
) -> RoleAssignment:
    """Give ``role`` to ``person`` from ``since_s`` (the first holder; later ones via handoff)."""
    row = RoleAssignment(
        incident_id=incident_id,
        role=validate.one_of(Role, role, "role"),
        person=validate.name(person, "person"),
        since_s=validate.seconds(since_s, "since_s"),
    )
    incidents.require(session=session, incident_id=incident_id)
    with writing(session, f"cannot assign {row.role} on {incident_id}"):
        session.add(row)
    return row


def history(*, session: Session, incident_id: str) -> Sequence[RoleAssignment]:
    """Every assignment on the incident, in time order."""
    query = (
        select(RoleAssignment)
        .where(RoleAssignment.incident_id == incident_id)
        .order_by(RoleAssignment.since_s, RoleAssignment.id)
    )
    with mapped_errors(f"cannot read the roles of {incident_id}"):
        return session.scalars(query).all()


def current(*, session: Session, incident_id: str) -> dict[Role, RoleAssignment]:
    """Who holds each role now (roles never assigned are absent)."""
    return {row.role: row for row in history(session=session, incident_id=incident_id)}


def handoff(
    *,
    session: Session,
    incident_id: str,
    role: Role | str,
    to_person: str,
    at_s: float,
    open_threads: Iterable[str],
    next_update_s: float,
) -> Handoff:
    """Hand ``role`` to ``to_person``: records the handoff and the new assignment together."""
    the_role = validate.one_of(Role, role, "role")
    to = validate.name(to_person, "to_person")
    at = validate.seconds(at_s, "at_s")
    nxt = validate.seconds(next_update_s, "next_update_s")
    threads = [validate.name(t, "open_threads") for t in _strings(open_threads)]
    if nxt <= at:
        raise StoreError("next_update_s must be after the handoff")
    incidents.require(session=session, incident_id=incident_id)
    holder = current(session=session, incident_id=incident_id).get(the_role)
    if holder is not None and holder.person == to:
        raise StoreError(f"{to} already holds {the_role} on {incident_id}")
    if holder is not None and at < holder.since_s:
        raise StoreError(f"{the_role} cannot be handed over before {holder.person} took it")
    row = Handoff(
        incident_id=incident_id,
        role=the_role,
        from_person=None if holder is None else holder.person,
        to_person=to,
        at_s=at,
        open_threads=threads,
        next_update_s=nxt,
        text=handoff_text(the_role, to, at, threads, nxt),
    )
    with writing(session, f"cannot hand over {the_role} on {incident_id}"):
        session.add(row)
        session.add(RoleAssignment(incident_id=incident_id, role=the_role, person=to, since_s=at))
    return row


def handoffs(*, session: Session, incident_id: str) -> Sequence[Handoff]:
    """The incident's handoffs in time order."""
    query = (
        select(Handoff).where(Handoff.incident_id == incident_id).order_by(Handoff.at_s, Handoff.id)
    )
    with mapped_errors(f"cannot read the handoffs of {incident_id}"):
        return session.scalars(query).all()


def _strings(values: Iterable[str]) -> Iterable[str]:
    if isinstance(values, str):
        raise StoreError("open_threads must be a list of thread names, not a single string")
    return values

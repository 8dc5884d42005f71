"""An incident's case file: everything the store knows about one incident, read in one go.

``firedrill incident show|timeline|postmortem`` render it, ``incident list`` reads ``find``, and
``hand_off`` is the one write they make: a handoff, said as a sentence on the call, recorded with
its timeline event and audit record in the same unit of work. Times given as a wall-clock
``HH:MM`` (UTC) are placed on the incident's own clock by ``at_clock``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from firedrill.errors import StoreError
from firedrill.store import audit, comms, incidents, levers, postmortems, roles, timeline, validate
from firedrill.store.db import mapped_errors
from firedrill.store.models import (
    ActionItem,
    CommsUpdate,
    Handoff,
    Incident,
    IncidentStatus,
    JsonObject,
    LeverEntry,
    Postmortem,
    Role,
    RoleAssignment,
    TimelineEvent,
)

DAY_S = 86_400.0
ROLE_NAMES: dict[str, Role] = {  # short names accepted on the command line
    "ic": Role.incident_commander,
    "ops": Role.operations_lead,
    "comms": Role.communications_lead,
    "scribe": Role.scribe,
    "model-owner": Role.model_owner,
    "capacity": Role.capacity_lead,
    "security": Role.security_lead,
}


@dataclass(frozen=True)
class CaseFile:
    """One incident with its timeline, lever journal, roles, comms and postmortem."""

    incident: Incident
    events: Sequence[TimelineEvent]
    levers: Sequence[LeverEntry]
    roles: Sequence[RoleAssignment]
    handoffs: Sequence[Handoff]
    comms: Sequence[CommsUpdate]
    postmortem: Postmortem | None
    action_items: Sequence[ActionItem]

    @property
    def assessment(self) -> JsonObject:
        """What triage recorded when the incident was imported (axes, suspects, ...), or {}."""
        found = [e for e in self.events if e.kind == "assessment"]
        return found[-1].data if found else {}

    @property
    def severity(self) -> list[TimelineEvent]:
        """The severity ratings, applied or not, in time order."""
        return [e for e in self.events if e.kind == "severity"]

    @property
    def current_roles(self) -> dict[Role, RoleAssignment]:
        """Who holds each role now."""
        return {r.role: r for r in self.roles}


def load(*, session: Session, incident_id: str) -> CaseFile:
    """The case file of ``incident_id``; ``StoreError`` naming the id when there is none."""
    inc = incidents.require(session=session, incident_id=incident_id)
    pm = postmortems.get(session=session, incident_id=incident_id)
    return CaseFile(
        incident=inc,
        events=timeline.list(session=session, incident_id=incident_id),
        levers=levers.list(session=session, incident_id=incident_id),
        roles=roles.history(session=session, incident_id=incident_id),
        handoffs=roles.handoffs(session=session, incident_id=incident_id),
        comms=comms.list(session=session, incident_id=incident_id),
        postmortem=pm,
        action_items=()
        if pm is None
        else postmortems.action_items(session=session, postmortem_id=pm.id),
    )


def find(
    *,
    session: Session,
    status: IncidentStatus | str | None = None,
    cell: str | None = None,
    sev: int | None = None,
) -> Sequence[Incident]:
    """Incidents in the order opened, filtered by status, cell and severity."""
    query = select(Incident).order_by(Incident.number)
    if status is not None:
        query = query.where(Incident.status == validate.one_of(IncidentStatus, status, "status"))
    if cell is not None:
        query = query.where(Incident.cell == cell)
    if sev is not None:
        query = query.where(
            Incident.sev == validate.count(sev, "sev", low=incidents.WORST_SEV, high=4)
        )
    with mapped_errors("cannot list incidents"):
        return session.scalars(query).all()


def role(value: str) -> Role:
    """A role by its short name (``ic``, ``ops``, ...) or its full name."""
    key = value.strip().lower()
    if key in ROLE_NAMES:
        return ROLE_NAMES[key]
    try:
        return Role(key.replace("-", "_"))
    except ValueError:
        names = ", ".join([*ROLE_NAMES, *(r.value for r in Role)])
        raise StoreError(f"unknown role {value!r}: one of {names}") from None


def parse_clock(value: str) -> float:
    """``HH:MM`` (24 h, UTC) as seconds after midnight."""
    hh, sep, mm = value.strip().partition(":")
    if not (sep and hh.isdigit() and mm.isdigit() and len(mm) == 2):
        raise StoreError(f"expected a time as HH:MM (UTC), got {value!r}")
    h, m = int(hh), int(mm)
    if not (0 <= h < 24 and 0 <= m < 60):
        raise StoreError(f"expected a time as HH:MM (UTC), got {value!r}")
    return h * 3600.0 + m * 60.0


def at_clock(clock_s: float, *, not_before_s: float, strictly_after: bool = False) -> float:
    """The first time at or after ``not_before_s`` (after, if ``strictly_after``) whose time of
    day is ``clock_s``: a wall-clock "04:30" placed on the incident's timeline."""
    day = (not_before_s // DAY_S) * DAY_S
    at = day + clock_s
    if at < not_before_s or (strictly_after and at == not_before_s):
        at += DAY_S
    return at


def hand_off(
    *,
    session: Session,
    incident_id: str,
    role_name: str,
    to_person: str,
    at_clock_s: float,
    open_threads: Iterable[str],
    next_update_clock_s: float,
    actor: str,
) -> Handoff:
    """Hand a role over at a wall-clock time; records the handoff, a timeline event and an audit
    record (the store refuses a handoff to the current holder, or before they took the role)."""
    inc = incidents.require(session=session, incident_id=incident_id)
    the_role = role(role_name)
    holder = roles.current(session=session, incident_id=incident_id).get(the_role)
    since = inc.opened_at_s if holder is None else max(inc.opened_at_s, holder.since_s)
    at = at_clock(at_clock_s, not_before_s=since)
    nxt = at_clock(next_update_clock_s, not_before_s=at, strictly_after=True)
    row = roles.handoff(
        session=session,
        incident_id=incident_id,
        role=the_role,
        to_person=to_person,
        at_s=at,
        open_threads=list(open_threads),
        next_update_s=nxt,
    )
    timeline.add(
        session=session,
        incident_id=incident_id,
        at_s=at,
        kind="handoff",
        actor=actor,
        text=row.text,
        data={
            "role": the_role.value,
            "from": row.from_person,
            "to": row.to_person,
            "open_threads": list(row.open_threads),
            "next_update_s": nxt,
        },
    )
    audit.append(
        session,
        actor=actor,
        action="role.handoff",
        subject=incident_id,
        data={"role": the_role.value, "from": row.from_person, "to": row.to_person},
        at_s=at,
    )
    return row

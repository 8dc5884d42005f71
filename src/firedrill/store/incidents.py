"""Incidents: opened with a number, a cell and a SEV; mitigated, then resolved; never deleted.

The store keeps two of the reference's rules even if a caller forgets them: severity only goes up
during an incident (``escalate`` refuses a lower SEV; the postmortem is where a SEV comes down),
and the times only move forward (opened <= mitigated <= resolved).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from firedrill.errors import StoreError
from firedrill.store import validate
from firedrill.store.db import mapped_errors, serialize_writers, writing
from firedrill.store.models import Incident, IncidentStatus

WORST_SEV = 1
MILDEST_SEV = 4


def format_id(number: int) -> str:
    """``INC-0001`` for 1 (wider past 9999)."""
    return f"INC-{number:04d}"


def _sev(value: object) -> int:
    return validate.count(value, "sev", low=WORST_SEV, high=MILDEST_SEV)


def create(
    *,
    session: Session,
    cell: str,
    region: str,
    title: str,
    sev: int,
    opened_at_s: float,
) -> Incident:
    """Open an incident and give it the next number."""
    row = Incident(
        cell=validate.name(cell, "cell"),
        region=validate.name(region, "region"),
        title=validate.prose(title, "title"),
        sev=_sev(sev),
        status=IncidentStatus.open,
        opened_at_s=validate.seconds(opened_at_s, "opened_at_s"),
    )
    with writing(session, "cannot open the incident"):
        serialize_writers(session, Incident.__tablename__)
        last = session.scalar(select(func.max(Incident.number)))
        row.number = (last or 0) + 1
        row.id = format_id(row.number)
        session.add(row)
    return row


def get(*, session: Session, incident_id: str) -> Incident | None:
    """The incident with this id, or ``None``."""
    with mapped_errors(f"cannot read incident {incident_id!r}"):
        return session.get(Incident, incident_id)


def require(*, session: Session, incident_id: str) -> Incident:
    """The incident with this id; ``StoreError`` when there is none."""
    row = get(session=session, incident_id=incident_id)
    if row is None:
        raise StoreError(f"no incident {incident_id!r}")
    return row


def list(  # shadows the builtin on purpose: callers write incidents.list(...)
    *,
    session: Session,
    status: IncidentStatus | str | None = None,
    cell: str | None = None,
) -> Sequence[Incident]:
    """Incidents in the order they were opened, optionally of one status or one cell."""
    query = select(Incident).order_by(Incident.number)
    if status is not None:
        query = query.where(Incident.status == validate.one_of(IncidentStatus, status, "status"))
    if cell is not None:
        query = query.where(Incident.cell == cell)
    with mapped_errors("cannot list incidents"):
        return session.scalars(query).all()


def escalate(*, session: Session, incident_id: str, sev: int) -> Incident:
    """Raise the incident's severity to ``sev`` (1 is the worst); a lower severity is refused."""
    new = _sev(sev)
    row = require(session=session, incident_id=incident_id)
    if new > row.sev:
        raise StoreError(
            f"{incident_id} is SEV{row.sev}: severity only goes up during an incident "
            f"(SEV{new} refused)"
        )
    with writing(session, f"cannot change the severity of {incident_id}"):
        row.sev = new
    return row


def mitigate(*, session: Session, incident_id: str, at_s: float) -> Incident:
    """Mark the incident mitigated (users served again; the cause may still be there)."""
    at = validate.seconds(at_s, "at_s")
    row = require(session=session, incident_id=incident_id)
    if row.status is not IncidentStatus.open:
        raise StoreError(f"{incident_id} is already {row.status}")
    if at < row.opened_at_s:
        raise StoreError(f"{incident_id} cannot be mitigated before it was opened")
    with writing(session, f"cannot mitigate {incident_id}"):
        row.status = IncidentStatus.mitigated
        row.mitigated_at_s = at
    return row


def resolve(*, session: Session, incident_id: str, at_s: float) -> Incident:
    """Mark the incident resolved; one resolved straight from open counts as mitigated then too."""
    at = validate.seconds(at_s, "at_s")
    row = require(session=session, incident_id=incident_id)
    if row.status is IncidentStatus.resolved:
        raise StoreError(f"{incident_id} is already resolved")
    earliest = row.mitigated_at_s if row.mitigated_at_s is not None else row.opened_at_s
    if at < earliest:
        raise StoreError(f"{incident_id} cannot be resolved before it was opened or mitigated")
    with writing(session, f"cannot resolve {incident_id}"):
        row.status = IncidentStatus.resolved
        if row.mitigated_at_s is None:
            row.mitigated_at_s = at
        row.resolved_at_s = at
    return row

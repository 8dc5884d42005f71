"""Alerts received from Alertmanager, kept once each, and the lever approvals given through the API.

``firedrill serve`` has to survive restarts without paging twice or forgetting which alerts are
still firing. Alertmanager re-sends every alert of a group on each interval, so the service keeps
one row per distinct ``(fingerprint, startsAt, status)`` (``seen`` answers which of a batch are
already known, the unique key refuses a second copy), with the incident it joined. On start,
``open_incident_alerts`` gives back what every unresolved incident carried, in arrival order.

Approvals of a lever are audit records (``lever.approve``), so they are tamper-evident like every
other decision; ``approvals`` reads them back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, cast

from sqlalchemy import Table, insert, select
from sqlalchemy.orm import Session

from firedrill.errors import StoreError
from firedrill.store import validate
from firedrill.store.db import mapped_errors, writing
from firedrill.store.models import (
    HASH_LEN,
    ISO_TIME_LEN,
    AuditRecord,
    Incident,
    IncidentStatus,
    ReceivedAlert,
)

STATUSES: Final = ("firing", "resolved")
Key = tuple[str, str, str]  # fingerprint, startsAt (ISO text), status
_BATCH: Final = 500  # fingerprints per lookup: far below every backend's bound-parameter limit


@dataclass(frozen=True)
class Received:
    """A received alert as the service reads it back."""

    fingerprint: str
    starts_at: str
    status: str
    labels: dict[str, str]
    receiver: str
    at_s: float
    incident_id: str | None


def _row(r: ReceivedAlert) -> Received:
    return Received(
        r.fingerprint, r.starts_at, r.status, dict(r.labels), r.receiver, r.at_s, r.incident_id
    )


def seen(session: Session, keys: Iterable[Key]) -> set[Key]:
    """Which of ``keys`` are stored already.

    The lookup goes by fingerprint, the first column of the unique key's index, and the rest of
    the key is compared here: SQLite answers a row-value ``IN`` over all three columns by
    scanning the whole index, which made each webhook call slower as the table grew.
    """
    wanted = set(keys)
    fingerprints = sorted({k[0] for k in wanted})
    found: set[Key] = set()
    cols = (ReceivedAlert.fingerprint, ReceivedAlert.starts_at, ReceivedAlert.status)
    with mapped_errors("cannot read received alerts"):
        for i in range(0, len(fingerprints), _BATCH):
            chunk = fingerprints[i : i + _BATCH]
            rows = session.execute(select(*cols).where(ReceivedAlert.fingerprint.in_(chunk))).all()
            for a, b, c in rows:
                key = (str(a), str(b), str(c))
                if key in wanted:
                    found.add(key)
    return found


def record(
    session: Session,
    *,
    fingerprint: str,
    starts_at: str,
    status: str,
    labels: Mapping[str, str],
    receiver: str,
    at_s: float,
    incident_id: str | None,
) -> None:
    """Keep one received alert (the caller checked ``seen``; a duplicate is a ``StoreError``)."""
    if status not in STATUSES:
        raise StoreError(f"status must be firing or resolved, got {status!r}")
    if not fingerprint or len(fingerprint) > HASH_LEN:
        raise StoreError(f"fingerprint must be 1..{HASH_LEN} characters")
    if not starts_at or len(starts_at) > ISO_TIME_LEN:
        raise StoreError(f"starts_at must be 1..{ISO_TIME_LEN} characters")
    row = ReceivedAlert(
        fingerprint=validate.text(fingerprint, "fingerprint"),
        starts_at=validate.text(starts_at, "starts_at"),
        status=status,
        labels={validate.text(k, "labels"): validate.text(v, "labels") for k, v in labels.items()},
        receiver=validate.name(receiver, "receiver"),
        at_s=validate.seconds(at_s, "at_s"),
        incident_id=incident_id,
    )
    with writing(session, f"cannot keep alert {fingerprint}"):
        session.add(row)


def record_many(session: Session, rows: Sequence[Mapping[str, object]]) -> None:
    """Keep a batch of received alerts in one INSERT (each row as ``record`` takes it).

    Every row is checked first; one bad row refuses the batch and nothing is written.
    """
    checked = []
    for r in rows:
        status = r.get("status")
        fingerprint, starts_at = r.get("fingerprint"), r.get("starts_at")
        if status not in STATUSES:
            raise StoreError(f"status must be firing or resolved, got {status!r}")
        if not isinstance(fingerprint, str) or not 0 < len(fingerprint) <= HASH_LEN:
            raise StoreError(f"fingerprint must be 1..{HASH_LEN} characters")
        if not isinstance(starts_at, str) or not 0 < len(starts_at) <= ISO_TIME_LEN:
            raise StoreError(f"starts_at must be 1..{ISO_TIME_LEN} characters")
        labels = r.get("labels")
        if not isinstance(labels, Mapping):
            raise StoreError("labels must be an object")
        incident_id = r.get("incident_id")
        checked.append(
            {
                "fingerprint": validate.text(fingerprint, "fingerprint"),
                "starts_at": validate.text(starts_at, "starts_at"),
                "status": status,
                "labels": {
                    validate.text(k, "labels"): validate.text(v, "labels")
                    for k, v in labels.items()
                },
                "receiver": validate.name(r.get("receiver"), "receiver"),
                "at_s": validate.seconds(r.get("at_s"), "at_s"),
                "incident_id": incident_id if isinstance(incident_id, str) else None,
            }
        )
    if not checked:
        return
    with mapped_errors(f"cannot keep {len(checked)} alert(s)"):
        # a Core executemany: the ORM's bulk path costs more than the INSERT itself here
        session.execute(_INSERT_RECEIVED, checked)


_INSERT_RECEIVED = insert(cast(Table, ReceivedAlert.__table__))


def open_incident_alerts(session: Session) -> list[Received]:
    """Alerts of every unresolved incident, in the order they arrived."""
    query = (
        select(ReceivedAlert)
        .join(Incident, Incident.id == ReceivedAlert.incident_id)
        .where(Incident.status != IncidentStatus.resolved)
        .order_by(ReceivedAlert.id)
    )
    with mapped_errors("cannot read received alerts"):
        return [_row(r) for r in session.scalars(query).all()]


def for_incident(session: Session, incident_id: str) -> list[Received]:
    """Every alert an incident carried, in the order they arrived."""
    query = (
        select(ReceivedAlert)
        .where(ReceivedAlert.incident_id == incident_id)
        .order_by(ReceivedAlert.id)
    )
    with mapped_errors(f"cannot read the alerts of {incident_id}"):
        return [_row(r) for r in session.scalars(query).all()]


def count(session: Session) -> int:
    """How many distinct alert events are kept."""
    from sqlalchemy import func

    with mapped_errors("cannot count received alerts"):
        return int(session.scalar(select(func.count()).select_from(ReceivedAlert)) or 0)


def audit_of(session: Session, *, action: str, subject: str | None = None) -> Sequence[AuditRecord]:
    """Audit records of one action (on one subject), oldest first."""
    query = select(AuditRecord).where(AuditRecord.action == action).order_by(AuditRecord.seq)
    if subject is not None:
        query = query.where(AuditRecord.subject == subject)
    with mapped_errors(f"cannot read {action} records"):
        return session.scalars(query).all()


def approvals(session: Session, journal_id: int) -> list[tuple[str, str, float]]:
    """(person, role, at_s) of each approval of a lever journal entry, oldest first."""
    out = []
    for rec in audit_of(session, action="lever.approve", subject=f"lever:{journal_id}"):
        out.append((rec.actor, str(rec.data.get("role", "")), rec.at_s))
    return out

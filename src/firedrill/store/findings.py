"""Action items: a drill's findings tracked to closure, one row per gap, history per run.

``track`` is called with each stored drill result: every finding of the run is raised (a new item,
the same item again, or an item reopened because the fix did not hold), in the result's unit of
work. ``close`` is a person's decision and goes to the audit log. The rules (identity, due dates,
transitions) are pure, in ``firedrill.drill.actions``; this module only keeps what they decide.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from firedrill.drill.actions import ItemStatus, identity, raised_from_report, transition
from firedrill.drill.actions import due_date as due_for
from firedrill.errors import StoreError
from firedrill.store import audit, validate
from firedrill.store.db import mapped_errors, writing
from firedrill.store.models import (
    DrillFinding,
    DrillFindingEvent,
    DrillResult,
    FindingEventKind,
    FindingStatus,
    JsonValue,
)

__all__ = ["ItemView", "close", "get", "history", "list_items", "open_at_rung", "track"]


@dataclass(frozen=True)
class ItemView:
    """An action item as the CLI, the ladder and the API show it."""

    id: str
    drill: str
    model: str
    rung: int
    kind: str
    owner: str
    text: str
    status: str
    due: str
    times_raised: int
    first_result_id: int
    last_result_id: int

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "id": self.id,
            "drill": self.drill,
            "model": self.model,
            "rung": self.rung,
            "kind": self.kind,
            "owner": self.owner,
            "text": self.text,
            "status": self.status,
            "due": self.due,
            "times_raised": self.times_raised,
            "first_result_id": self.first_result_id,
            "last_result_id": self.last_result_id,
        }


def _view(row: DrillFinding) -> ItemView:
    return ItemView(
        id=row.id,
        drill=row.drill,
        model=row.model,
        rung=row.rung,
        kind=row.kind,
        owner=row.owner,
        text=row.text,
        status=str(row.status),
        due=row.due,
        times_raised=row.times_raised,
        first_result_id=row.first_result_id,
        last_result_id=row.last_result_id,
    )


def track(*, session: Session, result: DrillResult, at: datetime) -> list[ItemView]:
    """Raise every finding of a stored result (``result.report['findings']``) as an action item."""
    if at.tzinfo is None:
        raise StoreError("at must be timezone-aware (UTC)")
    findings = result.report.get("findings") or []
    if not isinstance(findings, list):
        raise StoreError(f"drill result {result.id}: findings is not a list")
    raised = raised_from_report(
        [f for f in findings if isinstance(f, dict)],
        drill=result.name,
        model=result.model,
        rung=result.rung,
    )
    out: list[ItemView] = []
    with writing(session, f"cannot track the findings of drill result {result.id}"):
        for r in raised:
            row = session.get(DrillFinding, r.identity)
            step = transition(None if row is None else _status(row.status), event="raise", at=at)
            if row is None:
                row = DrillFinding(
                    id=r.identity,
                    key=validate.text(r.key, "key"),
                    drill=r.drill,
                    model=r.model,
                    rung=r.rung,
                    kind=validate.name(r.kind, "kind"),
                    owner=validate.name(r.owner, "owner"),
                    text=validate.prose(r.text, "text"),
                    status=FindingStatus(step.status),
                    due=due_for(r.kind, at.date()).isoformat(),
                    first_result_id=result.id,
                    last_result_id=result.id,
                    times_raised=1,
                )
                session.add(row)
            else:
                row.text = validate.prose(r.text, "text")
                row.status = FindingStatus(step.status)
                row.last_result_id = result.id
                row.times_raised += 1
            session.flush()
            session.add(
                DrillFindingEvent(
                    item_id=row.id,
                    event=FindingEventKind(step.event),
                    at=at.isoformat(),
                    by=result.run_by,
                    result_id=result.id,
                    note=step.note,
                )
            )
            out.append(_view(row))
    return out


def _status(value: FindingStatus | str) -> ItemStatus:
    return "closed" if FindingStatus(value) is FindingStatus.closed else "open"


def close(
    *, session: Session, item_id: str, by: str, note: str, at: datetime, at_s: float = 0.0
) -> ItemView:
    """Close an item (who, why), with an audit record. ``StoreError`` if unknown or closed."""
    who = validate.name(by, "by")
    why = validate.prose(note, "note")
    row = session.get(DrillFinding, item_id)
    if row is None:
        raise StoreError(f"no action item {item_id!r}")
    try:
        step = transition(_status(row.status), event="close", at=at, by=who)
    except ValueError as exc:
        raise StoreError(f"{item_id}: {exc}") from exc
    with writing(session, f"cannot close {item_id}"):
        row.status = FindingStatus(step.status)
        session.add(
            DrillFindingEvent(
                item_id=row.id,
                event=FindingEventKind(step.event),
                at=at.isoformat(),
                by=who,
                result_id=None,
                note=f"{step.note}: {why}",
            )
        )
        audit.append(
            session,
            actor=who,
            action="drill.finding_closed",
            subject=row.id,
            data={"drill": row.drill, "model": row.model, "kind": row.kind, "note": why},
            at_s=at_s,
        )
    return _view(row)


def get(*, session: Session, item_id: str) -> ItemView | None:
    with mapped_errors(f"cannot read {item_id}"):
        row = session.get(DrillFinding, item_id)
    return None if row is None else _view(row)


def history(*, session: Session, item_id: str) -> list[tuple[str, str, str, int | None, str]]:
    """(event, at, by, result id, note) of one item, oldest first."""
    query = (
        select(DrillFindingEvent)
        .where(DrillFindingEvent.item_id == item_id)
        .order_by(DrillFindingEvent.id)
    )
    with mapped_errors(f"cannot read the history of {item_id}"):
        rows = session.scalars(query).all()
    return [(str(r.event), r.at, r.by, r.result_id, r.note) for r in rows]


def list_items(
    *,
    session: Session,
    model: str | None = None,
    status: str | None = None,
    rung: int | None = None,
) -> list[ItemView]:
    """Items ordered by model, rung, due date and id (``status``: open, closed, all/None)."""
    query = select(DrillFinding)
    if status == "all":
        status = None
    if status is not None and status not in FindingStatus.__members__:
        raise StoreError(f"status is open, closed or all, got {status!r}")
    if model is not None:
        query = query.where(DrillFinding.model == model)
    if status is not None:
        query = query.where(DrillFinding.status == FindingStatus(status))
    if rung is not None:
        query = query.where(DrillFinding.rung == rung)
    with mapped_errors("cannot list action items"):
        rows = session.scalars(query).all()
    views = [_view(r) for r in rows]
    return sorted(views, key=lambda v: (v.model, v.rung, v.due, v.id))


def open_at_rung(*, session: Session, model: str, rung: int) -> list[ItemView]:
    """Open items raised by runs of ``rung`` for ``model`` (what a promotion gate checks)."""
    return list_items(session=session, model=model, status="open", rung=rung)


def identity_of(drill: str, key: str) -> str:
    """The id an item for ``key`` found by ``drill`` has (or would have)."""
    return identity(drill, key)


def results_raising(*, session: Session, item_id: str) -> Sequence[int]:
    """The ids of the drill results that raised an item, in order."""
    query = (
        select(DrillFindingEvent.result_id)
        .where(DrillFindingEvent.item_id == item_id, DrillFindingEvent.result_id.is_not(None))
        .order_by(DrillFindingEvent.id)
    )
    with mapped_errors(f"cannot read the history of {item_id}"):
        return [int(x) for x in session.scalars(query).all() if x is not None]


def counts_by_model(views: Sequence[ItemView]) -> Mapping[str, int]:
    """Open items per model."""
    out: dict[str, int] = {}
    for v in views:
        if v.status == "open":
            out[v.model] = out.get(v.model, 0) + 1
    return out

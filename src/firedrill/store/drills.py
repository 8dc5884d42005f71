"""Drill results: each game day's verdict on its ladder rung, with the full JSON report.

The ladder reads these to know which rung a model has climbed; the report keeps the seed and spec
digest, so any result can be rerun.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from firedrill.errors import StoreError
from firedrill.store import validate
from firedrill.store.db import mapped_errors, writing
from firedrill.store.models import ISO_TIME_LEN, DrillResult, JsonValue, Verdict


def record(
    *,
    session: Session,
    name: str,
    rung: int,
    model: str,
    verdict: Verdict | str,
    run_by: str,
    at_s: float,
    report: Mapping[str, JsonValue],
    runbook_author: str | None = None,
    override_reason: str | None = None,
    started_at: str | None = None,
) -> DrillResult:
    """Store a drill's result (``started_at``: wall clock, ISO 8601 with a UTC offset)."""
    row = DrillResult(
        name=validate.name(name, "name"),
        rung=validate.count(rung, "rung"),
        model=validate.name(model, "model"),
        verdict=validate.one_of(Verdict, verdict, "verdict"),
        run_by=validate.name(run_by, "run_by"),
        at_s=validate.seconds(at_s, "at_s"),
        report=validate.json_object(report, "report"),
        runbook_author=_optional(validate.name, runbook_author, "runbook_author"),
        override_reason=_optional(validate.prose, override_reason, "override_reason"),
        started_at=_optional(_wall_clock, started_at, "started_at"),
    )
    with writing(session, f"cannot store the result of drill {row.name!r}"):
        session.add(row)
    return row


def _optional(check: Callable[[object, str], str], value: str | None, field: str) -> str | None:
    return None if value is None else check(value, field)


def _wall_clock(value: object, field: str) -> str:
    """An ISO 8601 time with a UTC offset, as ``datetime.isoformat`` writes it."""
    text = validate.text(value, field)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError as exc:
        raise StoreError(f"{field} must be an ISO 8601 time, got {text!r}") from exc
    if parsed.tzinfo is None:
        raise StoreError(f"{field} must carry a UTC offset, got {text!r}")
    if len(text) > ISO_TIME_LEN:
        raise StoreError(f"{field} is longer than {ISO_TIME_LEN} characters")
    return text


def get(*, session: Session, result_id: int) -> DrillResult | None:
    """One result, or ``None``."""
    with mapped_errors(f"cannot read drill result {result_id}"):
        return session.get(DrillResult, result_id)


def list(  # shadows the builtin on purpose: callers write drills.list(...)
    *,
    session: Session,
    name: str | None = None,
    model: str | None = None,
    verdict: Verdict | str | None = None,
) -> Sequence[DrillResult]:
    """Results in time order, optionally of one drill, one model and/or one verdict."""
    query = select(DrillResult).order_by(DrillResult.at_s, DrillResult.id)
    if name is not None:
        query = query.where(DrillResult.name == name)
    if model is not None:
        query = query.where(DrillResult.model == model)
    if verdict is not None:
        query = query.where(DrillResult.verdict == validate.one_of(Verdict, verdict, "verdict"))
    with mapped_errors("cannot list drill results"):
        return session.scalars(query).all()

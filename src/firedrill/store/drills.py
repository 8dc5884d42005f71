"""Drill results: each game day's verdict on its ladder rung, with the full JSON report.

The ladder reads these to know which rung a model has climbed; the report keeps the seed and spec
digest, so any result can be rerun.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from firedrill.store import validate
from firedrill.store.db import mapped_errors, writing
from firedrill.store.models import DrillResult, JsonValue, Verdict


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
) -> DrillResult:
    """Store a drill's result."""
    row = DrillResult(
        name=validate.name(name, "name"),
        rung=validate.count(rung, "rung"),
        model=validate.name(model, "model"),
        verdict=validate.one_of(Verdict, verdict, "verdict"),
        run_by=validate.name(run_by, "run_by"),
        at_s=validate.seconds(at_s, "at_s"),
        report=validate.json_object(report, "report"),
    )
    with writing(session, f"cannot store the result of drill {row.name!r}"):
        session.add(row)
    return row


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

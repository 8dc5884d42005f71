"""The drill ladder over stored results: gate a rung, record a run, read the history.

The rules live in ``firedrill.drill.ladder`` (pure); this service feeds them the stored drill
results and writes what the rules ask to be kept: each run with who ran it and who wrote its
runbook, and, when the gate was overridden, the reason, both on the result and in the audit log.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from firedrill.drill.ladder import Gate, LadderRun, gate, rotation_warnings, rung_number
from firedrill.errors import StoreError
from firedrill.store import audit, drills
from firedrill.store import findings as action_items
from firedrill.store.db import mapped_errors
from firedrill.store.models import DrillResult, JsonValue

__all__ = ["LadderCheck", "check", "record", "runs"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class LadderCheck:
    """The gate's answer for a run, and the rotation warnings that go with it."""

    gate: Gate
    warnings: tuple[str, ...]


def _as_run(row: DrillResult) -> LadderRun:
    # Results stored before the ladder columns existed have no wall clock: order them by their
    # simulated time, before every run that has one.
    started = (
        datetime.fromisoformat(row.started_at)
        if row.started_at
        else _EPOCH + timedelta(seconds=max(row.at_s, 0.0))
    )
    return LadderRun(
        drill=row.name,
        model=row.model,
        rung=row.rung,
        verdict=str(row.verdict),
        run_by=row.run_by,
        started_at=started,
        runbook_author=row.runbook_author,
        override_reason=row.override_reason,
    )


def runs(*, session: Session, model: str | None = None) -> list[LadderRun]:
    """Every stored run (of one model), oldest first."""
    query = select(DrillResult).order_by(DrillResult.id)
    if model is not None:
        query = query.where(DrillResult.model == model)
    with mapped_errors("cannot read drill results"):
        rows = session.scalars(query).all()
    return sorted((_as_run(r) for r in rows), key=lambda r: r.started_at)


def check(
    *,
    session: Session,
    model: str,
    rung: int | str,
    run_by: str,
    runbook_author: str | None = None,
    override_reason: str | None = None,
    require_closed_findings: bool = False,
) -> LadderCheck:
    """May ``rung`` run for ``model`` now, and what should the person running it hear?

    With ``require_closed_findings`` the action items raised at the rung below must be closed.
    """
    number = _rung(rung)
    history = runs(session=session, model=model)
    open_below: list[str] = []
    if require_closed_findings and number > 0:
        open_below = [
            v.id for v in action_items.open_at_rung(session=session, model=model, rung=number - 1)
        ]
    return LadderCheck(
        gate=gate(
            history,
            model=model,
            rung=number,
            override_reason=override_reason,
            open_below=open_below,
            require_closed=require_closed_findings,
        ),
        warnings=tuple(
            rotation_warnings(
                history, model=model, rung=number, run_by=run_by, runbook_author=runbook_author
            )
        ),
    )


def record(
    *,
    session: Session,
    name: str,
    model: str,
    rung: int | str,
    verdict: str,
    run_by: str,
    at_s: float,
    report: Mapping[str, JsonValue],
    started_at: datetime,
    runbook_author: str | None = None,
    override_reason: str | None = None,
    require_closed_findings: bool = False,
) -> tuple[DrillResult, LadderCheck]:
    """Store one run; refused (``StoreError``) if the gate refuses it and no reason overrides.

    An override's reason is kept on the result and appended to the audit log, by ``run_by``.
    The run's findings become (or raise again) action items (``store.action_items``).
    """
    if started_at.tzinfo is None:
        raise StoreError("started_at must be timezone-aware (UTC)")
    number = _rung(rung)
    reason = (override_reason or "").strip() or None
    answer = check(
        session=session,
        model=model,
        rung=number,
        run_by=run_by,
        runbook_author=runbook_author,
        override_reason=reason,
        require_closed_findings=require_closed_findings,
    )
    if not answer.gate.allowed:
        raise StoreError(f"the ladder refuses this run: {answer.gate.reason}")
    row = drills.record(
        session=session,
        name=name,
        rung=number,
        model=model,
        verdict=verdict,
        run_by=run_by,
        at_s=at_s,
        report=report,
        runbook_author=runbook_author,
        override_reason=reason if answer.gate.overridden else None,
        started_at=started_at.astimezone(UTC).isoformat(),
    )
    action_items.track(session=session, result=row, at=started_at.astimezone(UTC))
    if answer.gate.overridden:
        audit.append(
            session,
            actor=run_by,
            action="drill.ladder_override",
            subject=name,
            data={
                "model": model,
                "rung": f"L{number}",
                "reason": reason,
                "gate": answer.gate.reason,
                "verdict": verdict,
            },
            at_s=at_s,
        )
    return row, answer


def _rung(rung: int | str) -> int:
    try:
        return rung_number(rung)
    except ValueError as exc:
        raise StoreError(str(exc)) from exc

"""The ladder over stored drill results, on SQLite and PostgreSQL; ``firedrill gameday ladder``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from firedrill.cli import app
from firedrill.drill.result import DrillReport
from firedrill.errors import StoreError
from firedrill.store import Store, audit, drills, open_store
from firedrill.store import ladder as stored
from firedrill.store.models import JsonValue

T0 = datetime(2025, 10, 1, 14, 0, tzinfo=UTC)
REPORT: dict[str, JsonValue] = {"drill": "x", "verdict": "passed", "hypothesis": []}


def _record(
    s: Session,
    rung: int,
    verdict: str = "passed",
    *,
    day: float,
    by: str = "alice",
    author: str | None = None,
    override: str | None = None,
    model: str = "llm-70b",
) -> None:
    stored.record(
        session=s,
        name=f"l{rung}-{model}",
        model=model,
        rung=f"L{rung}",
        verdict=verdict,
        run_by=by,
        at_s=600.0,
        report=REPORT,
        started_at=T0 + timedelta(days=day),
        runbook_author=author,
        override_reason=override,
    )


def test_runs_are_gated_recorded_and_read_back(store: Store) -> None:
    with store.session() as s:
        _record(s, 0, day=1, by="alice", author="bob")
        _record(s, 0, day=2, by="bob", author="bob")
        with pytest.raises(StoreError, match="needs L1 passed twice in a row"):
            _record(s, 2, day=3)
    with store.session() as s:
        runs = stored.runs(session=s)
        assert [(r.rung, r.run_by, r.runbook_author) for r in runs] == [
            (0, "alice", "bob"),
            (0, "bob", "bob"),
        ]
        assert runs[0].started_at == T0 + timedelta(days=1)
        check = stored.check(session=s, model="llm-70b", rung="L1", run_by="bob")
        assert check.gate.allowed
        assert check.warnings == ()
        check = stored.check(session=s, model="llm-70b", rung=0, run_by="bob", runbook_author="bob")
        assert len(check.warnings) == 2  # twice in a row, and the runbook's author
        assert [r.name for r in drills.list(session=s, model="llm-70b")] == ["l0-llm-70b"] * 2


def test_an_override_is_kept_on_the_result_and_in_the_audit_log(store: Store) -> None:
    with store.session() as s:
        _record(s, 5, day=1, by="carol", override="regional exit review needs L5 evidence")
        _record(s, 0, day=2, by="carol", override="not needed at L0")
    with store.session() as s:
        l5, l0 = drills.list(session=s)
        assert l5.override_reason == "regional exit review needs L5 evidence"
        assert l0.override_reason is None  # the gate was open: nothing was overridden
        assert l5.started_at == (T0 + timedelta(days=1)).isoformat()
        (record,) = audit.records(s)
        assert (record.actor, record.action, record.subject) == (
            "carol",
            "drill.ladder_override",
            "l5-llm-70b",
        )
        assert record.data["reason"] == "regional exit review needs L5 evidence"
        assert record.data["rung"] == "L5"
        assert audit.verify(s).ok


def test_bad_ladder_input_is_refused(store: Store) -> None:
    with store.session() as s:
        with pytest.raises(StoreError, match=r"L0\.\.L7"):
            _record(s, 9, day=1)
        with pytest.raises(StoreError, match="timezone-aware"):
            stored.record(
                session=s, name="l0", model="m", rung=0, verdict="passed", run_by="a",
                at_s=0.0, report={}, started_at=datetime(2025, 1, 1),
            )  # fmt: skip
        with pytest.raises(StoreError, match="started_at must carry a UTC offset"):
            drills.record(
                session=s, name="l0", rung=0, model="m", verdict="passed", run_by="a",
                at_s=0.0, report={}, started_at="2025-01-01T00:00:00",
            )  # fmt: skip


def test_gameday_ladder_shows_each_model(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'store.db'}"
    now = datetime.now(UTC)
    with open_store(db) as store:
        store.migrate()
        with store.session() as s:
            for k, by in enumerate(["alice", "bob", "carol", "dave", "erin", "frank"]):
                rung = k // 2
                stored.record(
                    session=s, name=f"l{rung}", model="llm-70b", rung=rung, verdict="passed",
                    run_by=by, at_s=0.0, report={}, started_at=now - timedelta(days=90 - k),
                )  # fmt: skip
            stored.record(
                session=s, name="l5-blackhole", model="llm-70b", rung=5, verdict="passed",
                run_by="gina", at_s=0.0, report={}, started_at=now - timedelta(days=41),
                override_reason="skip to L5 for the audit", runbook_author="gina",
            )  # fmt: skip
    runner = CliRunner()
    result = runner.invoke(app, ["gameday", "ladder", "--db", db], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "last successful L5 for llm-70b: 41 days ago" in result.output
    row = next(line for line in result.output.splitlines() if "llm-70b" in line)
    assert "L5" in row
    assert "L3" in row
    assert "gina ran a drill of a runbook they wrote (l5-blackhole)" in result.output
    result = runner.invoke(
        app, ["gameday", "ladder", "--db", db, "--model", "llm-70b"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert "region blackhole with replication paused" in result.output
    empty = runner.invoke(app, ["gameday", "ladder", "--db", db, "--model", "llm-8b"])
    assert empty.exit_code == 0
    assert "no drill results yet for llm-8b" in empty.output
    missing = runner.invoke(app, ["gameday", "ladder", "--db", f"sqlite:///{tmp_path}/none.db"])
    assert missing.exit_code == 4


def _report(drill: str, verdict: str) -> DrillReport:
    """The smallest drill report: a verdict and nothing measured."""
    marks = dict.fromkeys(
        ("t0_s", "page_s", "first_lever_s", "last_shift_s", "scale_out_s", "hydrated_s"), None
    )
    return DrillReport.from_json(
        {
            "drill": drill, "rung": "L0", "seed": 0, "spec_sha256": "", "verdict": verdict,
            "reason": "", "run_by": None, "runbook_author": None, "abort_owner": None,
            "target": {"model": "llm-70b"}, "survivor": [], "t0_s": 0.0, "steady_state_s": 0.0,
            "end_s": 0.0, "hypothesis": [], "stop_conditions": [], "injected": [],
            "rto": {
                "budget_s": None, "measured_s": None, "within_budget": None, "terms": {},
                "planned": {}, "posture_problem": False,
                "marks": {**marks, "users_served_s": None},
            },
            "reverted": {"all": True, "injections": []}, "security_floor": [],
            "admission": {"admitted": 0, "denied": 0, "unsigned_admitted": None},
            "hydrate": {}, "hydrate_by_region": {}, "failback": {"steps": []},
            "dependencies": [], "findings": [], "chains": [], "levers": [], "incidents": [],
            "refused": [], "timeline": [], "charts": {},
        }
    )  # fmt: skip


def test_the_run_hooks_gate_and_persist(tmp_path: Path) -> None:
    from firedrill.app.gameday import check_ladder, persist_drill

    db = f"sqlite:///{tmp_path / 'store.db'}"
    now = datetime.now(UTC)
    first = check_ladder(db=db, model="llm-70b", rung="L1", run_by="alice")
    assert not first.gate.allowed
    assert "L1 for llm-70b needs L0 passed twice in a row" in first.gate.reason
    for k, by in enumerate(["alice", "bob"]):
        result = _report("l0-tabletop", "passed")
        started = now - timedelta(hours=2 - k)
        result_id, _ = persist_drill(
            db=db, report=result, model="llm-70b", rung="L0", run_by=by, started_at=started,
            at_s=0.0,
        )  # fmt: skip
        assert result_id == k + 1
    rotated = check_ladder(db=db, model="llm-70b", rung="L1", run_by="bob", runbook_author="bob")
    assert rotated.gate.allowed
    assert any("wrote the runbook of this drill" in w for w in rotated.warnings)
    forced = check_ladder(db=db, model="llm-70b", rung=4, run_by="carol", override_reason="why")
    assert forced.gate.allowed
    assert forced.gate.overridden
    with pytest.raises(StoreError, match="refuses"):  # L3 with two L0 runs: the gate is closed
        persist_drill(
            db=db, report=_report("x", "passed"), model="llm-70b", rung=3, run_by="a",
            started_at=now, at_s=0.0,
        )  # fmt: skip
    with open_store(db) as store, store.session() as s:
        assert [(r.run_by, r.rung) for r in drills.list(session=s)] == [("alice", 0), ("bob", 0)]

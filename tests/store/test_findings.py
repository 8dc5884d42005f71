"""Drill findings as tracked action items, on SQLite and PostgreSQL: identity across runs, the
history, closing, reopening, and the ladder gate that waits for the rung below's items."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from firedrill.cli import app
from firedrill.drill.actions import identity
from firedrill.errors import StoreError
from firedrill.store import Store, audit, open_store
from firedrill.store import findings as items
from firedrill.store import ladder as stored
from firedrill.store.models import JsonValue

T0 = datetime(2026, 11, 2, 19, 0, tzinfo=UTC)
KEYS = ("dependency:probe-idp", "chain:ecc_dbe:health_condition", "rto_term:detect_s", "stop:x")


def _finding(key: str, text: str = "") -> dict[str, JsonValue]:
    return {"kind": "runbook_step", "text": text or f"gap {key}", "owner": "sre", "key": key}


def _record(
    s: object,
    rung: int,
    keys: tuple[str, ...],
    *,
    day: float,
    verdict: str = "passed",
    by: str = "alice",
    require_closed: bool = False,
    override: str | None = None,
    texts: dict[str, str] | None = None,
) -> int:
    report: dict[str, JsonValue] = {
        "drill": f"l{rung}",
        "verdict": verdict,
        "findings": [_finding(k, (texts or {}).get(k, "")) for k in keys],
    }
    row, _ = stored.record(
        session=s,  # type: ignore[arg-type]
        name=f"l{rung}",
        model="llm-70b",
        rung=rung,
        verdict=verdict,
        run_by=by,
        at_s=60.0,
        report=report,
        started_at=T0 + timedelta(days=day),
        override_reason=override,
        require_closed_findings=require_closed,
    )
    return row.id


def test_a_finding_raised_again_is_the_same_item_with_history(store: Store) -> None:
    with store.session() as s:
        first = _record(s, 0, (KEYS[0], KEYS[1]), day=0, texts={KEYS[0]: "seen 440 times"})
        second = _record(s, 0, (KEYS[0],), day=1, by="bob", texts={KEYS[0]: "seen 17 times"})
    with store.session() as s:
        rows = items.list_items(session=s, status="all")
        assert len(rows) == 2
        item = next(r for r in rows if r.id == identity("l0", KEYS[0]))
        # the wording follows the latest run; the identity and the first run do not change
        assert (item.times_raised, item.first_result_id, item.last_result_id) == (2, first, second)
        assert item.text == "seen 17 times"
        assert item.due == "2026-12-02"  # runbook steps are due 30 days after they are raised
        events = [e[0] for e in items.history(session=s, item_id=item.id)]
        assert events == ["raised", "raised_again"]


def test_close_is_audited_and_a_finding_seen_again_reopens(store: Store) -> None:
    ident = identity("l0", KEYS[2])
    with store.session() as s:
        _record(s, 0, (KEYS[2],), day=0)
        items.close(session=s, item_id=ident, by="carol", note="alert tuned in #123", at=T0)
        with pytest.raises(StoreError, match="already closed"):
            items.close(session=s, item_id=ident, by="carol", note="again", at=T0)
        with pytest.raises(StoreError, match="no action item"):
            items.close(session=s, item_id="FND-000000000000", by="carol", note="x", at=T0)
        assert items.get(session=s, item_id=ident).status == "closed"  # type: ignore[union-attr]
        _record(s, 0, (KEYS[2],), day=2)
    with store.session() as s:
        view = items.get(session=s, item_id=ident)
        assert view is not None
        assert view.status == "open"
        events = [e[0] for e in items.history(session=s, item_id=ident)]
        assert events == ["raised", "closed", "reopened"]
        record = [r for r in audit.records(s) if r.action == "drill.finding_closed"]
        assert [(r.actor, r.subject) for r in record] == [("carol", ident)]


def test_the_ladder_gate_waits_for_the_items_of_the_rung_below(store: Store) -> None:
    with store.session() as s:
        _record(s, 0, (KEYS[0],), day=0)
        _record(s, 0, (), day=1, by="bob")
        # L0 passed twice in a row, but its run raised an item that is still open
        check = stored.check(
            session=s, model="llm-70b", rung=1, run_by="carol", require_closed_findings=True
        )
        assert not check.gate.allowed
        assert identity("l0", KEYS[0]) in check.gate.reason
        assert "action items raised at L0 closed" in check.gate.reason
        # without the requirement the ladder is as before
        assert stored.check(session=s, model="llm-70b", rung=1, run_by="carol").gate.allowed
        with pytest.raises(StoreError, match="action items raised at L0"):
            _record(s, 1, (), day=2, by="carol", require_closed=True)
        # an override runs it, recorded and audited
        _record(s, 1, (), day=2, by="carol", require_closed=True, override="fix ships Friday")
        overrides = [r for r in audit.records(s) if r.action == "drill.ladder_override"]
        assert len(overrides) == 1
        assert "action items" in str(overrides[0].data["gate"])
        items.close(session=s, item_id=identity("l0", KEYS[0]), by="dan", note="fixed", at=T0)
        check = stored.check(
            session=s, model="llm-70b", rung=1, run_by="erin", require_closed_findings=True
        )
        assert check.gate.allowed
        assert "action items are closed" in check.gate.reason


# a run raises some of the keys; a person may close an open item in between
Step = tuple[str, frozenset[str]]
steps = st.lists(
    st.tuples(
        st.sampled_from(["run", "close"]),
        st.frozensets(st.sampled_from(KEYS), max_size=len(KEYS)),
    ),
    min_size=1,
    max_size=8,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(plan=steps)
def test_identity_and_status_follow_the_runs(
    tmp_path_factory: pytest.TempPathFactory, plan: list[Step]
) -> None:
    """Whatever the order of runs and closes: one item per gap, raised as often as runs found it,
    open exactly when the last thing that happened to it was a run finding it."""
    url = f"sqlite:///{tmp_path_factory.mktemp('findings')}/f.db"
    expected: dict[str, tuple[int, str, int]] = {}  # key -> (times raised, status, events)
    with open_store(url) as store:
        store.migrate()
        with store.session() as s:
            day = 0.0
            for action, keys in plan:
                day += 1
                if action == "run":
                    _record(s, 0, tuple(sorted(keys)), day=day)
                    for k in keys:
                        n, _, e = expected.get(k, (0, "open", 0))
                        expected[k] = (n + 1, "open", e + 1)
                else:
                    for k in sorted(keys):
                        if k in expected and expected[k][1] == "open":
                            items.close(
                                session=s, item_id=identity("l0", k), by="ops", note="done", at=T0
                            )
                            n, _, e = expected[k]
                            expected[k] = (n, "closed", e + 1)
        with store.session() as s:
            rows = {r.id: r for r in items.list_items(session=s, status="all")}
            assert set(rows) == {identity("l0", k) for k in expected}
            for k, (n, status, events) in expected.items():
                row = rows[identity("l0", k)]
                assert (row.times_raised, row.status) == (n, status)
                assert len(items.history(session=s, item_id=row.id)) == events


def test_findings_cli_lists_shows_and_closes(tmp_path: object) -> None:
    from pathlib import Path

    url = f"sqlite:///{Path(str(tmp_path)) / 'cli.db'}"
    with open_store(url) as store:
        store.migrate()
        with store.session() as s:
            _record(s, 0, (KEYS[0], "weird:[bold]not markup[/]"), day=0)
    runner = CliRunner()
    listed = runner.invoke(app, ["gameday", "findings", "--db", url, "--json"])
    assert listed.exit_code == 0, listed.output
    ident = identity("l0", KEYS[0])
    assert ident in listed.output
    shown = runner.invoke(app, ["gameday", "findings", "show", ident, "--db", url])
    assert shown.exit_code == 0
    assert "raised" in shown.output
    closed = runner.invoke(
        app, ["gameday", "findings", "close", ident, "--by", "alice", "--note", "done", "--db", url]
    )
    assert closed.exit_code == 0, closed.output
    again = runner.invoke(
        app, ["gameday", "findings", "close", ident, "--by", "alice", "--note", "done", "--db", url]
    )
    assert again.exit_code == 4
    assert "already closed" in again.output
    table = runner.invoke(app, ["gameday", "findings", "--db", url, "--status", "all"])
    assert table.exit_code == 0
    assert "[bold]not markup[/]" in table.output.replace("\n", "")

"""The store on SQLite and PostgreSQL: migrations, every table's services, refused input.

Every test that touches a database runs on both (the ``store``/``db_url`` fixtures); reads happen
in a fresh session, so they see what was committed, not the session's cache.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import func, inspect, select, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from firedrill.errors import FiredrillError, StoreError
from firedrill.store import (
    ActionKind,
    Channel,
    IncidentStatus,
    LeverStatus,
    Role,
    Store,
    Verdict,
    breakglass,
    comms,
    drills,
    incidents,
    levers,
    open_store,
    postmortems,
    roles,
    timeline,
)
from firedrill.store.db import parse_url
from firedrill.store.models import Base, Incident, TimelineEvent

TABLES = {
    "incidents",
    "timeline_events",
    "role_assignments",
    "handoffs",
    "lever_journal",
    "comms",
    "breakglass_grants",
    "postmortems",
    "action_items",
    "drill_results",
    "audit_log",
}

HOUR_S = 3600.0


def _open(s: Session, sev: int = 2, cell: str = "use1-a") -> Incident:
    return incidents.create(
        session=s,
        cell=cell,
        region="us-east-1",
        title="TTFT burn on llama-70b",
        sev=sev,
        opened_at_s=4 * HOUR_S,
    )


# --- migrations and URLs ------------------------------------------------------------------------


def test_migrations_apply_from_scratch_and_match_the_models(db_url: str) -> None:
    with open_store(db_url) as store:
        assert store.revision() is None
        store.migrate()
        assert store.revision() == store.head_revision()
        store.migrate()  # already at head: nothing to do
        with store.engine.connect() as conn:
            assert set(inspect(conn).get_table_names()) >= TABLES
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(ctx, Base.metadata) == []


def test_postgresql_urls_go_through_psycopg() -> None:
    assert parse_url("postgresql://u:pw@db:5432/fd").drivername == "postgresql+psycopg"
    assert parse_url("postgres://u@db/fd").drivername == "postgresql+psycopg"
    assert parse_url("sqlite:///firedrill.db").drivername == "sqlite"
    for bad in ("mysql://u@db/fd", "postgresql+psycopg2://u@db/fd", "not a url"):
        with pytest.raises(StoreError):
            parse_url(bad)


def test_unreachable_postgresql_is_a_store_error_without_the_password() -> None:
    store = open_store("postgresql://fd:s3cret@127.0.0.1:1/fd")  # nothing listens on port 1
    with pytest.raises(StoreError) as info, store, store.session() as s:
        incidents.list(session=s)
    assert isinstance(info.value.__cause__, OperationalError)
    assert "s3cret" not in str(info.value)


def test_read_only_store_refuses_writes_and_missing_files(store: Store, tmp_path: Any) -> None:
    with store.session() as s:
        _open(s)
    with pytest.raises(StoreError, match="no store"):
        open_store(f"sqlite:///{tmp_path / 'absent.db'}", read_only=True)
    assert not (tmp_path / "absent.db").exists()
    url = store.url.render_as_string(hide_password=False)
    with open_store(url, read_only=True) as ro:
        with ro.session() as s:
            assert [i.id for i in incidents.list(session=s)] == ["INC-0001"]
        with pytest.raises(StoreError), ro.session() as s:
            _open(s)


# --- each table ---------------------------------------------------------------------------------


def test_incidents_number_list_escalate_mitigate_resolve(store: Store) -> None:
    with store.session() as s:
        first = _open(s, sev=3)
        second = _open(s, sev=2, cell="use1-b")
    assert (first.id, second.id) == ("INC-0001", "INC-0002")
    with store.session() as s:
        incidents.escalate(session=s, incident_id=first.id, sev=1)
        with pytest.raises(StoreError, match="only goes up"):
            incidents.escalate(session=s, incident_id=first.id, sev=4)
        incidents.mitigate(session=s, incident_id=first.id, at_s=5 * HOUR_S)
        incidents.resolve(session=s, incident_id=second.id, at_s=6 * HOUR_S)
        with pytest.raises(StoreError, match="already resolved"):
            incidents.resolve(session=s, incident_id=second.id, at_s=7 * HOUR_S)
    with store.session() as s:
        got = incidents.get(session=s, incident_id=first.id)
        assert got is not None
        assert (got.sev, got.status, got.mitigated_at_s) == (
            1,
            IncidentStatus.mitigated,
            5 * HOUR_S,
        )
        assert got.resolved_at_s is None
        assert incidents.get(session=s, incident_id="INC-9999") is None
        assert [i.id for i in incidents.list(session=s)] == ["INC-0001", "INC-0002"]
        resolved = incidents.list(session=s, status="resolved")
        assert [(i.id, i.mitigated_at_s, i.resolved_at_s) for i in resolved] == [
            ("INC-0002", 6 * HOUR_S, 6 * HOUR_S)
        ]
        assert [i.id for i in incidents.list(session=s, cell="use1-b")] == ["INC-0002"]


def test_timeline_keeps_time_order_and_data(store: Store) -> None:
    with store.session() as s:
        inc = _open(s)
        timeline.add(
            session=s,
            incident_id=inc.id,
            at_s=120.0,
            kind="lever",
            actor="alice",
            text="drained use1-a to 50%",
            data={"weights": {"use1-a": 50, "use1-b": 150}},
        )
        timeline.add(
            session=s,
            incident_id=inc.id,
            at_s=60.0,
            kind="page",
            actor="alertmanager",
            text="FastBurn paged",
        )
    with store.session() as s:
        events = timeline.list(session=s, incident_id=inc.id)
        assert [(e.at_s, e.kind) for e in events] == [(60.0, "page"), (120.0, "lever")]
        assert events[1].data == {"weights": {"use1-a": 50, "use1-b": 150}}
        assert events[0].data == {}
        assert [e.kind for e in timeline.list(session=s, incident_id=inc.id, kind="page")] == [
            "page"
        ]


def test_roles_and_handoffs(store: Store) -> None:
    with store.session() as s:
        inc = _open(s)
        roles.assign(
            session=s,
            incident_id=inc.id,
            role=Role.incident_commander,
            person="Ana",
            since_s=4 * HOUR_S,
        )
        roles.assign(session=s, incident_id=inc.id, role="scribe", person="Cy", since_s=4 * HOUR_S)
        h = roles.handoff(
            session=s,
            incident_id=inc.id,
            role="incident_commander",
            to_person="Bo",
            at_s=28 * HOUR_S,
            open_threads=["A", "B"],
            next_update_s=28.5 * HOUR_S,
        )
    assert h.text == "IC handing to Bo at 04:00 UTC; open threads A, B; next update 04:30"
    with store.session() as s:
        now = roles.current(session=s, incident_id=inc.id)
        assert {r: a.person for r, a in now.items()} == {
            Role.incident_commander: "Bo",
            Role.scribe: "Cy",
        }
        assert [a.person for a in roles.history(session=s, incident_id=inc.id)] == [
            "Ana",
            "Cy",
            "Bo",
        ]
        (stored,) = roles.handoffs(session=s, incident_id=inc.id)
        assert (stored.from_person, stored.to_person, stored.open_threads) == (
            "Ana",
            "Bo",
            ["A", "B"],
        )
        assert stored.role is Role.incident_commander
        with pytest.raises(StoreError, match="already holds"):
            roles.handoff(
                session=s,
                incident_id=inc.id,
                role="incident_commander",
                to_person="Bo",
                at_s=29 * HOUR_S,
                open_threads=[],
                next_update_s=30 * HOUR_S,
            )


def test_lever_journal_requires_inverse_and_reasons(store: Store) -> None:
    op = {"op": "patch_route_weights", "route": "llama-70b", "weights": {"use1-a": 0}}
    inverse = {"op": "patch_route_weights", "route": "llama-70b", "weights": {"use1-a": 100}}
    with store.session() as s:
        inc = _open(s)
        levers.record(
            session=s,
            incident_id=inc.id,
            kind="drain_cell",
            scope="cell/use1-a",
            op=op,
            inverse=inverse,
            status=LeverStatus.applied,
            at_s=300.0,
            approvers=["ana", "bo"],
        )
        levers.record(
            session=s,
            incident_id=inc.id,
            kind="disable_admission",
            scope="fleet",
            op={"op": "admission", "failurePolicy": "Ignore"},
            inverse=None,
            status="refused",
            reason="containment never widens access",
            at_s=200.0,
        )
        with pytest.raises(StoreError, match="inverse"):
            levers.record(
                session=s,
                incident_id=inc.id,
                kind="drain_cell",
                scope="cell/use1-b",
                op=op,
                inverse=None,
                status="applied",
                at_s=400.0,
            )
        with pytest.raises(StoreError, match="reason"):
            levers.record(
                session=s,
                incident_id=inc.id,
                kind="x",
                scope="fleet",
                op=op,
                inverse=None,
                status="refused",
                at_s=400.0,
            )
    with store.session() as s:
        journal = levers.list(session=s, incident_id=inc.id)
        assert [(e.status, e.kind) for e in journal] == [
            (LeverStatus.refused, "disable_admission"),
            (LeverStatus.applied, "drain_cell"),
        ]
        assert journal[1].inverse == inverse
        assert journal[1].approvers == ["ana", "bo"]
        applied = levers.list(session=s, incident_id=inc.id, status="applied")
        assert [e.op for e in applied] == [op]


def test_comms(store: Store) -> None:
    with store.session() as s:
        inc = _open(s)
        comms.post(
            session=s,
            incident_id=inc.id,
            channel=Channel.status_page,
            text="Elevated latency in us-east-1",
            at_s=600.0,
            due_s=900.0,
        )
        comms.post(
            session=s, incident_id=inc.id, channel="incident_channel", text="IC: Ana", at_s=30.0
        )
    with store.session() as s:
        updates = comms.list(session=s, incident_id=inc.id)
        assert [(u.channel, u.at_s, u.due_s) for u in updates] == [
            (Channel.incident_channel, 30.0, None),
            (Channel.status_page, 600.0, 900.0),
        ]
        page = comms.list(session=s, incident_id=inc.id, channel="status_page")
        assert [u.text for u in page] == ["Elevated latency in us-east-1"]


def test_breakglass_grant_expire_reap(store: Store) -> None:
    with store.session() as s:
        inc = _open(s)
        g = breakglass.grant(
            session=s,
            incident_id=inc.id,
            identity="sre-ana-breakglass",
            requested_by="ana",
            approved_by=["bo", "cy"],
            granted_at_s=100.0,
            expires_at_s=3700.0,
            scope="nodes:patch",
        )
        with pytest.raises(StoreError, match="own"):
            breakglass.grant(
                session=s,
                incident_id=inc.id,
                identity="x",
                requested_by="ana",
                approved_by=["ana", "bo"],
                granted_at_s=100.0,
                expires_at_s=200.0,
                scope="nodes:patch",
            )
        with pytest.raises(StoreError, match="expires"):
            breakglass.grant(
                session=s,
                incident_id=inc.id,
                identity="x",
                requested_by="ana",
                approved_by=["bo", "cy"],
                granted_at_s=100.0,
                expires_at_s=100.0,
                scope="nodes:patch",
            )
    with store.session() as s:
        assert [x.id for x in breakglass.list(session=s, live_at_s=200.0)] == [g.id]
        assert breakglass.list(session=s, live_at_s=3700.0) == []
        assert [x.id for x in breakglass.due_for_reaping(session=s, at_s=3700.0)] == [g.id]
        breakglass.reap(session=s, grant_id=g.id, at_s=3710.0)
        with pytest.raises(StoreError, match="already reaped"):
            breakglass.reap(session=s, grant_id=g.id, at_s=3720.0)
        with pytest.raises(StoreError, match="no break-glass grant"):
            breakglass.reap(session=s, grant_id=g.id + 100, at_s=3720.0)
    with store.session() as s:
        (stored,) = breakglass.list(session=s, incident_id=inc.id)
        assert (stored.approved_by, stored.reaped_at_s) == (["bo", "cy"], 3710.0)
        assert breakglass.due_for_reaping(session=s, at_s=9999.0) == []


@pytest.mark.parametrize(
    ("requested_by", "approved_by", "scope", "why"),
    [
        ("ana", ["bo", "Bo"], "nodes:patch", "names someone twice"),
        ("ana", ["bo", " BO\u200b"], "nodes:patch", "names someone twice"),
        ("ana", ["ANA", "bo"], "nodes:patch", "own"),
        ("ana", ["bo"], "nodes:patch", "two distinct approvers"),
        ("ana", ["sre-Ana-Breakglass", "bo"], "nodes:patch", "own"),
        ("ana", ["bo", "cy"], "*", "never a break-glass scope"),
        ("ana", ["bo", "cy"], "system:masters,view", "never a break-glass scope"),
        ("ana", ["bo", "cy"], "cluster_admin", "never a break-glass scope"),
    ],
)
def test_breakglass_grant_keeps_the_two_person_rule_and_the_scope_allowlist(
    store: Store, requested_by: str, approved_by: list[str], scope: str, why: str
) -> None:
    with store.session() as s:
        inc = _open(s)
        with pytest.raises(StoreError, match=why):
            breakglass.grant(
                session=s,
                incident_id=inc.id,
                identity="sre-ana-breakglass",
                requested_by=requested_by,
                approved_by=approved_by,
                granted_at_s=100.0,
                expires_at_s=3700.0,
                scope=scope,
            )
    with store.session() as s:
        assert breakglass.list(session=s) == []


def test_postmortem_and_action_items(store: Store) -> None:
    with store.session() as s:
        inc = _open(s)
        pm = postmortems.create(
            session=s,
            incident_id=inc.id,
            ttd_s=240.0,
            ttm_s=1500.0,
            ttr_s=7200.0,
            gpu_hours_lost=1250.5,
            requests_failed=3_400_000,
            tokens_refunded=9_000_000_000,
            root_cause_class="bad_rollout",
            text="A node image rolled out to every cell at once.",
        )
        postmortems.add_action_item(
            session=s,
            postmortem_id=pm.id,
            kind=ActionKind.alert,
            text="Page on phantom XID rate",
            owner="obs",
        )
        postmortems.add_action_item(
            session=s,
            postmortem_id=pm.id,
            kind="game_day_scenario",
            text="Drill a bad node image in one cell",
            owner="sre",
        )
        with pytest.raises(StoreError, match="one of"):
            postmortems.add_action_item(
                session=s, postmortem_id=pm.id, kind="meeting", text="Discuss", owner="sre"
            )
        with pytest.raises(StoreError, match="ttd_s <= ttm_s <= ttr_s"):
            postmortems.create(
                session=s,
                incident_id=inc.id,
                ttd_s=10.0,
                ttm_s=5.0,
                ttr_s=20.0,
                gpu_hours_lost=0.0,
                requests_failed=0,
                tokens_refunded=0,
                root_cause_class="x",
                text="y",
            )
    with store.session() as s:
        got = postmortems.get(session=s, incident_id=inc.id)
        assert got is not None
        assert (got.tokens_refunded, got.gpu_hours_lost) == (9_000_000_000, 1250.5)
        items = postmortems.action_items(session=s, postmortem_id=got.id)
        assert [(i.kind, i.owner) for i in items] == [
            (ActionKind.alert, "obs"),
            (ActionKind.game_day_scenario, "sre"),
        ]
        assert [i.text for i in got.action_items] == [i.text for i in items]


def test_drill_results(store: Store) -> None:
    report = {"seed": 7, "spec_sha256": "ab" * 32, "rto_s": {"detect": 62.0, "shift": 180.5}}
    with store.session() as s:
        r = drills.record(
            session=s,
            name="cell-evacuation",
            rung=2,
            model="llama-70b",
            verdict=Verdict.passed,
            run_by="ana",
            at_s=1000.0,
            report=report,
        )
        drills.record(
            session=s,
            name="cell-evacuation",
            rung=2,
            model="llama-70b",
            verdict="aborted",
            run_by="bo",
            at_s=2000.0,
            report={},
        )
        drills.record(
            session=s,
            name="region-blackhole",
            rung=4,
            model="llama-70b",
            verdict="failed",
            run_by="bo",
            at_s=1500.0,
            report={},
        )
    with store.session() as s:
        got = drills.get(session=s, result_id=r.id)
        assert got is not None
        assert got.report == report
        assert got.verdict is Verdict.passed
        runs = drills.list(session=s, name="cell-evacuation")
        assert [x.verdict for x in runs] == [Verdict.passed, Verdict.aborted]
        assert [x.name for x in drills.list(session=s, verdict="failed")] == ["region-blackhole"]
        assert len(drills.list(session=s, model="llama-70b")) == 3


# --- refused input leaves the data as it was ----------------------------------------------------

BAD_CALLS: dict[str, Callable[[Session, str], Any]] = {
    "sev out of range": lambda s, i: incidents.create(
        session=s, cell="c", region="r", title="t", sev=0, opened_at_s=0.0
    ),
    "sev is a bool": lambda s, i: incidents.create(
        session=s, cell="c", region="r", title="t", sev=True, opened_at_s=0.0
    ),
    "NaN time": lambda s, i: incidents.create(
        session=s, cell="c", region="r", title="t", sev=2, opened_at_s=float("nan")
    ),
    "empty cell": lambda s, i: incidents.create(
        session=s, cell=" ", region="r", title="t", sev=2, opened_at_s=0.0
    ),
    "name too long": lambda s, i: incidents.create(
        session=s, cell="c" * 201, region="r", title="t", sev=2, opened_at_s=0.0
    ),
    "NUL in text": lambda s, i: timeline.add(
        session=s, incident_id=i, at_s=1.0, kind="k", actor="a", text="a\x00b"
    ),
    "unknown incident": lambda s, i: timeline.add(
        session=s, incident_id="INC-9999", at_s=1.0, kind="k", actor="a", text="x"
    ),
    "data not JSON": lambda s, i: timeline.add(
        session=s, incident_id=i, at_s=1.0, kind="k", actor="a", text="x", data={"x": object()}
    ),
    "data NaN": lambda s, i: timeline.add(
        session=s, incident_id=i, at_s=1.0, kind="k", actor="a", text="x", data={"x": float("inf")}
    ),
    "unknown role": lambda s, i: roles.assign(
        session=s, incident_id=i, role="ceo", person="x", since_s=0.0
    ),
    "handoff threads as a string": lambda s, i: roles.handoff(
        session=s,
        incident_id=i,
        role="scribe",
        to_person="x",
        at_s=0.0,
        open_threads="AB",
        next_update_s=60.0,
    ),
    "approver twice": lambda s, i: levers.record(
        session=s,
        incident_id=i,
        kind="k",
        scope="fleet",
        op={},
        inverse={},
        status="applied",
        at_s=1.0,
        approvers=["a", "a"],
    ),
    "unknown channel": lambda s, i: comms.post(
        session=s, incident_id=i, channel="twitter", text="x", at_s=1.0
    ),
    "no approver": lambda s, i: breakglass.grant(
        session=s,
        incident_id=i,
        identity="x",
        requested_by="a",
        approved_by=[],
        granted_at_s=0.0,
        expires_at_s=60.0,
        scope="fleet",
    ),
    "negative count": lambda s, i: postmortems.create(
        session=s,
        incident_id=i,
        ttd_s=1.0,
        ttm_s=2.0,
        ttr_s=3.0,
        gpu_hours_lost=0.0,
        requests_failed=-1,
        tokens_refunded=0,
        root_cause_class="x",
        text="y",
    ),
    "no such postmortem": lambda s, i: postmortems.add_action_item(
        session=s, postmortem_id=12345, kind="alert", text="x", owner="y"
    ),
    "unknown verdict": lambda s, i: drills.record(
        session=s, name="d", rung=1, model="m", verdict="meh", run_by="a", at_s=0.0, report={}
    ),
    "negative rung": lambda s, i: drills.record(
        session=s, name="d", rung=-1, model="m", verdict="passed", run_by="a", at_s=0.0, report={}
    ),
}


def _counts(s: Session) -> dict[str, int]:
    return {
        table.name: s.execute(select(func.count()).select_from(table)).scalar_one()
        for table in Base.metadata.sorted_tables
    }


def test_refused_input_raises_store_error_and_changes_nothing(store: Store) -> None:
    with store.session() as s:
        inc = _open(s)
        timeline.add(session=s, incident_id=inc.id, at_s=1.0, kind="page", actor="am", text="x")
    with store.session() as s:
        before = _counts(s)
        for what, call in BAD_CALLS.items():
            with pytest.raises(StoreError):
                call(s, inc.id)
            assert _counts(s) == before, what
        # the session is still usable after all that, and commits cleanly
        timeline.add(session=s, incident_id=inc.id, at_s=2.0, kind="note", actor="a", text="y")
    with store.session() as s:
        assert [e.kind for e in timeline.list(session=s, incident_id=inc.id)] == ["page", "note"]
        assert _counts(s)["incidents"] == 1


def test_database_refusal_rolls_back_only_that_write(store: Store) -> None:
    def write_postmortem(s: Session, incident_id: str) -> None:
        postmortems.create(
            session=s,
            incident_id=incident_id,
            ttd_s=1.0,
            ttm_s=2.0,
            ttr_s=3.0,
            gpu_hours_lost=0.0,
            requests_failed=0,
            tokens_refunded=0,
            root_cause_class="x",
            text="first",
        )

    with store.session() as s:
        inc = _open(s)
        write_postmortem(s, inc.id)
    with store.session() as s:
        timeline.add(session=s, incident_id=inc.id, at_s=5.0, kind="note", actor="a", text="kept")
        # the one-postmortem-per-incident rule is the database's (a UNIQUE constraint)
        with pytest.raises(StoreError, match="postmortem") as info:
            write_postmortem(s, inc.id)
        assert isinstance(info.value.__cause__, IntegrityError)
        timeline.add(session=s, incident_id=inc.id, at_s=6.0, kind="note", actor="a", text="also")
    with store.session() as s:
        assert [e.text for e in timeline.list(session=s, incident_id=inc.id)] == ["kept", "also"]
        got = postmortems.get(session=s, incident_id=inc.id)
        assert got is not None
        assert got.text == "first"


def test_a_unit_of_work_that_raises_writes_nothing(store: Store) -> None:
    with store.session() as s:
        _open(s)

    def fail_half_way() -> None:
        with store.session() as s:
            inc = _open(s)
            timeline.add(session=s, incident_id=inc.id, at_s=1.0, kind="k", actor="a", text="x")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail_half_way()
    with store.session() as s:
        assert [i.id for i in incidents.list(session=s)] == ["INC-0001"]
        assert s.scalar(select(func.count()).select_from(TimelineEvent)) == 0


def test_raw_sql_errors_in_a_unit_of_work_are_store_errors(store: Store) -> None:
    with pytest.raises(StoreError) as info, store.session() as s:
        s.execute(text("SELECT * FROM no_such_table"))
    assert isinstance(info.value, FiredrillError)
    assert info.value.__cause__ is not None


def test_concurrent_writers_get_distinct_incident_numbers(store: Store) -> None:
    def open_some() -> None:
        for _ in range(5):
            with store.session() as s:
                _open(s)

    with ThreadPoolExecutor(max_workers=4) as pool:
        for future in [pool.submit(open_some) for _ in range(4)]:
            future.result()  # re-raises a worker's error here
    with store.session() as s:
        ids = [i.id for i in incidents.list(session=s)]
    assert ids == [f"INC-{n:04d}" for n in range(1, 21)]

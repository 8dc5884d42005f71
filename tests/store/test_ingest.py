"""Respond reports and alerts into the store, on SQLite and PostgreSQL.

The reports are real: two example scenarios run once per module through ``firedrill respond
--json`` (a phantom XID on a canary node, resolved with a quarantine; and an exporter-upgrade
storm that ends mitigated, not resolved, after automation acted before the incident opened).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from firedrill.cli import app
from firedrill.errors import StoreError
from firedrill.model.series import labels_of
from firedrill.store import (
    IncidentStatus,
    LeverStatus,
    Store,
    audit,
    breakglass,
    comms,
    incidents,
    levers,
    postmortems,
    timeline,
)
from firedrill.store.ingest import AlertIngestor, persist_report
from firedrill.store.models import AuditRecord, Incident, TimelineEvent
from firedrill.store.respond_report import read_report
from tests.shapes import dig

CANARY = Path("examples/scenarios/phantom-xid-canary.yaml")
STORM = Path("examples/scenarios/exporter-upgrade-storm.yaml")
REGISTRY = Path("examples/scenarios/registry-down-before-peak.yaml")


def _respond(path: Path, out: Path) -> dict[str, Any]:
    result = CliRunner().invoke(
        app, ["respond", str(path), "--json", str(out), "--quiet"], env={"FIREDRILL_DB": None}
    )
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(out.read_text())
    return report


@pytest.fixture(scope="module")
def canary(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _respond(CANARY, tmp_path_factory.mktemp("canary") / "canary.json")


@pytest.fixture(scope="module")
def storm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _respond(STORM, tmp_path_factory.mktemp("storm") / "storm.json")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _respond(REGISTRY, tmp_path_factory.mktemp("registry") / "registry.json")


def _count(store: Store, model: type[Any]) -> int:
    with store.session() as s:
        return int(s.scalar(select(func.count()).select_from(model)) or 0)


def _actions(store: Store) -> list[str]:
    with store.session() as s:
        return list(s.scalars(select(AuditRecord.action).order_by(AuditRecord.seq)))


# --- persist_report ----------------------------------------------------------------------------


def test_a_resolved_incident_is_persisted_whole(store: Store, canary: dict[str, Any]) -> None:
    (report_inc,) = canary["incidents"]
    with store.session() as s:
        result = persist_report(s, canary, actor="alice")
    assert result.created
    sid = result.incidents[report_inc["id"]]
    with store.session() as s:
        inc = incidents.require(session=s, incident_id=sid)
        assert (inc.cell, inc.region, inc.sev) == ("use1-a", "us-east-1", 4)
        assert inc.status is IncidentStatus.resolved
        assert inc.opened_at_s == report_inc["opened_at_s"]
        assert inc.resolved_at_s == report_inc["resolved_at_s"]
        # the quarantine ran 15 s before the incident opened: it mitigated it when it opened
        assert report_inc["mitigated_at_s"] < inc.opened_at_s == inc.mitigated_at_s
        kinds = [e.kind for e in timeline.list(session=s, incident_id=sid)]
        assert {"opened", "assessment", "severity", "lever", "mitigated", "resolved"} <= set(kinds)
        assert kinds.count("alert_group") == sum(
            e["kind"] == "alert_joined" for e in report_inc["timeline"]
        )
        journal = levers.list(session=s, incident_id=sid)
        assert len(journal) == len(report_inc["levers"])
        applied = [e for e in journal if e.status is LeverStatus.applied]
        assert applied
        for entry in applied:
            assert entry.approvers == ["automation"]
            assert entry.inverse is not None
            undo = entry.inverse["operations"]
            assert isinstance(undo, list)
            assert {"Untaint", "Uncordon"} <= {op["op"] for op in undo if isinstance(op, dict)}
        pm = postmortems.get(session=s, incident_id=sid)
        assert pm is not None
        start = inc.opened_at_s - report_inc["postmortem"]["ttd_s"]
        assert pm.ttd_s == report_inc["postmortem"]["ttd_s"]
        assert pm.ttm_s == inc.opened_at_s - start  # not before detection: clamped as above
        assert pm.ttr_s == inc.resolved_at_s - start
        items = postmortems.action_items(session=s, postmortem_id=pm.id)
        assert [(i.kind.value, i.text) for i in items] == [
            (a["kind"], a["text"]) for a in report_inc["postmortem"]["action_items"]
        ]
        assert audit.verify(s).ok
    actions = _actions(store)
    for action in (
        "incident.open",
        "lever.applied",
        "lever.approve",
        "incident.mitigate",
        "incident.resolve",
        "postmortem.write",
    ):
        assert action in actions
    assert actions[-1] == "respond.persist"
    assert actions.count("lever.applied") == len(applied)


def test_an_unresolved_incident_has_no_postmortem_yet(store: Store, storm: dict[str, Any]) -> None:
    with store.session() as s:
        result = persist_report(s, storm, actor="alice")
    cell_inc = next(i for i in storm["incidents"] if i["cell"] == "use1-a")
    assert cell_inc["resolved_at_s"] is None
    sid = result.incidents[cell_inc["id"]]
    with store.session() as s:
        inc = incidents.require(session=s, incident_id=sid)
        mitigated = cell_inc["mitigated_at_s"] is not None
        assert inc.status is (IncidentStatus.mitigated if mitigated else IncidentStatus.open)
        assert inc.resolved_at_s is None
        assert postmortems.get(session=s, incident_id=sid) is None
        (assessment,) = timeline.list(session=s, incident_id=sid, kind="assessment")
        suspects = assessment.data["suspects"]
        assert isinstance(suspects, list)
        assert suspects
        assert dig(suspects, 0, "stream") == "node_layer"
        draft = assessment.data["postmortem_draft"]
        assert isinstance(draft, dict)
        assert draft["action_items"]
        journal = levers.list(session=s, incident_id=sid)
        report_levers = sorted(cell_inc["levers"], key=lambda lv: lv["at_s"])
        assert [(e.kind, e.status.value) for e in journal] == [
            (lv["kind"], lv["status"]) for lv in report_levers
        ]
        for entry, lv in zip(journal, report_levers, strict=True):
            if lv.get("inverse") is None:
                assert entry.inverse is None
            else:
                assert entry.inverse == {"operations": lv["inverse"]}
        assert audit.verify(s).ok


def test_comms_break_glass_and_refusals_are_kept(store: Store, registry: dict[str, Any]) -> None:
    with store.session() as s:
        result = persist_report(s, registry, actor="alice")
    inc = next(i for i in registry["incidents"] if i.get("breakglass"))
    assert inc["comms"]["updates"]
    sid = result.incidents[inc["id"]]
    with store.session() as s:
        grants = breakglass.list(session=s, incident_id=sid)
        assert [(g.identity, g.scope, g.approved_by) for g in grants] == [
            (g["identity"], g["scope"], g["approvers"]) for g in inc["breakglass"]
        ]
        for g in grants:
            assert g.requested_by not in g.approved_by
        posted = comms.list(session=s, incident_id=sid)
        texts = [(c.channel.value, c.text) for c in posted]
        for u in inc["comms"]["updates"]:
            assert ("incident_channel", u["channel"]) in texts
            if u["status_page"] is not None:
                assert ("status_page", u["status_page"]["text"]) in texts
        refused = levers.list(session=s, incident_id=sid, status="refused")
        assert [(r.kind, r.reason) for r in refused] == [
            (lv["kind"], lv["reason"]) for lv in inc["levers"] if lv["status"] == "refused"
        ]
        assert audit.verify(s).ok
    actions = _actions(store)
    broker_events = [e["event"] for g in inc["breakglass"] for e in g["audit"]]
    assert "use" in broker_events  # every use of a break-glass identity is audited
    assert sorted(a for a in actions if a.startswith("breakglass.")) == sorted(
        f"breakglass.{e}" for e in broker_events
    )
    assert actions.count("lever.refused") == len(refused)


def test_a_grant_approved_by_its_requester_is_refused(
    store: Store, registry: dict[str, Any]
) -> None:
    bad = copy.deepcopy(registry)
    i, inc = next((i, x) for i, x in enumerate(bad["incidents"]) if x.get("breakglass"))
    grant = inc["breakglass"][0]
    requester = next(e["actor"] for e in grant["audit"] if e["event"] == "request")
    grant["approvers"].append(requester)
    with pytest.raises(StoreError, match=rf"incidents\[{i}\]\.breakglass\[0\]\.approvers"):
        read_report(bad)


def test_re_importing_a_run_is_idempotent(store: Store, canary: dict[str, Any]) -> None:
    with store.session() as s:
        first = persist_report(s, canary, actor="alice")
    before = (_count(store, Incident), _count(store, TimelineEvent), _count(store, AuditRecord))
    with store.session() as s:
        again = persist_report(s, copy.deepcopy(canary), actor="bob", run_at_s=86_400.0)
    assert not again.created
    assert again.incidents == first.incidents
    assert again.run == first.run
    after = (_count(store, Incident), _count(store, TimelineEvent), _count(store, AuditRecord))
    assert after == before


def test_another_run_gets_new_ids_and_run_at_s_moves_its_times(
    store: Store, canary: dict[str, Any]
) -> None:
    with store.session() as s:
        first = persist_report(s, canary, actor="alice")
    other = copy.deepcopy(canary)
    other["seed"] = canary["seed"] + 1  # a different run: a different digest
    with store.session() as s:
        second = persist_report(s, other, actor="alice", run_at_s=86_400.0)
    assert second.created
    (a,) = first.incidents.values()
    (b,) = second.incidents.values()
    assert a != b
    with store.session() as s:
        one = incidents.require(session=s, incident_id=a)
        two = incidents.require(session=s, incident_id=b)
        assert two.opened_at_s == one.opened_at_s + 86_400.0
        assert [e.at_s - 86_400.0 for e in timeline.list(session=s, incident_id=b)] == [
            e.at_s for e in timeline.list(session=s, incident_id=a)
        ]


def _without_inverse(report: dict[str, Any]) -> dict[str, Any]:
    bad = copy.deepcopy(report)
    lever = next(lv for lv in bad["incidents"][0]["levers"] if lv["status"] == "applied")
    del lever["inverse"]
    return bad


def _severity_down(report: dict[str, Any]) -> dict[str, Any]:
    bad = copy.deepcopy(report)
    inc = bad["incidents"][0]
    inc["sev_history"] = [
        {"at_s": 1.0, "sev": "SEV2", "axis": "users", "reason": "x", "applied": True},
        {"at_s": 2.0, "sev": "SEV3", "axis": "users", "reason": "y", "applied": True},
    ]
    return bad


def _missing(report: dict[str, Any]) -> dict[str, Any]:
    bad = copy.deepcopy(report)
    del bad["incidents"][0]["opened_at_s"]
    return bad


@pytest.mark.parametrize(
    ("spoil", "says"),
    [
        (_without_inverse, "incidents[0].levers[0].inverse: an applied lever needs its inverse"),
        (_severity_down, "incidents[0].sev_history: severity went down"),
        (_missing, "incidents[0]: missing field 'opened_at_s'"),
    ],
    ids=["applied-lever-without-inverse", "severity-down", "missing-field"],
)
def test_a_bad_report_is_refused_with_nothing_written(
    store: Store, canary: dict[str, Any], spoil: Any, says: str
) -> None:
    with pytest.raises(StoreError, match="report " + re.escape(says)), store.session() as s:
        persist_report(s, spoil(canary), actor="alice")
    assert _count(store, Incident) == 0
    assert _count(store, AuditRecord) == 0


def test_a_write_refused_half_way_undoes_the_whole_report(
    store: Store, canary: dict[str, Any]
) -> None:
    bad = copy.deepcopy(canary)
    second = copy.deepcopy(bad["incidents"][0])
    second["id"] = "INC-0002"
    second["cell"] = "c" * 201  # the store refuses a name this long, after INC-0001 is written
    bad["incidents"].append(second)
    read_report(bad)  # the report itself is well-formed
    with store.session() as s:
        with pytest.raises(StoreError, match="cell is longer than 200"):
            persist_report(s, bad, actor="alice")
        # the session is still usable, and nothing of the report is in it
        assert s.scalar(select(func.count()).select_from(Incident)) == 0
    assert _count(store, AuditRecord) == 0


def test_a_report_that_is_not_json_is_refused(canary: dict[str, Any]) -> None:
    bad = copy.deepcopy(canary)
    bad["sim_seconds"] = float("nan")
    with pytest.raises(StoreError, match="not plain JSON"):
        read_report(bad)


# --- AlertIngestor -----------------------------------------------------------------------------


def _xid(cell: str, i: int) -> tuple[tuple[str, str], ...]:
    return labels_of(
        alertname="DCGMXidFatal", severity="ticket", cell=cell, region="us-east-1", node=f"n{i}"
    )


def test_a_storm_in_a_cell_is_one_incident_in_the_store(store: Store) -> None:
    ing = AlertIngestor(actor="alertmanager")
    opened: list[str] = []
    for i in range(40):  # one transaction per alert
        with store.session() as s:
            opened += ing.ingest(s, _xid("use1-a", i), 10.0 + i).opened
    assert len(opened) == 1
    (sid,) = opened
    with store.session() as s:
        inc = incidents.require(session=s, incident_id=sid)
        assert (inc.sev, inc.cell, inc.status) == (4, "use1-a", IncidentStatus.open)
        events = timeline.list(session=s, incident_id=sid)
        assert [e.kind for e in events] == ["opened"] + ["alert_group"] * 39
        assert audit.verify(s).ok
    assert _actions(store) == ["incident.open"]


def test_a_page_raises_the_cell_incident_and_a_tripwire_opens_its_own(store: Store) -> None:
    ing = AlertIngestor(actor="alertmanager")
    burn = labels_of(
        alertname="CellTTFTBurnFast",
        severity="page",
        cell="use1-a",
        region="us-east-1",
        burn_tier="fast",
        burn_factor="14.4",
        tier="paid",
    )
    tripwire = labels_of(
        alertname="SandboxReachedMetadata", severity="security", cell="use1-a", region="us-east-1"
    )
    with store.session() as s:  # one transaction for the batch
        (cell_id,) = ing.ingest(s, _xid("use1-a", 1), 10.0).opened
        raised = ing.ingest(s, burn, 20.0)
        (sec_id,) = ing.ingest(s, tripwire, 30.0).opened
    assert raised.raised == (cell_id,)
    assert sec_id != cell_id
    with store.session() as s:
        assert incidents.require(session=s, incident_id=cell_id).sev == 2  # paid, one region
        assert incidents.require(session=s, incident_id=sec_id).sev == 1
        (raise_event,) = timeline.list(session=s, incident_id=cell_id, kind="severity")
        assert "SEV4 → SEV2" in raise_event.text
        assert audit.verify(s).ok
    assert _actions(store) == ["incident.open", "incident.escalate", "incident.open"]


def test_resolving_and_the_next_alert_opening_anew(store: Store) -> None:
    ing = AlertIngestor()
    with store.session() as s:
        (first,) = ing.ingest(s, _xid("use1-b", 1), 10.0).opened
        with pytest.raises(Exception, match="firing"):
            ing.resolve(s, first, 20.0)  # its alert still fires
    with store.session() as s:
        ing.ingest(s, _xid("use1-b", 1), 30.0, resolved=True)
        ing.resolve(s, first, 40.0)
        (second,) = ing.ingest(s, _xid("use1-b", 2), 50.0).opened
    assert second != first
    with store.session() as s:
        done = incidents.require(session=s, incident_id=first)
        assert (done.status, done.resolved_at_s) == (IncidentStatus.resolved, 40.0)
    assert _actions(store)[-2:] == ["incident.resolve", "incident.open"]


def test_bad_alerts_are_refused_before_anything_changes(store: Store) -> None:
    ing = AlertIngestor()
    with store.session() as s:
        with pytest.raises(StoreError, match="no 'cell' label"):
            ing.ingest(s, labels_of(alertname="X", severity="ticket"), 1.0)
        ing.ingest(s, _xid("use1-a", 1), 10.0)
        with pytest.raises(StoreError, match="before the book's clock"):
            ing.ingest(s, _xid("use1-a", 2), 5.0)
        ing.ingest(s, _xid("use1-a", 3), 11.0)  # still usable: nothing changed
    assert _count(store, Incident) == 1


def test_a_failed_write_retires_the_ingestor(store: Store) -> None:
    ing = AlertIngestor()
    too_long = labels_of(alertname="DCGMXidFatal", severity="ticket", cell="c", region="r" * 201)
    with pytest.raises(StoreError, match="region is longer than 200"), store.session() as s:
        ing.ingest(s, too_long, 1.0)
    with pytest.raises(StoreError, match="start a new one"), store.session() as s:
        ing.ingest(s, _xid("use1-a", 1), 2.0)
    assert _count(store, Incident) == 0

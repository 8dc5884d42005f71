"""Incidents from grouped notifications: one per cell, security apart, severity only up."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firedrill.detect.notify import Notification
from firedrill.errors import OperationError, UnknownTargetError
from firedrill.model.series import Labels, labels_of
from firedrill.respond.incidents import IncidentBook, classify, impact_of
from firedrill.respond.severity import Sev


def xid(cell: str, node: int) -> Labels:
    return labels_of(
        alertname="DCGMXidFatal",
        severity="ticket",
        team="gpu-fleet",
        cell=cell,
        region="us-east",
        node=f"gpu-{node:04d}",
        Hostname=f"gpu-{node:04d}",
        gpu="0",
    )


def burn(cell: str, tier: str, *, paid: bool = True) -> Labels:
    severity = "page" if tier in ("fast", "slow") else "ticket"
    return labels_of(
        alertname=f"InferenceTTFTBurn{tier.title()}",
        severity=severity,
        team="inference",
        burn_tier=tier,
        slo="ttft",
        cell=cell,
        region="us-east",
        tier="paid" if paid else "free",
    )


def tripwire(cell: str, alertname: str = "SandboxMetadataAccess") -> Labels:
    return labels_of(
        alertname=alertname,
        severity="security",
        team="security",
        cell=cell,
        region="us-east",
        tenant="acme",
    )


def note(
    receiver: str,
    at_s: float,
    alerts: list[Labels],
    resolved: list[Labels] | None = None,
) -> Notification:
    first = (alerts or resolved or [()])[0]
    name = dict(first).get("alertname", "")
    cell = dict(first).get("cell", "")
    return Notification(
        receiver=receiver,
        group_key=(cell, name),
        alertname=name,
        cell=cell,
        at_s=at_s,
        alerts=tuple(sorted(alerts)),
        resolved=tuple(sorted(resolved or [])),
    )


def test_400_xids_and_the_cells_burn_page_are_one_incident() -> None:
    book = IncidentBook()
    xids = [xid("use1-a", i) for i in range(400)]
    first = book.ingest(note("ticket", 30.0, xids))
    second = book.ingest(note("page", 60.0, [burn("use1-a", "fast")]))
    assert len(book.incidents) == 1
    (inc,) = book.incidents
    assert first.opened == (inc.id,)
    assert second.opened == ()
    assert second.joined == (inc.id,)
    assert inc.id == "INC-0001"
    assert inc.cell == "use1-a"
    assert inc.region == "us-east"
    assert len(inc.alerts) == 401
    assert inc.kind == "cell"  # the page made the automation incident a cell one
    assert inc.sev is Sev.SEV2  # fast burn on a paid tier in one region


def test_repeated_notifications_do_not_duplicate_alerts() -> None:
    book = IncidentBook()
    xids = [xid("use1-a", i) for i in range(10)]
    book.ingest(note("ticket", 30.0, xids))
    update = book.ingest(note("ticket", 14_430.0, xids))  # repeat_interval re-send
    (inc,) = book.incidents
    assert len(inc.alerts) == 10
    assert update.joined == ()
    assert [e.kind for e in inc.timeline] == ["opened"]


def test_two_cells_are_two_incidents() -> None:
    book = IncidentBook()
    book.ingest(note("page", 30.0, [burn("use1-a", "fast")]))
    book.ingest(note("page", 30.0, [burn("use1-b", "fast")]))
    assert [(i.id, i.cell) for i in book.incidents] == [
        ("INC-0001", "use1-a"),
        ("INC-0002", "use1-b"),
    ]


def test_a_tripwire_in_a_cell_with_an_open_incident_opens_its_own_sev1() -> None:
    book = IncidentBook()
    book.ingest(note("page", 30.0, [burn("use1-a", "slow")]))
    update = book.ingest(note("security", 40.0, [tripwire("use1-a")]))
    assert len(book.incidents) == 2
    cell_inc, sec = book.incidents
    assert update.opened == (sec.id,)
    assert sec.kind == "security"
    assert sec.cell == "use1-a"
    assert sec.sev is Sev.SEV1
    assert sec.severity.history[-1].axis == "security"
    assert cell_inc.sev is Sev.SEV3  # untouched by the tripwire
    assert tripwire("use1-a") not in cell_inc.alerts


def test_the_page_copy_of_a_tripwire_joins_the_security_incident() -> None:
    book = IncidentBook()
    book.ingest(note("page", 30.0, [burn("use1-a", "fast")]))
    book.ingest(note("security", 40.0, [tripwire("use1-a")]))
    update = book.ingest(note("page", 40.0, [tripwire("use1-a")]))  # continue: true copy
    assert len(book.incidents) == 2
    assert update.opened == ()
    assert update.joined == ()  # already carried
    sec = book.incidents[1]
    assert sec.alerts == [tripwire("use1-a")]


def test_later_tripwires_of_the_group_join_it() -> None:
    book = IncidentBook()
    first = labels_of(**{**dict(tripwire("use1-a")), "tenant": "acme"})
    later = labels_of(**{**dict(tripwire("use1-a")), "tenant": "globex"})
    book.ingest(note("security", 40.0, [first]))
    update = book.ingest(note("security", 340.0, [first, later]))
    (sec,) = book.incidents
    assert update.joined == (sec.id,)
    assert sec.alerts == [first, later]
    assert sec.timeline[-1].kind == "alert_joined"
    assert sec.timeline[-1].data["alerts"] == 1


def test_confirmed_side_effects_are_measured_on_the_security_axis() -> None:
    book = IncidentBook()
    book.ingest(note("security", 40.0, [tripwire("use1-a", "MoneyToolWithoutApproval")]))
    (sec,) = book.incidents
    assert sec.sev is Sev.SEV1
    assert "unapproved side effect" in sec.severity.history[-1].reason


def test_a_ticket_only_flood_opens_one_sev4_automation_incident() -> None:
    book = IncidentBook()
    book.ingest(note("ticket", 30.0, [xid("use1-a", i) for i in range(200)]))
    book.ingest(note("ticket", 330.0, [xid("use1-a", i) for i in range(400)]))
    (inc,) = book.incidents
    assert inc.kind == "automation"
    assert inc.sev is Sev.SEV4
    assert inc.title == "DCGMXidFatal in use1-a (automation)"
    assert len(inc.alerts) == 400
    assert [e.kind for e in inc.timeline] == ["opened", "alert_joined"]


def test_severity_rises_on_a_fast_burn_after_a_slow_one_and_never_falls() -> None:
    book = IncidentBook()
    book.ingest(note("page", 30.0, [burn("use1-a", "slow")]))
    (inc,) = book.incidents
    sevs = [inc.sev]
    update = book.ingest(note("page", 600.0, [burn("use1-a", "fast")]))
    assert update.raised == (inc.id,)
    sevs.append(inc.sev)
    # The fast burn resolves and a drift ticket arrives: measured lower, not applied.
    book.ingest(note("page", 900.0, [], resolved=[burn("use1-a", "fast")]))
    update = book.ingest(note("ticket", 1200.0, [burn("use1-a", "drift")]))
    assert update.raised == ()
    sevs.append(inc.sev)
    assert sevs == [Sev.SEV3, Sev.SEV2, Sev.SEV2]
    assert inc.severity.history[-1].applied is False


def test_stalled_gpus_are_priced_on_the_gpu_hours_axis() -> None:
    book = IncidentBook()
    stalled = labels_of(
        alertname="TrainingJobStalled", severity="page", cell="train-1", gpus="16384"
    )
    book.ingest(note("page", 30.0, [stalled]))
    (inc,) = book.incidents
    assert inc.sev is Sev.SEV2  # 16,384 GPUs × $2/h ≈ $32K/h
    assert inc.severity.history[-1].axis == "gpu_hours"


def test_timeline_records_in_order() -> None:
    book = IncidentBook()
    book.ingest(note("ticket", 30.0, [xid("use1-a", 1)]))
    book.ingest(note("page", 60.0, [burn("use1-a", "fast")]))
    (inc,) = book.incidents
    book.mitigate(inc.id, 300.0, by="ops: drained use1-a")
    book.ingest(note("ticket", 400.0, [], resolved=[xid("use1-a", 1)]))
    book.ingest(note("page", 500.0, [], resolved=[burn("use1-a", "fast")]))
    book.resolve(inc.id, 600.0)
    assert [e.kind for e in inc.timeline] == [
        "opened",
        "alert_joined",
        "severity_raised",
        "mitigated",
        "resolved",
    ]
    times = [e.at_s for e in inc.timeline]
    assert times == sorted(times)
    assert inc.status == "resolved"
    assert inc.mitigated_by == "ops: drained use1-a"


def test_resolve_needs_every_alert_resolved() -> None:
    book = IncidentBook()
    book.ingest(note("page", 30.0, [burn("use1-a", "fast")]))
    (inc,) = book.incidents
    with pytest.raises(OperationError, match="1 firing alert"):
        book.resolve(inc.id, 60.0)
    assert inc.status == "open"


def test_after_resolution_the_cell_opens_a_new_incident() -> None:
    book = IncidentBook()
    book.ingest(note("page", 30.0, [burn("use1-a", "fast")]))
    book.ingest(note("page", 330.0, [], resolved=[burn("use1-a", "fast")]))
    book.resolve("INC-0001", 400.0)
    update = book.ingest(note("page", 900.0, [burn("use1-a", "fast")]))
    assert update.opened == ("INC-0002",)
    assert len(book.incidents) == 2


def test_mitigated_incidents_still_take_the_cells_alerts() -> None:
    book = IncidentBook()
    book.ingest(note("page", 30.0, [burn("use1-a", "slow")]))
    book.mitigate("INC-0001", 60.0, by="ops")
    book.ingest(note("ticket", 90.0, [xid("use1-a", 7)]))
    (inc,) = book.incidents
    assert inc.status == "mitigated"
    assert xid("use1-a", 7) in inc.alerts


def test_commands_check_their_target_and_state() -> None:
    book = IncidentBook()
    with pytest.raises(UnknownTargetError):
        book.mitigate("INC-9999", 0.0, by="ops")
    book.ingest(note("page", 30.0, [burn("use1-a", "fast")]))
    with pytest.raises(ValueError, match="who"):
        book.mitigate("INC-0001", 40.0, by=" ")
    book.mitigate("INC-0001", 40.0, by="ops")
    with pytest.raises(OperationError, match="mitigated"):
        book.mitigate("INC-0001", 50.0, by="ops")
    with pytest.raises(ValueError, match="before"):
        book.ingest(note("page", 10.0, [burn("use1-b", "fast")]))


def test_classify_prefers_the_severity_label() -> None:
    assert classify("page", tripwire("c")) == "security"
    assert classify("security", labels_of(alertname="X")) == "security"
    assert classify("ticket", burn("c", "fast")) == "page"
    assert classify("page", labels_of(alertname="X")) == "page"
    assert classify("ticket", labels_of(alertname="X")) == "ticket"


def test_impact_of_burn_labels() -> None:
    assert impact_of([burn("c", "slow", paid=False)]).burn_rate == 6.0
    assert impact_of([burn("c", "fast", paid=False)]).paid_tier is False
    free = labels_of(**{**dict(burn("c", "fast", paid=False)), "product": "chat"})
    assert impact_of([free], paid_products={"chat"}).paid_tier is True
    factor = labels_of(**{**dict(burn("c", "fast")), "burn_factor": "20"})
    assert impact_of([factor]).burn_rate == 20.0


_STEP = st.sampled_from(
    [
        ("page", "fast"),
        ("page", "slow"),
        ("ticket", "drift"),
        ("ticket", "budget"),
        ("ticket", "xid"),
        ("resolve", "fast"),
        ("resolve", "slow"),
    ]
)


@settings(max_examples=100, deadline=None)
@given(st.lists(_STEP, min_size=1, max_size=30), st.booleans())
def test_severity_never_goes_down_while_open(steps: list[tuple[str, str]], paid: bool) -> None:
    book = IncidentBook()
    seen: list[Sev] = []
    for i, (receiver, what) in enumerate(steps):
        at_s = 30.0 * (i + 1)
        alert = xid("use1-a", i) if what == "xid" else burn("use1-a", what, paid=paid)
        if receiver == "resolve":
            book.ingest(note("page", at_s, [], resolved=[alert]))
        else:
            book.ingest(note(receiver, at_s, [alert]))
        if book.incidents:
            seen.append(book.incidents[0].sev)
    assert len(book.incidents) <= 1
    assert all(later <= earlier for earlier, later in itertools.pairwise(seen))

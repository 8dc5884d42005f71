"""The responder: advise proposes in order, auto applies what it may and verifies it."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from firedrill.detect.notify import Notification
from firedrill.model import operations as ops
from firedrill.model.series import Labels, labels_of
from firedrill.model.spec import FleetSpec
from firedrill.respond.bundle import parse_serving_config
from firedrill.respond.guards import UnsafeRequest
from firedrill.respond.levers import (
    DigestParams,
    Lever,
    LeverKind,
    QueueHoldParams,
    RouteWeightParams,
)
from firedrill.respond.responder import (
    Candidate,
    Responder,
    ResponderPolicy,
    Runbook,
    RunbookContext,
)
from firedrill.respond.runbooks import RUNBOOKS
from firedrill.respond.severity import Sev
from firedrill.respond.suspects import Symptom, SymptomKind, rank
from firedrill.specfile import load_fleet
from firedrill.twin.engine import Twin
from firedrill.twin.world import TwinWorld

FLEET = load_fleet(Path("examples/fleet.yaml"))
WEIGHT = 56  # llm-70b's route weight in every demo cell


class Probe:
    """A symptom the test sets by hand: the burn rate, and the alerts firing."""

    def __init__(self, burn: float = 20.0) -> None:
        self.burn = burn
        self.alerts: set[Labels] = set()

    def burn_rate(self, cells: Collection[str], window_s: float) -> float | None:
        return self.burn

    def firing(self) -> Collection[Labels]:
        return self.alerts


def _twin(spec: FleetSpec = FLEET) -> Twin:
    return Twin(spec, 0, record=False)


def _page(at_s: float, cell: str = "use1-a", tier: str = "fast") -> Notification:
    labels = labels_of(
        alertname="CellTTFTBurnFast",
        severity="page",
        burn_tier=tier,
        cell=cell,
        region="us-east-1",
        product="chat",
        model_name="llm-70b",
        tier="paid",
    )
    return Notification("page", (cell, "CellTTFTBurnFast"), "CellTTFTBurnFast", cell, at_s,
                        (labels,), ())  # fmt: skip


def _weights(twin: Twin, cell: str, model: str = "llm-70b") -> int:
    view = next(c for c in twin.cells() if c.name == cell)
    return dict(view.route_weights)[model]


def _fixed(*cands: Candidate) -> dict[SymptomKind, Runbook]:
    def book(ctx: RunbookContext) -> Sequence[Candidate]:
        return cands

    return {"ttft": book}


def _responder(
    twin: Twin, probe: Probe, runbooks: dict[SymptomKind, Runbook], **policy: object
) -> Responder:
    return Responder(
        ResponderPolicy.model_validate(policy),
        twin,
        probe=probe,
        classify=lambda alerts: "ttft",
        signals=twin,
        capacity=TwinWorld(twin),
        catalog=TwinWorld(twin),
        runbooks=runbooks,
    )


class Clock:
    """The run's evaluation clock; the twin itself need not step for the responder's logic."""

    def __init__(self) -> None:
        self.t = 0.0


def _steps(r: Responder, clock: Clock, until_s: float, notes: list[Notification]) -> None:
    while clock.t < until_s:
        clock.t += 15.0
        r.observe(clock.t, notes)


ROUTE_A = Lever("route_weight", "llm-70b", RouteWeightParams((("use1-a", 28),)))
ROUTE_B = Lever("route_weight", "llm-70b", RouteWeightParams((("use1-b", 28),)))
ABORT = Lever("rollout_abort", "llm-70b")


def test_advise_proposes_every_candidate_in_order_and_applies_nothing() -> None:
    twin = _twin()
    clock = Clock()
    probe = Probe()
    shortcut = UnsafeRequest("public_bucket", "us-east-1", "someone")
    r = _responder(
        twin,
        probe,
        _fixed(Candidate(ROUTE_A, "first"), Candidate(ABORT, "second"), Candidate(shortcut, "no")),
    )
    notes = [_page(0.0)]
    r.observe(0.0, notes)
    (inc,) = r.book.incidents
    recs = r.records(inc.id)
    assert [(x.entry.kind, x.entry.status) for x in recs] == [
        ("route_weight", "proposed"),
        ("rollout_abort", "proposed"),
        ("public_bucket", "refused"),
    ]
    assert [a.role for a in recs[0].entry.approvers] == ["capacity_lead"]
    assert [a.role for a in recs[1].entry.approvers] == ["model_owner"]
    assert "public weights bucket" in recs[2].entry.reason
    assert all(x.verified is None for x in recs)
    _steps(r, clock, 900.0, notes)  # nothing more happens: each candidate is journalled once
    assert len(r.records(inc.id)) == 3
    assert _weights(twin, "use1-a") == WEIGHT
    assert inc.status == "open"


def test_auto_applies_only_the_allowed_kinds_with_their_owner_approving() -> None:
    twin = _twin()
    clock = Clock()
    probe = Probe()
    r = _responder(
        twin,
        probe,
        _fixed(Candidate(ABORT, "abort"), Candidate(ROUTE_A, "route")),
        mode="auto",
        auto_apply=["route_weight"],
    )
    notes = [_page(0.0)]
    r.observe(0.0, notes)
    (inc,) = r.book.incidents
    abort, route = r.records(inc.id)
    assert abort.entry.status == "proposed"
    assert "does not apply rollout_abort" in abort.entry.reason
    assert route.entry.status == "applied"
    assert [(a.name, a.role) for a in route.entry.approvers] == [("capacity-lead", "capacity_lead")]
    assert _weights(twin, "use1-a") == 28
    assert route.entry.inverses  # recorded before it was applied
    probe.burn = 0.4
    _steps(r, clock, 30.0, notes)
    route = r.records(inc.id)[1]
    assert route.verified is True
    assert "cleared" in route.verify_detail
    assert inc.status == "mitigated"


def test_auto_refuses_a_lever_whose_owner_is_not_on_the_roster() -> None:
    twin = _twin()
    r = _responder(
        twin,
        Probe(),
        _fixed(Candidate(ROUTE_A, "route")),
        mode="auto",
        roster={"ic": "incident_commander", "ops": "ops_lead"},
        decides={"route_weight": "capacity_lead"},
    )
    r.observe(0.0, [_page(0.0)])
    (rec,) = r.records(r.book.incidents[0].id)
    assert rec.entry.status == "refused"
    assert "needs approval" in rec.entry.reason
    assert _weights(twin, "use1-a") == WEIGHT


def test_a_lever_that_does_not_clear_the_symptom_is_undone_and_the_next_is_tried() -> None:
    twin = _twin()
    clock = Clock()
    probe = Probe(burn=20.0)
    r = _responder(
        twin,
        probe,
        _fixed(Candidate(ROUTE_A, "first try"), Candidate(ROUTE_B, "second try")),
        mode="auto",
        verify={"window": "10m"},
    )
    notes = [_page(0.0)]
    r.observe(0.0, notes)
    inc = r.book.incidents[0]
    assert _weights(twin, "use1-a") == 28
    _steps(r, clock, 585.0, notes)
    assert [x.entry.kind for x in r.records(inc.id)] == ["route_weight"]  # still verifying
    _steps(r, clock, 600.0, notes)
    first, second = r.records(inc.id)
    assert first.verified is False
    assert first.undo is not None
    assert first.undo.status == "applied"
    assert "not cleared" in first.undo.reason
    assert _weights(twin, "use1-a") == WEIGHT  # the inverse put it back
    assert second.entry.status == "applied"
    assert _weights(twin, "use1-b") == 28
    probe.burn = 0.5
    _steps(r, clock, 630.0, notes)
    assert r.records(inc.id)[1].verified is True
    assert inc.status == "mitigated"


def test_max_levers_caps_the_tries() -> None:
    twin = _twin()
    clock = Clock()
    r = _responder(
        twin,
        Probe(burn=20.0),
        _fixed(Candidate(ROUTE_A, "a"), Candidate(ROUTE_B, "b")),
        mode="auto",
        max_levers=1,
    )
    notes = [_page(0.0)]
    r.observe(0.0, notes)
    _steps(r, clock, 1500.0, notes)
    (rec,) = r.records(r.book.incidents[0].id)
    assert rec.verified is False
    assert _weights(twin, "use1-b") == WEIGHT


def test_a_fleet_wide_lever_without_a_second_approver_is_refused() -> None:
    both = Lever("route_weight", "llm-70b", RouteWeightParams((("use1-a", 28), ("use1-b", 28))))
    twin = _twin()
    r = _responder(
        twin,
        Probe(),
        _fixed(Candidate(both, "global route table")),
        mode="auto",
        roster={"cap": "capacity_lead", "ops": "ops_lead"},
    )
    r.observe(0.0, [_page(0.0)])
    (rec,) = r.records(r.book.incidents[0].id)
    assert rec.entry.scope == "fleet"
    assert rec.entry.status == "refused"
    assert "second approver" in rec.entry.reason
    assert _weights(twin, "use1-a") == WEIGHT
    # With the incident commander on the roster it goes ahead, signed by both.
    twin2 = _twin()
    r2 = _responder(twin2, Probe(), _fixed(Candidate(both, "global")), mode="auto")
    r2.observe(0.0, [_page(0.0)])
    (rec2,) = r2.records(r2.book.incidents[0].id)
    assert rec2.entry.status == "applied"
    assert {a.role for a in rec2.entry.approvers} == {"capacity_lead", "incident_commander"}


def test_a_lever_outside_the_on_call_role_goes_through_break_glass() -> None:
    twin = _twin()
    clock = Clock()
    r = _responder(
        twin,
        Probe(),
        _fixed(Candidate(ROUTE_A, "route")),
        mode="auto",
        breakglass=["route_weight"],
        breakglass_ttl="30m",
    )
    notes = [_page(0.0)]
    r.observe(0.0, notes)
    inc = r.book.incidents[0]
    (rec,) = r.records(inc.id)
    assert rec.entry.status == "applied"
    assert rec.breakglass is not None
    (grant,) = r.grants(inc.id)
    assert set(grant.approvers) == {"ic-oncall", "security-lead"}
    assert [p.grant_id for p in r.security_pages(inc.id)] == [grant.grant_id]
    assert [a.event for a in r.broker.journal] == ["request", "approve", "approve", "grant", "use"]
    _steps(r, clock, 1800.0, notes)
    assert r.broker.active == []  # reaped at expiry without anyone asking
    assert r.broker.journal[-1].event == "reap"


def test_break_glass_without_two_approvers_refuses_the_lever() -> None:
    twin = _twin()
    r = _responder(
        twin,
        Probe(),
        _fixed(Candidate(ROUTE_A, "route")),
        mode="auto",
        breakglass=["route_weight"],
        roster={"cap": "capacity_lead", "ops": "ops_lead", "ic": "incident_commander"},
    )
    r.observe(0.0, [_page(0.0)])
    (rec,) = r.records(r.book.incidents[0].id)
    assert rec.entry.status == "refused"
    assert "break-glass refused" in rec.entry.reason
    assert "security_lead" in rec.entry.reason
    assert _weights(twin, "use1-a") == WEIGHT


def test_a_break_glass_kind_without_a_grant_is_refused_and_pages_security() -> None:
    """A policy cannot list the catalogue's break-glass kinds away; without a grant the lever
    is refused, and security is paged about the attempt."""
    twin = _twin()
    bad = twin.spec.models[twin.model_index["llm-70b"]].weights.digest
    rollback = Lever("digest_rollback", "llm-70b", DigestParams("us-east-1", bad))
    r = _responder(
        twin,
        Probe(),
        _fixed(Candidate(rollback, "roll back")),
        mode="auto",
        auto_apply=["digest_rollback"],
        breakglass=[],
        roster={"ops": "ops_lead", "ic": "incident_commander", "mo": "model_owner"},
    )
    r.observe(0.0, [_page(0.0)])
    inc = r.book.incidents[0]
    (rec,) = r.records(inc.id)
    assert rec.entry.status == "refused"
    assert "break-glass refused" in rec.entry.reason
    assert rec.breakglass is None
    (page,) = r.security_pages(inc.id)
    assert page.grant_id == ""
    assert page.action == "digest_rollback on llm-70b"
    assert "no grant" in page.summary


def test_the_first_update_is_drafted_before_the_deadline_or_recorded_as_missed() -> None:
    for draft_after, missed in (("5m", False), ("20m", True)):
        twin = _twin()
        clock = Clock()
        r = _responder(twin, Probe(), _fixed(), comms={"draft_after": draft_after})
        notes = [_page(0.0)]  # a paid-tier fast burn: SEV2
        r.observe(0.0, notes)
        inc = r.book.incidents[0]
        assert inc.sev is Sev.SEV2
        _steps(r, clock, 1500.0, notes)
        first = r.updates(inc.id)[0]
        plan = r.comms_plan(inc.id)
        assert plan is not None
        assert plan.first_update_due_s == 900.0
        assert first.update.missed_deadline is missed
        assert first.status_page is not None
        assert first.status_page.product == "chat"
        assert first.status_page.region == "us-east-1"
        assert "use1-a" not in first.status_page.text  # product x region, never a cell


def test_a_declared_registry_incident_pins_scalers_first_and_refuses_the_shortcuts() -> None:
    twin = _twin()
    clock = Clock()
    policy = {
        "mode": "auto",
        "declare": [
            {"at": "1m", "region": "us-east-1", "title": "registry down", "tags": ["registry"]}
        ],
    }
    r = Responder(
        ResponderPolicy.model_validate(policy),
        twin,
        probe=Probe(burn=0.0),
        classify=lambda alerts: "xid",
        signals=twin,
        capacity=TwinWorld(twin),
        catalog=TwinWorld(twin),
        runbooks=RUNBOOKS,
    )
    _steps(r, clock, 120.0, [])
    (inc,) = r.book.incidents
    assert inc.cell == "region:us-east-1"
    assert inc.sev is Sev.SEV2
    recs = r.records(inc.id)
    kinds = [(x.entry.kind, x.entry.status) for x in recs]
    assert kinds[:3] == [("scaler_pause", "applied")] * 3
    refused = {k for k, s in kinds if s == "refused"}
    assert {"public_mirror", "admission_ignore", "widen_bucket_iam"} <= refused


def test_the_policy_rejects_decision_rights_the_catalogue_does_not_grant() -> None:
    with pytest.raises(ValidationError, match="model_owner cannot decide route_weight"):
        ResponderPolicy.model_validate({"decides": {"route_weight": "model_owner"}})
    with pytest.raises(ValidationError, match="cell_drain"):
        ResponderPolicy.model_validate({"auto_apply": ["cell_drain"]})


# ---------------------------------------------------------------------------------------------
# property: never apply a lever whose guard failed; every applied lever has its inverse

POOL: list[Candidate] = [
    Candidate(ROUTE_A, "route a"),
    Candidate(ROUTE_B, "route b"),
    Candidate(ABORT, "abort"),
    Candidate(Lever("route_weight", "llm-70b", RouteWeightParams((("use1-a", -1),))), "bad"),
    Candidate(
        Lever("route_weight", "llm-70b", RouteWeightParams((("use1-a", 10), ("usw2-a", 10)))),
        "fleet-wide",
    ),
    Candidate(Lever("cell_drain", "use1-a"), "drain"),
    Candidate(Lever("scaler_pause", "use1-b"), "pin", prerequisite=True),
    Candidate(Lever("queue_hold", "research-h100", QueueHoldParams()), "hold"),
    Candidate(
        Lever("digest_rollback", "llm-70b", DigestParams("us-east-1", "sha256:" + "0" * 64)),
        "never published",
    ),
    Candidate(UnsafeRequest("cluster_admin", "use1-a"), "shortcut"),
]
KINDS: list[LeverKind] = ["route_weight", "rollout_abort", "queue_hold", "scaler_pause"]
ROLES = {
    "ic": "incident_commander",
    "ops": "ops_lead",
    "cap": "capacity_lead",
    "owner": "model_owner",
    "sec": "security_lead",
}


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    order=st.permutations(range(len(POOL))),
    people=st.sets(st.sampled_from(sorted(ROLES)), min_size=1),
    allowed=st.sets(st.sampled_from(KINDS)),
    burns=st.lists(st.sampled_from([0.2, 3.0, 30.0]), min_size=1, max_size=6),
    mode=st.sampled_from(["advise", "auto"]),
)
def test_never_applies_a_lever_whose_guard_failed(
    order: list[int], people: set[str], allowed: set[LeverKind], burns: list[float], mode: str
) -> None:
    twin = _twin()
    probe = Probe()
    r = _responder(
        twin,
        probe,
        _fixed(*(POOL[i] for i in order)),
        mode=mode,
        roster={p: ROLES[p] for p in people},
        auto_apply=sorted(allowed),
        max_levers=4,
    )
    notes = [_page(0.0)]
    t = 0.0
    for i in range(36):  # 9 minutes of evaluations, the symptom changing as drawn
        probe.burn = burns[i % len(burns)]
        t += 615.0 if i == 20 else 15.0  # once, a jump past a verification window
        r.observe(t, notes)
    for inc in r.book.incidents:
        for rec in r.records(inc.id):
            e = rec.entry
            if e.status != "applied":
                continue
            assert mode == "auto"
            assert e.kind in allowed
            assert all(c.ok for c in e.checks), e.checks
            assert e.inverses
            assert len(e.inverses) == len(e.ops)
            assert e.approvers
            if rec.verified is False and rec.shared_from is None:
                assert rec.undo is not None
                assert rec.undo.status == "applied"


# --- a bad bundle: the label goes back first, whichever alert opens the incident ----------------

BAD_BUNDLE = "sha256:" + "b2" * 32


def _bad_bundle_twin() -> tuple[Twin, str]:
    """The demo twin with llm-8b's bundle moved to a KV-starved serving config at 60 s."""
    twin = _twin()
    twin.run_for(60)
    before = twin.changes(since_s=0.0)
    twin.apply(ops.SetServingConfig("llm-8b", BAD_BUNDLE, 512, 0.27))
    (change,) = [c for c in twin.changes(since_s=0.0, cell="use1-a") if c not in before]
    return twin, change.before


def _availability_page(at_s: float, cell: str) -> Notification:
    labels = labels_of(
        alertname="CellAvailabilityBurnFast",
        severity="page",
        burn_tier="fast",
        cell=cell,
        region="us-east-1",
        product="code",
        model_name="llm-8b",
    )
    return Notification("page", (cell, "CellAvailabilityBurnFast"), "CellAvailabilityBurnFast",
                        cell, at_s, (labels,), ())  # fmt: skip


@pytest.mark.parametrize("kind", ["availability", "ttft"])
def test_a_bundle_change_before_onset_is_reverted_before_any_traffic_moves(
    kind: SymptomKind,
) -> None:
    """The burn can page before the KV tickets fire; the bundle is still the lever to pull."""
    twin, good = _bad_bundle_twin()
    symptom = Symptom(kind, 300.0, "use1-a", "us-east-1")
    ctx = RunbookContext("INC-1", symptom, tuple(rank(twin.changes(since_s=0.0), symptom)), twin,
                         300.0)  # fmt: skip
    kinds = [c.request.kind for c in RUNBOOKS[kind](ctx)]
    assert kinds[0] == "bundle_revert"
    (first,) = [c.request for c in RUNBOOKS[kind](ctx)][:1]
    assert isinstance(first, Lever)
    assert first.params == parse_serving_config(good)
    if kind == "availability":
        assert kinds.index("cell_drain") > 0  # a drain only after the cheaper lever


def test_incidents_opening_with_the_revert_do_not_revert_it_back() -> None:
    """Two cells page in one step: the first reverts the bundle, the second shares the revert.

    The revert is a bundle change at the second incident's onset; taken as its cause, it would
    be "reverted" to the bad config.
    """
    twin, good = _bad_bundle_twin()
    twin.run_for(240)  # the fleet's clock is the responder's: its levers change the fleet at 300 s
    r = Responder(
        ResponderPolicy.model_validate({"mode": "auto", "auto_apply": ["bundle_revert"]}),
        twin,
        probe=Probe(burn=0.0),
        classify=lambda alerts: "availability",
        signals=twin,
        capacity=TwinWorld(twin),
        catalog=TwinWorld(twin),
        runbooks=RUNBOOKS,
    )
    notes = [_availability_page(300.0, "use1-a"), _availability_page(300.0, "use1-b")]
    r.observe(300.0, notes)
    r.observe(315.0, notes)
    bundle = [c for c in twin.changes(since_s=0.0, cell="use1-a") if c.stream == "bundle"]
    assert [c.after for c in bundle] == [f"{BAD_BUNDLE} seqs=512 gmu=0.27", good]
    first = [r.records(i.id)[0] for i in r.book.incidents]
    assert [rec.entry.kind for rec in first] == ["bundle_revert", "bundle_revert"]
    assert all(rec.applied for rec in first)
    assert first[1].shared_from == r.book.incidents[0].id

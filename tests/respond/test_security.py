"""The security runbook: findings from the audit log, containment narrowest first, the deny-all
gate (SEV1, incident commander and security lead), and comms that never name the tenant's cells,
pods or sessions."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from firedrill.model import operations as ops
from firedrill.model.spec import FleetSpec
from firedrill.respond.comms import CommsError
from firedrill.respond.guards import Approver, UnsafeRequest, widens_access
from firedrill.respond.levers import (
    CompensationParams,
    ContentParams,
    FreezeParams,
    KillSwitchParams,
    Lever,
    WarmPoolParams,
    pull,
)
from firedrill.respond.responder import RUNBOOKS, RunbookContext
from firedrill.respond.security import (
    AuditLog,
    Findings,
    contain,
    containment_plan,
    findings,
    security_runbook,
    security_update,
)
from firedrill.respond.severity import Sev
from firedrill.respond.suspects import Symptom
from firedrill.specfile import load_fleet
from firedrill.twin.engine import Twin

FLEET_YAML = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"
SEED = 8
HASH = "sha256:" + "9a" * 32
IC = Approver("ivy", "incident_commander")
SEC = Approver("sam", "security_lead")
OWNER = Approver("mo", "model_owner")
OPS = Approver("oz", "ops_lead")
EVERYONE = (IC, SEC, OWNER, OPS)
NARROWEST_FIRST = [
    "kill_switch",
    "warm_pool",
    "pod_quarantine",
    "promotion_freeze",
    "content_block",
    "compensation",
]


@pytest.fixture(scope="module")
def spec() -> FleetSpec:
    return load_fleet(FLEET_YAML)


def incident(spec: FleetSpec) -> Twin:
    """acme exfiltrating from use1-a and injected in use1-b for 5 minutes; globex quiet."""
    twin = Twin(spec, SEED)
    twin.run_for(60)
    twin.apply(ops.InjectExfiltration("acme", "use1-a", 2.0))
    twin.apply(ops.InjectPromptInjection("acme", "use1-b", HASH, "write", 0.5, 0.3))
    twin.run_for(300)
    return twin


def acme_findings(twin: Twin) -> Findings:
    return findings(twin, tenant="acme", start_s=0.0, end_s=twin.now_s())


def test_the_twin_is_an_audit_log(spec: FleetSpec) -> None:
    assert isinstance(Twin(spec, SEED), AuditLog)


def test_findings_name_the_sessions_pods_and_content(spec: FleetSpec) -> None:
    twin = incident(spec)
    f = acme_findings(twin)
    assert f.denials > 400
    assert f.destinations == f.denials
    assert f.unapproved_calls > 50
    assert f.content_hashes == (HASH,)
    assert "use1-a" in f.cells
    assert "use1-b" in f.cells
    assert len(f.pods) == len(f.sessions) >= 2
    assert all(p.startswith("sbx-tenant-acme/") for p in f.pods)
    assert 60.0 <= f.since_s < 90.0
    assert f.completed_writes > 0
    quiet = findings(twin, tenant="globex", start_s=0.0, end_s=twin.now_s())
    assert not quiet.implicated
    assert quiet.denials == quiet.unapproved_calls == 0


def test_the_plan_is_narrowest_first_and_never_fleet_wide(spec: FleetSpec) -> None:
    f = acme_findings(incident(spec))
    plan = containment_plan(f)
    kinds = [c.request.kind for c in plan if isinstance(c.request, Lever)]
    order = [k for k in NARROWEST_FIRST if k in kinds]
    assert order == NARROWEST_FIRST
    assert kinds == sorted(kinds, key=NARROWEST_FIRST.index)
    levers = [c.request for c in plan if isinstance(c.request, Lever)]
    assert levers[0] == Lever("kill_switch", "acme", KillSwitchParams("read"))
    assert levers[1] == Lever("warm_pool", "acme", WarmPoolParams(0))
    assert {lv.target for lv in levers if lv.kind == "pod_quarantine"} == set(f.pods)
    assert Lever("content_block", "acme", ContentParams(HASH)) in levers
    assert all(lv.target != "*" for lv in levers)
    assert all(lv.target in ("acme", *f.pods, *f.products) for lv in levers)
    assert all(c.prerequisite for c in plan)  # held, never undone by a verification loop
    escalated = containment_plan(f, escalate=True)
    assert escalated[-1].request == Lever("kill_switch", "*")


def test_containment_narrows_and_touches_only_the_tenant(spec: FleetSpec) -> None:
    twin = incident(spec)
    f = acme_findings(twin)
    plan = containment_plan(f, fleet=twin)
    journal = contain(plan, twin, sev=Sev.SEV1, people=EVERYONE, at_s=twin.now_s())
    assert [e.status for e in journal] == ["applied"] * len(journal)
    assert [e.kind for e in journal][:2] == ["kill_switch", "warm_pool"]
    for e in journal:
        for op, inverse in zip(e.ops, e.inverses, strict=True):
            assert widens_access(op, inverse) is None
    assert twin.flags == {"acme.max_side_effect": "read"}
    assert twin.sandbox.warm_pool("acme") == 0
    assert twin.sandbox.warm_pool("globex") == 20
    live = {c.request.target for c in plan if isinstance(c.request, Lever)} & set(f.pods)
    assert live
    assert live < set(f.pods)  # some implicated sessions had ended, their pods with them
    assert live == {p for p in twin.quarantined_pods if p.startswith("sbx-tenant-acme/")}
    assert twin.sandbox.frozen == {(p, k) for p in f.products for k in ("bundle", "toolset")}
    assert twin.sandbox.compensations(tenant="acme")
    assert not twin.sandbox.compensations(tenant="globex")
    twin.run_for(600)
    assert all(twin.sandbox.has_pod(p) for p in live)  # retained, never deleted
    late = acme_findings(twin)
    assert late.denials == f.denials  # nothing more reaches the proxy from the pod
    assert late.dropped > 0


def test_deny_all_goes_only_at_sev1_with_the_ic_and_the_security_lead(spec: FleetSpec) -> None:
    twin = incident(spec)
    deny_all = containment_plan(acme_findings(twin), escalate=True)[-1:]
    at = twin.now_s()
    (sev2,) = contain(deny_all, twin, sev=Sev.SEV2, people=EVERYONE, at_s=at)
    assert sev2.status == "refused"
    assert "SEV1 lever" in sev2.reason
    assert "incident is SEV2" in sev2.reason
    (alone,) = contain(deny_all, twin, sev=Sev.SEV1, people=(SEC, OPS), at_s=at)
    assert alone.status == "refused"
    assert "second approver" in alone.reason
    (no_sec,) = contain(deny_all, twin, sev=Sev.SEV1, people=(IC, OPS), at_s=at)
    assert no_sec.status == "refused"
    assert "security_lead" in no_sec.reason
    assert "proxy.deny_all" not in twin.flags
    (ok,) = contain(deny_all, twin, sev=Sev.SEV1, people=(IC, SEC), at_s=at)
    assert ok.status == "applied"
    assert {a.role for a in ok.approvers} == {"incident_commander", "security_lead"}
    assert twin.flags["proxy.deny_all"] == "true"


def test_a_warm_pool_lever_never_grows_the_pool(spec: FleetSpec) -> None:
    twin = Twin(spec, SEED)
    twin.apply(ops.SetWarmPool("acme", 5))
    grow = pull(
        Lever("warm_pool", "acme", WarmPoolParams(30)), twin, approvers=[SEC], at_s=0, reason="x"
    )
    assert grow.status == "refused"
    assert "never grows" in grow.reason
    assert twin.sandbox.warm_pool("acme") == 5
    assert widens_access(ops.SetWarmPool("acme", 30), ops.SetWarmPool("acme", 5)) is not None
    assert widens_access(ops.UnfreezePromotions("chat", "bundle")) is not None
    assert widens_access(ops.UnblockContentHash("acme", HASH)) is not None


@pytest.mark.parametrize(
    "lever",
    [
        Lever("warm_pool", "acme"),
        Lever("content_block", "acme", ContentParams(HASH)),
        Lever("compensation", "acme", CompensationParams(0.0)),
        Lever("promotion_freeze", "chat", FreezeParams(("bundle",))),
    ],
)
def test_sandbox_levers_need_their_owner(spec: FleetSpec, lever: Lever) -> None:
    twin = Twin(spec, SEED)
    refused = pull(lever, twin, approvers=[OPS], at_s=0, reason="x")
    assert refused.status == "refused"
    owner = OWNER if lever.kind == "promotion_freeze" else SEC
    assert pull(lever, twin, approvers=[owner], at_s=0, reason="x").status == "applied"


def test_the_runbook_is_registered_for_egress_and_reads_the_alerts(spec: FleetSpec) -> None:
    assert RUNBOOKS["egress"] is security_runbook
    twin = incident(spec)
    alert = (("alertname", "EgressExfilPattern"), ("cell", "use1-a"), ("tenant", "acme"))
    ctx = RunbookContext(
        incident_id="INC-0001",
        symptom=Symptom("egress", 75.0, "use1-a", "us-east-1"),
        suspects=(),
        fleet=twin,
        at_s=twin.now_s(),
        alerts=(alert,),
    )
    plan = security_runbook(ctx)
    assert [c.request.kind for c in plan[:2]] == ["kill_switch", "warm_pool"]
    assert isinstance(plan[-1].request, UnsafeRequest)
    assert plan[-1].request.kind == "delete_pod_under_investigation"


def test_comms_are_product_by_region_and_carry_no_destination(spec: FleetSpec) -> None:
    twin = incident(spec)
    f = acme_findings(twin)
    cells = [c.name for c in twin.cells()]
    update = security_update(
        f,
        incident_id="INC-0001",
        sev=Sev.SEV1,
        audit_query_url="https://audit.corp/query?incident=INC-0001",
        known_cells=cells,
        contained=["kill switch", "warm pool 0"],
    )
    assert {(p.product, p.region) for p in update.status_pages} == {
        (p, r) for p in f.products for r in f.regions
    }
    for page in update.status_pages:
        for hidden in ("acme", *cells, *f.sessions, *(p.split("/")[1] for p in f.pods)):
            assert hidden not in page.text
    hosts = [
        r.dest_host
        for r in twin.egress_records(start_s=0.0, end_s=math.inf, tenant="acme")
        if r.dest_class == "base64-subdomain"
    ]
    assert hosts
    assert not any(h in update.channel.text for h in hosts)
    assert "https://audit.corp/query?incident=INC-0001" in update.channel.text
    leaky = Findings(**{**f.__dict__, "products": ("acme chat",)})
    with pytest.raises(CommsError, match="acme"):
        security_update(
            leaky,
            incident_id="INC-0001",
            sev=Sev.SEV1,
            audit_query_url="https://audit.corp/q",
            known_cells=cells,
        )


def test_deny_all_needs_two_people_holding_the_two_roles(spec: FleetSpec) -> None:
    """One person as security lead and incident commander, plus a scribe, is not two people."""
    twin = incident(spec)
    deny_all = containment_plan(acme_findings(twin), escalate=True)[-1:]
    at = twin.now_s()
    scribe = Approver("bob", "scribe")
    for people in (
        (Approver("alice", "security_lead"), Approver("alice", "incident_commander"), scribe),
        (Approver("alice", "security_lead"), Approver("Alice ", "incident_commander"), scribe),
        (Approver("alice", "security_lead"), Approver("ALICE", "incident_commander"), OPS, OWNER),
    ):
        (entry,) = contain(deny_all, twin, sev=Sev.SEV1, people=people, at_s=at)
        assert entry.status == "refused", people
        assert "proxy.deny_all" not in twin.flags
    # the same person in both roles, and someone else holding one of them: they are picked
    people = (
        Approver("alice", "security_lead"),
        Approver("alice", "incident_commander"),
        Approver("ivy", "incident_commander"),
    )
    (ok,) = contain(deny_all, twin, sev=Sev.SEV1, people=people, at_s=at)
    assert ok.status == "applied", ok.reason
    assert [a.name for a in ok.approvers] == ["alice", "ivy"]

"""Break-glass: two-person approval, expiry and reaping, paged and audited uses, no weights."""

from __future__ import annotations

import pytest

from firedrill.errors import OperationError, UnknownTargetError
from firedrill.respond.breakglass import (
    INCIDENT_COMMANDER,
    SECURITY_LEAD,
    BreakGlassBroker,
    BreakGlassError,
    Grant,
    can_access,
)
from firedrill.respond.severity import Sev


def _sev1_grant(broker: BreakGlassBroker, *, include_weight_buckets: bool = False) -> Grant:
    req = broker.request(
        "bg-oncall",
        "nodes:patch",
        "quarantine use1-a",
        "alice",
        0.0,
        Sev.SEV1,
        include_weight_buckets=include_weight_buckets,
    )
    assert broker.approve(req.request_id, "ivan", INCIDENT_COMMANDER, 60.0) is None
    grant = broker.approve(req.request_id, "sara", SECURITY_LEAD, 120.0)
    assert grant is not None
    return grant


def test_sev1_grant_needs_the_ic_and_the_security_lead() -> None:
    broker = BreakGlassBroker()
    grant = _sev1_grant(broker)
    assert grant.approvers == ("ivan", "sara")
    assert grant.granted_at_s == 120.0
    assert grant.expires_at_s == 120.0 + 3600.0  # default 1 h
    assert broker.active == [grant]


def test_sev1_refuses_an_approver_in_another_role() -> None:
    broker = BreakGlassBroker()
    req = broker.request("bg", "nodes:patch", "why", "alice", 0.0, Sev.SEV1)
    with pytest.raises(BreakGlassError, match="incident commander and the security lead"):
        broker.approve(req.request_id, "olga", "ops_lead", 10.0)


def test_sev1_refuses_two_ics() -> None:
    broker = BreakGlassBroker()
    req = broker.request("bg", "nodes:patch", "why", "alice", 0.0, Sev.SEV1)
    broker.approve(req.request_id, "ivan", INCIDENT_COMMANDER, 10.0)
    with pytest.raises(BreakGlassError, match="other role"):
        broker.approve(req.request_id, "ian", INCIDENT_COMMANDER, 20.0)


@pytest.mark.parametrize("approver", ["alice", "bg"])
def test_self_approval_is_refused(approver: str) -> None:
    broker = BreakGlassBroker()
    req = broker.request("bg", "nodes:patch", "why", "alice", 0.0, Sev.SEV1)
    with pytest.raises(BreakGlassError, match="own break-glass request") as err:
        broker.approve(req.request_id, approver, INCIDENT_COMMANDER, 10.0)
    assert isinstance(err.value, OperationError)
    assert broker.journal[-1].event == "refused"


def test_the_same_person_cannot_approve_twice() -> None:
    broker = BreakGlassBroker()
    req = broker.request("bg", "rollouts:patch", "why", "alice", 0.0, Sev.SEV2)
    broker.approve(req.request_id, "bob", "ops_lead", 10.0)
    with pytest.raises(BreakGlassError, match="two distinct people"):
        broker.approve(req.request_id, "bob", "capacity_lead", 20.0)


def test_below_sev1_any_two_distinct_approvers_suffice() -> None:
    broker = BreakGlassBroker()
    req = broker.request("bg", "rollouts:patch", "why", "alice", 0.0, Sev.SEV2, ttl_s=1800.0)
    assert broker.approve(req.request_id, "bob", "ops_lead", 10.0) is None
    grant = broker.approve(req.request_id, "carol", "ops_lead", 20.0)
    assert grant is not None
    assert grant.expires_at_s == 1820.0
    with pytest.raises(UnknownTargetError):
        broker.approve(req.request_id, "dave", "ops_lead", 30.0)  # no longer pending


def test_ttl_over_four_hours_is_refused() -> None:
    broker = BreakGlassBroker()
    broker.request("bg", "nodes:patch", "why", "alice", 0.0, Sev.SEV2, ttl_s=4 * 3600.0)
    with pytest.raises(BreakGlassError, match="ttl_s"):
        broker.request("bg", "nodes:patch", "why", "alice", 0.0, Sev.SEV2, ttl_s=4 * 3600.0 + 1)


@pytest.mark.parametrize("scope", ["cluster-admin", "Cluster-Admin", "system:masters"])
def test_cluster_admin_is_never_a_break_glass_scope(scope: str) -> None:
    broker = BreakGlassBroker()
    with pytest.raises(BreakGlassError, match="never a break-glass scope") as err:
        broker.request("bg", scope, "everything is on fire", "alice", 0.0, Sev.SEV1)
    assert "verbs the incident needs" in err.value.reason
    assert broker.journal[-1].event == "refused"


def test_a_request_needs_a_reason() -> None:
    with pytest.raises(BreakGlassError, match="reason"):
        BreakGlassBroker().request("bg", "nodes:patch", " ", "alice", 0.0, Sev.SEV2)


def test_reap_removes_expired_grants_and_returns_them() -> None:
    broker = BreakGlassBroker()
    grant = _sev1_grant(broker)
    assert broker.reap(grant.expires_at_s - 1) == []
    assert broker.reap(grant.expires_at_s) == [grant]
    assert broker.active == []
    assert broker.reap(grant.expires_at_s + 10) == []
    assert broker.journal[-1].event == "reap"


def test_use_after_reaping_raises() -> None:
    broker = BreakGlassBroker()
    grant = _sev1_grant(broker)
    broker.reap(grant.expires_at_s + 1)
    with pytest.raises(BreakGlassError, match="reaped"):
        broker.use(grant.grant_id, "patch node", grant.expires_at_s + 2)


def test_use_after_expiry_raises_even_before_the_reaper_runs() -> None:
    broker = BreakGlassBroker()
    grant = _sev1_grant(broker)
    with pytest.raises(BreakGlassError, match="expired"):
        broker.use(grant.grant_id, "patch node", grant.expires_at_s)


def test_every_use_pages_security_and_returns_an_audit_record() -> None:
    broker = BreakGlassBroker()
    grant = _sev1_grant(broker)
    uses = [broker.use(grant.grant_id, f"taint node {i}", 200.0 + i) for i in range(3)]
    assert [u.page.action for u in uses] == ["taint node 0", "taint node 1", "taint node 2"]
    assert all(u.page.identity == "bg-oncall" and u.page.sev is Sev.SEV1 for u in uses)
    assert [u.audit.at_s for u in uses] == [200.0, 201.0, 202.0]
    assert all(u.audit.level == "RequestResponse" and u.audit.event == "use" for u in uses)
    assert broker.journal[-3:] == [u.audit for u in uses]


def test_use_of_an_unknown_grant_raises() -> None:
    with pytest.raises(UnknownTargetError):
        BreakGlassBroker().use("bg-99", "x", 0.0)


def test_weight_buckets_are_excluded_by_default() -> None:
    grant = _sev1_grant(BreakGlassBroker())
    assert not grant.include_weight_buckets
    assert not can_access(grant, "models/llama-70b/weights.safetensors")
    assert can_access(grant, "nodes/gpu-h100-use1-0042")


def test_weight_buckets_only_when_the_request_asked_for_them() -> None:
    grant = _sev1_grant(BreakGlassBroker(), include_weight_buckets=True)
    assert can_access(grant, "models/llama-70b/weights.safetensors")


# --- one person is one person, however their name is spelled -------------------------------------


@pytest.mark.parametrize("again", ["Bob", " BOB ", "ｂｏｂ", "bo\u200bb", "BOB\t"])
def test_approvals_differing_only_in_spelling_are_one_person(again: str) -> None:
    broker = BreakGlassBroker()
    req = broker.request("bg", "rollouts:patch", "why", "alice", 0.0, Sev.SEV2)
    assert broker.approve(req.request_id, "bob", "ops_lead", 10.0) is None
    with pytest.raises(BreakGlassError, match="two distinct people"):
        broker.approve(req.request_id, again, "capacity_lead", 20.0)
    assert broker.active == []


@pytest.mark.parametrize("approver", ["Alice", "ALICE ", "BG"])
def test_the_requester_or_identity_in_another_case_cannot_approve(approver: str) -> None:
    broker = BreakGlassBroker()
    req = broker.request("bg", "nodes:patch", "why", "alice", 0.0, Sev.SEV1)
    with pytest.raises(BreakGlassError, match="own break-glass request"):
        broker.approve(req.request_id, approver, INCIDENT_COMMANDER, 10.0)


def test_sev1_roles_are_held_by_two_people_not_two_spellings() -> None:
    broker = BreakGlassBroker()
    req = broker.request("bg", "nodes:patch", "why", "alice", 0.0, Sev.SEV1)
    broker.approve(req.request_id, "ivan", INCIDENT_COMMANDER, 10.0)
    with pytest.raises(BreakGlassError, match="two distinct people"):
        broker.approve(req.request_id, "Ivan", SECURITY_LEAD, 20.0)


def test_an_approver_whose_name_is_only_invisible_characters_is_nobody() -> None:
    broker = BreakGlassBroker()
    req = broker.request("bg", "nodes:patch", "why", "alice", 0.0, Sev.SEV2)
    with pytest.raises(BreakGlassError, match="names the approver"):
        broker.approve(req.request_id, "\u200b\u200d", "ops_lead", 10.0)


# --- scopes from an allowlist; paths normalised ------------------------------------------------


@pytest.mark.parametrize(
    "scope",
    ["*", "*/*", "cluster_admin", "clusteradmin", "Cluster Admin", "system:masters,view",
     "system:masters", "nodes:*", "nodes:patch,pods:delete", "ｃluster-admin"],
)  # fmt: skip
def test_cluster_admin_like_scopes_are_refused(scope: str) -> None:
    broker = BreakGlassBroker()
    with pytest.raises(BreakGlassError, match="never a break-glass scope"):
        broker.request("bg", scope, "everything is on fire", "alice", 0.0, Sev.SEV1)
    assert broker.journal[-1].event == "refused"


@pytest.mark.parametrize(
    "scope", ["nodes", "secrets:get", "nodes:delete", "route_weight:../x", "anything:goes", ":"]
)
def test_scopes_off_the_allowlist_are_refused(scope: str) -> None:
    with pytest.raises(BreakGlassError, match="not"):
        BreakGlassBroker().request("bg", scope, "why", "alice", 0.0, Sev.SEV1)


@pytest.mark.parametrize("scope", ["nodes:patch", "Pods:Evict", "digest_rollback:llm-70b"])
def test_scopes_on_the_allowlist_are_granted(scope: str) -> None:
    req = BreakGlassBroker().request("bg", scope, "why", "alice", 0.0, Sev.SEV1)
    assert req.scope == scope


def test_every_lever_kind_is_a_scope_and_nothing_else_is() -> None:
    from firedrill.model.access import LEVER_SCOPES
    from firedrill.respond.levers import CATALOGUE

    assert set(CATALOGUE) == LEVER_SCOPES


@pytest.mark.parametrize(
    "path",
    ["/models/x", "./models/x", "Models/x", "MODELS/llama/w.safetensors", "nodes/../models/x",
     "%2e/models/x", "%2Fmodels%2Fx", "models\\x", "//models//x", "ｍodels/x",
     "s3://weights-use1/models/x", "../models/x", "nodes/../../x"],
)  # fmt: skip
def test_weight_paths_are_normalised_before_they_are_matched(path: str) -> None:
    grant = _sev1_grant(BreakGlassBroker())
    assert not can_access(grant, path)
    weights = _sev1_grant(BreakGlassBroker(), include_weight_buckets=True)
    assert can_access(weights, path)


def test_paths_outside_weight_buckets_stay_reachable() -> None:
    grant = _sev1_grant(BreakGlassBroker())
    for path in ("nodes/gpu-h100-use1-0042", "/pods/serve-chat/r1", "modelsx/notes"):
        assert can_access(grant, path), path

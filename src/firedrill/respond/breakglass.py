"""Break-glass access: two people approve it, it expires on its own, and every use is loud.

On-call holds exactly the runbook verbs. When an incident needs more, a break-glass grant gives
it, under rules that keep the escape hatch from becoming the usual door:

* **Two-person rule.** Two distinct approvers, neither of them the requester nor the identity
  being granted. At SEV1 the two are the incident commander and the security lead. People are
  told apart by ``model.identity.canonical_identity`` (``alice`` and ``Alice`` are one person).
* **Expiry.** A grant lasts one hour by default and four at most; ``reap`` removes expired
  grants the way a controller deletes an expired binding, and a reaped grant cannot be used.
* **Every use pages security** and leaves an audit record at full fidelity.
* **No weights by default.** The identity is kept out of weight buckets (``models/*``) unless the
  request explicitly asked for them; paths are normalised before they are matched
  (``model.access.is_weight_path``: ``/models/x``, ``./models/x``, ``Models/x`` are weights).
* **Never cluster-admin.** A break-glass scope is what the incident needs, not everything: one
  entry of an allowlist (``model.access.scope_refusal``), never a wildcard, list or group.

The broker is pure: callers pass simulated times in, and deliver the pages and audit records it
returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Final, NamedTuple

from firedrill.errors import OperationError, UnknownTargetError
from firedrill.model.access import is_weight_path, scope_refusal
from firedrill.model.identity import canonical_identity, same_person
from firedrill.respond.severity import Sev

DEFAULT_TTL_S: Final = 3600.0  # seconds a grant lasts unless the request says otherwise
MAX_TTL_S: Final = 4 * 3600.0
INCIDENT_COMMANDER: Final = "incident_commander"
SECURITY_LEAD: Final = "security_lead"
SEV1_ROLES: Final = frozenset({INCIDENT_COMMANDER, SECURITY_LEAD})
AUDIT_LEVEL: Final = "RequestResponse"  # break-glass identities are audited at full fidelity


class BreakGlassError(OperationError):
    """A break-glass request, approval or use is refused; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True)
class Approval:
    """One person's approval of a request, in the role they approved as."""

    approver: str
    role: str
    at_s: float


@dataclass(frozen=True)
class BreakGlassRequest:
    """What is asked for, for whom, by whom, and why."""

    request_id: str
    identity: str
    scope: str
    reason: str
    requested_by: str
    at_s: float
    sev: Sev
    ttl_s: float
    include_weight_buckets: bool
    approvals: tuple[Approval, ...] = ()


@dataclass(frozen=True)
class Grant:
    """Granted access: valid from ``granted_at_s`` until ``expires_at_s``."""

    grant_id: str
    request_id: str
    identity: str
    scope: str
    reason: str
    sev: Sev
    approvers: tuple[str, ...]
    granted_at_s: float
    expires_at_s: float
    include_weight_buckets: bool


@dataclass(frozen=True)
class SecurityPage:
    """A page to security: every use of break-glass access raises one."""

    at_s: float
    grant_id: str
    identity: str
    action: str
    sev: Sev
    summary: str


@dataclass(frozen=True)
class AuditRecord:
    """One break-glass event, for the caller to append to the store's audit log."""

    at_s: float
    event: str  # request, refused, approve, grant, use, reap
    actor: str
    subject: str  # the request or grant id
    detail: str
    level: str = AUDIT_LEVEL


class Use(NamedTuple):
    """What one use of a grant produces: the page to send and the record to keep."""

    page: SecurityPage
    audit: AuditRecord


def _check_time(at_s: float) -> None:
    if not math.isfinite(at_s):
        raise ValueError(f"at_s must be finite, got {at_s}")


def can_access(grant: Grant, resource: str) -> bool:
    """Whether the grant reaches ``resource``; weight buckets only when explicitly asked for."""
    if is_weight_path(resource):
        return grant.include_weight_buckets
    return True


class BreakGlassBroker:
    """Requests, two-person approvals, expiring grants and audited uses."""

    def __init__(self) -> None:
        self.journal: list[AuditRecord] = []  # every event, refusals included, oldest first
        self._requests: dict[str, BreakGlassRequest] = {}  # waiting for approvals
        self._grants: dict[str, Grant] = {}
        self._reaped: dict[str, Grant] = {}
        self._next_id = 1

    def _id(self, prefix: str) -> str:
        n = self._next_id
        self._next_id += 1
        return f"{prefix}-{n}"

    def _record(
        self, at_s: float, event: str, actor: str, subject: str, detail: str
    ) -> AuditRecord:
        record = AuditRecord(at_s, event, actor, subject, detail)
        self.journal.append(record)
        return record

    def _refuse(self, at_s: float, actor: str, subject: str, reason: str) -> BreakGlassError:
        self._record(at_s, "refused", actor, subject, reason)
        return BreakGlassError(reason)

    @property
    def active(self) -> list[Grant]:
        """Grants not yet reaped, oldest first."""
        return list(self._grants.values())

    def request(
        self,
        identity: str,
        scope: str,
        reason: str,
        requested_by: str,
        at_s: float,
        sev: Sev,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        include_weight_buckets: bool = False,
    ) -> BreakGlassRequest:
        """Ask for access; refused for a scope off the allowlist (cluster-admin above all),
        without a reason, or over the max TTL."""
        _check_time(at_s)
        who = requested_by.strip()
        if not canonical_identity(identity) or not canonical_identity(who):
            raise self._refuse(at_s, who, "", "a request names the identity and the requester")
        why = scope_refusal(scope)
        if why is not None:
            raise self._refuse(at_s, who, identity, why)
        if not reason.strip():
            raise self._refuse(at_s, who, identity, "a request needs a reason")
        if not 0 < ttl_s <= MAX_TTL_S:
            raise self._refuse(
                at_s, who, identity, f"ttl_s must be in (0, {MAX_TTL_S:g}] seconds, got {ttl_s}"
            )
        req = BreakGlassRequest(
            self._id("bgr"),
            identity.strip(),
            scope.strip(),
            reason.strip(),
            who,
            at_s,
            sev,
            ttl_s,
            include_weight_buckets,
        )
        self._requests[req.request_id] = req
        weights = "; includes weight buckets" if include_weight_buckets else ""
        self._record(
            at_s,
            "request",
            who,
            req.request_id,
            f"{req.identity} {req.scope}: {req.reason}{weights}",
        )
        return req

    def pending(self, request_id: str) -> BreakGlassRequest:
        """A request still waiting for approvals."""
        try:
            return self._requests[request_id]
        except KeyError:
            raise UnknownTargetError("break-glass request", request_id) from None

    def approve(self, request_id: str, approver: str, role: str, at_s: float) -> Grant | None:
        """Add an approval; the second valid one issues the grant, which is returned."""
        _check_time(at_s)
        req = self.pending(request_id)
        who = approver.strip()
        if not canonical_identity(who):
            raise self._refuse(at_s, who, request_id, "an approval names the approver")
        if at_s < req.at_s:
            raise ValueError(f"at_s {at_s} is before the request ({req.at_s})")
        if same_person(who, req.requested_by) or same_person(who, req.identity):
            raise self._refuse(
                at_s, who, request_id, f"{who} cannot approve their own break-glass request"
            )
        if any(same_person(a.approver, who) for a in req.approvals):
            raise self._refuse(
                at_s, who, request_id, f"{who} already approved: two distinct people are needed"
            )
        if req.sev is Sev.SEV1:
            if role not in SEV1_ROLES:
                raise self._refuse(
                    at_s,
                    who,
                    request_id,
                    f"SEV1 break-glass needs the incident commander and the security lead, "
                    f"not {role}",
                )
            if any(a.role == role for a in req.approvals):
                raise self._refuse(
                    at_s, who, request_id, f"{role} already approved; SEV1 needs the other role"
                )
        req = replace(req, approvals=(*req.approvals, Approval(who, role, at_s)))
        self._record(at_s, "approve", who, request_id, f"as {role}")
        if len(req.approvals) < 2:
            self._requests[request_id] = req
            return None
        del self._requests[request_id]
        grant = Grant(
            self._id("bg"),
            req.request_id,
            req.identity,
            req.scope,
            req.reason,
            req.sev,
            tuple(a.approver for a in req.approvals),
            at_s,
            at_s + req.ttl_s,
            req.include_weight_buckets,
        )
        self._grants[grant.grant_id] = grant
        self._record(
            at_s,
            "grant",
            " + ".join(grant.approvers),
            grant.grant_id,
            f"{grant.identity} {grant.scope} until {grant.expires_at_s:g} s",
        )
        return grant

    def reap(self, now_s: float) -> list[Grant]:
        """Remove every grant expired at ``now_s``; returns them."""
        _check_time(now_s)
        expired = [g for g in self._grants.values() if g.expires_at_s <= now_s]
        for g in expired:
            del self._grants[g.grant_id]
            self._reaped[g.grant_id] = g
            self._record(now_s, "reap", "broker", g.grant_id, f"expired at {g.expires_at_s:g} s")
        return expired

    def use(self, grant_id: str, action: str, at_s: float) -> Use:
        """Use a grant: refused once expired or reaped; otherwise pages security and audits."""
        _check_time(at_s)
        if grant_id in self._reaped:
            raise self._refuse(at_s, "", grant_id, f"grant {grant_id} expired and was reaped")
        grant = self._grants.get(grant_id)
        if grant is None:
            raise UnknownTargetError("break-glass grant", grant_id)
        if at_s >= grant.expires_at_s:
            raise self._refuse(
                at_s,
                grant.identity,
                grant_id,
                f"grant {grant_id} expired at {grant.expires_at_s:g} s",
            )
        if at_s < grant.granted_at_s:
            raise ValueError(f"at_s {at_s} is before the grant ({grant.granted_at_s})")
        page = SecurityPage(
            at_s,
            grant_id,
            grant.identity,
            action,
            grant.sev,
            f"break-glass use by {grant.identity} ({grant.scope}): {action}",
        )
        audit = self._record(at_s, "use", grant.identity, grant_id, action)
        return Use(page, audit)

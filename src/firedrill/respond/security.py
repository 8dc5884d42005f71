"""Security incidents in agent sandboxes: findings, containment narrowest first, comms.

Reference self-check 4: security reports a spike in egress-proxy denials for tenant acme, with
destinations that look like base64 subdomains. The answer, as code:

1. **Findings** from the audit log (``AuditLog``: the egress proxy's and the tool gateway's
   records, read for the incident window): which sessions and pods sent the base64-looking
   lookups or called write/money tools without approval, which content (by hash) made them, the
   write and money calls that completed, and the products involved.
2. **Containment, narrowest first** (``containment_plan``), every step a typed lever that only
   narrows access and touches that tenant alone:

   a. the tenant's kill switch: ``<tenant>.max_side_effect=read`` (tools down to read-only);
   b. the tenant's sandbox warm pool to 0 (no new session starts; running ones are evidence);
   c. each implicated pod quarantined, never deleted (``ir.corp/quarantine=true``; the pod, its
      filesystem and its flows stay for the security lead, and the session's end retains it);
   d. CatalogBundle and toolset promotions of the affected products frozen (rollbacks still go);
   e. the injecting content blocked at retrieval, by hash;
   f. the registered compensations run for the write and money calls that completed.

   The fleet-wide proxy deny-all breaks every tenant, so it is never in the plan unless asked
   for (``escalate``), and then it goes only at SEV1 with the incident commander's and the
   security lead's approval (``check_sev1`` and the levers' approvals); otherwise it is journalled
   refused, with the reason.
3. **Evidence** is exported and preserved (``firedrill.respond.evidence``).
4. **Comms**: the status page says product × region, never the tenant, its cells, pods or
   sessions; the channel gets counts and a link to the audit query, redacted, never the
   destinations (the data that left is in them).

``security_runbook`` registers the plan with the responder for the ``egress`` symptom. Every
step is a prerequisite there: containment is applied and held, never "verified" against the
tripwire and undone when it keeps firing (undoing containment would widen access).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from firedrill.errors import UnknownTargetError
from firedrill.model import operations as ops
from firedrill.model.identity import canonical_identity
from firedrill.model.sandbox import EgressRecord, ToolCallRecord
from firedrill.ports import Fleet
from firedrill.respond import levers as lv
from firedrill.respond.comms import Redacted, StatusPageEntry, redact, status_page_entry
from firedrill.respond.guards import Approver, GuardResult, UnsafeRequest, check_sev1
from firedrill.respond.levers import (
    CATALOGUE,
    CompensationParams,
    ContentParams,
    FreezeParams,
    KillSwitchParams,
    Lever,
    LeverJournalEntry,
    WarmPoolParams,
)
from firedrill.respond.responder import Candidate, RunbookContext, runbook
from firedrill.respond.severity import Sev

EVIDENCE_LOOKBACK_S = 3600.0  # the audit window starts this long before the incident opened
SUSPICIOUS_DEST = frozenset({"base64-subdomain", "metadata", "kube-api"})
DENY_ALL = lv.FLEET_WIDE


@runtime_checkable
class AuditLog(Protocol):
    """The egress proxy's and the tool gateway's audit records (the twin serves both)."""

    def egress_records(
        self, *, start_s: float, end_s: float, tenant: str | None = None
    ) -> Sequence[EgressRecord]: ...

    def tool_records(
        self, *, start_s: float, end_s: float, tenant: str | None = None
    ) -> Sequence[ToolCallRecord]: ...


@dataclass(frozen=True)
class Findings:
    """What the audit log says about one tenant's sandboxes over a window."""

    tenant: str
    start_s: float
    end_s: float
    since_s: float  # the first suspicious record (end_s when there is none)
    sessions: tuple[str, ...]  # implicated sessions, first seen first
    pods: tuple[str, ...]
    cells: tuple[str, ...]
    regions: tuple[str, ...]
    products: tuple[str, ...]
    denials: int  # suspicious egress the proxy denied
    dropped: int  # suspicious egress the quarantine policy dropped
    destinations: int  # distinct suspicious destinations
    domains: tuple[str, ...]  # the domains under the base64-looking labels, most used first
    unapproved_calls: int  # write/money calls that arrived without approval
    content_hashes: tuple[str, ...]  # content the unapproved calls followed, most calls first
    completed_writes: int  # write/money calls of the implicated sessions or content that ran
    # (in the window: a compromised session's earlier writes are as suspect as its later ones)

    @property
    def implicated(self) -> bool:
        return bool(self.sessions)


def _domain(host: str) -> str:
    return host.split(".", 1)[1] if "." in host else host


def findings(audit: AuditLog, *, tenant: str, start_s: float, end_s: float) -> Findings:
    """Read the tenant's audit records in [start_s, end_s] and name what is implicated."""
    egress = audit.egress_records(start_s=start_s, end_s=end_s, tenant=tenant)
    calls = audit.tool_records(start_s=start_s, end_s=end_s, tenant=tenant)
    bad_egress = [r for r in egress if r.dest_class in SUSPICIOUS_DEST]
    unapproved = [r for r in calls if r.side_effect != "read" and r.approved == "false"]
    suspicious: list[EgressRecord | ToolCallRecord] = [*bad_egress, *unapproved]
    sessions: dict[str, EgressRecord | ToolCallRecord] = {}
    for r in sorted(suspicious, key=lambda r: r.at_s):
        sessions.setdefault(r.session, r)
    hashes = Counter(r.content_hash for r in unapproved if r.content_hash)
    domains = Counter(_domain(r.dest_host) for r in bad_egress)
    implicated = set(sessions)
    bad_hashes = set(hashes)
    completed = [
        r
        for r in calls
        if r.side_effect != "read"
        and r.outcome == "ok"
        and (r.session in implicated or (r.content_hash and r.content_hash in bad_hashes))
    ]
    first = [r.at_s for r in suspicious]
    records = list(sessions.values())
    return Findings(
        tenant=tenant,
        start_s=start_s,
        end_s=end_s,
        since_s=min(first) if first else end_s,
        sessions=tuple(sessions),
        pods=tuple(dict.fromkeys(r.pod for r in records)),
        cells=tuple(dict.fromkeys(r.cell for r in records)),
        regions=tuple(dict.fromkeys(r.region for r in records)),
        products=tuple(dict.fromkeys(r.product for r in records if r.product)),
        denials=sum(1 for r in bad_egress if r.decision == "deny"),
        dropped=sum(1 for r in bad_egress if r.decision == "dropped"),
        destinations=len({r.dest_host for r in bad_egress}),
        domains=tuple(d for d, _ in sorted(domains.items(), key=lambda kv: (-kv[1], kv[0]))),
        unapproved_calls=len(unapproved),
        content_hashes=tuple(h for h, _ in sorted(hashes.items(), key=lambda kv: (-kv[1], kv[0]))),
        completed_writes=len(completed),
    )


def existing_pods(fleet: Fleet, pods: Iterable[str]) -> tuple[str, ...]:
    """The pods that still exist (a session that ended without quarantine took its pod along;
    its audit records are what is left of it)."""
    out: list[str] = []
    for pod in pods:
        try:
            fleet.inverse_of(ops.QuarantinePod(pod))
        except UnknownTargetError:
            continue
        out.append(pod)
    return tuple(out)


def containment_plan(
    f: Findings, *, fleet: Fleet | None = None, escalate: bool = False
) -> list[Candidate]:
    """The ordered containment for the findings: narrowest first, deny-all only if escalated.

    With ``fleet``, only the implicated pods that still exist are quarantined.
    """
    t = f.tenant
    pods = sorted(f.pods if fleet is None else existing_pods(fleet, f.pods))
    why = (
        f"{f.denials + f.dropped} egress attempt(s) to {f.destinations} base64-looking "
        f"destination(s) and {f.unapproved_calls} unapproved write/money call(s) from "
        f"{len(f.sessions)} session(s) of {t}"
    )
    out = [
        Candidate(
            Lever("kill_switch", t, KillSwitchParams("read")),
            f"narrowest first: {t}'s tools down to read-only side effects ({why})",
            prerequisite=True,
        ),
        Candidate(
            Lever("warm_pool", t, WarmPoolParams(0)),
            f"no new {t} sandbox starts; running sessions stay as evidence",
            prerequisite=True,
        ),
    ]
    out += [
        Candidate(
            Lever("pod_quarantine", pod),
            f"cut {pod} off and keep it (label, shutdownPolicy Retain): the security lead's "
            "evidence, never deleted",
            prerequisite=True,
        )
        for pod in pods
    ]
    out += [
        Candidate(
            Lever("promotion_freeze", product, FreezeParams()),
            f"no CatalogBundle or toolset promotion for {product} while {t} is contained",
            prerequisite=True,
        )
        for product in f.products
    ]
    out += [
        Candidate(
            Lever("content_block", t, ContentParams(h)),
            f"{h} preceded {t}'s unapproved calls: block it at retrieval",
            prerequisite=True,
        )
        for h in f.content_hashes
    ]
    if f.completed_writes:
        if f.sessions:
            out.append(
                Candidate(
                    Lever("compensation", t, CompensationParams(f.start_s, f.sessions)),
                    f"{f.completed_writes} write/money call(s) completed in the implicated "
                    "sessions or after the injecting content: run their compensations",
                    prerequisite=True,
                )
            )
        out += [
            Candidate(
                Lever("compensation", t, CompensationParams(f.start_s, content_hash=h)),
                f"compensate the writes that followed {h} in any {t} session",
                prerequisite=True,
            )
            for h in f.content_hashes
        ]
    if escalate:
        out.append(
            Candidate(
                Lever("kill_switch", DENY_ALL),
                "escalation: the fleet-wide egress deny-all breaks every tenant; SEV1 only, "
                "with the incident commander and the security lead",
                prerequisite=True,
            )
        )
    return out


@runbook("egress")
def security_runbook(ctx: RunbookContext) -> list[Candidate]:
    """The responder's runbook for sandbox security incidents (needs an ``AuditLog`` fleet)."""
    audit = ctx.fleet
    if not isinstance(audit, AuditLog):
        return []  # no audit log to read: the tenant is contained by hand
    start = max(0.0, ctx.symptom.onset_s - EVIDENCE_LOOKBACK_S)
    out: list[Candidate] = []
    for tenant in ctx.label_values("tenant"):
        f = findings(audit, tenant=tenant, start_s=start, end_s=ctx.at_s)
        if f.implicated:
            out += containment_plan(f, fleet=ctx.fleet)
    out.append(
        Candidate(
            UnsafeRequest("delete_pod_under_investigation", ctx.symptom.cell, "on-call"),
            "deleting the sandbox pods would stop the traffic and destroy the evidence",
        )
    )
    return out


# ---------------------------------------------------------------------------------------------
# pulling the plan outside the responder (the CLI, drills, tests)


def approvers_for(lever: Lever, people: Iterable[Approver]) -> tuple[Approver, ...]:
    """Who signs a lever from the people present: its owner, and for a fleet-wide one also
    the incident commander (a second, distinct person)."""
    spec = CATALOGUE[lever.kind]
    present = list(people)
    out = [a for a in present if a.role in spec.decided_by][:1]
    if lv.scope_of(lever) == "fleet":
        for role in sorted(set(spec.fleet_roles) | {"incident_commander"}):
            taken = {canonical_identity(a.name) for a in out}
            holder = next(
                (a for a in present if a.role == role and canonical_identity(a.name) not in taken),
                None,
            )
            if holder is not None:
                out.append(holder)
    return tuple(out)


def contain(
    plan: Sequence[Candidate],
    fleet: Fleet,
    *,
    sev: Sev,
    people: Sequence[Approver],
    at_s: float,
    dry_run: bool = False,
) -> list[LeverJournalEntry]:
    """Pull the plan in order; every pull, refused ones too, is journalled with its reason."""
    journal: list[LeverJournalEntry] = []
    for cand in plan:
        if isinstance(cand.request, UnsafeRequest):
            journal.append(lv.refuse(cand.request, at_s=at_s))
            continue
        lever = cand.request
        checks: list[GuardResult] = []
        if lever.kind == "kill_switch" and lever.target == DENY_ALL:
            checks.append(check_sev1(sev, "the fleet-wide egress deny-all"))
        journal.append(
            lv.pull(
                lever,
                fleet,
                approvers=approvers_for(lever, people),
                at_s=at_s,
                reason=cand.reason,
                checks=checks,
                dry_run=dry_run,
            )
        )
    return journal


# ---------------------------------------------------------------------------------------------
# comms


@dataclass(frozen=True)
class SecurityUpdate:
    status_pages: tuple[StatusPageEntry, ...]  # one per product × region
    channel: Redacted


def security_update(
    f: Findings,
    *,
    incident_id: str,
    sev: Sev,
    audit_query_url: str,
    known_cells: Iterable[str],
    contained: Sequence[str] = (),
) -> SecurityUpdate:
    """The status-page entries (product × region) and the incident-channel text for findings.

    The status page never names the tenant, its cells, pods or sessions (the entry is refused if
    it does); the channel text carries counts and the audit query, never the destinations.
    """
    hidden = [f.tenant, *f.pods, *f.sessions, *(p.split("/", 1)[-1] for p in f.pods)]
    text = (
        "Investigating a security issue affecting agent tools; some agent actions are "
        "temporarily limited to read-only."
    )
    products = f.products or ("agent tools",)
    pages = tuple(
        status_page_entry(product, region, text, known_cells=known_cells, known_nodes=hidden)
        for product in products
        for region in f.regions
    )
    steps = ", ".join(contained) or "none yet"
    what = (
        f"{incident_id} ({sev}): {f.denials + f.dropped} egress attempt(s) to "
        f"{f.destinations} base64-looking destination(s) under {', '.join(f.domains) or '-'}, "
        f"{f.unapproved_calls} unapproved write/money call(s), from {len(f.sessions)} session(s) "
        f"of tenant {f.tenant} in {', '.join(f.cells) or '-'}. Contained: {steps}. "
        f"Records: {audit_query_url}"
    )
    return SecurityUpdate(pages, redact(what, audit_query_url))


def window_of(opened_at_s: float, end_s: float) -> tuple[float, float]:
    """The evidence window of an incident: the lookback before it opened, to ``end_s``."""
    if not (math.isfinite(opened_at_s) and math.isfinite(end_s)):
        raise ValueError("an evidence window needs finite times")
    return max(0.0, opened_at_s - EVIDENCE_LOOKBACK_S), end_s

"""The responder's journal as the ``respond --json`` contract has it.

Each lever keeps the keys every lever of the report has (``kind``, ``scope``, ``at_s``,
``status``, ``reason``, ``approvers``, ``operations``, ``inverse``) and adds what the responder
knows: the target, whether verification cleared the symptom (``verified``: true, false, or null
when nothing was applied or the lever is a prerequisite), when, and the undo applied when it did
not. The incident also carries its comms (the first-update deadline, each update, misses) and
the break-glass grants its levers were applied under.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from firedrill.model.operations import Operation
from firedrill.respond.incidents import Incident
from firedrill.respond.responder import LeverRecord, Responder


def _operation(op: Operation) -> dict[str, Any]:
    return {"op": type(op).__name__, "args": asdict(op)}


def lever_json(r: LeverRecord) -> dict[str, Any]:
    """One journalled lever."""
    e = r.entry
    out: dict[str, Any] = {
        "kind": e.kind,
        "scope": e.scope,
        "target": e.target,
        "at_s": e.at_s,
        "status": e.status,
        "reason": e.reason,
        "approvers": [a.name for a in e.approvers],
        "roles": [a.role for a in e.approvers],
        "checks": [{"guard": c.guard, "ok": c.ok, "reason": c.reason} for c in e.checks],
        "operations": [_operation(op) for op in e.ops],
        "inverse": [_operation(op) for op in reversed(e.inverses)],
        "prerequisite": r.prerequisite,
        "verified": r.verified,
        "verified_at_s": r.verified_at_s,
        "verification": r.verify_detail,
        "breakglass": r.breakglass,
    }
    if r.undo is not None:
        out["undone_at_s"] = r.undo.at_s
        out["undo"] = {"status": r.undo.status, "reason": r.undo.reason}
    return out


def responder_levers(responder: Responder, inc: Incident) -> list[dict[str, Any]]:
    """The incident's levers from the responder's journal, in the order it handled them."""
    return [lever_json(r) for r in responder.records(inc.id)]


def responder_extras(responder: Responder, inc: Incident) -> dict[str, Any]:
    """Comms and break-glass for one incident, plus the mode the responder ran in."""
    plan = responder.comms_plan(inc.id)
    updates = responder.updates(inc.id)
    pages = responder.security_pages(inc.id)
    return {
        "responder_mode": responder.policy.mode,
        "comms": {
            "first_update_due_s": None if plan is None else plan.first_update_due_s,
            "missed": sum(1 for u in updates if u.update.missed_deadline),
            "updates": [
                {
                    "at_s": u.update.at_s,
                    "first": u.update.first,
                    "due_s": u.update.due_s,
                    "missed_deadline": u.update.missed_deadline,
                    "late_s": u.update.late_s,
                    "status_page": None
                    if u.status_page is None
                    else {
                        "product": u.status_page.product,
                        "region": u.status_page.region,
                        "text": u.status_page.text,
                    },
                    "status_page_refused": u.refused,
                    "channel": u.channel_text,
                    "redacted": list(u.redacted),
                }
                for u in updates
            ],
        },
        "breakglass": [
            {
                "grant": g.grant_id,
                "scope": g.scope,
                "identity": g.identity,
                "approvers": list(g.approvers),
                "granted_at_s": g.granted_at_s,
                "expires_at_s": g.expires_at_s,
                "audit": [
                    {"at_s": a.at_s, "event": a.event, "actor": a.actor, "detail": a.detail}
                    for a in responder.broker.journal
                    if a.subject in (g.grant_id, g.request_id)
                ],
                "security_pages": [p.summary for p in pages if p.grant_id == g.grant_id],
            }
            for g in responder.grants(inc.id)
        ],
        # levers that needed break-glass and got no grant: refused, and security paged
        "breakglass_refused": [
            {"at_s": p.at_s, "action": p.action, "page": p.summary} for p in pages if not p.grant_id
        ],
    }

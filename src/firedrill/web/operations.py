"""The incident operations the JSON API and the browser pages share, so the rules live once.

Each function takes the service, the caller and a validated body, checks the role the operation
needs, writes through the store inside one transaction and publishes the change on the event
hub. ``web/app.py`` maps them to ``/api/v1`` routes (bearer token), ``web/ui.py`` to form posts
(session cookie and CSRF token); a refusal is the same ``HTTPException`` on both.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict, Field

from firedrill.app.serve import IncidentService
from firedrill.store import audit, breakglass, comms, incidents, postmortems, roles
from firedrill.web.auth import Principal
from firedrill.web.events import EventHub

# --- request bodies ----------------------------------------------------------------------------


class CommsBody(BaseModel):
    channel: str = Field(pattern="^(status_page|incident_channel)$")
    text: str = Field(min_length=1, max_length=4000)


class HandoffBody(BaseModel):
    role: str = Field(min_length=1, max_length=64)
    to_person: str = Field(min_length=1, max_length=200)
    open_threads: list[Annotated[str, Field(max_length=200)]] = Field(default=[], max_length=50)
    next_update_in_s: float = Field(default=1800.0, gt=0, le=86400)


class ActionItemBody(BaseModel):
    kind: str = Field(pattern="^(alert|runbook_step|automation_guardrail|game_day_scenario)$")
    text: str = Field(min_length=1, max_length=2000)
    owner: str = Field(min_length=1, max_length=200)


class PostmortemBody(BaseModel):
    """What people write; the times come from the incident (``ttd_s``: impact before it opened)."""

    root_cause_class: str = Field(min_length=1, max_length=200)
    text: str = Field(min_length=1, max_length=100_000)
    ttd_s: float = Field(default=0.0, ge=0, le=30 * 86400)
    gpu_hours_lost: float = Field(default=0.0, ge=0, le=1e9)
    requests_failed: int = Field(default=0, ge=0, le=10**15)
    tokens_refunded: int = Field(default=0, ge=0, le=10**18)
    action_items: list[ActionItemBody] = Field(min_length=1, max_length=50)


# --- answers -----------------------------------------------------------------------------------


class _Row(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class CommsRead(_Row):
    id: int
    channel: str
    text: str
    at_s: float
    due_s: float | None


class HandoffRead(_Row):
    id: int
    role: str
    from_person: str | None
    to_person: str
    at_s: float
    next_update_s: float
    open_threads: list[str]
    text: str


class GrantRead(_Row):
    id: int
    identity: str
    scope: str
    requested_by: str
    approved_by: list[str]
    granted_at_s: float
    expires_at_s: float
    reaped_at_s: float | None


class ActionItemRead(_Row):
    kind: str
    text: str
    owner: str


class PostmortemRead(_Row):
    id: int
    ttd_s: float
    ttm_s: float
    ttr_s: float
    gpu_hours_lost: float
    requests_failed: int
    tokens_refunded: int
    root_cause_class: str
    text: str
    action_items: list[ActionItemRead]


# --- reads -------------------------------------------------------------------------------------


def comms_of(service: IncidentService, incident_id: str) -> list[CommsRead]:
    with service.store.session() as s:
        incidents.require(session=s, incident_id=incident_id)
        return [CommsRead.model_validate(c) for c in comms.list(session=s, incident_id=incident_id)]


def handoffs_of(service: IncidentService, incident_id: str) -> list[HandoffRead]:
    with service.store.session() as s:
        incidents.require(session=s, incident_id=incident_id)
        return [
            HandoffRead.model_validate(h)
            for h in roles.handoffs(session=s, incident_id=incident_id)
        ]


def grants_of(service: IncidentService, incident_id: str) -> list[GrantRead]:
    with service.store.session() as s:
        incidents.require(session=s, incident_id=incident_id)
        return [
            GrantRead.model_validate(g) for g in breakglass.list(session=s, incident_id=incident_id)
        ]


def postmortem_of(service: IncidentService, incident_id: str) -> PostmortemRead | None:
    with service.store.session() as s:
        pm = postmortems.get(session=s, incident_id=incident_id)
        if pm is None:
            return None
        items = postmortems.action_items(session=s, postmortem_id=pm.id)
        return PostmortemRead.model_validate(
            {
                **{k: getattr(pm, k) for k in PostmortemRead.model_fields if k != "action_items"},
                "action_items": [ActionItemRead.model_validate(a) for a in items],
            }
        )


# --- writes ------------------------------------------------------------------------------------


def post_comms(
    service: IncidentService, hub: EventHub, p: Principal, incident_id: str, body: CommsBody
) -> CommsRead:
    if not p.roles & {"comms_lead", "incident_commander"}:
        raise HTTPException(403, "comms are posted by the comms lead or the commander")
    now = service.clock.now_s()
    with service.store.session() as s:
        row = comms.post(
            session=s, incident_id=incident_id, channel=body.channel, text=body.text, at_s=now
        )
        s.flush()
        out = CommsRead.model_validate(row)
    hub.publish("comms", incident_id, {"at_s": now, "by": p.person})
    return out


def post_handoff(
    service: IncidentService, hub: EventHub, p: Principal, incident_id: str, body: HandoffBody
) -> HandoffRead:
    now = service.clock.now_s()
    with service.store.session() as s:
        h = roles.handoff(
            session=s,
            incident_id=incident_id,
            role=body.role,
            to_person=body.to_person,
            at_s=now,
            open_threads=body.open_threads,
            next_update_s=now + body.next_update_in_s,
        )
        s.flush()
        out = HandoffRead.model_validate(h)
    hub.publish("timeline", incident_id, {"handoff": out.id, "by": p.person})
    return out


def write_postmortem(
    service: IncidentService, hub: EventHub, p: Principal, incident_id: str, body: PostmortemBody
) -> PostmortemRead:
    if "incident_commander" not in p.roles:
        raise HTTPException(403, "the incident commander writes the postmortem")
    with service.store.session() as s:
        row = incidents.require(session=s, incident_id=incident_id)
        if row.resolved_at_s is None:
            raise HTTPException(409, f"{incident_id} is not resolved: no postmortem yet")
        if postmortems.get(session=s, incident_id=incident_id) is not None:
            raise HTTPException(409, f"{incident_id} has its postmortem already")
        mitigated = row.mitigated_at_s if row.mitigated_at_s is not None else row.resolved_at_s
        pm = postmortems.create(
            session=s,
            incident_id=incident_id,
            ttd_s=body.ttd_s,
            ttm_s=body.ttd_s + mitigated - row.opened_at_s,
            ttr_s=body.ttd_s + row.resolved_at_s - row.opened_at_s,
            gpu_hours_lost=body.gpu_hours_lost,
            requests_failed=body.requests_failed,
            tokens_refunded=body.tokens_refunded,
            root_cause_class=body.root_cause_class,
            text=body.text,
        )
        s.flush()
        items = [
            postmortems.add_action_item(
                session=s, postmortem_id=pm.id, kind=a.kind, text=a.text, owner=a.owner
            )
            for a in body.action_items
        ]
        audit.append(
            s,
            actor=p.person,
            action="postmortem.write",
            subject=incident_id,
            data={"postmortem_id": pm.id, "action_items": len(items)},
            at_s=service.clock.now_s(),
        )
        s.flush()
        out = PostmortemRead.model_validate(
            {
                **{k: getattr(pm, k) for k in PostmortemRead.model_fields if k != "action_items"},
                "action_items": [ActionItemRead.model_validate(a) for a in items],
            }
        )
    hub.publish("timeline", incident_id, {"postmortem": out.id})
    return out

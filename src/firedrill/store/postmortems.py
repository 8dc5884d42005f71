"""Postmortems and their action items: the numbers of an incident and what it changes.

One postmortem per incident (the database enforces it, so two writers cannot both add one).
Durations are measured from the start of impact, so TTD <= TTM <= TTR.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from firedrill.errors import StoreError
from firedrill.store import incidents, validate
from firedrill.store.db import mapped_errors, writing
from firedrill.store.models import ActionItem, ActionKind, Postmortem


def create(
    *,
    session: Session,
    incident_id: str,
    ttd_s: float,
    ttm_s: float,
    ttr_s: float,
    gpu_hours_lost: float,
    requests_failed: int,
    tokens_refunded: int,
    root_cause_class: str,
    text: str,
) -> Postmortem:
    """Write the incident's postmortem."""
    row = Postmortem(
        incident_id=incident_id,
        ttd_s=validate.nonnegative(ttd_s, "ttd_s"),
        ttm_s=validate.nonnegative(ttm_s, "ttm_s"),
        ttr_s=validate.nonnegative(ttr_s, "ttr_s"),
        gpu_hours_lost=validate.nonnegative(gpu_hours_lost, "gpu_hours_lost"),
        requests_failed=validate.count(requests_failed, "requests_failed"),
        tokens_refunded=validate.count(tokens_refunded, "tokens_refunded"),
        root_cause_class=validate.name(root_cause_class, "root_cause_class"),
        text=validate.prose(text, "text"),
    )
    if not row.ttd_s <= row.ttm_s <= row.ttr_s:
        raise StoreError(
            f"expected ttd_s <= ttm_s <= ttr_s, got {row.ttd_s:g}, {row.ttm_s:g}, {row.ttr_s:g}"
        )
    incidents.require(session=session, incident_id=incident_id)
    with writing(session, f"cannot write the postmortem of {incident_id}"):
        session.add(row)
    return row


def get(*, session: Session, incident_id: str) -> Postmortem | None:
    """The incident's postmortem, or ``None``."""
    query = select(Postmortem).where(Postmortem.incident_id == incident_id)
    with mapped_errors(f"cannot read the postmortem of {incident_id}"):
        return session.scalars(query).one_or_none()


def add_action_item(
    *, session: Session, postmortem_id: int, kind: ActionKind | str, text: str, owner: str
) -> ActionItem:
    """Add an action item (an alert, runbook step, automation guardrail or game-day scenario)."""
    row = ActionItem(
        postmortem_id=postmortem_id,
        kind=validate.one_of(ActionKind, kind, "kind"),
        text=validate.prose(text, "text"),
        owner=validate.name(owner, "owner"),
    )
    with mapped_errors(f"cannot read postmortem {postmortem_id}"):
        if session.get(Postmortem, postmortem_id) is None:
            raise StoreError(f"no postmortem {postmortem_id}")
    with writing(session, f"cannot add an action item to postmortem {postmortem_id}"):
        session.add(row)
    return row


def action_items(*, session: Session, postmortem_id: int) -> Sequence[ActionItem]:
    """The postmortem's action items in the order they were added."""
    query = (
        select(ActionItem).where(ActionItem.postmortem_id == postmortem_id).order_by(ActionItem.id)
    )
    with mapped_errors(f"cannot read the action items of postmortem {postmortem_id}"):
        return session.scalars(query).all()

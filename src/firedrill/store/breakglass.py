"""Break-glass grants: emergency access that is approved by someone else, scoped, and expires.

The store keeps the broker's rules too, so nothing it holds says a rule was met when it was
not: two distinct approvers (told apart by ``model.identity.canonical_identity``, so ``alice``
and ``Alice`` are one person), neither the requester nor the identity granted, and a scope
from the allowlist (``model.access.scope_refusal``).

A grant is live from ``granted_at_s`` until the first of ``expires_at_s`` and ``reaped_at_s``.
The reaper asks ``due_for_reaping`` and calls ``reap``; nothing is deleted, so an auditor can see
every grant, who approved it and when it ended.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from firedrill.errors import StoreError
from firedrill.model.access import scope_refusal
from firedrill.model.identity import distinct_people, same_person
from firedrill.store import incidents, validate
from firedrill.store.db import mapped_errors, writing
from firedrill.store.models import BreakGlassGrant


def grant(
    *,
    session: Session,
    incident_id: str,
    identity: str,
    requested_by: str,
    approved_by: Iterable[str],
    granted_at_s: float,
    expires_at_s: float,
    scope: str,
) -> BreakGlassGrant:
    """Record a grant: two distinct approvers other than the requester and the identity, a
    scope from the allowlist, and an expiry."""
    row = BreakGlassGrant(
        incident_id=incident_id,
        identity=validate.name(identity, "identity"),
        requested_by=validate.name(requested_by, "requested_by"),
        approved_by=validate.names(approved_by, "approved_by", non_empty=True),
        granted_at_s=validate.seconds(granted_at_s, "granted_at_s"),
        expires_at_s=validate.seconds(expires_at_s, "expires_at_s"),
        reaped_at_s=None,
        scope=validate.name(scope, "scope"),
    )
    for approver in row.approved_by:
        if same_person(approver, row.requested_by) or same_person(approver, row.identity):
            raise StoreError(f"{approver} cannot approve their own break-glass request")
    if len(distinct_people(row.approved_by)) < 2:
        raise StoreError(
            f"a break-glass grant needs two distinct approvers, got {row.approved_by} "
            "(names are compared case-folded and normalised)"
        )
    why = scope_refusal(row.scope)
    if why is not None:
        raise StoreError(why)
    if row.expires_at_s <= row.granted_at_s:
        raise StoreError("expires_at_s must be after granted_at_s")
    incidents.require(session=session, incident_id=incident_id)
    with writing(session, f"cannot record a break-glass grant on {incident_id}"):
        session.add(row)
    return row


def reap(*, session: Session, grant_id: int, at_s: float) -> BreakGlassGrant:
    """Mark the grant's access removed at ``at_s``."""
    at = validate.seconds(at_s, "at_s")
    with mapped_errors(f"cannot read break-glass grant {grant_id}"):
        row = session.get(BreakGlassGrant, grant_id)
    if row is None:
        raise StoreError(f"no break-glass grant {grant_id}")
    if row.reaped_at_s is not None:
        raise StoreError(f"break-glass grant {grant_id} was already reaped")
    if at < row.granted_at_s:
        raise StoreError(f"break-glass grant {grant_id} cannot be reaped before it was granted")
    with writing(session, f"cannot reap break-glass grant {grant_id}"):
        row.reaped_at_s = at
    return row


def list(  # shadows the builtin on purpose: callers write breakglass.list(...)
    *, session: Session, incident_id: str | None = None, live_at_s: float | None = None
) -> Sequence[BreakGlassGrant]:
    """Grants in the order they were given: of one incident, and/or live at ``live_at_s``."""
    query = select(BreakGlassGrant).order_by(BreakGlassGrant.granted_at_s, BreakGlassGrant.id)
    if incident_id is not None:
        query = query.where(BreakGlassGrant.incident_id == incident_id)
    if live_at_s is not None:
        t = validate.seconds(live_at_s, "live_at_s")
        query = query.where(
            BreakGlassGrant.granted_at_s <= t,
            BreakGlassGrant.expires_at_s > t,
            or_(BreakGlassGrant.reaped_at_s.is_(None), BreakGlassGrant.reaped_at_s > t),
        )
    with mapped_errors("cannot list break-glass grants"):
        return session.scalars(query).all()


def due_for_reaping(*, session: Session, at_s: float) -> Sequence[BreakGlassGrant]:
    """Grants expired by ``at_s`` whose access has not been removed yet."""
    t = validate.seconds(at_s, "at_s")
    query = (
        select(BreakGlassGrant)
        .where(BreakGlassGrant.expires_at_s <= t, BreakGlassGrant.reaped_at_s.is_(None))
        .order_by(BreakGlassGrant.expires_at_s, BreakGlassGrant.id)
    )
    with mapped_errors("cannot list break-glass grants"):
        return session.scalars(query).all()

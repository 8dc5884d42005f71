"""The store: incidents, timelines, roles, lever journals, comms, break-glass grants,
postmortems, drill results and the audit log, kept in SQLite (default) or PostgreSQL.

Nothing firedrill learns during an incident or a drill may be lost, and the audit log must be
trustworthy later, so they live in a database rather than in a run's memory. The store is an
adapter: the core never imports it (an import-linter contract says so), and SQLAlchemy, Alembic
and psycopg are imported here only.

Usage, in the shape of every service (keyword-only ``session``, validate first, then write)::

    store = open_store("sqlite:///firedrill.db")   # or postgresql://user@host/db
    store.migrate()
    with store.session() as session:               # one unit of work: commit or roll back
        inc = incidents.create(session=session, cell="use1-a", region="us-east-1",
                               title="TTFT burn on llama-70b", sev=2, opened_at_s=0.0)
        timeline.add(session=session, incident_id=inc.id, at_s=60.0, kind="page",
                     actor="alertmanager", text="FastBurn paged")
        audit.append(session, actor="alice", action="incident.open", subject=inc.id,
                     data={"sev": 2}, at_s=0.0)

Every error is a ``firedrill.errors.StoreError``; a refused write leaves the data as it was.
"""

from firedrill.store import (
    audit,
    breakglass,
    comms,
    drills,
    incidents,
    levers,
    postmortems,
    roles,
    timeline,
)
from firedrill.store.audit import ChainHead, VerifyResult
from firedrill.store.db import DEFAULT_URL, Store, open_store
from firedrill.store.models import (
    ActionKind,
    Channel,
    IncidentStatus,
    LeverStatus,
    Role,
    Verdict,
)

__all__ = [
    "DEFAULT_URL",
    "ActionKind",
    "ChainHead",
    "Channel",
    "IncidentStatus",
    "LeverStatus",
    "Role",
    "Store",
    "Verdict",
    "VerifyResult",
    "audit",
    "breakglass",
    "comms",
    "drills",
    "incidents",
    "levers",
    "open_store",
    "postmortems",
    "roles",
    "timeline",
]

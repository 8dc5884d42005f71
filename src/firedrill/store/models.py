"""The tables of the store, as typed SQLAlchemy models.

Incident command has to survive the process that ran it: a handoff at 04:00 UTC, a postmortem a
week later and an auditor a year later all read the same rows. Every table here is written by the
services next to it (``incidents``, ``timeline``, ``roles``, ``levers``, ``comms``, ``breakglass``,
``postmortems``, ``drills``, ``audit``), which validate first and write second.

Conventions: times are seconds (``*_s``; on the twin, simulated seconds since its epoch); closed
vocabularies are ``StrEnum`` values stored as short strings with a CHECK constraint (portable, and
a new value is a one-line migration instead of an ``ALTER TYPE``); free-form payloads are JSON.
Constraint names are fixed by ``NAMING`` so the migrations name them the same way on SQLite and
PostgreSQL.

The schema is created and changed only by the migrations under ``migrations/``; a test compares
these models with the migrated database, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Any, TypeAlias, TypeVar

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    Dialect,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

JsonValue: TypeAlias = str | int | float | bool | list["JsonValue"] | dict[str, "JsonValue"] | None
JsonObject: TypeAlias = dict[str, JsonValue]

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

NAME_LEN = 200  # people, cells, regions, scopes, kinds: short names, checked by the services
ENUM_LEN = 32
HASH_LEN = 64  # hex SHA-256
ISO_TIME_LEN = 40  # wall-clock time as ISO 8601 text, e.g. 2025-12-02T21:37:25.191257+00:00


class IncidentStatus(StrEnum):
    open = "open"
    mitigated = "mitigated"
    resolved = "resolved"


class Role(StrEnum):
    incident_commander = "incident_commander"
    operations_lead = "operations_lead"
    communications_lead = "communications_lead"
    scribe = "scribe"
    model_owner = "model_owner"
    capacity_lead = "capacity_lead"
    security_lead = "security_lead"


class LeverStatus(StrEnum):
    applied = "applied"
    proposed = "proposed"
    refused = "refused"


class Channel(StrEnum):
    status_page = "status_page"
    incident_channel = "incident_channel"


class ActionKind(StrEnum):
    alert = "alert"
    runbook_step = "runbook_step"
    automation_guardrail = "automation_guardrail"
    game_day_scenario = "game_day_scenario"


class Verdict(StrEnum):
    passed = "passed"
    failed = "failed"
    aborted = "aborted"


E = TypeVar("E", bound=StrEnum)


class EnumText(TypeDecorator[E]):
    """A ``StrEnum`` stored as its value in a short string column; reads come back as the enum."""

    impl = String(ENUM_LEN)
    cache_ok = True

    def __init__(self, enum: type[E]) -> None:
        super().__init__()
        self.enum = enum

    def process_bind_param(self, value: E | str | None, dialect: Dialect) -> str | None:
        return None if value is None else self.enum(value).value

    def process_result_value(self, value: Any | None, dialect: Dialect) -> E | None:
        return None if value is None else self.enum(value)


def one_of(column: str, values: Iterable[str], name: str | None = None) -> CheckConstraint:
    """A CHECK that ``column`` holds one of ``values`` (named after the column by default)."""
    listed = ", ".join(f"'{v}'" for v in values)
    return CheckConstraint(f"{column} IN ({listed})", name=name or column)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


def _incident_fk() -> Mapped[str]:
    return mapped_column(String(16), ForeignKey("incidents.id"), index=True)


class Incident(Base):
    """One incident per cell and cause; ``id`` is ``INC-0001``, numbered in order of opening."""

    __tablename__ = "incidents"
    __table_args__ = (
        CheckConstraint("sev BETWEEN 1 AND 4", name="sev"),
        one_of("status", IncidentStatus),
    )

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, unique=True)
    cell: Mapped[str] = mapped_column(String(NAME_LEN))
    region: Mapped[str] = mapped_column(String(NAME_LEN))
    title: Mapped[str] = mapped_column(Text)
    sev: Mapped[int] = mapped_column(Integer)  # 1 (worst) .. 4
    status: Mapped[IncidentStatus] = mapped_column(EnumText(IncidentStatus))
    opened_at_s: Mapped[float] = mapped_column(Float)
    mitigated_at_s: Mapped[float | None] = mapped_column(Float)
    resolved_at_s: Mapped[float | None] = mapped_column(Float)


class TimelineEvent(Base):
    """What happened, when and who did it: the incident's timeline, in order of ``at_s``."""

    __tablename__ = "timeline_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    incident_id: Mapped[str] = _incident_fk()
    at_s: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(NAME_LEN))
    actor: Mapped[str] = mapped_column(String(NAME_LEN))
    text: Mapped[str] = mapped_column(Text)
    data: Mapped[JsonObject] = mapped_column(JSON)


class RoleAssignment(Base):
    """Who holds a role from ``since_s``; the latest row per role is the current holder."""

    __tablename__ = "role_assignments"
    __table_args__ = (one_of("role", Role),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    incident_id: Mapped[str] = _incident_fk()
    role: Mapped[Role] = mapped_column(EnumText(Role))
    person: Mapped[str] = mapped_column(String(NAME_LEN))
    since_s: Mapped[float] = mapped_column(Float)


class Handoff(Base):
    """A role changing hands, with the sentence said on the call ("IC handing to ...")."""

    __tablename__ = "handoffs"
    __table_args__ = (one_of("role", Role),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    incident_id: Mapped[str] = _incident_fk()
    role: Mapped[Role] = mapped_column(EnumText(Role))
    from_person: Mapped[str | None] = mapped_column(String(NAME_LEN))
    to_person: Mapped[str] = mapped_column(String(NAME_LEN))
    at_s: Mapped[float] = mapped_column(Float)
    open_threads: Mapped[list[str]] = mapped_column(JSON)
    next_update_s: Mapped[float] = mapped_column(Float)
    text: Mapped[str] = mapped_column(Text)


class LeverEntry(Base):
    """One lever in the journal: the operation, its inverse (recorded before it is applied), the
    decision and who approved it."""

    __tablename__ = "lever_journal"
    __table_args__ = (one_of("status", LeverStatus),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    incident_id: Mapped[str] = _incident_fk()
    kind: Mapped[str] = mapped_column(String(NAME_LEN))
    scope: Mapped[str] = mapped_column(String(NAME_LEN))
    op: Mapped[JsonObject] = mapped_column(JSON)
    inverse: Mapped[JsonObject | None] = mapped_column(JSON)
    status: Mapped[LeverStatus] = mapped_column(EnumText(LeverStatus))
    reason: Mapped[str] = mapped_column(Text)
    approvers: Mapped[list[str]] = mapped_column(JSON)
    at_s: Mapped[float] = mapped_column(Float)


class CommsUpdate(Base):
    """An update posted to the status page or the incident channel; ``due_s`` is when it was due."""

    __tablename__ = "comms"
    __table_args__ = (one_of("channel", Channel),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    incident_id: Mapped[str] = _incident_fk()
    channel: Mapped[Channel] = mapped_column(EnumText(Channel))
    text: Mapped[str] = mapped_column(Text)
    at_s: Mapped[float] = mapped_column(Float)
    due_s: Mapped[float | None] = mapped_column(Float)


class BreakGlassGrant(Base):
    """Emergency access: who asked, who approved, for what scope, until when, and when it was
    reaped."""

    __tablename__ = "breakglass_grants"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    incident_id: Mapped[str] = _incident_fk()
    identity: Mapped[str] = mapped_column(String(NAME_LEN))
    requested_by: Mapped[str] = mapped_column(String(NAME_LEN))
    approved_by: Mapped[list[str]] = mapped_column(JSON)
    granted_at_s: Mapped[float] = mapped_column(Float)
    expires_at_s: Mapped[float] = mapped_column(Float)
    reaped_at_s: Mapped[float | None] = mapped_column(Float)
    scope: Mapped[str] = mapped_column(String(NAME_LEN))


class Postmortem(Base):
    """The incident's numbers and story; at most one per incident."""

    __tablename__ = "postmortems"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    incident_id: Mapped[str] = mapped_column(String(16), ForeignKey("incidents.id"), unique=True)
    ttd_s: Mapped[float] = mapped_column(Float)  # time to detect, from the start of impact
    ttm_s: Mapped[float] = mapped_column(Float)  # time to mitigate
    ttr_s: Mapped[float] = mapped_column(Float)  # time to resolve
    gpu_hours_lost: Mapped[float] = mapped_column(Float)
    requests_failed: Mapped[int] = mapped_column(BigInteger)
    tokens_refunded: Mapped[int] = mapped_column(BigInteger)
    root_cause_class: Mapped[str] = mapped_column(String(NAME_LEN))
    text: Mapped[str] = mapped_column(Text)

    action_items: Mapped[list[ActionItem]] = relationship(
        back_populates="postmortem", order_by="ActionItem.id"
    )


class ActionItem(Base):
    """What the postmortem changes: an alert, a runbook step, a guardrail or a game day."""

    __tablename__ = "action_items"
    __table_args__ = (one_of("kind", ActionKind),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    postmortem_id: Mapped[int] = mapped_column(ForeignKey("postmortems.id"), index=True)
    kind: Mapped[ActionKind] = mapped_column(EnumText(ActionKind))
    text: Mapped[str] = mapped_column(Text)
    owner: Mapped[str] = mapped_column(String(NAME_LEN))

    postmortem: Mapped[Postmortem] = relationship(back_populates="action_items")


class DrillResult(Base):
    """A game day's outcome on a ladder rung, with its full JSON report."""

    __tablename__ = "drill_results"
    __table_args__ = (
        one_of("verdict", Verdict),
        CheckConstraint("rung >= 0", name="rung"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LEN), index=True)
    rung: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(NAME_LEN), index=True)
    verdict: Mapped[Verdict] = mapped_column(EnumText(Verdict))
    run_by: Mapped[str] = mapped_column(String(NAME_LEN))
    at_s: Mapped[float] = mapped_column(Float)
    report: Mapped[JsonObject] = mapped_column(JSON)
    # the ladder (revision 0002): rotation warnings, recorded overrides, "N days ago"
    runbook_author: Mapped[str | None] = mapped_column(String(NAME_LEN), nullable=True)
    override_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    started_at: Mapped[str | None] = mapped_column(String(ISO_TIME_LEN), nullable=True)


class AuditRecord(Base):
    """One link of the audit log's hash chain (see ``audit``): never updated, never deleted.

    ``seq`` counts from 1 with no gaps and is assigned by ``audit.append``, not by a database
    sequence: PostgreSQL burns sequence values in rolled-back transactions, and a gap must mean a
    removed record. ``prev_hash`` is unique, so two writers can never fork the chain.
    """

    __tablename__ = "audit_log"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    at_s: Mapped[float] = mapped_column(Float)
    actor: Mapped[str] = mapped_column(String(NAME_LEN))
    action: Mapped[str] = mapped_column(String(NAME_LEN))
    subject: Mapped[str] = mapped_column(String(NAME_LEN))
    data: Mapped[JsonObject] = mapped_column(JSON)
    prev_hash: Mapped[str] = mapped_column(String(HASH_LEN), unique=True)
    hash: Mapped[str] = mapped_column(String(HASH_LEN), unique=True)


class FindingStatus(StrEnum):
    open = "open"
    closed = "closed"


class FindingEventKind(StrEnum):
    raised = "raised"
    raised_again = "raised_again"
    reopened = "reopened"
    closed = "closed"


class DrillFinding(Base):
    """A drill finding tracked to closure (revision 0003); ``id`` is its stable identity.

    The same gap found again by a later run of the same drill is this row again
    (``firedrill.drill.actions.identity``), with a new line in its history.
    """

    __tablename__ = "drill_findings"
    __table_args__ = (one_of("status", FindingStatus), CheckConstraint("rung >= 0", name="rung"))

    id: Mapped[str] = mapped_column(String(16), primary_key=True)  # FND-<12 hex>
    key: Mapped[str] = mapped_column(Text)
    drill: Mapped[str] = mapped_column(String(NAME_LEN), index=True)
    model: Mapped[str] = mapped_column(String(NAME_LEN), index=True)
    rung: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(ENUM_LEN))
    owner: Mapped[str] = mapped_column(String(NAME_LEN))
    text: Mapped[str] = mapped_column(Text)  # as the latest run worded it
    status: Mapped[FindingStatus] = mapped_column(EnumText(FindingStatus))
    due: Mapped[str] = mapped_column(String(ISO_TIME_LEN))  # ISO date
    first_result_id: Mapped[int] = mapped_column(Integer, ForeignKey("drill_results.id"))
    last_result_id: Mapped[int] = mapped_column(Integer, ForeignKey("drill_results.id"))
    times_raised: Mapped[int] = mapped_column(Integer)


class DrillFindingEvent(Base):
    """One line of an action item's history: raised, raised again, reopened, closed."""

    __tablename__ = "drill_finding_events"
    __table_args__ = (one_of("event", FindingEventKind),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    item_id: Mapped[str] = mapped_column(String(16), ForeignKey("drill_findings.id"), index=True)
    event: Mapped[FindingEventKind] = mapped_column(EnumText(FindingEventKind))
    at: Mapped[str] = mapped_column(String(ISO_TIME_LEN))  # wall clock, ISO 8601 with offset
    by: Mapped[str] = mapped_column(String(NAME_LEN))
    result_id: Mapped[int | None] = mapped_column(
        Integer, ForeignKey("drill_results.id"), nullable=True
    )
    note: Mapped[str] = mapped_column(Text)

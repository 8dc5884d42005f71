"""The initial schema: incidents and everything hanging off them, drill results, the audit log.

On PostgreSQL the audit log also gets a trigger that refuses UPDATE, DELETE and TRUNCATE; SQLite
relies on the hash chain alone (see ``firedrill.store.audit``).

Revision ID: 0001
Revises:
Create Date: 2025-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.schema import SchemaItem

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = 200
ENUM = 32
HASH = 64


def _one_of(table: str, column: str, *values: str) -> sa.CheckConstraint:
    listed = ", ".join(f"'{v}'" for v in values)
    return sa.CheckConstraint(f"{column} IN ({listed})", name=op.f(f"ck_{table}_{column}"))


def _id(table: str) -> list[SchemaItem]:
    return [
        sa.Column("id", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{table}")),
    ]


def _incident(table: str) -> list[SchemaItem]:
    return [
        sa.Column("incident_id", sa.String(16), nullable=False),
        sa.ForeignKeyConstraint(
            ["incident_id"], ["incidents.id"], name=op.f(f"fk_{table}_incident_id_incidents")
        ),
    ]


def _index_incident(table: str) -> None:
    op.create_index(op.f(f"ix_{table}_incident_id"), table, ["incident_id"])


ROLES = (
    "incident_commander",
    "operations_lead",
    "communications_lead",
    "scribe",
    "model_owner",
    "capacity_lead",
    "security_lead",
)

APPEND_ONLY_FUNCTION = """
CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "incidents",
        sa.Column("id", sa.String(16), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("cell", sa.String(NAME), nullable=False),
        sa.Column("region", sa.String(NAME), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("sev", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(ENUM), nullable=False),
        sa.Column("opened_at_s", sa.Float(), nullable=False),
        sa.Column("mitigated_at_s", sa.Float(), nullable=True),
        sa.Column("resolved_at_s", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_incidents")),
        sa.UniqueConstraint("number", name=op.f("uq_incidents_number")),
        sa.CheckConstraint("sev BETWEEN 1 AND 4", name=op.f("ck_incidents_sev")),
        _one_of("incidents", "status", "open", "mitigated", "resolved"),
    )
    op.create_table(
        "timeline_events",
        *_id("timeline_events"),
        *_incident("timeline_events"),
        sa.Column("at_s", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(NAME), nullable=False),
        sa.Column("actor", sa.String(NAME), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
    )
    op.create_table(
        "role_assignments",
        *_id("role_assignments"),
        *_incident("role_assignments"),
        sa.Column("role", sa.String(ENUM), nullable=False),
        sa.Column("person", sa.String(NAME), nullable=False),
        sa.Column("since_s", sa.Float(), nullable=False),
        _one_of("role_assignments", "role", *ROLES),
    )
    op.create_table(
        "handoffs",
        *_id("handoffs"),
        *_incident("handoffs"),
        sa.Column("role", sa.String(ENUM), nullable=False),
        sa.Column("from_person", sa.String(NAME), nullable=True),
        sa.Column("to_person", sa.String(NAME), nullable=False),
        sa.Column("at_s", sa.Float(), nullable=False),
        sa.Column("open_threads", sa.JSON(), nullable=False),
        sa.Column("next_update_s", sa.Float(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        _one_of("handoffs", "role", *ROLES),
    )
    op.create_table(
        "lever_journal",
        *_id("lever_journal"),
        *_incident("lever_journal"),
        sa.Column("kind", sa.String(NAME), nullable=False),
        sa.Column("scope", sa.String(NAME), nullable=False),
        sa.Column("op", sa.JSON(), nullable=False),
        sa.Column("inverse", sa.JSON(), nullable=True),
        sa.Column("status", sa.String(ENUM), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("approvers", sa.JSON(), nullable=False),
        sa.Column("at_s", sa.Float(), nullable=False),
        _one_of("lever_journal", "status", "applied", "proposed", "refused"),
    )
    op.create_table(
        "comms",
        *_id("comms"),
        *_incident("comms"),
        sa.Column("channel", sa.String(ENUM), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("at_s", sa.Float(), nullable=False),
        sa.Column("due_s", sa.Float(), nullable=True),
        _one_of("comms", "channel", "status_page", "incident_channel"),
    )
    op.create_table(
        "breakglass_grants",
        *_id("breakglass_grants"),
        *_incident("breakglass_grants"),
        sa.Column("identity", sa.String(NAME), nullable=False),
        sa.Column("requested_by", sa.String(NAME), nullable=False),
        sa.Column("approved_by", sa.JSON(), nullable=False),
        sa.Column("granted_at_s", sa.Float(), nullable=False),
        sa.Column("expires_at_s", sa.Float(), nullable=False),
        sa.Column("reaped_at_s", sa.Float(), nullable=True),
        sa.Column("scope", sa.String(NAME), nullable=False),
    )
    for table in (
        "timeline_events",
        "role_assignments",
        "handoffs",
        "lever_journal",
        "comms",
        "breakglass_grants",
    ):
        _index_incident(table)
    op.create_table(
        "postmortems",
        *_id("postmortems"),
        *_incident("postmortems"),
        sa.Column("ttd_s", sa.Float(), nullable=False),
        sa.Column("ttm_s", sa.Float(), nullable=False),
        sa.Column("ttr_s", sa.Float(), nullable=False),
        sa.Column("gpu_hours_lost", sa.Float(), nullable=False),
        sa.Column("requests_failed", sa.BigInteger(), nullable=False),
        sa.Column("tokens_refunded", sa.BigInteger(), nullable=False),
        sa.Column("root_cause_class", sa.String(NAME), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.UniqueConstraint("incident_id", name=op.f("uq_postmortems_incident_id")),
    )
    op.create_table(
        "action_items",
        *_id("action_items"),
        sa.Column("postmortem_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(ENUM), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("owner", sa.String(NAME), nullable=False),
        sa.ForeignKeyConstraint(
            ["postmortem_id"],
            ["postmortems.id"],
            name=op.f("fk_action_items_postmortem_id_postmortems"),
        ),
        _one_of(
            "action_items",
            "kind",
            "alert",
            "runbook_step",
            "automation_guardrail",
            "game_day_scenario",
        ),
    )
    op.create_index(op.f("ix_action_items_postmortem_id"), "action_items", ["postmortem_id"])
    op.create_table(
        "drill_results",
        *_id("drill_results"),
        sa.Column("name", sa.String(NAME), nullable=False),
        sa.Column("rung", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(NAME), nullable=False),
        sa.Column("verdict", sa.String(ENUM), nullable=False),
        sa.Column("run_by", sa.String(NAME), nullable=False),
        sa.Column("at_s", sa.Float(), nullable=False),
        sa.Column("report", sa.JSON(), nullable=False),
        _one_of("drill_results", "verdict", "passed", "failed", "aborted"),
        sa.CheckConstraint("rung >= 0", name=op.f("ck_drill_results_rung")),
    )
    op.create_index(op.f("ix_drill_results_name"), "drill_results", ["name"])
    op.create_table(
        "audit_log",
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("at_s", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(NAME), nullable=False),
        sa.Column("action", sa.String(NAME), nullable=False),
        sa.Column("subject", sa.String(NAME), nullable=False),
        # json, not jsonb, on PostgreSQL: the text is kept as written, so it reads back to the
        # very values that were hashed
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("prev_hash", sa.String(HASH), nullable=False),
        sa.Column("hash", sa.String(HASH), nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_audit_log")),
        sa.UniqueConstraint("prev_hash", name=op.f("uq_audit_log_prev_hash")),
        sa.UniqueConstraint("hash", name=op.f("uq_audit_log_hash")),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(APPEND_ONLY_FUNCTION)
        op.execute(
            "CREATE TRIGGER audit_log_no_update_delete BEFORE UPDATE OR DELETE ON audit_log "
            "FOR EACH ROW EXECUTE FUNCTION audit_log_append_only()"
        )
        op.execute(
            "CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log "
            "FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only()"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER audit_log_no_truncate ON audit_log")
        op.execute("DROP TRIGGER audit_log_no_update_delete ON audit_log")
        op.execute("DROP FUNCTION audit_log_append_only()")
    for table in (
        "audit_log",
        "drill_results",
        "action_items",
        "postmortems",
        "breakglass_grants",
        "comms",
        "lever_journal",
        "handoffs",
        "role_assignments",
        "timeline_events",
        "incidents",
    ):
        op.drop_table(table)

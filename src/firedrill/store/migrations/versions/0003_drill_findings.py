"""Drill findings tracked as action items, with their history across runs.

A finding has a stable identity (the drill and the finding's key), an owner, a due date and a
status; every run that raises it again, and every close, adds a history line.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = 200
ENUM = 32
ISO_TIME = 40


def upgrade() -> None:
    op.create_table(
        "drill_findings",
        sa.Column("id", sa.String(16), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("drill", sa.String(NAME), nullable=False),
        sa.Column("model", sa.String(NAME), nullable=False),
        sa.Column("rung", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(ENUM), nullable=False),
        sa.Column("owner", sa.String(NAME), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("status", sa.String(ENUM), nullable=False),
        sa.Column("due", sa.String(ISO_TIME), nullable=False),
        sa.Column("first_result_id", sa.Integer(), nullable=False),
        sa.Column("last_result_id", sa.Integer(), nullable=False),
        sa.Column("times_raised", sa.Integer(), nullable=False),
        sa.CheckConstraint("status IN ('open', 'closed')", name=op.f("ck_drill_findings_status")),
        sa.CheckConstraint("rung >= 0", name=op.f("ck_drill_findings_rung")),
        sa.ForeignKeyConstraint(
            ["first_result_id"],
            ["drill_results.id"],
            name=op.f("fk_drill_findings_first_result_id_drill_results"),
        ),
        sa.ForeignKeyConstraint(
            ["last_result_id"],
            ["drill_results.id"],
            name=op.f("fk_drill_findings_last_result_id_drill_results"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_drill_findings")),
    )
    op.create_index(op.f("ix_drill_findings_drill"), "drill_findings", ["drill"])
    op.create_index(op.f("ix_drill_findings_model"), "drill_findings", ["model"])
    op.create_table(
        "drill_finding_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("item_id", sa.String(16), nullable=False),
        sa.Column("event", sa.String(ENUM), nullable=False),
        sa.Column("at", sa.String(ISO_TIME), nullable=False),
        sa.Column("by", sa.String(NAME), nullable=False),
        sa.Column("result_id", sa.Integer(), nullable=True),
        sa.Column("note", sa.Text(), nullable=False),
        sa.CheckConstraint(
            "event IN ('raised', 'raised_again', 'reopened', 'closed')",
            name=op.f("ck_drill_finding_events_event"),
        ),
        sa.ForeignKeyConstraint(
            ["item_id"],
            ["drill_findings.id"],
            name=op.f("fk_drill_finding_events_item_id_drill_findings"),
        ),
        sa.ForeignKeyConstraint(
            ["result_id"],
            ["drill_results.id"],
            name=op.f("fk_drill_finding_events_result_id_drill_results"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_drill_finding_events")),
    )
    op.create_index(op.f("ix_drill_finding_events_item_id"), "drill_finding_events", ["item_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_drill_finding_events_item_id"), table_name="drill_finding_events")
    op.drop_table("drill_finding_events")
    op.drop_index(op.f("ix_drill_findings_model"), table_name="drill_findings")
    op.drop_index(op.f("ix_drill_findings_drill"), table_name="drill_findings")
    op.drop_table("drill_findings")

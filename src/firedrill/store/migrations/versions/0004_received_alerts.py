"""Alerts received from Alertmanager's webhook, one row per (fingerprint, startsAt, status).

Alertmanager re-sends a group's alerts on every ``group_interval`` and ``repeat_interval`` and
retries a failed delivery, so the same alert arrives many times. ``firedrill serve`` keeps each
distinct firing and resolution once (the unique key refuses a second copy even from a second
process), with the incident it joined, so a restart rebuilds which alerts are still firing.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = 200
ISO_TIME = 40


def upgrade() -> None:
    op.create_table(
        "received_alerts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("starts_at", sa.String(ISO_TIME), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("receiver", sa.String(NAME), nullable=False),
        sa.Column("at_s", sa.Float(), nullable=False),
        sa.Column("incident_id", sa.String(16), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_received_alerts")),
        sa.ForeignKeyConstraint(
            ["incident_id"], ["incidents.id"], name=op.f("fk_received_alerts_incident_id_incidents")
        ),
        sa.UniqueConstraint(
            "fingerprint", "starts_at", "status", name=op.f("uq_received_alerts_fingerprint")
        ),
        sa.CheckConstraint(
            "status IN ('firing', 'resolved')", name=op.f("ck_received_alerts_status")
        ),
    )
    op.create_index(op.f("ix_received_alerts_incident_id"), "received_alerts", ["incident_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_received_alerts_incident_id"), table_name="received_alerts")
    op.drop_table("received_alerts")

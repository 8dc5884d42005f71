"""Drill results for the ladder: who wrote the runbook, an override's reason, the wall clock.

The ladder gates each rung on the two latest runs of the rung below and warns when the same
person runs a rung twice in a row or runs a drill of a runbook they wrote; "last successful L5:
N days ago" needs wall-clock time (``at_s`` is simulated time). The new columns are nullable:
results stored before this revision have none of them.

Revision ID: 0002
Revises: 0001
Create Date: 2025-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = 200
ISO_TIME = 40


def upgrade() -> None:
    op.add_column("drill_results", sa.Column("runbook_author", sa.String(NAME), nullable=True))
    op.add_column("drill_results", sa.Column("override_reason", sa.Text(), nullable=True))
    op.add_column("drill_results", sa.Column("started_at", sa.String(ISO_TIME), nullable=True))
    op.create_index(op.f("ix_drill_results_model"), "drill_results", ["model"])


def downgrade() -> None:
    op.drop_index(op.f("ix_drill_results_model"), table_name="drill_results")
    with op.batch_alter_table("drill_results") as batch:  # SQLite rebuilds the table
        batch.drop_column("started_at")
        batch.drop_column("override_reason")
        batch.drop_column("runbook_author")

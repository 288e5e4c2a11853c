"""A write-ahead log of records and ticks; snapshots say which log rows they cover.

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "profiler_log",
        sa.Column("seq", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("workflow_type_id", sa.String(128), nullable=False),
        sa.Column("request_id", sa.String(255), nullable=True, unique=True),
        sa.Column("body", sa.Text(), nullable=False),
    )
    op.create_index("ix_profiler_log_profile_seq", "profiler_log", ["tenant", "workflow_type_id", "seq"])
    # A snapshot written before the log existed covers no log row.
    with op.batch_alter_table("profiler_profiles") as batch:
        batch.add_column(sa.Column("covers_seq", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("profiler_profiles") as batch:
        batch.drop_column("covers_seq")
    op.drop_index("ix_profiler_log_profile_seq", table_name="profiler_log")
    op.drop_table("profiler_log")

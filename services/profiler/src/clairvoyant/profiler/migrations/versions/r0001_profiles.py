"""Profiles: one row per (tenant, workflow type) with the profile's state as JSON text.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "profiler_profiles",
        sa.Column("tenant", sa.String(128), primary_key=True),
        sa.Column("workflow_type_id", sa.String(128), primary_key=True),
        sa.Column("state_format", sa.Integer(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("instances", sa.BigInteger(), nullable=False),
        sa.Column("tier", sa.String(16), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("profiler_profiles")

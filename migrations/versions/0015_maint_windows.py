"""Maintenance windows (issue 37): a node's planned work, which refuses claims into it, tells
holders ahead and holds the node's alerts while it is open.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-12
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``maint_windows``, empty: no window is planned before gpubot knows them."""
    op.create_table(
        "maint_windows",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("starts_at", sa.String(27), nullable=False),
        sa.Column("ends_at", sa.String(27), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("opened_by", sa.Text(), nullable=False),
        sa.Column("created_at", sa.String(27), nullable=False),
        sa.Column("ended_at", sa.String(27), nullable=True),
        sa.Column("ended_by", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_maint_windows"),
    )
    op.create_index("ix_maint_windows_ends_at", "maint_windows", ["ends_at"])


def downgrade() -> None:
    """Drop what ``upgrade`` created (the windows' opening and ending stay in the audit log)."""
    op.drop_index("ix_maint_windows_ends_at", table_name="maint_windows")
    op.drop_table("maint_windows")

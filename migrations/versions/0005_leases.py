"""Leases with fencing tokens for exclusive work (a node's reset, the sweep).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the ``leases`` table (one row per resource, never deleted: tokens only grow)."""
    op.create_table(
        "leases",
        sa.Column("resource", sa.Text(), nullable=False),
        sa.Column("holder", sa.Text(), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("since", sa.String(27), nullable=False),
        sa.Column("expires_at", sa.String(27), nullable=False),
        sa.PrimaryKeyConstraint("resource", name="pk_leases"),
    )


def downgrade() -> None:
    """Drop what ``upgrade`` created."""
    op.drop_table("leases")

"""Since when each process has held its GPU, kept beside the GPUs' idle runs (issue 34).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``gpu_holders``, empty: each holder's run starts at the first sweep after the
    upgrade, and no earlier than its process did (what a restart used to give)."""
    op.create_table(
        "gpu_holders",
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("pid", sa.BigInteger(), nullable=False),
        sa.Column("start_ticks", sa.BigInteger(), nullable=False),
        sa.Column("since", sa.String(27), nullable=False),
        sa.Column("last_at", sa.String(27), nullable=False),
        sa.PrimaryKeyConstraint("node", "gpu_index", "pid", "start_ticks", name="pk_gpu_holders"),
    )
    op.create_index("ix_gpu_holders_last_at", "gpu_holders", ["last_at"])


def downgrade() -> None:
    """Drop what ``upgrade`` created."""
    op.drop_index("ix_gpu_holders_last_at", table_name="gpu_holders")
    op.drop_table("gpu_holders")

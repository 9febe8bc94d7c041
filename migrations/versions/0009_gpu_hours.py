"""GPU-hours buckets, their sweeps, gaps and weekly digests; the reclaim ladder.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

TIME = sa.String(27)
MS = ("busy_ms", "idle_ms", "unknown_ms", "unused_ms", "free_ms", "samples")


def upgrade() -> None:
    """Create ``gpu_usage`` (+ each GPU's last sample counted), ``usage_sweeps``,
    ``usage_gaps``, ``idle_ladder`` and ``usage_digests``. GPU-hours count from the first
    sweep after it."""
    op.create_table(
        "gpu_usage",
        sa.Column("hour", TIME, nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("holder", sa.Text(), nullable=False),
        *(sa.Column(c, sa.BigInteger(), nullable=False) for c in MS),
        sa.PrimaryKeyConstraint("hour", "node", "gpu_index", "holder", name="pk_gpu_usage"),
    )
    op.create_table(
        "gpu_usage_last",
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("last_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("node", "gpu_index", name="pk_gpu_usage_last"),
    )
    op.create_table(
        "usage_sweeps",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_usage_sweeps"),
    )
    op.create_index("ix_usage_sweeps_at", "usage_sweeps", ["at"])
    op.create_table(
        "usage_gaps",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("start_at", TIME, nullable=False),
        sa.Column("end_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_usage_gaps"),
    )
    op.create_index("ix_usage_gaps_end_at", "usage_gaps", ["end_at"])
    op.create_table(
        "idle_ladder",
        sa.Column("finding", sa.Text(), nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("started_at", TIME, nullable=False),
        sa.Column("step_at", TIME, nullable=False),
        sa.Column("kept_by", sa.Text(), nullable=True),
        sa.Column("kept_reason", sa.Text(), nullable=True),
        sa.Column("kept_at", TIME, nullable=True),
        sa.PrimaryKeyConstraint("finding", name="pk_idle_ladder"),
    )
    op.create_table(
        "usage_digests",
        sa.Column("period", sa.Text(), nullable=False),
        sa.Column("token", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("channel", sa.Text(), nullable=True),
        sa.Column("message_ts", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("period", name="pk_usage_digests"),
    )


def downgrade() -> None:
    """Drop what ``upgrade`` created."""
    op.drop_table("usage_digests")
    op.drop_table("idle_ladder")
    op.drop_index("ix_usage_gaps_end_at", table_name="usage_gaps")
    op.drop_table("usage_gaps")
    op.drop_index("ix_usage_sweeps_at", table_name="usage_sweeps")
    op.drop_table("usage_sweeps")
    op.drop_table("gpu_usage_last")
    op.drop_table("gpu_usage")

"""Per-GPU utilisation and memory samples, one row per GPU per sweep (idle holders).

Revision ID: 0003
Revises: 0002
Create Date: 2024-08-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the ``gpu_samples`` table and its indexes (time; GPU and time)."""
    op.create_table(
        "gpu_samples",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("gpu_uuid", sa.Text(), nullable=False),
        sa.Column("taken_at", sa.String(27), nullable=False),
        sa.Column("utilization_pct", sa.Integer(), nullable=True),
        sa.Column("memory_used_mib", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_gpu_samples"),
    )
    op.create_index("ix_gpu_samples_taken_at", "gpu_samples", ["taken_at"])
    op.create_index(
        "ix_gpu_samples_node_gpu_index_taken_at", "gpu_samples", ["node", "gpu_index", "taken_at"]
    )


def downgrade() -> None:
    """Drop what ``upgrade`` created."""
    op.drop_index("ix_gpu_samples_node_gpu_index_taken_at", table_name="gpu_samples")
    op.drop_index("ix_gpu_samples_taken_at", table_name="gpu_samples")
    op.drop_table("gpu_samples")

"""Per-GPU idle runs, and an index for one node's audit records.

The idle check reads ``gpu_idle``, not the samples; ``audit list --node`` reads the index. (The
first line is what Alembic logs: one line, so every log line starts with its time.)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``gpu_idle`` (one row per GPU) and the audit log's (node, kind, seq) index.

    ``gpu_idle`` starts empty: each GPU's first sweep after the upgrade rebuilds its run from
    the samples already kept, once.
    """
    op.create_table(
        "gpu_idle",
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("gpu_uuid", sa.Text(), nullable=False),
        sa.Column("last_at", sa.String(27), nullable=False),
        sa.Column("idle_since", sa.String(27), nullable=True),
        sa.Column("min_mib", sa.Integer(), nullable=False),
        sa.Column("max_gap_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("node", "gpu_index", "gpu_uuid", name="pk_gpu_idle"),
    )
    op.create_index("ix_gpu_idle_last_at", "gpu_idle", ["last_at"])
    op.create_index("ix_audit_log_node_kind_seq", "audit_log", ["node", "kind", "seq"])


def downgrade() -> None:
    """Drop what ``upgrade`` created."""
    op.drop_index("ix_audit_log_node_kind_seq", table_name="audit_log")
    op.drop_index("ix_gpu_idle_last_at", table_name="gpu_idle")
    op.drop_table("gpu_idle")

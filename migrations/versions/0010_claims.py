"""GPU claims and the queue (issue 26).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``claims`` (unique ``holding``: one active claim per GPU) and ``claim_waits``."""
    op.create_table(
        "claims",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("gpu_uuid", sa.Text(), nullable=False),
        sa.Column("user", sa.Text(), nullable=False),
        sa.Column("chat_id", sa.Text(), nullable=False),
        sa.Column("started_at", sa.String(27), nullable=False),
        sa.Column("ends_at", sa.String(27), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("ended_at", sa.String(27), nullable=True),
        sa.Column("idle_since", sa.String(27), nullable=True),
        sa.Column("idle_last_at", sa.String(27), nullable=True),
        sa.Column("idle_dm_at", sa.String(27), nullable=True),
        sa.Column("intruder_told", sa.Text(), nullable=True),
        sa.Column("holding", sa.Text(), nullable=True),
        sa.CheckConstraint("state IN ('active', 'released', 'expired')", name="ck_claims_state"),
        sa.PrimaryKeyConstraint("id", name="pk_claims"),
        sa.UniqueConstraint("holding", name="uq_claims_holding"),
    )
    op.create_index("ix_claims_state_ends_at", "claims", ["state", "ends_at"])
    op.create_index("ix_claims_started_at", "claims", ["started_at"])
    op.create_table(
        "claim_waits",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("gpus", sa.Text(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("duration_s", sa.Integer(), nullable=True),
        sa.Column("user", sa.Text(), nullable=False),
        sa.Column("chat_id", sa.Text(), nullable=False),
        sa.Column("created_at", sa.String(27), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("offered", sa.Text(), nullable=False),
        sa.Column("hold_until", sa.String(27), nullable=True),
        sa.CheckConstraint(
            "state IN ('waiting', 'offered', 'taken', 'lapsed', 'left')",
            name="ck_claim_waits_state",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_claim_waits"),
    )
    op.create_index("ix_claim_waits_state_node", "claim_waits", ["state", "node"])


def downgrade() -> None:
    """Drop what ``upgrade`` created."""
    op.drop_index("ix_claim_waits_state_node", table_name="claim_waits")
    op.drop_table("claim_waits")
    op.drop_index("ix_claims_started_at", table_name="claims")
    op.drop_index("ix_claims_state_ends_at", table_name="claims")
    op.drop_table("claims")

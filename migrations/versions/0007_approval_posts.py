"""The approval outbox: one row per approval and purpose, recorded before the post is made.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the ``approval_posts`` table, its (approval, purpose) pair and its state index."""
    op.create_table(
        "approval_posts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("approval_id", sa.Integer(), nullable=False),
        sa.Column("purpose", sa.String(16), nullable=False),
        sa.Column("token", sa.String(64), nullable=False),
        sa.Column("channel", sa.Text(), nullable=False),
        sa.Column("thread_ts", sa.Text(), nullable=True),
        sa.Column("created_at", sa.String(27), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("repeats", sa.Integer(), nullable=False),
        sa.Column("message_ts", sa.Text(), nullable=True),
        sa.Column("finished_at", sa.String(27), nullable=True),
        sa.CheckConstraint(
            "state IN ('pending', 'posted', 'refused', 'abandoned')",
            name="ck_approval_posts_state",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_approval_posts"),
        sa.UniqueConstraint("token", name="uq_approval_posts_token"),
        sa.UniqueConstraint("approval_id", "purpose", name="uq_approval_posts_approval_id_purpose"),
    )
    op.create_index("ix_approval_posts_state", "approval_posts", ["state"])


def downgrade() -> None:
    """Drop what ``upgrade`` created."""
    op.drop_index("ix_approval_posts_state", table_name="approval_posts")
    op.drop_table("approval_posts")

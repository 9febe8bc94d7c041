"""The alert outbox: one row per alert post, recorded before the post is made.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the ``alert_posts`` table and its index (state)."""
    op.create_table(
        "alert_posts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("token", sa.String(64), nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("keys", sa.Text(), nullable=False),
        sa.Column("since", sa.String(27), nullable=False),
        sa.Column("created_at", sa.String(27), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("repeats", sa.Integer(), nullable=False),
        sa.Column("channel", sa.Text(), nullable=True),
        sa.Column("message_ts", sa.Text(), nullable=True),
        sa.Column("finished_at", sa.String(27), nullable=True),
        sa.CheckConstraint(
            "state IN ('pending', 'posted', 'refused', 'abandoned')", name="ck_alert_posts_state"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_alert_posts"),
        sa.UniqueConstraint("token", name="uq_alert_posts_token"),
    )
    op.create_index("ix_alert_posts_state", "alert_posts", ["state"])


def downgrade() -> None:
    """Drop what ``upgrade`` created."""
    op.drop_index("ix_alert_posts_state", table_name="alert_posts")
    op.drop_table("alert_posts")

"""Direct messages handed from one front end's process to another's (issue 39): a person on
Matrix told of a claim by the Slack process's duty, and the other way round.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``dm_due``, empty: nothing was handed over before."""
    op.create_table(
        "dm_due",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("chat_id", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", sa.String(27), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_dm_due"),
        sa.UniqueConstraint("subject", name="uq_dm_due_subject"),
    )


def downgrade() -> None:
    """Drop what ``upgrade`` created; a message still kept is lost (it is in no audit)."""
    op.drop_table("dm_due")

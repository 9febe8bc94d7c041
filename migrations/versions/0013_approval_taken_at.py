"""When a retry last took a waiting approval back to ``approved`` (``taken_at``), so that the
periodic look for interrupted approvals counts its settling time from then, not from the
decision (issue 34): a just-resumed approval is never taken for one a stopped gpubot left.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-11
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

STATES = (
    "'pending', 'approved', 'denied', 'expired', 'cancelled', 'executed', 'failed', "
    "'incomplete', 'waiting'"
)  # as 0011 left them


def _approvals() -> sa.Table:
    """Return the approvals table as ``upgrade`` leaves it (0011's, with ``taken_at``)."""

    def time(name: str, nullable: bool = False) -> sa.Column[str]:
        return sa.Column(name, sa.String(27), nullable=nullable)

    return sa.Table(
        "approvals",
        sa.MetaData(),
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("requester", sa.Text(), nullable=False),
        sa.Column("requester_name", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("plan", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        time("created_at"),
        time("expires_at"),
        sa.Column("decided_by", sa.Text(), nullable=True),
        sa.Column("decided_by_name", sa.Text(), nullable=True),
        time("decided_at", nullable=True),
        time("finished_at", nullable=True),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column("channel", sa.Text(), nullable=True),
        sa.Column("message_ts", sa.Text(), nullable=True),
        time("taken_at", nullable=True),
        sa.CheckConstraint(f"state IN ({STATES})", name="ck_approvals_state"),
        sa.PrimaryKeyConstraint("id", name="pk_approvals"),
        sa.Index("ix_approvals_state", "state"),
    )


def upgrade() -> None:
    """Add ``taken_at``, empty: an approval no retry has taken settles from its decision, as
    before."""
    op.add_column("approvals", sa.Column("taken_at", sa.String(27), nullable=True))


def downgrade() -> None:
    """Drop ``taken_at`` (0012 settles every approval from its decision)."""
    if op.get_bind().dialect.name == "sqlite":
        # Copy the table from its full definition: a reflected copy could lose the CHECK.
        with op.batch_alter_table("approvals", copy_from=_approvals(), recreate="always") as batch:
            batch.drop_column("taken_at")
        return
    op.drop_column("approvals", "taken_at")

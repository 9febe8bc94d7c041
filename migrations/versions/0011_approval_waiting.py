"""Approvals may wait: approved, but the action could not run yet (its node busy, its lease
lost, the database down), so gpubot retries it while the approval is valid (issue 34).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-09
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

OLD = "'pending', 'approved', 'denied', 'expired', 'cancelled', 'executed', 'failed', 'incomplete'"
NEW = OLD + ", 'waiting'"
NAME = "ck_approvals_state"  # as tables.py names it (and 0002 left it)


def _approvals(states: str) -> sa.Table:
    """Return the approvals table (as 0002 left it) with the given CHECK on its state."""

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
        sa.CheckConstraint(f"state IN ({states})", name=NAME),
        sa.PrimaryKeyConstraint("id", name="pk_approvals"),
        sa.Index("ix_approvals_state", "state"),
    )


def _states(states: str) -> None:
    if op.get_bind().dialect.name == "sqlite":
        # SQLite cannot alter a CHECK constraint: copy the table into its new definition.
        with op.batch_alter_table("approvals", copy_from=_approvals(states), recreate="always"):
            pass
        return
    op.drop_constraint(op.f(NAME), "approvals", type_="check")
    op.create_check_constraint(op.f(NAME), "approvals", f"state IN ({states})")


def upgrade() -> None:
    """Allow the ``waiting`` state."""
    _states(NEW)


def downgrade() -> None:
    """Fold ``waiting`` into ``failed`` (what 0010 knows: it never ran), then restore the
    old check."""
    op.execute("UPDATE approvals SET state = 'failed' WHERE state = 'waiting'")
    _states(OLD)

"""Approvals may end ``incomplete``: approved, but the bot stopped before recording the end.

Revision ID: 0002
Revises: 0001
Create Date: 2024-07-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

OLD = "'pending', 'approved', 'denied', 'expired', 'cancelled', 'executed', 'failed'"
NEW = OLD + ", 'incomplete'"
NAME = "ck_approvals_state"  # as tables.py names it
OLD_NAME = "ck_approvals_ck_approvals_state"  # 0001's name went through the naming convention


def _approvals(states: str, name: str) -> sa.Table:
    """Return the approvals table of 0001 with the given CHECK on its state."""

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
        sa.CheckConstraint(f"state IN ({states})", name=name),
        sa.PrimaryKeyConstraint("id", name="pk_approvals"),
        sa.Index("ix_approvals_state", "state"),
    )


def _states(states: str, old: str, new: str) -> None:
    if op.get_bind().dialect.name == "sqlite":
        # SQLite cannot alter a CHECK constraint: copy the table into its new definition.
        table = _approvals(states, new)
        with op.batch_alter_table("approvals", copy_from=table, recreate="always"):
            pass
        return
    op.drop_constraint(op.f(old), "approvals", type_="check")
    op.create_check_constraint(op.f(new), "approvals", f"state IN ({states})")


def upgrade() -> None:
    """Allow the ``incomplete`` state."""
    _states(NEW, OLD_NAME, NAME)


def downgrade() -> None:
    """Fold ``incomplete`` back into ``failed`` (what 0001 knows), then restore the old check."""
    op.execute("UPDATE approvals SET state = 'failed' WHERE state = 'incomplete'")
    _states(OLD, NAME, OLD_NAME)

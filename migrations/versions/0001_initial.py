"""Audit chain, chain head, approvals and sweep alerts.

Revision ID: 0001
Revises:
Create Date: 2024-06-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

GENESIS = "0" * 64
STATES = "'pending', 'approved', 'denied', 'expired', 'cancelled', 'executed', 'failed'"
REFUSAL = "audit records are append-only"


def _time(name: str, nullable: bool = False) -> sa.Column[str]:
    return sa.Column(name, sa.String(27), nullable=nullable)


def upgrade() -> None:
    """Create every table, and triggers that refuse to change audit records."""
    op.create_table(
        "audit_log",
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("action_id", sa.BigInteger(), nullable=True),
        sa.Column("kind", sa.String(16), nullable=False),
        _time("created_at"),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("node", sa.Text(), nullable=True),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_audit_log"),
        sa.UniqueConstraint("prev_hash", name="uq_audit_log_prev_hash"),
        sa.UniqueConstraint("hash", name="uq_audit_log_hash"),
    )
    op.create_index("ix_audit_log_action_id", "audit_log", ["action_id"])
    op.create_index("ix_audit_log_kind_seq", "audit_log", ["kind", "seq"])
    op.create_index("ix_audit_log_created_at", "audit_log", ["created_at"])

    head = op.create_table(
        "audit_head",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit_head"),
    )
    op.bulk_insert(head, [{"id": 1, "seq": 0, "hash": GENESIS}])

    op.create_table(
        "approvals",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("requester", sa.Text(), nullable=False),
        sa.Column("requester_name", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("plan", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        _time("created_at"),
        _time("expires_at"),
        sa.Column("decided_by", sa.Text(), nullable=True),
        sa.Column("decided_by_name", sa.Text(), nullable=True),
        _time("decided_at", nullable=True),
        _time("finished_at", nullable=True),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column("channel", sa.Text(), nullable=True),
        sa.Column("message_ts", sa.Text(), nullable=True),
        sa.CheckConstraint(f"state IN ({STATES})", name="ck_approvals_state"),
        sa.PrimaryKeyConstraint("id", name="pk_approvals"),
    )
    op.create_index("ix_approvals_state", "approvals", ["state"])

    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("gpu", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("holder", sa.Text(), nullable=False),
        _time("first_seen"),
        _time("last_seen"),
        sa.Column("seen_count", sa.Integer(), nullable=False),
        _time("alerted_at", nullable=True),
        sa.Column("channel", sa.Text(), nullable=True),
        sa.Column("message_ts", sa.Text(), nullable=True),
        _time("reminded_at", nullable=True),
        _time("snoozed_until", nullable=True),
        _time("resolved_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_alerts"),
        sa.UniqueConstraint("key", name="uq_alerts_key"),
    )

    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN RAISE EXCEPTION '{REFUSAL}'; END $$"
        )
        op.execute(
            "CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log "
            "FOR EACH ROW EXECUTE FUNCTION audit_log_append_only()"
        )
        op.execute(
            "CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log "
            "FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only()"
        )
    else:
        for verb in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER audit_log_no_{verb.lower()} BEFORE {verb} ON audit_log "
                f"BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END"
            )


def downgrade() -> None:
    """Drop everything ``upgrade`` created."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_truncate ON audit_log")
        op.execute("DROP TRIGGER IF EXISTS audit_log_append_only ON audit_log")
        op.execute("DROP FUNCTION IF EXISTS audit_log_append_only()")
    else:
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_update")
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_delete")
    op.drop_table("alerts")
    op.drop_index("ix_approvals_state", table_name="approvals")
    op.drop_table("approvals")
    op.drop_table("audit_head")
    op.drop_index("ix_audit_log_created_at", table_name="audit_log")
    op.drop_index("ix_audit_log_kind_seq", table_name="audit_log")
    op.drop_index("ix_audit_log_action_id", table_name="audit_log")
    op.drop_table("audit_log")

"""Each GPU's uncorrectable ECC counts as the last sweep saw them (issue 27).

A count that grows between sweeps is a finding; kept here, it still is after a restart. (The
first line is what Alembic logs: one line, so every log line starts with its time.)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``gpu_ecc`` (empty: each GPU's first sweep after the upgrade is its baseline)."""
    op.create_table(
        "gpu_ecc",
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column("gpu_uuid", sa.Text(), nullable=False),
        sa.Column("counter", sa.Text(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("grew_from", sa.BigInteger(), nullable=True),
        sa.Column("sweeps_since", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("node", "gpu_uuid", "counter", name="pk_gpu_ecc"),
    )


def downgrade() -> None:
    """Drop what ``upgrade`` created."""
    op.drop_table("gpu_ecc")

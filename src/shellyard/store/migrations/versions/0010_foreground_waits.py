"""foreground_waits: callers waiting on one replica for an execution another finalizes (N3)

Revision ID: 0010_foreground_waits
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0010_foreground_waits"
# A branch of its own on 0001, like 0002–0009: the store upgrades to every head.
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "foreground_waits",
        sa.Column("execution_id", sa.String(length=64), nullable=False),
        sa.Column("waiter_id", sa.String(length=64), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("execution_id", "waiter_id"),
    )
    op.create_index("ix_foreground_waits_expires", "foreground_waits", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_foreground_waits_expires", table_name="foreground_waits")
    op.drop_table("foreground_waits")

"""execution usage: the limit that ended an execution, its peak memory and CPU seconds (R2)

Revision ID: 0011_execution_usage
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0011_execution_usage"
# A branch of its own on 0001, like 0002-0010: the store upgrades to every head.
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("executions") as batch:
        batch.add_column(sa.Column("ended_by_limit", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("peak_memory_bytes", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("cpu_seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("executions") as batch:
        batch.drop_column("cpu_seconds")
        batch.drop_column("peak_memory_bytes")
        batch.drop_column("ended_by_limit")

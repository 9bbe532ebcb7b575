"""executions.read_only: readers beside the workspace's writer (W2)

Revision ID: 0007_read_only
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0007_read_only"
# A branch of its own on 0001 (which has the executions table), like 0002–0006: the store
# upgrades to every head.
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Records made before it were all writers.
    op.add_column(
        "executions",
        sa.Column("read_only", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    op.drop_column("executions", "read_only")

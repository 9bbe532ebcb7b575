"""retention: executions.logs_pruned_at (set when the runner deleted an execution's logs)

Revision ID: 0006_retention
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

# The file was 0006_retention.py beside 0006_execution_policy.py; renamed so no two files share a
# prefix. The revision id stays: databases record it in alembic_version.
revision = "0006_retention"
# A branch of its own on 0001 (which has the executions table), like 0002 to 0005.
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("executions") as batch:
        batch.add_column(sa.Column("logs_pruned_at", sa.Float(), nullable=True))
    op.create_index("ix_executions_finished_at", "executions", ["finished_at"])


def downgrade() -> None:
    op.drop_index("ix_executions_finished_at", table_name="executions")
    with op.batch_alter_table("executions") as batch:
        batch.drop_column("logs_pruned_at")

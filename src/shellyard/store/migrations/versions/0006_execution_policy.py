"""executions.sandbox_policy: the sandbox policy each execution ran under (R2)

Revision ID: 0006_execution_policy
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0006_execution_policy"
# A branch of its own on 0001 (which has the executions table), like 0002–0005: the store
# upgrades to every head.
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # JSON of the runner's ExecutionPolicy (network mode, allow-list digest, seccomp profile);
    # NULL for records made before it was kept.
    op.add_column("executions", sa.Column("sandbox_policy", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("executions", "sandbox_policy")

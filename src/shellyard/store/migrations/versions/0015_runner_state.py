"""runner state: the runner's state id an unanswered start was sent to (E9)

Revision ID: 0015_runner_state
Revises: 0001

A start whose answer never came is resolved by asking its runner; "this runner holds no
trace" means "never started" only from the state the start was sent to, not from a runner
whose state folder was replaced since (control/executions/unstarted.py, runner/state_id.py).
Rows from before have none: they keep the reading of before (docs/runners.md).
"""

import sqlalchemy as sa
from alembic import op

revision = "0015_runner_state"
# A branch of its own on 0001, like 0002-0014: the store upgrades to every head.
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("executions") as batch:
        batch.add_column(sa.Column("runner_state", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("executions") as batch:
        batch.drop_column("runner_state")

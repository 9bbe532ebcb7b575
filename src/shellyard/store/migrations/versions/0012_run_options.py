"""run options: an execution's timeout_ms, env, cwd and args (E1), as JSON

Revision ID: 0012_run_options
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0012_run_options"
# A branch of its own on 0001, like 0002-0011: the store upgrades to every head.
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("executions") as batch:
        batch.add_column(sa.Column("run_options", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("executions") as batch:
        batch.drop_column("run_options")

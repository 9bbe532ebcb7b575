"""managed environments: environments, their revisions and changes; executions.waiting_for

Revision ID: 0004_environments
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_environments"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("executions") as batch:
        batch.add_column(sa.Column("waiting_for", sa.String(length=64), nullable=True))
    op.create_index("ix_executions_environment_state", "executions", ["environment_id", "state"])

    op.create_table(
        "environments",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.Column("runner_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("language", sa.String(length=16), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"]),
        sa.ForeignKeyConstraint(["created_by"], ["agents.id"]),
        sa.ForeignKeyConstraint(["runner_id"], ["runners.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("session_id", "runner_id", "name", name="uq_environment_name"),
    )

    op.create_table(
        "environment_revisions",
        sa.Column("environment_id", sa.String(length=64), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("packages", sa.JSON(), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("change_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["environment_id"], ["environments.id"]),
        sa.PrimaryKeyConstraint("environment_id", "revision"),
    )

    op.create_table(
        "environment_changes",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("environment_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("manager", sa.String(length=16), nullable=True),
        sa.Column("specs", sa.JSON(), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("waiting_for", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("error_kind", sa.String(length=16), nullable=True),
        sa.Column("revision", sa.Integer(), nullable=True),
        sa.Column("progress", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["environment_id"], ["environments.id"]),
        sa.ForeignKeyConstraint(["agent_id"], ["agents.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_environment_changes_env_state",
        "environment_changes",
        ["environment_id", "state"],
    )


def downgrade() -> None:
    op.drop_index("ix_environment_changes_env_state", table_name="environment_changes")
    op.drop_table("environment_changes")
    op.drop_table("environment_revisions")
    op.drop_table("environments")
    op.drop_index("ix_executions_environment_state", table_name="executions")
    with op.batch_alter_table("executions") as batch:
        batch.drop_column("waiting_for")

"""sessions, agents' lifecycle events, wakes and their webhook deliveries, timers

Revision ID: 0002_sessions
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_sessions"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "session_events",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("agent_id", sa.String(length=64), nullable=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"]),
        sa.PrimaryKeyConstraint("seq"),
    )
    op.create_index("ix_session_events_session", "session_events", ["session_id", "seq"])

    op.create_table(
        "timers",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("fire_at", sa.Float(), nullable=False),
        sa.Column("execution_id", sa.String(length=64), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("late", sa.Boolean(), nullable=False),
        sa.Column("cancel_reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("fired_at", sa.Float(), nullable=True),
        sa.Column("cancelled_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["agent_id"], ["agents.id"]),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_timers_state_fire_at", "timers", ["state", "fire_at"])
    op.create_index("ix_timers_agent", "timers", ["agent_id"])
    op.create_index("ix_timers_execution", "timers", ["execution_id"])

    op.create_table(
        "webhooks",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("secret", sa.Text(), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"]),
        sa.PrimaryKeyConstraint("id"),
    )

    op.create_table(
        "wakes",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("reason", sa.String(length=16), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["agent_id"], ["agents.id"]),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"]),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("id"),
    )
    op.create_index("ix_wakes_session", "wakes", ["session_id", "seq"])

    op.create_table(
        "wake_deliveries",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("wake_id", sa.String(length=64), nullable=False),
        sa.Column("webhook_id", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.Float(), nullable=True),
        sa.Column("delivered_at", sa.Float(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["wake_id"], ["wakes.id"]),
        sa.ForeignKeyConstraint(["webhook_id"], ["webhooks.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("wake_id", "webhook_id", name="uq_delivery_wake_webhook"),
    )
    op.create_index("ix_wake_deliveries_state", "wake_deliveries", ["state"])

    op.create_table(
        "delivery_attempts",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("delivery_id", sa.String(length=64), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["delivery_id"], ["wake_deliveries.id"]),
        sa.PrimaryKeyConstraint("seq"),
    )
    op.create_index("ix_delivery_attempts_delivery", "delivery_attempts", ["delivery_id"])

    with op.batch_alter_table("notices", schema=None) as batch_op:
        batch_op.add_column(sa.Column("wake_id", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("notices", schema=None) as batch_op:
        batch_op.drop_column("wake_id")
    op.drop_index("ix_delivery_attempts_delivery", table_name="delivery_attempts")
    op.drop_table("delivery_attempts")
    op.drop_index("ix_wake_deliveries_state", table_name="wake_deliveries")
    op.drop_table("wake_deliveries")
    op.drop_index("ix_wakes_session", table_name="wakes")
    op.drop_table("wakes")
    op.drop_table("webhooks")
    op.drop_index("ix_timers_execution", table_name="timers")
    op.drop_index("ix_timers_agent", table_name="timers")
    op.drop_index("ix_timers_state_fire_at", table_name="timers")
    op.drop_table("timers")
    op.drop_index("ix_session_events_session", table_name="session_events")
    op.drop_table("session_events")

"""leases: which replica watches each piece of ongoing work; one default session (docs/operations.md)

Revision ID: 0009_leases
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0009_leases"
# A branch of its own on 0001 (which has the sessions table), like 0002–0007: the store
# upgrades to every head.
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("subject_id", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=64), nullable=False),
        sa.Column("scope", sa.String(length=255), nullable=True),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("acquired_at", sa.Float(), nullable=False),
        sa.Column("takeovers", sa.Integer(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("kind", "subject_id"),
    )
    op.create_index("ix_leases_expires", "leases", ["expires_at"])
    op.create_index("ix_leases_holder", "leases", ["holder"])
    # Replicas of an older release could race to a second default session: keep the oldest
    # as the default (the others stay, as ordinary sessions) so the index can exist.
    sessions = sa.table(
        "sessions",
        sa.column("id", sa.String),
        sa.column("is_default", sa.Boolean),
        sa.column("created_at", sa.Float),
    )
    oldest = (
        sa.select(sessions.c.id)
        .where(sessions.c.is_default.is_(True))
        .order_by(sessions.c.created_at, sessions.c.id)
        .limit(1)
        .scalar_subquery()
    )
    op.execute(
        sessions.update()
        .where(sessions.c.is_default.is_(True), sessions.c.id != oldest)
        .values(is_default=False)
    )
    op.create_index(
        "uq_sessions_one_default",
        "sessions",
        ["is_default"],
        unique=True,
        postgresql_where=sa.text("is_default"),
        sqlite_where=sa.text("is_default"),
    )


def downgrade() -> None:
    op.drop_index("uq_sessions_one_default", table_name="sessions")
    op.drop_index("ix_leases_holder", table_name="leases")
    op.drop_index("ix_leases_expires", table_name="leases")
    op.drop_table("leases")

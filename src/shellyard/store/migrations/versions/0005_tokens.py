"""bearer tokens (admin, session, agent), stored as sha256 hashes

Revision ID: 0005_tokens
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_tokens"
# A branch of its own on 0001 (which has sessions and agents), like 0002 and 0003: the store
# upgrades to every head.
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tokens",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("secret_sha256", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=True),
        sa.Column("agent_id", sa.String(length=64), nullable=True),
        sa.Column("created_by", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("revoked_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"]),
        sa.ForeignKeyConstraint(["agent_id"], ["agents.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("secret_sha256"),
    )


def downgrade() -> None:
    op.drop_table("tokens")

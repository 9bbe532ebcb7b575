"""transfers and their per-file outcomes, artifacts, snapshot retention marks

Revision ID: 0003_files
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_files"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("snapshots") as batch:
        batch.add_column(sa.Column("pruned_at", sa.Float(), nullable=True))

    op.create_table(
        "transfers",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("source_workspace_id", sa.String(length=64), nullable=False),
        sa.Column("source_seq", sa.Integer(), nullable=True),
        sa.Column("target_workspace_id", sa.String(length=64), nullable=False),
        sa.Column("target_folder", sa.Text(), nullable=False),
        sa.Column("paths", sa.JSON(), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("files_total", sa.Integer(), nullable=False),
        sa.Column("bytes_total", sa.BigInteger(), nullable=False),
        sa.Column("files_copied", sa.Integer(), nullable=False),
        sa.Column("files_unchanged", sa.Integer(), nullable=False),
        sa.Column("files_skipped", sa.Integer(), nullable=False),
        sa.Column("files_failed", sa.Integer(), nullable=False),
        sa.Column("bytes_done", sa.BigInteger(), nullable=False),
        sa.Column("bytes_sent", sa.BigInteger(), nullable=False),
        sa.Column("batches", sa.Integer(), nullable=False),
        sa.Column("target_seq", sa.Integer(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["agent_id"], ["agents.id"]),
        sa.ForeignKeyConstraint(["source_workspace_id"], ["workspaces.id"]),
        sa.ForeignKeyConstraint(["target_workspace_id"], ["workspaces.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_transfers_agent", "transfers", ["agent_id", "created_at"])
    op.create_index("ix_transfers_state", "transfers", ["state"])

    op.create_table(
        "transfer_files",
        sa.Column("transfer_id", sa.String(length=64), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("source_path", sa.Text(), nullable=False),
        sa.Column("target_path", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("mode", sa.Integer(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=True),
        sa.Column("link_target", sa.Text(), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("target_seq", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["transfer_id"], ["transfers.id"]),
        sa.PrimaryKeyConstraint("transfer_id", "idx"),
    )
    op.create_index("ix_transfer_files_outcome", "transfer_files", ["transfer_id", "outcome"])

    op.create_table(
        "artifacts",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("workspace_id", sa.String(length=64), nullable=False),
        sa.Column("runner_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["agent_id"], ["agents.id"]),
        sa.ForeignKeyConstraint(["workspace_id"], ["workspaces.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("agent_id", "name", name="uq_artifact_agent_name"),
    )


def downgrade() -> None:
    op.drop_table("artifacts")
    op.drop_index("ix_transfer_files_outcome", table_name="transfer_files")
    op.drop_table("transfer_files")
    op.drop_index("ix_transfers_state", table_name="transfers")
    op.drop_index("ix_transfers_agent", table_name="transfers")
    op.drop_table("transfers")
    with op.batch_alter_table("snapshots") as batch:
        batch.drop_column("pruned_at")

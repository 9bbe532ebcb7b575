"""artifact content id: the snapshot store's id of an artifact's file, beside its real sha256

Revision ID: 0013_artifact_content_id
Revises: 0003_files
"""

import sqlalchemy as sa
from alembic import op

revision = "0013_artifact_content_id"
# On 0003_files, which made the artifacts table.
down_revision = "0003_files"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("artifacts") as batch:
        batch.add_column(sa.Column("content_id", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("artifacts") as batch:
        batch.drop_column("content_id")

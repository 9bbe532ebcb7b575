"""executions by seq: an index on the submission order

Revision ID: 0014_executions_seq
Revises: 0001

Every submit takes its ``seq`` as ``max(seq) + 1`` in its insert (store/executions.py): with
no index that read the whole table, on SQLite ~14 ms at 100,000 executions and growing with
every execution a home ever ran (docs/benchmarks.md, the section on the server's CPU per call,
session 49). The index answers it from its last entry, and serves the listings ordered by seq.
"""

from alembic import op

revision = "0014_executions_seq"
# On 0001, which made the executions table.
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_executions_seq", "executions", ["seq"])


def downgrade() -> None:
    op.drop_index("ix_executions_seq", table_name="executions")

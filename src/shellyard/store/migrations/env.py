"""Alembic environment: the store passes an open connection; no alembic.ini is needed."""

from __future__ import annotations

from alembic import context

from shellyard.store.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()

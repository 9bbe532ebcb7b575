"""The control plane's records: one schema (SQLAlchemy Core + Alembic) on SQLite or PostgreSQL."""

from shellyard.store.store import Store

__all__ = ["Store"]

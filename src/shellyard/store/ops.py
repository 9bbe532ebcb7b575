"""What an operator watches (docs/operations.md): counts for /metrics, and the checks of /readyz."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shellyard.store import schema
from shellyard.store.db import Database
from shellyard.store.schema import executions, wake_deliveries


class OpsRecords(Database):
    async def execution_counts(self) -> dict[str, int]:
        """Executions by state, every replica's."""
        rows = await self.all(
            sa.select(executions.c.state, sa.func.count().label("n")).group_by(executions.c.state)
        )
        return {str(r["state"]): int(r["n"]) for r in rows}

    async def delivery_counts(self) -> dict[str, int]:
        """Webhook deliveries of wakes by state (pending, delivered, failed)."""
        rows = await self.all(
            sa.select(wake_deliveries.c.state, sa.func.count().label("n")).group_by(
                wake_deliveries.c.state
            )
        )
        return {str(r["state"]): int(r["n"]) for r in rows}

    async def missing_migrations(self) -> list[str]:
        """The heads of the code's migrations the database has not applied (empty: at head)."""
        return await self.run(_missing_migrations)


def _missing_migrations(conn: Connection) -> list[str]:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(Path(schema.__file__).parent / "migrations"))
    applied = {str(r[0]) for r in conn.execute(sa.text("SELECT version_num FROM alembic_version"))}
    return sorted(set(script.get_heads()) - applied)

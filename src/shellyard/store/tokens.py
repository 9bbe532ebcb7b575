"""Records of bearer tokens: each secret is kept only as its sha256; revoking sets
``revoked_at`` (the row stays, so the list shows who had access until when)."""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from shellyard.store.db import Row, new_id
from shellyard.store.schema import tokens, wakes
from shellyard.store.store import Store


class TokenRecords:
    def __init__(self, store: Store) -> None:
        self.store = store
        #: Counts revocations written through these records: a cache of verified tokens
        #: (control/tokens.py) is dropped whenever it moves.
        self.revocations = 0

    async def add(
        self,
        kind: str,
        secret_sha256: str,
        *,
        session_id: str | None = None,
        agent_id: str | None = None,
        created_by: str | None = None,
    ) -> Row:
        values: dict[str, Any] = {
            "id": new_id("tok"),
            "kind": kind,
            "secret_sha256": secret_sha256,
            "session_id": session_id,
            "agent_id": agent_id,
            "created_by": created_by,
            "created_at": time.time(),
            "revoked_at": None,
        }
        await self.store.run(_insert, values)
        return values

    async def by_hash(self, secret_sha256: str) -> Row | None:
        return await self.store.one(
            sa.select(tokens).where(tokens.c.secret_sha256 == secret_sha256)
        )

    async def get(self, token_id: str) -> Row | None:
        return await self.store.one(sa.select(tokens).where(tokens.c.id == token_id))

    async def list(self, session_id: str | None = None) -> list[Row]:
        """Every token, or those scoped to ``session_id`` (session and agent tokens both
        record their session)."""
        stmt = sa.select(tokens).order_by(tokens.c.created_at)
        if session_id is not None:
            stmt = stmt.where(tokens.c.session_id == session_id)
        return await self.store.all(stmt)

    async def session_of_wake(self, wake_id: str) -> str | None:
        row = await self.store.one(sa.select(wakes.c.session_id).where(wakes.c.id == wake_id))
        return None if row is None else str(row["session_id"])

    async def revoke(self, token_id: str) -> Row | None:
        try:
            await self.store.run(_revoke, token_id, time.time())
        finally:  # even when the commit's outcome is unknown: forgetting costs one read
            self.revocations += 1
        return await self.get(token_id)


def _insert(conn: sa.Connection, values: dict[str, Any]) -> None:
    conn.execute(tokens.insert().values(**values))


def _revoke(conn: sa.Connection, token_id: str, now: float) -> None:
    conn.execute(
        tokens.update()
        .where(tokens.c.id == token_id, tokens.c.revoked_at.is_(None))
        .values(revoked_at=now)
    )

"""Records of bearer tokens: each secret is kept only as its sha256; revoking sets
``revoked_at`` (the row stays, so the list shows who had access until when)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa

from shellyard.store.db import Database, new_id
from shellyard.store.records import from_row, from_rows, maybe
from shellyard.store.schema import tokens, wakes


@dataclass(frozen=True, slots=True, kw_only=True)
class Token:
    """A ``tokens`` row (docs/architecture.md "Records at the store boundary"): a bearer
    token or a web login (web/cookies.py), kept as its secret's sha256."""

    id: str
    kind: Literal["admin", "session", "agent"]
    secret_sha256: str
    session_id: str | None
    agent_id: str | None
    #: the token a web login came from
    created_by: str | None
    created_at: float
    revoked_at: float | None


class TokenRecords(Database):
    #: Counts revocations written through these records (set by ``Store.__init__``): a cache
    #: of verified tokens (control/tokens.py) is dropped whenever it moves.
    revocations: int

    async def add_token(
        self,
        kind: str,
        secret_sha256: str,
        *,
        session_id: str | None = None,
        agent_id: str | None = None,
        created_by: str | None = None,
    ) -> Token:
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
        await self.run(_insert, values)
        return from_row(Token, values)

    async def token_by_hash(self, secret_sha256: str) -> Token | None:
        row = await self.one(sa.select(tokens).where(tokens.c.secret_sha256 == secret_sha256))
        return maybe(Token, row)

    async def get_token(self, token_id: str) -> Token | None:
        return maybe(Token, await self.one(sa.select(tokens).where(tokens.c.id == token_id)))

    async def list_tokens(self, session_id: str | None = None) -> list[Token]:
        """Every token, or those scoped to ``session_id`` (session and agent tokens both
        record their session)."""
        stmt = sa.select(tokens).order_by(tokens.c.created_at)
        if session_id is not None:
            stmt = stmt.where(tokens.c.session_id == session_id)
        return from_rows(Token, await self.all(stmt))

    async def session_of_wake(self, wake_id: str) -> str | None:
        row = await self.one(sa.select(wakes.c.session_id).where(wakes.c.id == wake_id))
        return None if row is None else str(row["session_id"])

    async def revoke_token(self, token_id: str) -> Token | None:
        try:
            await self.run(_revoke, token_id, time.time())
        finally:  # even when the commit's outcome is unknown: forgetting costs one read
            self.revocations += 1
        return await self.get_token(token_id)


def _insert(conn: sa.Connection, values: dict[str, Any]) -> None:
    conn.execute(tokens.insert().values(**values))


def _revoke(conn: sa.Connection, token_id: str, now: float) -> None:
    conn.execute(
        tokens.update()
        .where(tokens.c.id == token_id, tokens.c.revoked_at.is_(None))
        .values(revoked_at=now)
    )

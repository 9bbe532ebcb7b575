"""Records of bearer tokens: each secret is kept only as its sha256; revoking sets
``revoked_at`` (the row stays, so the list shows who had access until when)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa

from shellyard.store.db import Database, new_id
from shellyard.store.records import from_row, from_rows, maybe
from shellyard.store.schema import sessions, tokens, wakes

#: A web login (web/cookies.py) is a row beside the tokens whose id starts with this: the
#: rows a login makes, bounds per source token and the sweep deletes are told apart by it.
WEB_SESSION_ID_PREFIX = "web"
#: A web session ends this long after its login, even if the browser still holds the cookie;
#: past it the row is deleted by the sweep (``delete_expired_web_sessions``).
WEB_SESSION_TTL_S = 7 * 24 * 3600.0


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
        values = _new_row("tok", kind, secret_sha256, session_id, agent_id, created_by)
        await self.run(_insert, values)
        return from_row(Token, values)

    async def add_agent_token(
        self,
        secret_sha256: str,
        *,
        session_id: str,
        agent_id: str,
        created_by: str | None,
        most: int,
    ) -> tuple[Token | None, int]:
        """An agent token, unless its session already holds ``most`` live (not revoked) agent
        tokens: then nothing is written and the row is None. Counted and written in one
        transaction with the session's row locked (PostgreSQL; SQLite writes one transaction
        at a time), so concurrent makers never pass the bound. Returns the row and the live
        count before it."""
        values = _new_row("tok", "agent", secret_sha256, session_id, agent_id, created_by)
        added, live = await self.run(_insert_agent_token, values, most)
        return (from_row(Token, values) if added else None), live

    async def add_web_session(
        self,
        kind: str,
        secret_sha256: str,
        *,
        session_id: str | None,
        agent_id: str | None,
        created_by: str,
        keep: int,
    ) -> tuple[Token, int]:
        """A web login made from the token ``created_by``, and in the same transaction the
        oldest of that token's other web sessions deleted past ``keep`` (ended, revoked or
        live: a login loop, or a login-logout loop, grows nothing). Returns the row and how
        many were deleted."""
        values = _new_row(
            WEB_SESSION_ID_PREFIX, kind, secret_sha256, session_id, agent_id, created_by
        )
        deleted = await self.run(_insert_web_session, values, keep)
        if deleted:  # a cache of principals never holds a web session; dropped all the same
            self.revocations += 1
        return from_row(Token, values), deleted

    async def delete_expired_web_sessions(self, before: float, batch: int) -> int:
        """At most ``batch`` web sessions made before ``before`` deleted (they answer 401
        already); call again while it returns anything."""
        deleted = await self.run(_delete_expired_web_sessions, before, batch)
        if deleted:
            self.revocations += 1
        return deleted

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


def _insert_agent_token(conn: sa.Connection, values: dict[str, Any], most: int) -> tuple[bool, int]:
    session_id = values["session_id"]
    conn.execute(sa.select(sessions.c.id).where(sessions.c.id == session_id).with_for_update())
    live = conn.execute(
        sa.select(sa.func.count())
        .select_from(tokens)
        .where(
            tokens.c.kind == "agent",
            tokens.c.session_id == session_id,
            tokens.c.revoked_at.is_(None),
            # an agent token's web logins are rows of kind "agent" too, bounded per token
            # (``add_web_session``'s ``keep``): not tokens, so not this bound's
            sa.not_(_web_sessions()),
        )
    ).scalar_one()
    if live >= most:
        return False, int(live)
    conn.execute(tokens.insert().values(**values))
    return True, int(live)


def _web_sessions() -> Any:
    return tokens.c.id.like(f"{WEB_SESSION_ID_PREFIX}\\_%", escape="\\")


def _insert_web_session(conn: sa.Connection, values: dict[str, Any], keep: int) -> int:
    conn.execute(tokens.insert().values(**values))
    mine = sa.and_(_web_sessions(), tokens.c.created_by == values["created_by"])
    kept = (
        sa.select(tokens.c.id)
        .where(mine)
        .order_by(tokens.c.created_at.desc(), tokens.c.id.desc())
        .limit(keep)
    )
    gone = conn.execute(tokens.delete().where(mine, tokens.c.id.not_in(kept.scalar_subquery())))
    return int(gone.rowcount)


def _delete_expired_web_sessions(conn: sa.Connection, before: float, batch: int) -> int:
    ids = [
        r[0]
        for r in conn.execute(
            sa.select(tokens.c.id)
            .where(_web_sessions(), tokens.c.created_at < before)
            .order_by(tokens.c.created_at)
            .limit(batch)
        )
    ]
    if not ids:
        return 0
    conn.execute(tokens.delete().where(tokens.c.id.in_(ids)))
    return len(ids)


def _revoke(conn: sa.Connection, token_id: str, now: float) -> None:
    conn.execute(
        tokens.update()
        .where(tokens.c.id == token_id, tokens.c.revoked_at.is_(None))
        .values(revoked_at=now)
    )


def _new_row(
    id_prefix: str,
    kind: str,
    secret_sha256: str,
    session_id: str | None,
    agent_id: str | None,
    created_by: str | None,
) -> dict[str, Any]:
    """A new token row's values: a bearer token (``tok_…``) or a web session (``web_…``)."""
    return {
        "id": new_id(id_prefix),
        "kind": kind,
        "secret_sha256": secret_sha256,
        "session_id": session_id,
        "agent_id": agent_id,
        "created_by": created_by,
        "created_at": time.time(),
        "revoked_at": None,
    }

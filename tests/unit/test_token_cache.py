"""Verified bearer tokens kept in memory (control/tokens.py): on SQLite, where one process
writes the database, a known token costs no transaction and any revocation forgets every kept
token; on PostgreSQL every request reads the token again, so a revocation written by another
replica takes effect on the next request (docs/security.md: revocation is immediate)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from conftest import POSTGRES_URL
from shellyard.control.agents import session_of
from shellyard.control.tokens import (
    UNAUTHENTICATED_ADMIN,
    TokenService,
    hash_secret,
    new_secret,
)
from shellyard.errors import Unauthorized
from shellyard.store import Store


@contextmanager
def transactions() -> Iterator[list[int]]:
    """How many transactions any engine of this process began meanwhile (one-item list)."""
    box = [0]

    def begin(_conn: object) -> None:
        box[0] += 1

    event.listen(Engine, "begin", begin)
    try:
        yield box
    finally:
        event.remove(Engine, "begin", begin)


async def _admin_token(tokens: TokenService) -> tuple[str, str]:
    secret = new_secret()
    row = await tokens.store.add_token("admin", hash_secret(secret))
    return secret, row.id


async def test_a_known_token_is_looked_up_once_on_sqlite_and_revocation_forgets_it(
    store: Store,
) -> None:
    tokens = TokenService(store)
    secret, token_id = await _admin_token(tokens)
    first = await tokens.authenticate(secret)
    with transactions() as begun:
        again = await tokens.authenticate(secret)
    assert again == first and again.token_id == token_id
    assert begun[0] == (0 if store.is_sqlite else 1)
    await tokens.revoke(UNAUTHENTICATED_ADMIN, token_id)
    with pytest.raises(Unauthorized, match="unknown or revoked"):
        await tokens.authenticate(secret)
    # A token never verified, and one that is wrong, are refused as before.
    with pytest.raises(Unauthorized):
        await tokens.authenticate("sy_wrong")
    with pytest.raises(Unauthorized, match="missing"):
        await tokens.authenticate("")


async def test_a_revocation_by_another_replica_applies_to_the_next_request(
    pg_schema: str,
) -> None:
    """Two token services on one database stand for two replicas (PostgreSQL only: SQLite
    serves one process per home, server.lock)."""
    store = await Store.open(POSTGRES_URL, schema_name=pg_schema)
    try:
        await _revoked_by_the_other(store)
    finally:
        await store.close()


async def _revoked_by_the_other(store: Store) -> None:
    here, there = TokenService(store), TokenService(store)
    secret, token_id = await _admin_token(here)
    await here.authenticate(secret)
    await there.revoke(UNAUTHENTICATED_ADMIN, token_id)
    with pytest.raises(Unauthorized, match="unknown or revoked"):
        await here.authenticate(secret)


async def test_a_revocation_written_while_a_token_is_read_is_not_kept_out(
    store: Store,
) -> None:
    """A principal read before a revocation committed is not kept: the revocation counter
    moved while it was read, so the next request reads the token again."""
    tokens = TokenService(store)
    secret, token_id = await _admin_token(tokens)
    real_by_hash = tokens.store.token_by_hash

    async def revoked_meanwhile(digest: str) -> object:
        row = await real_by_hash(digest)  # read before the revocation commits
        await tokens.store.revoke_token(token_id)
        return row

    tokens.store.token_by_hash = revoked_meanwhile  # type: ignore[method-assign,assignment]
    await tokens.authenticate(secret)  # answered from the row read before: allowed once
    tokens.store.token_by_hash = real_by_hash  # type: ignore[method-assign]
    with pytest.raises(Unauthorized, match="unknown or revoked"):
        await tokens.authenticate(secret)


async def test_an_agents_session_is_read_once_and_a_missing_agent_is_not_remembered(
    store: Store,
) -> None:
    _session, agent = await store.default_owner()
    agent_id = str(agent.id)
    assert await session_of(store, agent_id) == agent.session_id
    with transactions() as begun:
        assert await session_of(store, agent_id) == agent.session_id
    assert begun[0] == 0
    assert await session_of(store, "agt_missing") is None
    with transactions() as begun:
        assert await session_of(store, "agt_missing") is None
    assert begun[0] == 1

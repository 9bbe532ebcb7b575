"""A session's live agent tokens are bounded (docs/security.md "Limits at each door"): each may
hold web sessions of its own, so a session token making them in a loop grew the tokens table
without end. At ``SHELLYARD_AGENT_TOKENS_PER_SESSION`` (100) live ones the next is refused
with 429 ``too_many`` saying what to revoke and how; nothing is deleted or revoked to make
room, a revoked one frees its place, and another session is not affected.

Real components: the control plane on SQLite and its REST app (in-process ASGI)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shellyard.api.app import create_app
from shellyard.config import Settings
from shellyard.control.plane import ControlPlane, build
from shellyard.control.tokens import AGENT_TOKENS_PER_SESSION
from shellyard.errors import InvalidInput
from shellyard.store import Store


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _serve(home: Path, settings: Settings) -> tuple[ControlPlane, str, httpx.AsyncClient]:
    plane = await build(settings)
    admin = await plane.tokens.ensure_admin_file(plane.settings.home)
    transport = httpx.ASGITransport(app=create_app(plane))
    return plane, admin, httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1")


@pytest.fixture
async def door(home: Path) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    plane, admin, client = await _serve(home, Settings(home=home / "home"))
    async with client:
        yield client, admin
    await plane.aclose()


async def _session(client: httpx.AsyncClient, admin: str) -> tuple[dict[str, Any], str]:
    """A new session and its session token."""
    made = await client.post("/v1/sessions", headers=bearer(admin))
    assert made.status_code == 200, made.text
    session = made.json()
    token = await client.post(
        "/v1/tokens",
        json={"kind": "session", "session_id": session["session_id"]},
        headers=bearer(admin),
    )
    assert token.status_code == 200, token.text
    return session, str(token.json()["token"])


async def _agent_token(client: httpx.AsyncClient, by: str, agent_id: str) -> httpx.Response:
    return await client.post(
        "/v1/tokens", json={"kind": "agent", "agent_id": agent_id}, headers=bearer(by)
    )


async def test_a_session_holds_at_most_100_live_agent_tokens(
    door: tuple[httpx.AsyncClient, str],
) -> None:
    client, admin = door
    session, session_token = await _session(client, admin)
    agent = session["main_agent_id"]
    assert AGENT_TOKENS_PER_SESSION == 100
    made = []
    for _ in range(AGENT_TOKENS_PER_SESSION):
        response = await _agent_token(client, session_token, agent)
        assert response.status_code == 200, response.text
        made.append(response.json()["token_id"])

    refused = await _agent_token(client, session_token, agent)
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "too_many"
    message = error["message"]
    assert f"already holds {AGENT_TOKENS_PER_SESSION} live agent tokens" in message
    assert "SHELLYARD_AGENT_TOKENS_PER_SESSION" in message
    assert "shellyard token revoke TOKEN_ID" in message and "DELETE /v1/tokens/" in message
    assert error["details"]["limit"] == AGENT_TOKENS_PER_SESSION
    document = (await client.get("/openapi.json", headers=bearer(admin))).json()
    declared = document["paths"]["/v1/tokens"]["post"]["responses"]["429"]
    assert declared["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    # The admin is held to the same bound for this session.
    assert (await _agent_token(client, admin, agent)).status_code == 429

    # Nothing was deleted or revoked to make room: every token made still works.
    listed = (await client.get("/v1/tokens", headers=bearer(session_token))).json()
    agents = [t for t in listed if t["kind"] == "agent"]
    assert [t["token_id"] for t in agents] == made
    assert all(t["revoked_at"] is None for t in agents)

    # Another session makes its own.
    other, other_token = await _session(client, admin)
    assert (await _agent_token(client, other_token, other["main_agent_id"])).status_code == 200

    # A revoked token frees its place, for one more only.
    revoked = await client.delete(f"/v1/tokens/{made[0]}", headers=bearer(session_token))
    assert revoked.status_code == 200, revoked.text
    again = await _agent_token(client, session_token, agent)
    assert again.status_code == 200, again.text
    assert (await _agent_token(client, session_token, agent)).status_code == 429


async def test_the_bound_is_a_setting(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHELLYARD_AGENT_TOKENS_PER_SESSION", "0")
    said = re.escape(
        "SHELLYARD_AGENT_TOKENS_PER_SESSION='0' is not valid: use a whole number, 1 or more"
    )
    with pytest.raises(InvalidInput, match=said):
        Settings.from_env(home=home / "home")
    monkeypatch.setenv("SHELLYARD_AGENT_TOKENS_PER_SESSION", "2")
    plane, admin, client = await _serve(home, Settings.from_env(home=home / "home"))
    try:
        async with client:
            session, session_token = await _session(client, admin)
            agent = session["main_agent_id"]
            for _ in range(2):
                assert (await _agent_token(client, session_token, agent)).status_code == 200
            refused = await _agent_token(client, session_token, agent)
            assert refused.status_code == 429
            assert "already holds 2 live agent tokens" in refused.json()["error"]["message"]
    finally:
        await plane.aclose()


async def test_concurrent_makers_never_pass_the_bound_on_sqlite_and_postgresql(
    store: Store,
) -> None:
    """The store's side: the count and the insert are one transaction with the session's row
    locked, so makers racing for the last places make exactly as many as are left."""
    session, agent = await store.create_session()
    results = await asyncio.gather(
        *(
            store.add_agent_token(
                f"secret-{n}", session_id=session.id, agent_id=agent.id, created_by=None, most=5
            )
            for n in range(12)
        )
    )
    assert sum(row is not None for row, _live in results) == 5
    assert sorted(live for row, live in results if row is None) == [5] * 7
    # Revoked and other kinds do not count.
    first = next(row for row, _live in results if row is not None)
    assert first is not None
    await store.revoke_token(first.id)
    await store.add_token("session", "a-session-token", session_id=session.id)
    row, live = await store.add_agent_token(
        "one-more", session_id=session.id, agent_id=agent.id, created_by=None, most=5
    )
    assert row is not None and live == 4

"""The web login's records stay bounded (docs/web.md "Login", docs/security.md "Attack pass
(session 44)"): an agent token logging in again and again (``POST /v1/auth/login`` with the
token: each login is a web session, a row beside the tokens, kept 7 days) keeps at most
``MAX_WEB_SESSIONS_PER_TOKEN`` of them, its oldest ended first; the operator's admin login
is untouched; expired web sessions and login codes are deleted, not only refused.

Real components: the control plane on SQLite and its REST app (in-process ASGI), the
retention pass ``shellyard gc`` runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from shellyard.api.app import create_app
from shellyard.config import Settings
from shellyard.control.plane import ControlPlane, build
from shellyard.store import Store
from shellyard.store.schema import tokens
from shellyard.web import login
from shellyard.web.login import MAX_WEB_SESSIONS_PER_TOKEN

#: The login cookie's name at http://127.0.0.1 (port 80).
COOKIE = "shellyard_login_80"
CSRF = {"X-Shellyard-CSRF": "1"}


@dataclass
class Web:
    client: httpx.AsyncClient
    plane: ControlPlane
    app: FastAPI
    admin: str

    async def login(self, token: str) -> str:
        """The cookie of a new web session made from ``token``."""
        made = await self.client.post("/v1/auth/login", json={"token": token}, headers=CSRF)
        assert made.status_code == 200, made.text
        self.client.cookies.clear()  # each login is a browser of its own
        return str(made.cookies[COOKIE])

    async def me(self, cookie: str) -> httpx.Response:
        return await self.with_cookie(cookie, "GET", "/v1/auth/me")

    async def with_cookie(
        self, cookie: str, method: str, path: str, **kw: object
    ) -> httpx.Response:
        self.client.cookies.set(COOKIE, cookie)
        try:
            return await self.client.request(method, path, **kw)  # type: ignore[arg-type]
        finally:
            self.client.cookies.clear()

    async def web_sessions_of(self, token_id: str) -> list[str]:
        rows = await self.plane.store.all(
            sa.select(tokens.c.id).where(
                tokens.c.created_by == token_id, tokens.c.id.like("web\\_%", escape="\\")
            )
        )
        return [str(r["id"]) for r in rows]


@pytest.fixture
async def web(home: Path) -> AsyncIterator[Web]:
    plane = await build(Settings(home=home / "home"))
    admin = await plane.tokens.ensure_admin_file(plane.settings.home)
    app = create_app(plane)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        yield Web(client, plane, app, admin)
    await plane.aclose()


async def _agent_token(web: Web) -> tuple[str, str]:
    """(secret, token id) of an agent token of a new session, made by the admin."""
    admin = {"Authorization": f"Bearer {web.admin}"}
    session = (await web.client.post("/v1/sessions", headers=admin)).json()
    made = await web.client.post(
        "/v1/tokens", json={"kind": "agent", "agent_id": session["main_agent_id"]}, headers=admin
    )
    assert made.status_code == 200, made.text
    return str(made.json()["token"]), str(made.json()["token_id"])


async def test_a_token_logging_in_past_the_bound_keeps_the_newest_and_the_operators(
    web: Web,
) -> None:
    """An agent token logs in N+k times: N of its web sessions are left, the first k answer
    401, and the rows in the database are N; the operator's admin login (made first) still
    answers ``admin``. A code made with one of the agent's cookies logs in as a web session
    counted against the agent's token too (no web session makes web sessions without end)."""
    operator = await web.login(web.admin)
    secret, token_id = await _agent_token(web)
    extra = 5
    cookies = [await web.login(secret) for _ in range(MAX_WEB_SESSIONS_PER_TOKEN + extra)]

    for cookie in cookies[:extra]:
        assert (await web.me(cookie)).status_code == 401
    for cookie in cookies[extra:]:
        answer = await web.me(cookie)
        assert answer.status_code == 200 and answer.json()["kind"] == "agent", answer.text
    assert len(await web.web_sessions_of(token_id)) == MAX_WEB_SESSIONS_PER_TOKEN
    me = await web.me(operator)
    assert me.status_code == 200 and me.json()["kind"] == "admin", me.text

    # A login through a code the newest web session made: the oldest live one ends.
    newest = cookies[-1]
    csrf = {"X-Shellyard-CSRF": (await web.me(newest)).json()["csrf"]}
    code = await web.with_cookie(newest, "POST", "/v1/auth/codes", json={}, headers=csrf)
    assert code.status_code == 200, code.text
    traded = await web.client.post(
        "/v1/auth/login", json={"code": code.json()["code"]}, headers=CSRF
    )
    assert traded.status_code == 200, traded.text
    web.client.cookies.clear()
    assert len(await web.web_sessions_of(token_id)) == MAX_WEB_SESSIONS_PER_TOKEN
    assert (await web.me(cookies[extra])).status_code == 401
    assert (await web.me(operator)).json()["kind"] == "admin"


async def test_expired_web_sessions_and_login_codes_are_deleted(
    web: Web, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Web sessions past their 7 days are deleted by the retention pass (the rows are gone,
    not only refused); a live one, the operator's, stays. A login code past its two minutes
    is deleted from the server's memory without any request coming for it."""
    operator = await web.login(web.admin)
    secret, token_id = await _agent_token(web)
    for _ in range(3):
        await web.login(secret)
    old = time.time() - 8 * 24 * 3600
    await web.plane.store.run(
        lambda conn: conn.execute(
            tokens.update().where(tokens.c.created_by == token_id).values(created_at=old)
        )
    )
    report = await web.plane.retention.run()
    assert report.events_deleted.get("web_sessions") == 3, report
    assert await web.web_sessions_of(token_id) == []
    assert (await web.me(operator)).json()["kind"] == "admin"
    # the agent's token itself (a bearer token, never expiring) is not a web session
    assert await web.plane.store.get_token(token_id) is not None

    monkeypatch.setattr(login, "CODE_TTL_S", 0.2)
    monkeypatch.setattr(login, "CODE_SWEEP_SLACK_S", 0.1)
    code = await web.client.post(
        "/v1/auth/codes", json={}, headers={"Authorization": f"Bearer {secret}"}
    )
    assert code.status_code == 200, code.text
    codes = web.app.state.login_codes
    assert len(codes) == 1
    for _ in range(100):
        if not codes:
            break
        await asyncio.sleep(0.05)
    assert not codes, "the expired code is still kept"


async def test_the_bound_and_the_sweep_on_sqlite_and_postgresql(store: Store) -> None:
    """The store's side, on both databases: a token's web sessions past ``keep`` go oldest
    first, no other token's and no bearer token (even one ``created_by`` that token) with
    them; the sweep deletes web sessions only."""
    for number in range(5):
        await store.add_web_session(
            "admin", f"a{number}", session_id=None, agent_id=None, created_by="tok_a", keep=3
        )
    await store.add_web_session(
        "admin", "b0", session_id=None, agent_id=None, created_by="tok_b", keep=3
    )
    bearer = await store.add_token("admin", "bearer", created_by="tok_a")
    rows = await store.list_tokens()
    of_a = [r.secret_sha256 for r in rows if r.created_by == "tok_a" and r.id != bearer.id]
    assert of_a == ["a2", "a3", "a4"]
    assert {"b0", "bearer"} <= {r.secret_sha256 for r in rows}
    assert await store.delete_expired_web_sessions(time.time() + 1, 2) == 2
    assert await store.delete_expired_web_sessions(time.time() + 1, 500) == 2
    assert [r.id for r in await store.list_tokens()] == [bearer.id]

"""Security (issue 6 item 2, docs/contract.md "Interfaces", T1): tokens, scopes, loopback rule.

The scope test walks EVERY operation of the OpenAPI document: each one that names an object
(in its path, query or body) is called with objects of session B, by session A's tokens
(refused: 404 as if missing, or 403) and by B's own token (not refused). Operations that name
no object must not show A anything of B. An operation this file does not know fails the test,
so a new endpoint cannot be added without saying how it is scoped.
"""

from __future__ import annotations

import asyncio
import io
import os
import stat
import subprocess
import sys
import tarfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from shellyard.api.app import create_app
from shellyard.api.server import check_bind
from shellyard.config import Settings
from shellyard.contract.sessions import WakeView
from shellyard.control.plane import ControlPlane, build
from shellyard.control.tokens import ADMIN_TOKEN_NAME
from shellyard.errors import InvalidInput

REFUSED = (403, 404)
#: Ids that name an object of a session; ``runner_id`` names no session's object.
SCOPED_IDS = {
    "session_id",
    "agent_id",
    "execution_id",
    "workspace_id",
    "transfer_id",
    "timer_id",
    "artifact_id",
    "webhook_id",
    "wake_id",
    "token_id",
    "environment_id",
    "change_id",
}
#: Only the admin token may call these (403 for every other token).
ADMIN_ONLY = {
    ("POST", "/v1/runners"),
    ("POST", "/v1/runners/remove"),
    ("POST", "/v1/runners/bootstrap"),
    ("POST", "/v1/sessions"),
    ("POST", "/v1/retention"),
    ("POST", "/v1/gc"),
    ("GET", "/v1/debug/sizes"),
    ("GET", "/metrics"),  # issue 16: the counts of every session
}
#: Operations that name no object: A's answer must not mention any of B's ids.
NO_ID = {
    ("GET", "/health"),
    ("GET", "/healthz"),  # issue 16: probes, no secret
    ("GET", "/readyz"),
    ("POST", "/v1/executions"),
    ("GET", "/v1/executions"),
    ("GET", "/v1/runners"),
    ("GET", "/v1/sessions"),
    ("GET", "/v1/inbox"),
    ("GET", "/v1/inbox/summary"),
    ("POST", "/v1/inbox/read"),
    ("GET", "/v1/timers"),
    ("GET", "/v1/webhooks"),
    ("GET", "/v1/workspaces"),
    ("GET", "/v1/transfers"),
    ("GET", "/v1/artifacts"),
    ("GET", "/v1/tokens"),
    ("POST", "/v1/environments"),
    ("GET", "/v1/environments"),
    ("GET", "/v1/panel/sessions"),
    ("POST", "/v1/auth/login"),
    ("GET", "/v1/auth/me"),
    ("POST", "/v1/auth/logout"),
}
#: Required query parameters that are not ids.
QUERY = {"path": "f.txt", "from_seq": "0"}
#: The request body of each operation that names objects in its body (``{ids}`` filled in).
BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("POST", "/v1/auth/codes"): {"session_id": "{session_id}"},
    ("POST", "/v1/timers"): {"text": "t", "after_ms": 600_000, "execution_id": "{execution_id}"},
    ("POST", "/v1/webhooks"): {"url": "http://127.0.0.1:9/hook", "session_id": "{session_id}"},
    ("POST", "/v1/files/delete"): {"path": "d.txt", "workspace_id": "{workspace_id}"},
    ("POST", "/v1/files/move"): {
        "source": "m.txt",
        "destination": "m2.txt",
        "workspace_id": "{workspace_id}",
    },
    ("POST", "/v1/files/restore"): {"seq": 1, "workspace_id": "{workspace_id}"},
    ("POST", "/v1/transfers"): {
        "source_workspace_id": "{workspace_id}",
        "paths": ["f.txt"],
        "target_workspace_id": "{child_workspace_id}",
        "target_folder": "copied",
    },
    ("POST", "/v1/artifacts"): {"path": "f.txt", "workspace_id": "{workspace_id}"},
    ("POST", "/v1/ports"): {"port": 8000, "workspace_id": "{workspace_id}"},
    ("POST", "/v1/ports/close"): {"port": 8000, "workspace_id": "{workspace_id}"},
    ("POST", "/v1/tokens"): {"kind": "agent", "agent_id": "{agent_id}"},
    # wait_ms 0: B's change is only recorded (the environment is a bare record, see below).
    ("POST", "/v1/environments/{environment_id}/install"): {
        "manager": "pip",
        "specs": ["six"],
        "wait_ms": 0,
    },
    ("POST", "/v1/environments/{environment_id}/uninstall"): {
        "manager": "pip",
        "specs": ["six"],
        "wait_ms": 0,
    },
}


#: Raw request bodies (uploads).
def _tar() -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        member = tarfile.TarInfo("up.txt")
        member.size = 2
        tar.addfile(member, io.BytesIO(b"up"))
    return data.getvalue()


RAW_BODIES = {("PUT", "/v1/files/content"): b"new", ("POST", "/v1/files/archive"): _tar()}
#: The owner is not called here: the answer is an endless stream (its scope check runs
#: before the stream starts, so A's refusal is still checked).
OWNER_SKIPPED = {
    ("GET", "/v1/sessions/{session_id}/wakes/stream"),
    ("GET", "/v1/sessions/{session_id}/panel/stream"),
    # B forwards no port here, so its own close is not_found (of the forward, not of the
    # workspace); the owner's open, list and close are tests/integration/test_ports.py's
    ("POST", "/v1/ports/close"),
}


def bearer(token: str, agent: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token}"}
    if agent:
        headers["X-Shellyard-Agent"] = agent
    return headers


@dataclass
class World:
    client: httpx.AsyncClient
    plane: ControlPlane
    admin: str
    spec: dict[str, Any]
    a_agent: str = ""
    a_session: str = ""
    b_agent: str = ""
    b_session: str = ""
    ids: dict[str, str] = field(default_factory=dict)

    async def token(self, **body: str) -> dict[str, Any]:
        response = await self.client.post("/v1/tokens", json=body, headers=bearer(self.admin))
        assert response.status_code == 200, response.text
        made: dict[str, Any] = response.json()
        return made


@pytest.fixture
async def world(home: Path) -> AsyncIterator[World]:
    settings = Settings(home=home / "home")
    # The webhooks of these tests point at the host's loopback (never delivered anywhere):
    # allowed only by the operator's exact host:port exception.
    settings.notifications.webhook_exceptions = ["127.0.0.1:9"]
    plane = await build(settings)
    admin = await plane.tokens.ensure_admin_file(plane.settings.home)
    app = create_app(plane)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        yield World(client, plane, admin, app.openapi())
    await plane.aclose()


async def make_sessions(w: World) -> None:
    """Sessions A and B, each with a session token and an agent token of its main agent;
    in B: a child, an execution, a file, a transfer to the child, an artifact, a timer, a
    webhook, a wake, and one more token."""
    c, admin = w.client, bearer(w.admin)
    a = (await c.post("/v1/sessions", headers=admin)).json()
    b = (await c.post("/v1/sessions", headers=admin)).json()
    w.a_agent = (await w.token(kind="agent", agent_id=a["main_agent_id"]))["token"]
    w.a_session = (await w.token(kind="session", session_id=a["session_id"]))["token"]
    w.b_agent = (await w.token(kind="agent", agent_id=b["main_agent_id"]))["token"]
    w.b_session = (await w.token(kind="session", session_id=b["session_id"]))["token"]
    main = b["main_agent_id"]
    as_b = bearer(w.b_session)

    child = (await c.post(f"/v1/agents/{main}/children", headers=as_b)).json()
    woken = asyncio.Event()
    wakes: list[WakeView] = []

    async def on_wake(wake: WakeView) -> None:
        wakes.append(wake)
        woken.set()

    await w.plane.wakes.add_callback(on_wake, b["session_id"])
    ran = (
        await c.post(
            "/v1/executions",
            json={"command": "echo b | tee f.txt d.txt > m.txt", "background": True},
            headers=as_b,
        )
    ).json()
    # The background completion wakes B's main agent (nobody waited on it: N2, N3).
    await asyncio.wait_for(woken.wait(), 30)
    done = await c.get(f"/v1/executions/{ran['execution_id']}", headers=as_b)
    assert done.json()["state"] == "completed"

    own = (await c.get("/v1/workspaces", headers=as_b)).json()
    child_ws = await c.get("/v1/workspaces", headers=bearer(w.b_session, child["agent_id"]))
    transfer = await c.post(
        "/v1/transfers",
        json={
            "source_workspace_id": own[0]["workspace_id"],
            "paths": ["f.txt"],
            "target_workspace_id": child_ws.json()[0]["workspace_id"],
        },
        headers=as_b,
    )
    assert transfer.status_code == 200, transfer.text
    artifact = await c.post("/v1/artifacts", json={"path": "f.txt"}, headers=as_b)
    assert artifact.status_code == 200, artifact.text
    timer = await c.post("/v1/timers", json={"text": "x", "after_ms": 600_000}, headers=as_b)
    hook = await c.post(
        "/v1/webhooks",
        json={"url": "http://127.0.0.1:9/hook", "session_id": b["session_id"]},
        headers=admin,
    )
    spare = await w.token(kind="agent", agent_id=child["agent_id"])
    # An environment of B as a bare record: making a real prefix is test_environments' job.
    _env, change = await w.plane.store.create_environment(
        {
            "id": "env_b",
            "session_id": b["session_id"],
            "created_by": main,
            "runner_id": "local",
            "name": "b-env",
            "language": "python",
        },
        {
            "id": "chg_b",
            "environment_id": "env_b",
            "agent_id": main,
            "action": "create",
            "options": {"language": "python"},
        },
    )
    w.ids = {
        "session_id": b["session_id"],
        "agent_id": child["agent_id"],
        "execution_id": ran["execution_id"],
        "workspace_id": own[0]["workspace_id"],
        "child_workspace_id": child_ws.json()[0]["workspace_id"],
        "transfer_id": transfer.json()["transfer_id"],
        "timer_id": timer.json()["timer_id"],
        "artifact_id": artifact.json()["artifact_id"],
        "webhook_id": hook.json()["webhook_id"],
        "wake_id": wakes[0].wake_id,
        "token_id": spare["token_id"],
        "environment_id": "env_b",
        "change_id": change.id,
        "main_agent_id": main,
    }


def operations(app_openapi: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    found = []
    for path, methods in app_openapi["paths"].items():
        for method, operation in methods.items():
            found.append((method.upper(), path, operation))
    return found


def fill(value: Any, ids: dict[str, str]) -> Any:
    if isinstance(value, str) and value.startswith("{") and value.endswith("}"):
        return ids[value[1:-1]]
    if isinstance(value, dict):
        return {k: fill(v, ids) for k, v in value.items()}
    return value


#: Path parameters that name no object (a log's stream): the same word for every session.
PATH_WORDS = {"stream": "stdout"}


def build_request(
    method: str, path: str, operation: dict[str, Any], ids: dict[str, str]
) -> tuple[str, dict[str, str], Any, bytes | None, set[str]]:
    """(url, query, json body, raw body, the scoped ids the request names)."""
    named: set[str] = set()
    url = path
    query: dict[str, str] = {}
    for param in operation.get("parameters", []):
        name, where = param["name"], param["in"]
        if where == "path" and name in PATH_WORDS:
            url = url.replace("{" + name + "}", PATH_WORDS[name])
            continue
        if where == "path":
            if name not in ids:
                raise AssertionError(
                    f"{method} {path}: no object of session B for path parameter {name!r}; "
                    "make one in make_sessions() and say how the endpoint is scoped"
                )
            url = url.replace("{" + name + "}", ids[name])
            named.add(name)
        elif where == "query":
            if name in SCOPED_IDS:
                query[name] = ids[name]
                named.add(name)
            elif param.get("required"):
                if name not in QUERY:
                    raise AssertionError(f"{method} {path}: give a value for query {name!r}")
                query[name] = QUERY[name]
    body = BODIES.get((method, path))
    if body is not None:
        named |= {v[1:-1] for v in body.values() if isinstance(v, str) and v.startswith("{")}
        body = fill(body, ids)
    return url, query, body, RAW_BODIES.get((method, path)), named


async def send(
    w: World,
    method: str,
    url: str,
    query: dict[str, str],
    body: Any,
    raw: bytes | None,
    headers: dict[str, str],
) -> httpx.Response:
    if raw is not None:
        return await w.client.request(method, url, params=query, content=raw, headers=headers)
    if body is None and method in ("POST", "PUT"):
        body = {}
    return await w.client.request(method, url, params=query, json=body, headers=headers)


async def test_every_endpoint_is_scoped_to_the_tokens_session(world: World) -> None:
    """Issue 6 item 2, T1: A's agent and session tokens cannot list, read, change, cancel or
    transfer B's objects through any endpoint; B's session token can."""
    w = world
    await make_sessions(w)
    b_ids = set(w.ids.values())
    checked: list[str] = []
    for method, path, operation in operations(w.spec):
        key = (method, path)
        url, query, body, raw, named = build_request(method, path, operation, w.ids)
        named &= SCOPED_IDS
        if key in ADMIN_ONLY:
            for token in (w.a_agent, w.a_session, w.b_session):
                answer = await send(w, method, url, query, body, raw, bearer(token))
                assert answer.status_code == 403, (key, answer.text)
                assert answer.json()["error"]["code"] == "forbidden"
            checked.append(f"{method} {path}: admin only")
            continue
        if not named:
            assert key in NO_ID, (
                f"{method} {path} names no object and is not listed in NO_ID: say how it is "
                "scoped (add it to NO_ID, ADMIN_ONLY or BODIES)"
            )
            for token in (w.a_agent, w.a_session):
                answer = await send(w, method, url, query, body, raw, bearer(token))
                assert answer.status_code < 500, (key, answer.text)
                leaked = [i for i in b_ids if i in answer.text]
                assert not leaked, f"{method} {path} shows A the ids {leaked} of session B"
            checked.append(f"{method} {path}: no id")
            continue
        for token in (w.a_agent, w.a_session):
            answer = await send(w, method, url, query, body, raw, bearer(token))
            assert answer.status_code in REFUSED, (key, token == w.a_agent, answer.text)
            asked = url + str(query) + str(body)
            leaked = [i for i in b_ids if i in answer.text and i not in asked]
            assert not leaked, f"{method} {path}'s refusal mentions {leaked}"
        if key not in OWNER_SKIPPED:
            answer = await send(w, method, url, query, body, raw, bearer(w.b_session))
            assert answer.status_code not in (401, 403, 404), (key, answer.text)
        checked.append(f"{method} {path}: {sorted(named)}")
    assert len(checked) >= 60  # every operation of the document was walked

    # Ids in bodies of operations that name no object of their own: A's run_shell with B's
    # environment, a transfer from A's own workspace into B's (T1: no other workspaces).
    for token in (w.a_agent, w.a_session):
        ran = await w.client.post(
            "/v1/executions",
            json={"command": "true", "environment_id": w.ids["environment_id"]},
            headers=bearer(token),
        )
        assert ran.status_code == 404, ran.text
        own = (await w.client.get("/v1/workspaces", headers=bearer(token))).json()
        into_b = await w.client.post(
            "/v1/transfers",
            json={
                "source_workspace_id": own[0]["workspace_id"],
                "paths": ["*"],
                "target_workspace_id": w.ids["workspace_id"],
            },
            headers=bearer(token),
        )
        assert into_b.status_code == 404, into_b.text


async def test_agent_token_acts_only_as_its_agent(world: World) -> None:
    """An agent token acts as exactly one agent; a session token as the agents of its
    session (default: the main agent); X-Shellyard-Agent outside that is refused."""
    w = world
    await make_sessions(w)
    c, main, child = w.client, w.ids["main_agent_id"], w.ids["agent_id"]
    mine = await c.get("/v1/inbox/summary", headers=bearer(w.b_agent))
    assert mine.status_code == 200 and mine.json()["agent_id"] == main
    other = await c.get("/v1/inbox/summary", headers=bearer(w.b_agent, child))
    assert other.status_code == 403 and "acts only as agent" in other.json()["error"]["message"]
    as_child = await c.get("/v1/inbox/summary", headers=bearer(w.b_session, child))
    assert as_child.json()["agent_id"] == child
    default = await c.get("/v1/inbox/summary", headers=bearer(w.b_session))
    assert default.json()["agent_id"] == main
    outside = await c.get("/v1/inbox/summary", headers=bearer(w.a_session, child))
    assert outside.status_code == 403
    # A session token makes agent tokens for its own agents only; an agent token makes none.
    made = await c.post(
        "/v1/tokens", json={"kind": "agent", "agent_id": child}, headers=bearer(w.b_session)
    )
    assert made.status_code == 200 and made.json()["token"].startswith("sy_")
    refused = await c.post(
        "/v1/tokens", json={"kind": "agent", "agent_id": child}, headers=bearer(w.a_session)
    )
    assert refused.status_code == 404
    escalate = await c.post(
        "/v1/tokens",
        json={"kind": "session", "session_id": w.ids["session_id"]},
        headers=bearer(w.b_session),
    )
    assert escalate.status_code == 403
    # The list never shows secrets, and only the session's own tokens to a session token.
    listed = (await c.get("/v1/tokens", headers=bearer(w.b_session))).json()
    assert listed and all("token" not in t for t in listed)
    assert {t["session_id"] for t in listed} == {w.ids["session_id"]}


async def test_missing_wrong_and_revoked_tokens_are_refused(world: World) -> None:
    w = world
    await make_sessions(w)
    c = w.client
    assert (await c.get("/v1/executions")).status_code == 401
    wrong = await c.get("/v1/executions", headers=bearer("sy_wrong"))
    assert wrong.status_code == 401 and wrong.headers["WWW-Authenticate"] == "Bearer"
    assert "admin.token" in wrong.json()["error"]["message"]
    assert (await c.get("/health")).status_code == 200  # no secret needed to probe liveness

    made = await w.token(kind="agent", agent_id=w.ids["main_agent_id"])
    assert (await c.get("/v1/executions", headers=bearer(made["token"]))).status_code == 200
    revoked = await c.delete(f"/v1/tokens/{made['token_id']}", headers=bearer(w.admin))
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    assert (await c.get("/v1/executions", headers=bearer(made["token"]))).status_code == 401
    # Only a hash is stored: the secret is nowhere in the database file.
    database = (w.plane.settings.home).glob("*.db*")
    assert all(made["token"].encode() not in p.read_bytes() for p in database)


async def test_admin_token_file_is_private_and_reused(home: Path) -> None:
    """The admin token is made at the first start, mode 0600, and reused on restart."""
    settings = Settings(home=home / "home")
    path = settings.home / ADMIN_TOKEN_NAME
    async with ControlPlane.running(settings) as plane:
        first = await plane.tokens.ensure_admin_file(settings.home)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().strip() == first
    async with ControlPlane.running(settings) as plane:
        again = await plane.tokens.ensure_admin_file(settings.home)
        assert again == first
        assert (await plane.tokens.authenticate(first)).is_admin


def test_admin_token_file_made_by_serve_with_umask_zero(home: Path) -> None:
    """Made 0600 from the start: even a umask of 0 gives no wider mode; server.json names the
    file instead of holding the secret."""
    env = {**os.environ, "SHELLYARD_HOME": str(home / "h")}
    code = (
        "import os; os.umask(0); from shellyard.home import ensure_server;"
        f"print(ensure_server(__import__('pathlib').Path({str(home / 'h')!r})).pid)"
    )
    pid = int(
        subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout
    )
    try:
        token_file = home / "h" / ADMIN_TOKEN_NAME
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        info = (home / "h" / "server.json").read_text()
        assert token_file.read_text().strip() not in info and str(token_file) in info
    finally:
        os.kill(pid, 15)


def test_no_auth_is_refused_off_loopback(tmp_path: Path) -> None:
    """--host 0.0.0.0 --no-auth is refused with why and what to do; loopback is allowed."""
    with pytest.raises(InvalidInput, match="only on a loopback address"):
        check_bind("0.0.0.0", auth=False)
    check_bind("127.0.0.1", auth=False)
    check_bind("::1", auth=False)
    check_bind("0.0.0.0", auth=True)
    done = subprocess.run(
        # A home of its own: the default home may be served already (a user's, the demo's).
        [
            *(sys.executable, "-m", "shellyard", "serve", "--home", str(tmp_path / "home")),
            *("--host", "0.0.0.0", "--no-auth"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 2
    assert "loopback" in done.stderr and "Drop --no-auth" in done.stderr


async def test_no_auth_answers_loopback_names_only(home: Path) -> None:
    """--no-auth: no token needed, but a request for a non-loopback Host (DNS rebinding) is
    refused."""
    async with ControlPlane.running(Settings(home=home / "home")) as plane:
        app = create_app(plane, auth_required=False)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8000"
        ) as c:
            assert (await c.get("/v1/executions")).status_code == 200
            rebound = await c.get("/v1/executions", headers={"Host": "evil.example:8000"})
            assert rebound.status_code == 403 and "--no-auth" in rebound.text

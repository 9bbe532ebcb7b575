"""POST /v1/executions answers a JSON object body itself (api/run_route.py, E1): without
FastAPI's dependency solving, with each check done once — the token, the acting agent, the
body against the contract's model — and with the answers of the declared route, which still
handles every other body. Since session 49 that answer is given where the body bounds read
the body (api/bounds.py), past the router. A real control plane behind the ASGI app."""

from __future__ import annotations

from typing import Any

import fastapi.routing
import httpx
import pytest

from shellyard.control.plane import ControlPlane

JSON = "application/json"
#: a JSON content type FastAPI reads the same way, which the lean path leaves to it
JSON_CHARSET = "application/json; charset=utf-8"


@pytest.fixture
def solved(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths whose requests went through FastAPI's dependency solving."""
    seen: list[str] = []
    solve = fastapi.routing.solve_dependencies

    async def counted(*args: Any, **kw: Any) -> Any:
        seen.append(kw["request"].url.path)
        return await solve(*args, **kw)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counted)
    return seen


@pytest.fixture
def matched(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the app's router matched against its routes (spied, not replaced)."""
    seen: list[str] = []
    matches = fastapi.routing.APIRoute.matches

    def counted(self: fastapi.routing.APIRoute, scope: Any) -> Any:
        seen.append(scope["path"])
        return matches(self, scope)

    monkeypatch.setattr(fastapi.routing.APIRoute, "matches", counted)
    return seen


async def _post(
    client: httpx.AsyncClient, token: str, body: bytes, content_type: str = JSON, **headers: str
) -> httpx.Response:
    return await client.post(
        "/v1/executions",
        content=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": content_type, **headers},
    )


async def test_a_json_object_is_answered_without_dependency_solving(
    app_plane: tuple[httpx.AsyncClient, ControlPlane, str], solved: list[str]
) -> None:
    client, plane, admin = app_plane
    lean = await _post(client, admin, b'{"command": "echo hi; echo err >&2; exit 3"}')
    assert solved == []  # reverting api/run_route.py makes this ['/v1/executions']
    declared = await _post(
        client, admin, b'{"command": "echo hi; echo err >&2; exit 3"}', JSON_CHARSET
    )
    assert solved == ["/v1/executions"]
    assert lean.status_code == declared.status_code == 200, (lean.text, declared.text)
    assert lean.headers["content-type"] == declared.headers["content-type"]
    one, two = lean.json(), declared.json()
    assert list(one) == list(two)  # the same fields, in the same order (RunShellResult)
    varying = {"execution_id", "created_at", "started_at", "finished_at", "cpu_seconds",
               "peak_memory_bytes", "snapshot_seq"}  # fmt: skip
    assert {k: v for k, v in one.items() if k not in varying} == {
        k: v for k, v in two.items() if k not in varying
    }
    assert (one["state"], one["exit_code"], one["stdout"], one["stderr"]) == (
        "completed", 3, "hi\n", "err\n",
    )  # fmt: skip
    # the record the answer describes is the store's
    view = await plane.executions.status(one["execution_id"])
    assert view.exit_code == 3 and view.agent_id == one["agent_id"]


@pytest.mark.parametrize(
    ("body", "wording"),
    [
        (b'{"command": "true", "colour": "red"}', "colour"),  # extra="forbid"
        (b'{"command": "true", "script_path": "a.sh"}', "exactly one"),
        (b"{}", "exactly one"),
        (b'{"command": "true", "wait_ms": -1}', "wait_ms"),
        (b'{"command": "a\\udcff"}', "lone surrogate"),  # no text holds it: refused, as before
    ],
)
async def test_a_bad_body_gets_the_declared_routes_error(
    app_plane: tuple[httpx.AsyncClient, ControlPlane, str], body: bytes, wording: str
) -> None:
    client, _plane, admin = app_plane
    lean = await _post(client, admin, body)
    declared = await _post(client, admin, body, JSON_CHARSET)
    assert lean.status_code == declared.status_code == 400, (lean.text, declared.text)
    assert lean.json() == declared.json()
    assert lean.json()["error"]["code"] == "invalid_input"
    assert wording in lean.json()["error"]["message"], lean.text


@pytest.mark.parametrize("body", [b"[]", b'"true"', b"{nope", b""])
async def test_what_is_not_a_json_object_goes_to_the_declared_route(
    app_plane: tuple[httpx.AsyncClient, ControlPlane, str], solved: list[str], body: bytes
) -> None:
    client, _plane, admin = app_plane
    answer = await _post(client, admin, body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "invalid_input"
    # FastAPI refuses an unparsable body before solving the route's dependencies
    assert solved == ([] if body == b"{nope" else ["/v1/executions"])


async def test_the_token_and_the_acting_agent_are_still_checked(
    app_plane: tuple[httpx.AsyncClient, ControlPlane, str], solved: list[str]
) -> None:
    client, _plane, admin = app_plane
    bearer = {"Authorization": f"Bearer {admin}"}
    one = (await client.post("/v1/sessions", headers=bearer)).json()
    two = (await client.post("/v1/sessions", headers=bearer)).json()
    made = await client.post(
        "/v1/tokens", json={"kind": "session", "session_id": one["session_id"]}, headers=bearer
    )
    token = made.json()["token"]
    body = b'{"command": "true"}'
    refused = await _post(client, "sy_not_a_token", body)
    assert refused.status_code == 401, refused.text
    # A session token acts as its own agents only (the route's acting-agent check).
    outside = await _post(
        client, token, body, **{"X-Shellyard-Agent": two["main_agent_id"]}
    )  # fmt: skip
    assert outside.status_code == 403, outside.text
    mine = await _post(client, token, body)
    assert mine.status_code == 200 and mine.json()["agent_id"] == one["main_agent_id"]
    child = await client.post(f"/v1/agents/{one['main_agent_id']}/children", headers=bearer)
    as_child = await _post(
        client, token, body, **{"X-Shellyard-Agent": child.json()["agent_id"]}
    )  # fmt: skip
    assert as_child.status_code == 200 and as_child.json()["agent_id"] == child.json()["agent_id"]
    assert "/v1/executions" not in solved


async def test_a_json_object_is_answered_before_the_router(
    app_plane: tuple[httpx.AsyncClient, ControlPlane, str], matched: list[str]
) -> None:
    """E1 answered by the body bounds' layer (api/bounds.py ``lean``): the router never looks
    at the request (reverting it matches '/v1/executions' against the routes), and its errors
    keep the app's error shape (401 with its challenge, 400 for a bad body, 409 for a busy
    workspace, W1)."""
    client, _plane, admin = app_plane
    answer = await _post(client, admin, b'{"command": "true"}')
    assert answer.status_code == 200 and answer.json()["state"] == "completed", answer.text
    assert "/v1/executions" not in matched
    refused = await _post(client, "sy_not_a_token", b'{"command": "true"}')
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert refused.json()["error"]["code"] == "unauthorized"
    bad = await _post(client, admin, b'{"command": "true", "wait_ms": -1}')
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_input"
    running = await _post(client, admin, b'{"command": "sleep 5", "background": true}')
    busy = await _post(client, admin, b'{"command": "true"}')
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "workspace_busy", busy.text
    cancelled = await client.post(
        f"/v1/executions/{running.json()['execution_id']}/cancel",
        headers={"Authorization": f"Bearer {admin}"},
    )
    assert cancelled.status_code == 200
    assert "/v1/executions" not in matched
    # what it declines (another content type) goes through the router as before
    await _post(client, admin, b'{"command": "true"}', JSON_CHARSET)
    assert "/v1/executions" in matched

"""A request's credentials are looked up once (api/auth.py): the body bounds check them
before the body is read and the route's dependency reuses that principal, for the same
Authorization header only; a token of another session is still refused by the route's own
checks. A real control plane behind the ASGI app."""

from __future__ import annotations

from typing import Any

import httpx

from shellyard.control.plane import ControlPlane


async def test_a_run_shell_authenticates_its_token_once(
    app_plane: tuple[httpx.AsyncClient, ControlPlane, str],
) -> None:
    client, plane, admin = app_plane
    headers = {"Authorization": f"Bearer {admin}"}
    session = (await client.post("/v1/sessions", headers=headers)).json()
    made = await client.post(
        "/v1/tokens", json={"kind": "session", "session_id": session["session_id"]},
        headers=headers,
    )  # fmt: skip
    token = made.json()["token"]
    seen: list[str] = []
    authenticate = plane.tokens.authenticate

    async def counted(secret: str) -> Any:
        seen.append(secret)
        return await authenticate(secret)

    plane.tokens.authenticate = counted  # type: ignore[method-assign]
    answer = await client.post(
        "/v1/executions", json={"command": "true"}, headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["state"] == "completed"
    assert seen == [token]  # the bounds' check, reused by the route (was twice)
    # Each request checks its own header: a bad token on the next one is refused.
    refused = await client.post(
        "/v1/executions", json={"command": "true"}, headers={"Authorization": "Bearer nope"}
    )
    assert refused.status_code == 401
    # The route's own scope checks still run on the kept principal: another session's
    # path is missing to this token.
    other = (await client.post("/v1/sessions", headers=headers)).json()
    hidden = await client.get(
        f"/v1/sessions/{other['session_id']}", headers={"Authorization": f"Bearer {token}"}
    )
    assert hidden.status_code == 404, hidden.text

"""The one place a REST (and /mcp) request becomes a principal and an acting agent.

Every router depends on ``principal``: it resolves the bearer token (401 when missing, unknown
or revoked) and checks the ids in the path that name a session, an agent or a wake against the
token's scope (404 outside it, as if missing). Routes that act for an agent take
``AgentHeader``: the agent the token may act as (``X-Shellyard-Agent`` checked against the
token). Services then check that the objects they are asked about belong to that agent.

A server started with ``--no-auth`` (loopback only) treats every request as admin; it then
refuses requests whose Host header is not a loopback name, so a web page cannot reach it
through DNS rebinding.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from shellyard.control.plane import ControlPlane
from shellyard.control.tokens import UNAUTHENTICATED_ADMIN, Principal
from shellyard.errors import Forbidden
from shellyard.web.cookies import cookie_principal, cookie_secret

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def _plane(request: Request) -> ControlPlane:
    plane: ControlPlane = request.app.state.plane
    return plane


def _host_name(host_header: str) -> str:
    if host_header.startswith("["):
        return host_header.split("]", 1)[0] + "]"
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


#: Where a request keeps the principal its credentials gave: the body bounds (api/bounds.py)
#: check them before the body is read and the route's dependency after it, from the same
#: headers, so the token is looked up once per request (on PostgreSQL a read of the store
#: each time; docs/benchmarks.md §29). Per request (uvicorn gives each its own state).
_KEPT = "shellyard_principal"


async def principal(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> Principal:
    plane = _plane(request)
    state = request.scope.setdefault("state", {})
    kept = state.get(_KEPT)
    if kept is not None and kept[0] == authorization:
        who: Principal = kept[1]
    else:
        who = await _credentials(request, plane, authorization)
        state[_KEPT] = (authorization, who)
    await _check_path(plane, who, request.path_params)
    return who


async def _credentials(
    request: Request, plane: ControlPlane, authorization: str | None
) -> Principal:
    if not request.app.state.auth_required:
        host = _host_name(request.headers.get("host", ""))
        if host not in LOOPBACK_NAMES:
            raise Forbidden(
                f"this server runs without tokens (--no-auth) and answers only requests to a "
                f"loopback name, not {host!r}; use http://127.0.0.1:PORT"
            )
        who = UNAUTHENTICATED_ADMIN
    else:
        scheme, _, secret = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            secret = ""
        cookie = None if secret.strip() else cookie_secret(request)
        if cookie is not None:  # the web page's login (web/cookies.py); a bearer token wins
            who = await cookie_principal(request, plane, cookie)
        else:
            who = await plane.tokens.authenticate(secret.strip())
    return who


async def _check_path(plane: ControlPlane, who: Principal, params: dict[str, str]) -> None:
    """Ids in the path that name a session, an agent or a wake must be in the token's scope.
    Objects owned by an agent (executions, timers, transfers, ...) are checked by their
    services against the acting agent."""
    if who.is_admin:
        return
    if "session_id" in params:
        plane.tokens.check_session(who, params["session_id"])
    if "agent_id" in params:
        await plane.tokens.check_agent(who, params["agent_id"])
    if "wake_id" in params:
        await plane.tokens.check_wake(who, params["wake_id"])


PrincipalDep = Annotated[Principal, Depends(principal)]


async def acting_agent(
    request: Request,
    who: PrincipalDep,
    named: Annotated[
        str | None,
        Header(
            alias="X-Shellyard-Agent",
            description="act as this agent (admin: any; session token: one of its agents)",
        ),
    ] = None,
) -> str | None:
    return await _plane(request).tokens.acting_agent(who, named)


#: The agent a route acts for (None: the default session's main agent, admin only).
AgentHeader = Annotated[str | None, Depends(acting_agent)]


async def admin_only(request: Request, who: PrincipalDep) -> None:
    _plane(request).tokens.require_admin(who, f"{request.method} {request.url.path}")


__all__ = ["AgentHeader", "PrincipalDep", "acting_agent", "admin_only", "principal"]

"""MCP over streamable HTTP at ``/mcp`` (the path ``mcp.mount`` gives) on the control
plane's server (§3).

The tools are the stdio server's (``build_server``) over the same backend class, the REST
client, whose calls go in-process to this app (``httpx.ASGITransport``, no socket). Each call
carries the ``Authorization`` and ``X-Shellyard-Agent`` headers of the /mcp request it serves
(a context variable set by the gate below; the mcp SDK 2.x hands every message's sender
context to the tool handler). So a tool acts exactly as that token may act over REST: the same
scope checks, in one place, and a revoked token fails on its next tool call.

The gate refuses a request without a valid token (401) or with an agent the token may not act
as (403) before the MCP transport sees it, and a new session past :data:`MAX_SESSIONS_PER_TOKEN`
open ones of the same token (429 ``too_many``); a session idle for :data:`SESSION_IDLE_S` is
closed by the SDK (docs/security.md "Limits at each door"). The SDK's own cap
(:data:`MAX_SESSIONS`) is for the whole server.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextvars import ContextVar

import httpx
from fastapi import FastAPI
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

from shellyard.api.auth import acting_agent, principal
from shellyard.errors import ShellyardError, TooMany, Unauthorized, encode_error
from shellyard.mcp.toolsets import TOOLS_HEADER, parse_toolsets
from shellyard.sdk.client import AsyncClient

#: Most MCP sessions one token may hold open at once.
MAX_SESSIONS_PER_TOKEN = 32
#: Seconds without a request after which a session is closed (the SDK's default is 1800).
SESSION_IDLE_S = 600.0
#: Most MCP sessions of the whole server.
MAX_SESSIONS = 2000

#: Headers of the /mcp request being served, forwarded on every in-process REST call.
_forwarded: ContextVar[dict[str, str] | None] = ContextVar("shellyard_mcp_headers", default=None)
_FORWARD = ("authorization", "x-shellyard-agent")
#: The toolsets the /mcp request being served asked for (``?tools=`` or the header).
_DEFAULT_TOOLS = parse_toolsets(None)
_toolsets: ContextVar[frozenset[str]] = ContextVar("shellyard_mcp_tools", default=_DEFAULT_TOOLS)


class _ForwardingTransport(httpx.AsyncBaseTransport):
    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        for name, value in (_forwarded.get() or {}).items():
            request.headers[name] = value
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class InProcessClient(AsyncClient):
    """The REST client over this app itself, with the current /mcp request's credentials."""

    def __init__(self, app: FastAPI) -> None:
        # A loopback base URL: a --no-auth server answers only loopback Host names.
        self._http = httpx.AsyncClient(
            base_url="http://127.0.0.1",
            transport=_ForwardingTransport(httpx.ASGITransport(app=app)),
            timeout=30,
        )


class McpHttp:
    """The /mcp endpoint: the gate, the MCP server and its session manager's lifespan."""

    def __init__(self, app: FastAPI, path: str) -> None:
        from shellyard.mcp.server import build_server

        self.client = InProcessClient(app)
        # The local runner's mode (off, egress, host): run_shell's openWorldHint. The app is
        # create_app's, made over a built plane (docs/architecture.md "Wiring").
        network: str = app.state.plane.settings.local_policy.network
        self.server: MCPServer = build_server(self.client, network=network, enabled=_toolsets.get)
        # DNS-rebinding protection is the token's job (and the --no-auth Host check's).
        self.server.streamable_http_app(
            streamable_http_path=path,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            session_idle_timeout=SESSION_IDLE_S,
            max_sessions=MAX_SESSIONS,
        )
        #: Open sessions of each token (by token id); pruned against the SDK's live ones.
        self._sessions: dict[str, set[str]] = {}
        self._opening: dict[str, int] = {}

    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        try:
            async with self.server.session_manager.run():
                yield
        finally:
            await self.client.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            who = await principal(request, request.headers.get("authorization"))
            await acting_agent(request, who, request.headers.get("x-shellyard-agent"))
            # Every request of a session names the same toolsets: a client keeps its URL
            # (and its headers) for the whole session.
            enabled = parse_toolsets(
                request.query_params.get("tools") or request.headers.get(TOOLS_HEADER)
            )
        except ShellyardError as exc:
            headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
            response = JSONResponse(
                {"error": exc.to_dict()}, status_code=exc.http_status, headers=headers
            )
            await response(scope, receive, send)
            return
        headers = {name: request.headers[name] for name in _FORWARD if name in request.headers}
        opening = "mcp-session-id" not in request.headers and request.method == "POST"
        key = who.token_id or ""
        mine = self._open_sessions(key)
        if opening and len(mine) + self._opening.get(key, 0) >= MAX_SESSIONS_PER_TOKEN:
            refused = TooMany(
                f"this token has {len(mine)} MCP sessions open, the most one token may hold; "
                f"close one (DELETE /mcp with its Mcp-Session-Id) or wait {SESSION_IDLE_S:.0f} s "
                f"for an idle one to expire",
                limit=MAX_SESSIONS_PER_TOKEN,
            )
            await JSONResponse(encode_error(refused), status_code=refused.http_status)(
                scope, receive, send
            )
            return

        counted = [opening]  # this opening is still counted in ``_opening``

        def done_opening() -> None:
            if counted[0]:
                counted[0] = False
                self._opening[key] -= 1

        async def noting(message: Message) -> None:
            if opening and message["type"] == "http.response.start":
                for name, value in message.get("headers", []):
                    if name.lower() == b"mcp-session-id":
                        mine.add(value.decode("latin-1"))
                # Counted as open from here on, before the answer leaves: a client's next
                # opening may arrive before this handler returns, and must not see it twice.
                done_opening()
            await send(message)

        reset = _forwarded.set(headers)
        chosen = _toolsets.set(enabled)
        if opening:  # counted while it opens, so concurrent openings cannot pass the cap
            self._opening[key] = self._opening.get(key, 0) + 1
        try:
            await self.server.session_manager.handle_request(scope, receive, noting)
        finally:
            _toolsets.reset(chosen)
            _forwarded.reset(reset)
            done_opening()

    def _open_sessions(self, key: str) -> set[str]:
        """The token's sessions the SDK still holds (closed and expired ones dropped)."""
        live = self.server.session_manager._server_instances  # the SDK keeps no other view
        mine = self._sessions.setdefault(key, set())
        mine.intersection_update(live.keys())
        return mine


__all__ = ["McpHttp"]

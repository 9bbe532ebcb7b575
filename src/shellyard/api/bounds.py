"""Request limits before any work (T1; docs/security.md "Limits at each door").

A pure ASGI middleware in front of every route. For a request that carries a body it

1. authenticates from the headers alone (the same ``principal`` every route depends on), so a
   request without a valid token is answered 401 before one byte of its body is read;
2. refuses a declared ``Content-Length`` past the route's bound (413 ``too_large``) at once;
3. reads a bounded body (JSON routes, MCP) itself, up to the bound, and answers 413 when it
   grows past it; only then does the route see it. Upload routes stream: their bound is the
   workspace quota, which the runner enforces while it writes (runner/edits/tarscan.py).

Routes that take no token (the web page's login and logout) get a small bound and no
authentication here: they authenticate by their own rules.

A route named in ``lean`` (``POST /v1/executions``: api/run_route.py) gets its whole body here
and may answer it at once, past the app's inner layers; when it declines, the app answers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shellyard.errors import ShellyardError, TooLarge, Unauthorized, encode_error

#: Routes whose body streams to a workspace (the quota bounds them, not this middleware).
STREAMED = frozenset({("PUT", "/v1/files/content"), ("POST", "/v1/files/archive")})
#: Routes with a body and no token (they check what they were sent by their own rules).
TOKENLESS = frozenset({"/v1/auth/login", "/v1/auth/logout"})
#: Most bytes of a JSON (or MCP) request body: the largest request the contract allows (a
#: transfer naming 1000 paths of PATH_MAX, a command text) fits many times over.
MAX_JSON_BODY = 8 << 20
#: Most bytes of a body to a route that takes no token, or to anything outside /v1 and /mcp.
MAX_PUBLIC_BODY = 64 << 10


#: Answers a request whose whole body was read; False: the app answers it (nothing sent).
LeanRoute = Callable[[Scope, bytes, Receive, Send], Awaitable[bool]]


def body_bound(method: str, path: str) -> int | None:
    """The most bytes a request's body may have (None: streamed, bounded by the quota)."""
    if (method, path) in STREAMED:
        return None
    if path in TOKENLESS or not (path.startswith("/v1/") or path == "/mcp"):
        return MAX_PUBLIC_BODY
    return MAX_JSON_BODY


def _too_large(bound: int) -> TooLarge:
    return TooLarge(
        f"the request body is larger than {bound} bytes, the most this route takes; send "
        f"less (files go through PUT /v1/files/content or POST /v1/files/archive)",
        limit=bound,
    )


class RequestBounds:
    """See the module's text."""

    def __init__(
        self, app: ASGIApp, lean: Mapping[tuple[str, str], LeanRoute] | None = None
    ) -> None:
        self.app = app
        self.lean = dict(lean or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        declared = request.headers.get("content-length")
        chunked = "chunked" in request.headers.get("transfer-encoding", "").lower()
        try:
            length = int(declared) if declared is not None else None
        except ValueError:
            length = None
        if not chunked and not length:
            await self.app(scope, receive, send)  # no body: nothing to bound
            return
        path: str = scope["path"]
        bound = body_bound(scope["method"], path)
        try:
            if path not in TOKENLESS and (path.startswith("/v1/") or path == "/mcp"):
                from shellyard.api.auth import principal

                await principal(request, request.headers.get("authorization"))
            if bound is not None and length is not None and length > bound:
                raise _too_large(bound)
        except ShellyardError as exc:
            await _answer(exc, scope, receive, send)
            return
        if bound is None:
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break  # the client went away: the route sees that
            size += len(message.get("body", b""))
            if size > bound:
                await _answer(_too_large(bound), scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        lean = self.lean.get((scope["method"], path))
        if lean is not None and messages[-1]["type"] == "http.request":
            body = b"".join(message.get("body", b"") for message in messages)
            if await lean(scope, body, receive, send):
                return
            # declined before reading anything more: the app reads the same messages

        async def replay() -> Message:
            if messages:
                return messages.pop(0)
            return await receive()

        await self.app(scope, replay, send)


async def _answer(exc: ShellyardError, scope: Scope, receive: Receive, send: Send) -> None:
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else {}
    # the body was not read: the connection cannot carry another request
    headers["Connection"] = "close"
    response = JSONResponse(encode_error(exc), status_code=exc.http_status, headers=headers)
    await response(scope, receive, send)


__all__ = ["MAX_JSON_BODY", "MAX_PUBLIC_BODY", "RequestBounds", "body_bound"]

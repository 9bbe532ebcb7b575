"""``POST /v1/executions`` (E1 run_shell) without FastAPI's per-request parameter machinery.

run_shell is the call an agent host makes hundreds of times a task, and for it FastAPI's
dependency solving (the token, the acting agent's header, the body as a dict: ~16 parameter
reads a request) cost about as much CPU as the store's three transactions (docs/benchmarks.md
§33, §38). This route class keeps everything FastAPI derives from the declaration (the OpenAPI
operation, the body bound) and answers a JSON object body itself, each check done once:

1. the principal from the ``Authorization`` header (``auth.principal``, kept per request, so
   the body bounds' lookup is not repeated) and the acting agent from ``X-Shellyard-Agent``
   (``auth.acting_agent``): the same functions, in the same order, as the route's dependencies;
2. the body parsed once and validated once by the contract's model (``parse_run_shell``);
3. the answer written once from the model (``rawjson.dumps``), not dumped, re-validated as the
   response model and dumped again.

Anything else (another content type, a body that is not a JSON object, no body) goes to the
handler FastAPI builds for the declaration, so its answers, the error texts included, are the
ones it always gave.

``answer_run_shell`` is the same answer one layer further out: ``RequestBounds`` (api/bounds.py),
which has authenticated the request and read its body already, hands such a request to it
directly, past the layers between that middleware and this route (Starlette's exception
middleware, FastAPI's exit stack, the router's match over every route, the route's own
wrappers), which cost the server CPU on every call and do nothing for this one: its errors
are answered here by ``error_answer``, the app's own handler for them (api/app.py), and any
other exception goes up to Starlette's server-error middleware as before
(docs/benchmarks.md, the section on the server's CPU per call, session 49).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.routing import APIRoute
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from shellyard.api.auth import acting_agent, principal
from shellyard.contract import rawjson
from shellyard.contract.executions import parse_run_shell
from shellyard.control.plane import ControlPlane
from shellyard.errors import ShellyardError, Unauthorized, encode_error

#: The one route ``answer_run_shell`` answers (method, path).
RUN_SHELL = ("POST", "/v1/executions")


def error_answer(exc: ShellyardError) -> Response:
    """A ShellyardError as every REST answer gives it (the app's handler, api/app.py)."""
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
    # a message quoting a name that is not UTF-8 is written with \udcNN escapes, never
    # a 500 (docs/files-and-transfers.md "Names that are not UTF-8")
    return Response(
        rawjson.dumps_value(encode_error(exc)),
        status_code=exc.http_status,
        headers=headers,
        media_type="application/json",
    )


async def _run_shell(request: Request, data: dict[str, object]) -> Response:
    """The answer to a JSON object body, the same on both paths."""
    headers = request.headers
    who = await principal(request, headers.get("authorization"))
    agent = await acting_agent(request, who, headers.get("x-shellyard-agent"))
    plane: ControlPlane = request.app.state.plane
    result = await plane.executions.run_shell(parse_run_shell(data), agent)
    return Response(rawjson.dumps(result), media_type="application/json")


def _json_object(content_type: str | None, body: bytes) -> dict[str, object] | None:
    """The body when this module answers it: a JSON object sent as ``application/json``."""
    if content_type != "application/json":
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # JSONDecodeError, nested past the parser's depth
        return None  # (a 500 until session 49's attack pass): FastAPI's handler words it
    return data if isinstance(data, dict) else None


async def answer_run_shell(scope: Scope, body: bytes, receive: Receive, send: Send) -> bool:
    """Answer ``POST /v1/executions`` whose whole ``body`` was read (``RequestBounds``); False:
    not a body answered here, the app answers it (nothing was sent)."""
    request = Request(scope, receive)
    data = _json_object(request.headers.get("content-type"), body)
    if data is None:
        return False
    try:
        response = await _run_shell(request, data)
    except ShellyardError as exc:
        response = error_answer(exc)
    await response(scope, receive, send)
    return True


class RunShellRoute(APIRoute):
    """See the module's text. Used for ``POST /v1/executions`` only (api/app.py)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        declared = super().get_route_handler()

        async def run_shell(request: Request) -> Response:
            data = _json_object(request.headers.get("content-type"), await request.body())
            if data is None:
                return await declared(request)
            return await _run_shell(request, data)

        return run_shell


__all__ = ["RUN_SHELL", "RunShellRoute", "answer_run_shell", "error_answer"]

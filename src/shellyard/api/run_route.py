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
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.routing import APIRoute
from starlette.responses import Response

from shellyard.api.auth import acting_agent, principal
from shellyard.contract import rawjson
from shellyard.contract.executions import parse_run_shell
from shellyard.control.plane import ControlPlane


class RunShellRoute(APIRoute):
    """See the module's text. Used for ``POST /v1/executions`` only (api/app.py)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        declared = super().get_route_handler()

        async def run_shell(request: Request) -> Response:
            headers = request.headers
            if headers.get("content-type") != "application/json":
                return await declared(request)
            try:
                data = json.loads(await request.body())
            except ValueError:  # JSONDecodeError; FastAPI's handler words the error
                return await declared(request)
            if not isinstance(data, dict):
                return await declared(request)
            who = await principal(request, headers.get("authorization"))
            agent = await acting_agent(request, who, headers.get("x-shellyard-agent"))
            plane: ControlPlane = request.app.state.plane
            result = await plane.executions.run_shell(parse_run_shell(data), agent)
            return Response(rawjson.dumps(result), media_type="application/json")

        return run_shell


__all__ = ["RunShellRoute"]

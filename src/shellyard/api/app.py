"""REST API of the control plane: executions and runners here; sessions, agents, the inbox,
wakes and timers in ``api_sessions``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from shellyard import __version__
from shellyard.api.auth import AgentHeader, admin_only, principal
from shellyard.api.docs import (
    ERROR_RESPONSES,
    HealthView,
    body_doc,
    document_bodies,
)
from shellyard.contract.executions import (
    ExecutionView,
    LogsResult,
    RunShellRequest,
    RunShellResult,
    parse_run_shell,
)
from shellyard.control.service import ControlPlane
from shellyard.errors import InvalidInput, ShellyardError, Unauthorized

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized"}


class DirectRunnerRequest(BaseModel):
    runner_id: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="a name of your choice: letters, digits, '_', '.', '-'",
    )
    address: str = Field(pattern=r"^https?://[!-~]+$", description="the daemon's http(s) URL")
    token: str = Field(pattern=r"^[!-~]+$", description="the daemon's token (its ROOT/token)")


class RunnerView(BaseModel):
    runner_id: str
    kind: str
    address: str | None


def create_app(
    plane: ControlPlane,
    *,
    auth_required: bool = True,
    lifespan_hooks: tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]
    | None = None,
) -> FastAPI:
    """The REST API (and MCP over streamable HTTP at /mcp) over ``plane``. Every route but
    /health needs a bearer token (``auth_required=False``: the loopback-only --no-auth mode)."""
    from shellyard.mcp.mount import LazyMcp, mount_mcp

    mcp_app: LazyMcp | None = None

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if lifespan_hooks:
            await lifespan_hooks[0]()
        try:
            yield
        finally:
            if mcp_app is not None:
                await mcp_app.aclose()
            if lifespan_hooks:
                await lifespan_hooks[1]()

    app = FastAPI(
        title="shellyard",
        version=__version__,
        lifespan=lifespan,
        responses=ERROR_RESPONSES,
        description="A durable, sandboxed shell for AI agents. Every route but /health needs "
        "'Authorization: Bearer TOKEN'. Errors are {\"error\": {code, message, details}}.",
    )
    app.state.plane = plane
    app.state.auth_required = auth_required
    auth = [Depends(principal)]
    admin = [Depends(admin_only)]

    @app.exception_handler(ShellyardError)
    async def _shellyard_error(_request: Request, exc: ShellyardError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
        return JSONResponse({"error": exc.to_dict()}, status_code=exc.http_status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = [
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()
        ]
        error = InvalidInput("; ".join(parts))
        return JSONResponse({"error": error.to_dict()}, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Starlette's own answers (unparsable body, unknown route, wrong method) in the same
        # error shape as every other error of the API.
        code = _HTTP_CODES.get(exc.status_code, "invalid_input")
        message = f"{exc.detail} ({request.method} {request.url.path})"
        body = {"error": {"code": code, "message": message, "details": {}}}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.get("/health")
    async def health() -> HealthView:
        return HealthView(status="ok", version=__version__)

    @app.post("/v1/executions", dependencies=auth, openapi_extra=body_doc(RunShellRequest))
    async def run_shell(body: dict[str, object], agent: AgentHeader = None) -> RunShellResult:
        return await plane.executions.run_shell(parse_run_shell(body), agent)

    @app.get("/v1/executions", dependencies=auth)
    async def list_executions(
        agent: AgentHeader = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100
    ) -> list[ExecutionView]:
        return await plane.executions.list(agent, limit)

    @app.get("/v1/executions/{execution_id}", dependencies=auth)
    async def execution_status(execution_id: str, agent: AgentHeader = None) -> ExecutionView:
        return await plane.executions.status(execution_id, agent)

    @app.get("/v1/executions/{execution_id}/wait", dependencies=auth)
    async def execution_wait(
        execution_id: str,
        timeout_s: Annotated[float, Query(ge=0, le=30)] = 10,
        agent: AgentHeader = None,
    ) -> ExecutionView:
        return await plane.executions.wait(execution_id, timeout_s, agent)

    @app.get("/v1/executions/{execution_id}/logs", dependencies=auth)
    async def execution_logs(
        execution_id: str,
        stream: str = "stdout",
        offset: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=0)] = 65536,
        tail: Annotated[int | None, Query(ge=0)] = None,
        agent: AgentHeader = None,
    ) -> LogsResult:
        return await plane.executions.logs(execution_id, stream, offset, limit, tail, agent)

    @app.post("/v1/executions/{execution_id}/cancel", dependencies=auth)
    async def execution_cancel(
        execution_id: str,
        wait_s: Annotated[float, Query(ge=0, le=60)] = 0,
        agent: AgentHeader = None,
    ) -> ExecutionView:
        return await plane.executions.cancel(execution_id, agent, wait_s)

    @app.post("/v1/runners", dependencies=admin)
    async def register_runner(body: DirectRunnerRequest) -> RunnerView:
        await plane.runners.add_direct(body.runner_id, body.address, body.token)
        return RunnerView(runner_id=body.runner_id, kind="direct", address=body.address)

    @app.get("/v1/runners", dependencies=auth)
    async def list_runners() -> list[RunnerView]:
        assert plane.store is not None
        return [
            RunnerView(runner_id=r["id"], kind=r["kind"], address=r["address"])
            for r in await plane.store.list_runners()
        ]

    # Sessions, agents, inbox, wakes, timers.
    from shellyard.api.sessions import sessions_router

    app.include_router(sessions_router(plane), dependencies=auth)
    # Files, snapshot history, retention, transfers, artifacts.
    from shellyard.api.files import files_router

    app.include_router(files_router(plane), dependencies=auth)
    # Managed environments, their revisions and changes.
    from shellyard.api.environments import environments_router

    app.include_router(environments_router(plane), dependencies=auth)
    from shellyard.api.tokens import tokens_router

    app.include_router(tokens_router(plane), dependencies=auth)
    # The web page: its login, its session-wide reads, its static assets (issue 14).
    from shellyard.api.login import login_router
    from shellyard.api.panel import panel_router
    from shellyard.web import mount_web

    app.include_router(login_router(plane))
    app.include_router(panel_router(plane), dependencies=auth)
    mount_web(app)
    # MCP over streamable HTTP, the same tools as stdio, bound to each request's token.
    mcp_app = mount_mcp(app)
    document_bodies(app)
    return app

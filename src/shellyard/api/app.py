"""REST API of the control plane: executions and runners here; sessions, agents, the inbox,
wakes and timers in ``api/sessions.py``; the others in a router module per concept."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from shellyard import __version__
from shellyard.api.auth import AgentHeader, principal
from shellyard.api.bounds import RequestBounds
from shellyard.api.docs import (
    ERROR_RESPONSES,
    HealthView,
    body_doc,
    document_bodies,
)
from shellyard.api.forward import Forward, add_routes
from shellyard.api.run_route import RUN_SHELL, RunShellRoute, answer_run_shell, error_answer
from shellyard.contract.executions import (
    ExecutionCancelQuery,
    ExecutionListQuery,
    ExecutionLogsQuery,
    ExecutionResultQuery,
    ExecutionView,
    ExecutionWaitQuery,
    LogsResult,
    RunShellRequest,
    RunShellResult,
    parse_run_shell,
)
from shellyard.contract.interactive import (
    ExecutionInputRequest,
    InputResult,
    ScreenView,
    TerminalSize,
)
from shellyard.control.plane import ControlPlane
from shellyard.errors import (
    ERRORS_BY_CODE,
    ShellyardError,
    encode_error,
    invalid_input,
)

#: The execution routes that hand their inputs to ``plane.executions`` unchanged (E2-E6, E13).
EXECUTION_ROUTES = (
    Forward("GET", "/v1/executions", "list_executions", "executions.list",
            list[ExecutionView], ExecutionListQuery, agent=True),
    Forward("GET", "/v1/executions/{execution_id}", "execution_status", "executions.status",
            ExecutionView, agent=True),
    Forward("GET", "/v1/executions/{execution_id}/wait", "execution_wait", "executions.wait",
            ExecutionView, ExecutionWaitQuery, agent=True),
    Forward("GET", "/v1/executions/{execution_id}/result", "execution_result",
            "executions.result", RunShellResult, ExecutionResultQuery, agent=True),
    Forward("GET", "/v1/executions/{execution_id}/logs", "execution_logs", "executions.logs",
            LogsResult, ExecutionLogsQuery, agent=True),
    Forward("POST", "/v1/executions/{execution_id}/cancel", "execution_cancel",
            "executions.cancel", ExecutionView, ExecutionCancelQuery, agent=True),
    Forward("GET", "/v1/executions/{execution_id}/screen", "execution_screen",
            "executions.screen", ScreenView, agent=True),
)  # fmt: skip

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized"}


def create_app(
    plane: ControlPlane,
    *,
    auth_required: bool = True,
    lifespan_hooks: tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]
    | None = None,
) -> FastAPI:
    """The REST API (and MCP over streamable HTTP at /mcp) over ``plane``. Every route but
    /health needs a bearer token (``auth_required=False``: the loopback-only --no-auth mode)."""
    from shellyard.mcp.mount import McpMount, mount_mcp

    mcp_app: McpMount | None = None

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if mcp_app is not None:
            # Before the hook that publishes the server: a client's first MCP message must
            # not wait for the endpoint's build (mcp/mount.py says why).
            await mcp_app.start()
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

    @app.exception_handler(ShellyardError)
    async def _shellyard_error(_request: Request, exc: ShellyardError) -> Response:
        return error_answer(exc)  # also run_shell's lean answer's (api/run_route.py)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        error = invalid_input(exc)
        return JSONResponse(encode_error(error), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Starlette's own answers (unparsable body, unknown route, wrong method) in the same
        # error shape as every other error of the API.
        code = _HTTP_CODES.get(exc.status_code, "invalid_input")
        message = f"{exc.detail} ({request.method} {request.url.path})"
        error = ERRORS_BY_CODE.get(code, ShellyardError)(message)
        return JSONResponse(encode_error(error), status_code=exc.status_code, headers=exc.headers)

    @app.get("/health")
    async def health() -> HealthView:
        return HealthView(status="ok", version=__version__)

    async def run_shell(body: dict[str, object], agent: AgentHeader = None) -> RunShellResult:
        return await plane.executions.run_shell(parse_run_shell(body), agent)

    # Declared as any route (the document and the answers to odd bodies are FastAPI's); a JSON
    # object body is answered by RunShellRoute with each check once (api/run_route.py).
    app.router.add_api_route(
        "/v1/executions",
        run_shell,
        methods=["POST"],
        dependencies=auth,
        openapi_extra=body_doc(RunShellRequest),
        route_class_override=RunShellRoute,
    )

    # E13: input to an interactive execution, its terminal's screen and size.
    # The bodies are read after the owner check (E4: another session's execution is missing,
    # whatever the body says), so they come as dicts, documented by their models.
    @app.post(
        "/v1/executions/{execution_id}/input",
        dependencies=auth,
        openapi_extra=body_doc(ExecutionInputRequest),
    )
    async def execution_input(
        execution_id: str, body: dict[str, object], agent: AgentHeader = None
    ) -> InputResult:
        return await plane.executions.send_input(execution_id, body, agent)

    @app.post(
        "/v1/executions/{execution_id}/resize",
        dependencies=auth,
        openapi_extra=body_doc(TerminalSize),
    )
    async def execution_resize(
        execution_id: str, body: dict[str, object], agent: AgentHeader = None
    ) -> ScreenView:
        return await plane.executions.screen(execution_id, agent, body)

    # The execution reads and cancel: the service's own methods (api/forward.py).
    executions = APIRouter()
    add_routes(executions, plane, EXECUTION_ROUTES)
    app.include_router(executions, dependencies=auth)
    # Runners: registration, health, removal.
    from shellyard.api.runners import runners_router

    app.include_router(runners_router(plane), dependencies=auth)
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
    from shellyard.api.maintenance import maintenance_router  # gc, debug sizes (admin)

    app.include_router(maintenance_router(plane), dependencies=auth)
    from shellyard.api.ports import ports_router  # ports for the host (R5)

    app.include_router(ports_router(plane), dependencies=auth)

    # Operations (docs/operations.md): /healthz and /readyz open to probes, /metrics with the admin
    # token.
    from shellyard.api.ops import ops_router

    app.include_router(ops_router(plane))

    # The web page: its login, its session-wide reads, its static assets (docs/web.md).
    from shellyard.web import mount_web
    from shellyard.web.login import PendingCode, login_router
    from shellyard.web.panel import panel_router

    login_codes: dict[str, PendingCode] = {}
    app.state.login_codes = login_codes  # unused codes, by sha256 (their bound's tests)
    app.include_router(login_router(plane, login_codes))
    app.include_router(panel_router(plane), dependencies=auth)
    mount_web(app)
    # MCP over streamable HTTP, the same tools as stdio, bound to each request's token.
    mcp_app = mount_mcp(app)
    app.state.mcp = mcp_app  # whether it is built yet (tests/doors/mcp/test_mcp_capabilities.py)
    document_bodies(app)
    # body bounds and authentication before any body is read (docs/security.md)
    # and run_shell's JSON object bodies answered there once read (api/run_route.py)
    app.add_middleware(RequestBounds, lean={RUN_SHELL: answer_run_shell})
    return app

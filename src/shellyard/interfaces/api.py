"""REST API of the control plane: executions and runners here; sessions, agents, the inbox,
wakes and timers in ``api_sessions``."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from shellyard import __version__
from shellyard.control.service import ControlPlane
from shellyard.errors import InvalidInput, ShellyardError, Unauthorized
from shellyard.model import (
    ExecutionView,
    LogsResult,
    RunShellResult,
    parse_run_shell,
)

AgentHeader = Annotated[str | None, Header(alias="X-Shellyard-Agent")]


class DirectRunnerRequest(BaseModel):
    runner_id: str
    address: str
    token: str


class RunnerView(BaseModel):
    runner_id: str
    kind: str
    address: str | None


def create_app(
    plane: ControlPlane,
    token: str,
    *,
    lifespan_hooks: tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]
    | None = None,
) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if lifespan_hooks:
            await lifespan_hooks[0]()
        try:
            yield
        finally:
            if lifespan_hooks:
                await lifespan_hooks[1]()

    app = FastAPI(title="shellyard", version=__version__, lifespan=lifespan)

    async def authenticate(authorization: Annotated[str | None, Header()] = None) -> None:
        presented = (authorization or "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(presented.encode(), token.encode()):
            raise Unauthorized(
                "missing or wrong bearer token; the token is in the home's server.json"
            )

    auth = [Depends(authenticate)]

    @app.exception_handler(ShellyardError)
    async def _shellyard_error(_request: Request, exc: ShellyardError) -> JSONResponse:
        return JSONResponse({"error": exc.to_dict()}, status_code=exc.http_status)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = [
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()
        ]
        error = InvalidInput("; ".join(parts))
        return JSONResponse({"error": error.to_dict()}, status_code=400)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    @app.post("/v1/executions", dependencies=auth)
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

    @app.post("/v1/runners", dependencies=auth)
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

    # Sessions, agents, inbox, wakes, timers (imported here: that module uses AgentHeader).
    from shellyard.interfaces.api_sessions import sessions_router

    app.include_router(sessions_router(plane), dependencies=auth)
    # Files, snapshot history, retention, transfers, artifacts.
    from shellyard.interfaces.api_files import files_router

    app.include_router(files_router(plane), dependencies=auth)
    return app

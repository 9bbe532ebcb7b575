"""What an operator watches (docs/operations.md): ``/healthz`` (the process serves),
``/readyz`` (it can do its work: the database answers, its schema is at the code's head, the
local runner answers) and ``/metrics`` (Prometheus text format, admin token when tokens are
on: the counts name runners and the load of every session)."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel

from shellyard import loops
from shellyard.api.auth import principal
from shellyard.api.docs import JSON_ERROR_RESPONSES
from shellyard.control.metrics import Readings
from shellyard.control.plane import ControlPlane
from shellyard.control.runners import LOCAL_RUNNER_ID
from shellyard.control.tokens import Principal
from shellyard.errors import Forbidden

#: A readiness check that takes longer than this fails (a hung database is not ready).
CHECK_TIMEOUT_S = 5.0
PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class CheckView(BaseModel):
    ok: bool
    error: str | None = None
    seconds: float


class ReadyView(BaseModel):
    status: str
    replica: str | None
    checks: dict[str, CheckView]


def ops_router(plane: ControlPlane) -> APIRouter:
    router = APIRouter()

    @router.get("/healthz", tags=["operations"])
    async def healthz() -> dict[str, str]:
        """The process is up and serves requests (a liveness probe: nothing else is asked)."""
        return {"status": "ok"}

    @router.get("/readyz", tags=["operations"], response_model=ReadyView)
    async def readyz() -> JSONResponse:
        """200 when the database answers, its migrations are at the code's head and the
        local runner answers; until then 503 with the same body (``status`` "not ready",
        each check's ``ok`` and ``error``), not the error envelope."""
        checks = await _readiness(plane)
        ready = all(check["ok"] for check in checks.values())
        replica = plane.leases.replica_id
        return JSONResponse(
            {"status": "ready" if ready else "not ready", "replica": replica, "checks": checks},
            status_code=200 if ready else 503,
        )

    @router.get(
        "/metrics",
        tags=["operations"],
        response_class=PlainTextResponse,
        responses={
            **JSON_ERROR_RESPONSES,
            200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
        },
    )
    async def metrics(who: Annotated[Principal, Depends(principal)]) -> Response:
        """Prometheus text format: executions by state, queue depth, spawn and commit latency
        histograms, leases held, runner health, wakes emitted and webhook deliveries."""
        if not who.is_admin:
            raise Forbidden("/metrics needs the admin token (or a server run with --no-auth)")
        body = plane.metrics.render(await _readings(plane))
        return Response(body, media_type=PROMETHEUS_TYPE)

    return router


async def _readings(plane: ControlPlane) -> Readings:
    store, leases, fanout = plane.store, plane.leases, plane.fanout
    return Readings(
        executions=await store.execution_counts(),
        deliveries=await store.delivery_counts(),
        leases=await store.lease_counts(leases.replica_id),
        runners={view.runner_id: view.state == "up" for view in await plane.runners.views()},
        takeovers=leases.takeovers,
        wakes_emitted=plane.wakes.emitted,
        fanout_published=fanout.published,
        fanout_received=fanout.received,
        # the loop this handler runs on, not the setting: what the process really does
        event_loop=loops.name(asyncio.get_running_loop()),
    )


async def _readiness(plane: ControlPlane) -> dict[str, dict[str, Any]]:
    store = plane.store
    checks: dict[str, dict[str, Any]] = {}

    async def check(name: str, probe: Any) -> None:
        began = time.monotonic()
        try:
            detail = await asyncio.wait_for(probe(), CHECK_TIMEOUT_S)
            checks[name] = {"ok": detail is None, **({"error": detail} if detail else {})}
        except TimeoutError:
            checks[name] = {"ok": False, "error": f"no answer within {CHECK_TIMEOUT_S:g} s"}
        except Exception as exc:
            checks[name] = {"ok": False, "error": str(exc) or type(exc).__name__}
        checks[name]["seconds"] = round(time.monotonic() - began, 4)

    async def database() -> str | None:
        await store.execution_counts()
        return None

    async def migrations() -> str | None:
        missing = await store.missing_migrations()
        if missing:
            return f"migrations not applied: {', '.join(missing)}; restart a replica to migrate"
        return None

    async def runner() -> str | None:
        await plane.runners.get(LOCAL_RUNNER_ID).info()
        return None

    await check("database", database)
    if checks["database"]["ok"]:
        await check("migrations", migrations)
    await check("runner", runner)
    return checks

"""REST endpoints of runners: list them with their health (any token), register one and
remove one (admin only; ``remove`` is refused while executions run there)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from shellyard.api.auth import admin_only
from shellyard.contract.runners import (
    RunnerAddRequest,
    RunnerBootstrapRequest,
    RunnerBootstrapResult,
    RunnerView,
)
from shellyard.control.plane import ControlPlane


class RunnerRemoveRequest(BaseModel):
    runner_id: str = Field(description="the runner to forget (not 'local')")


def runners_router(plane: ControlPlane) -> APIRouter:
    router = APIRouter()
    admin = [Depends(admin_only)]

    @router.post("/v1/runners", dependencies=admin)
    async def register_runner(body: RunnerAddRequest) -> RunnerView:
        """Check that the runner answers as described (host key, user key, certificate,
        its key) and register it."""
        return await plane.runners.add(body)

    @router.get("/v1/runners")
    async def list_runners() -> list[RunnerView]:
        """Every runner: state (up, or unreachable since when), version, sandbox, limits,
        running executions."""
        return await plane.runners.views()

    @router.post("/v1/runners/remove", dependencies=admin)
    async def remove_runner(body: RunnerRemoveRequest) -> RunnerView:
        view = await plane.runners.view(body.runner_id)
        await plane.runners.remove(body.runner_id)
        return view

    @router.post("/v1/runners/bootstrap", dependencies=admin)
    async def bootstrap_runner(body: RunnerBootstrapRequest) -> RunnerBootstrapResult:
        """Start (idempotently) a runner daemon on a host over SSH and register it."""
        return await plane.runners.bootstrap(body)

    return router


__all__ = ["RunnerRemoveRequest", "runners_router"]

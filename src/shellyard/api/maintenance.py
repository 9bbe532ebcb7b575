"""REST endpoints for operators (admin tokens only): run retention now (``shellyard gc``),
and the sizes of the structures that must stay flat while the service runs for months."""

from typing import Annotated

from fastapi import APIRouter, Depends

from shellyard.api.auth import admin_only
from shellyard.api.bodies import body_of
from shellyard.api.docs import body_doc
from shellyard.contract.maintenance import GcReport, GcRequest
from shellyard.control.plane import ControlPlane
from shellyard.control.retention import structure_sizes


def maintenance_router(plane: ControlPlane) -> APIRouter:
    router = APIRouter(dependencies=[Depends(admin_only)])

    @router.post("/v1/gc", openapi_extra=body_doc(GcRequest))
    async def gc(request: Annotated[GcRequest, body_of(GcRequest)]) -> GcReport:
        """Apply the retention policy now (docs/operations.md); fields override it once."""
        return await plane.retention.run(request)

    @router.get("/v1/debug/sizes")
    async def sizes() -> dict[str, int]:
        """Sizes of per-execution structures, asyncio tasks, open fds, RSS of the server."""
        return structure_sizes(plane, plane.runners.get("local"))

    return router


__all__ = ["maintenance_router"]

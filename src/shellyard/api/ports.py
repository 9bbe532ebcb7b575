"""REST endpoints of ports for the host (R5): open, list and close a forward from a
loopback port of the runner's host into the acting agent's own workspace network."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from shellyard.api.auth import AgentHeader
from shellyard.contract.ports import PortCloseRequest, PortOpenRequest, PortView
from shellyard.control.plane import ControlPlane


def ports_router(plane: ControlPlane) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/ports")
    async def open_port(body: PortOpenRequest, agent: AgentHeader = None) -> PortView:
        """Forward host_port on your workspace's own loopback address (127.X.Y.Z) of the
        runner's host to ``port`` inside your workspace's network (it needs a running
        execution: start the server in the background first). Gone when closed or when the
        workspace's last execution ends."""
        return await plane.ports.open(
            body.port,
            body.host_port,
            workspace_id=body.workspace_id,
            runner_id=body.runner_id,
            agent_id=agent,
        )

    @router.get("/v1/ports")
    async def list_ports(
        workspace_id: Annotated[
            str | None, Query(description="your workspace (default: yours)")
        ] = None,
        runner_id: Annotated[str | None, Query(description="the runner (default local)")] = None,
        agent: AgentHeader = None,
    ) -> list[PortView]:
        return await plane.ports.list(
            workspace_id=workspace_id, runner_id=runner_id, agent_id=agent
        )

    @router.post("/v1/ports/close")
    async def close_port(body: PortCloseRequest, agent: AgentHeader = None) -> PortView:
        return await plane.ports.close(
            body.port, workspace_id=body.workspace_id, runner_id=body.runner_id, agent_id=agent
        )

    return router


__all__ = ["ports_router"]

"""REST endpoints of ports for the host (R5): open, list and close a forward from a
loopback port of the runner's host into the acting agent's own workspace network."""

from __future__ import annotations

from fastapi import APIRouter

from shellyard.api.auth import AgentHeader
from shellyard.api.forward import Forward, add_routes
from shellyard.contract.ports import PortCloseRequest, PortListQuery, PortOpenRequest, PortView
from shellyard.control.plane import ControlPlane

#: Listing the ports: its query model and the acting agent, to the service unchanged.
PORT_ROUTES = (
    Forward(
        "GET", "/v1/ports", "list_ports", "ports.list", list[PortView], PortListQuery, agent=True
    ),
)


def ports_router(plane: ControlPlane) -> APIRouter:
    router = APIRouter()
    add_routes(router, plane, PORT_ROUTES)

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

    @router.post("/v1/ports/close")
    async def close_port(body: PortCloseRequest, agent: AgentHeader = None) -> PortView:
        return await plane.ports.close(
            body.port, workspace_id=body.workspace_id, runner_id=body.runner_id, agent_id=agent
        )

    return router


__all__ = ["ports_router"]

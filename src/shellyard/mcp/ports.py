"""The ``workspace_port`` tool (R5): forward a loopback port of the runner's host into
your workspace's network so a person's browser on that host reaches your server; list the
forwards; close one. ``build_server`` adds it when its backend serves ports."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.tools import Tool

from shellyard.contract.ports import PortList, PortRequest, PortView
from shellyard.mcp.common import hints, model_tool
from shellyard.sdk.client import AsyncClient

DESCRIPTION = (
    "Let a person on the runner's host reach a server in your workspace: action 'open' "
    "forwards host_port on your workspace's own loopback address of that host (127.x.y.z; "
    "0: any free port) to port inside your "
    "workspace's private network and answers the url to open; 'list' shows the open "
    "forwards; 'close' stops one. Start the server first as a background run_shell "
    "(python3 -m http.server 8000, npm run dev); your own clients need no forward: run them "
    "with run_shell read_only=true and use localhost:PORT. A forward binds loopback only, "
    "and goes when closed or when the workspace's last execution ends."
)


def port_tools(backend: AsyncClient) -> list[Tool]:
    async def workspace_port(request: PortRequest, ctx: Context) -> dict[str, Any]:
        where = {"workspace_id": request.workspace_id, "runner_id": request.runner_id}
        if request.action == "list":
            views = await backend.ports(**where)
            return PortList(ports=views).model_dump(mode="json")
        assert request.port is not None  # PortRequest requires it for open and close
        if request.action == "open":
            opened = await backend.open_port(request.port, request.host_port, **where)
            return opened.model_dump(mode="json")
        return (await backend.close_port(request.port, **where)).model_dump(mode="json")

    tool = model_tool(
        "workspace_port",
        PortRequest,
        workspace_port,
        title="Forward a port to the host",
        description=DESCRIPTION,
        # It opens a way in to a server of yours (on loopback only), nothing is deleted.
        annotations=hints(idempotent=True),
    )
    tool.fn_metadata.output_schema = port_output_schema()
    return [tool]


def port_output_schema() -> dict[str, Any]:
    """workspace_port's outputSchema: a forward (open, close) or the list of them."""
    from pydantic import TypeAdapter

    schema = TypeAdapter(PortView | PortList).json_schema(mode="serialization")
    return {"type": "object", **schema}  # MCP wants an object at the root: both arms are


__all__ = ["port_tools"]

"""MCP tools of interactive executions (E13): ``execution_input`` (text, keys, end of input
to a command started with ``interactive`` or ``tty``) and ``execution_screen`` (its
terminal as a person would see it)."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.tools import Tool

from shellyard.contract.executions import ExecutionStatusRequest
from shellyard.contract.interactive import ExecutionInputCall, InputResult, ScreenView
from shellyard.mcp.common import READ, hints, model_tool
from shellyard.sdk.client import AsyncClient


def interactive_tools(backend: AsyncClient) -> list[Tool]:
    async def execution_input(request: ExecutionInputCall, ctx: Context) -> dict[str, Any]:
        sent = await backend.input(request.execution_id, request.text, request.keys, request.eof)
        return sent.model_dump(mode="json")

    async def execution_screen(request: ExecutionStatusRequest, ctx: Context) -> dict[str, Any]:
        return (await backend.screen(request.execution_id)).model_dump(mode="json")

    return [
        model_tool(
            "execution_input",
            ExecutionInputCall,
            execution_input,
            title="Type into an execution",
            description=(
                "Type into a command run with interactive or tty: text, then keys (tmux names: "
                "Enter, Tab, Up, C-c, C-d ...), then eof. Its awaiting_input: it waits for you."
            ),
            annotations=hints(),
            output=InputResult,
        ),
        model_tool(
            "execution_screen",
            ExecutionStatusRequest,
            execution_screen,
            title="Terminal screen",
            description="A tty execution's terminal as a person sees it now: text and cursor.",
            annotations=READ,
            output=ScreenView,
        ),
    ]

"""The runner tool: which runners ``run_shell``'s ``runner_id`` may name, and their health."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.tools import Tool
from pydantic import BaseModel

from shellyard.contract.runners import RunnerView
from shellyard.mcp.common import READ, model_tool
from shellyard.sdk.client import AsyncClient


class RunnerListResult(BaseModel):
    runners: list[RunnerView]


def runner_tools(backend: AsyncClient) -> list[Tool]:
    async def runner_list(_request: None, ctx: Context) -> dict[str, Any]:
        views = await backend.runners()
        return {"runners": [view.model_dump(mode="json") for view in views]}

    return [
        model_tool(
            "runner_list",
            None,
            runner_list,
            title="List runners",
            description=(
                "The runners run_shell's runner_id may name: each one's state (up, or "
                "unreachable since when), version, sandbox (network policy), limits and "
                "running executions."
            ),
            annotations=READ,
            output=RunnerListResult,
        )
    ]


__all__ = ["runner_tools"]

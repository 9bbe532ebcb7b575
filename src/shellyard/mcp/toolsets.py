"""Toolsets: which of shellyard's tools a session lists (docs/mcp.md, "Toolsets").

Every tool's name, description and input schema is sent to the model in every request of
every turn, so a session lists only what it asked for: ``default`` (the seed's tools and the
basic file tools) unless ``shellyard mcp --tools …``, ``/mcp?tools=…`` or the
``X-Shellyard-Tools`` header names more. A call of a tool left out is refused with the option
that adds it, never answered "unknown tool"."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, InputRequiredResult
from mcp_types import Tool as MCPTool

from shellyard.errors import InvalidInput

TOOLSETS: dict[str, tuple[str, ...]] = {
    "core": (
        "run_shell",
        "execution_status",
        "execution_logs",
        "execution_cancel",
        "execution_input",
        "execution_screen",
    ),
    "files": (
        "file_list",
        "file_read",
        "file_write",
        "file_delete",
        "file_move",
        "snapshot_list",
        "snapshot_diff",
        "snapshot_restore",
        "artifact_declare",
        "artifact_list",
    ),
    "env": (
        "environment_create",
        "environment_install",
        "environment_uninstall",
        "environment_list",
        "environment_show",
        "environment_revisions",
        "environment_change_status",
    ),
    "timers": ("timer_create", "timer_list", "timer_cancel", "inbox_list", "inbox_mark_read"),
    "transfers": ("workspace_transfer", "runner_list"),
    "ports": ("workspace_port",),
}
#: What an agent needs for the seed's work: run_shell and its execution tools,
#: workspace_transfer, environment_create/install/uninstall, timer_create/list/cancel, and
#: the basic file tools.
DEFAULT_TOOLS: tuple[str, ...] = (
    *TOOLSETS["core"],
    "workspace_transfer",
    "environment_create",
    "environment_install",
    "environment_uninstall",
    "timer_create",
    "timer_list",
    "timer_cancel",
    "file_list",
    "file_read",
    "file_write",
)
ALL_TOOLS: tuple[str, ...] = tuple(name for names in TOOLSETS.values() for name in names)
NAMES = ("default", *TOOLSETS, "all")
#: The header of /mcp naming the toolsets (the same value as ``?tools=``).
TOOLS_HEADER = "x-shellyard-tools"


def parse_toolsets(spec: str | None) -> frozenset[str]:
    """The tool names of ``spec``: comma-separated toolsets (``default``, ``core``, ``files``,
    ``env``, ``timers``, ``transfers``, ``ports``, ``all``) or single tool names. Empty or
    None is ``default``."""
    words = [word.strip() for word in (spec or "").split(",") if word.strip()]
    chosen: set[str] = set()
    for word in words or ["default"]:
        if word == "default":
            chosen.update(DEFAULT_TOOLS)
        elif word == "all":
            chosen.update(ALL_TOOLS)
        elif word in TOOLSETS:
            chosen.update(TOOLSETS[word])
        elif word in ALL_TOOLS:
            chosen.add(word)
        else:
            raise InvalidInput(
                f"unknown toolset {word!r}: use a comma-separated list of {', '.join(NAMES)} "
                "(or tool names)"
            )
    return frozenset(chosen)


def toolset_of(tool: str) -> str:
    return next((name for name, names in TOOLSETS.items() if tool in names), "all")


class ToolsetServer(MCPServer):
    """An MCP server that lists and calls only the tools ``enabled()`` names: fixed for a
    stdio process, the current request's choice on /mcp."""

    def __init__(self, *args: Any, enabled: Callable[[], frozenset[str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._enabled = enabled

    async def list_tools(self) -> list[MCPTool]:
        enabled = self._enabled()
        return [tool for tool in await super().list_tools() if tool.name in enabled]

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Any = None
    ) -> CallToolResult | InputRequiredResult:
        enabled = self._enabled()
        if name in ALL_TOOLS and name not in enabled:
            wanted = ",".join(sorted(_covering(enabled) | {toolset_of(name)}))
            raise ToolError(
                f"invalid_input: {name} is not in this session's toolsets (it is in "
                f"'{toolset_of(name)}'); start 'shellyard mcp --tools {wanted}', or connect to "
                f"/mcp?tools={wanted} (or send the header X-Shellyard-Tools: {wanted})"
            )
        return await super().call_tool(name, arguments, context)


def _covering(enabled: Iterable[str]) -> set[str]:
    """The toolset names that give back ``enabled`` (``default`` when it is all there)."""
    have = set(enabled)
    names = {"default"} if set(DEFAULT_TOOLS) <= have else set()
    names |= {name for name, tools in TOOLSETS.items() if set(tools) <= have}
    if "default" in names:
        names -= {name for name, tools in TOOLSETS.items() if set(tools) <= set(DEFAULT_TOOLS)}
    return names


__all__ = [
    "ALL_TOOLS",
    "DEFAULT_TOOLS",
    "TOOLSETS",
    "TOOLS_HEADER",
    "ToolsetServer",
    "parse_toolsets",
]

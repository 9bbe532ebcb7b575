"""The MCP server (§3): tools with the contract's exact names, JSON results, ToolError
messages that say what was wrong and what to do. ``shellyard mcp`` serves it over stdio as a
client of the home's control plane (started on demand); ``mcp.http`` serves it at /mcp.

The tool modules (executions, timers, files, environments) each return their tools, built
from the contract's request models by ``mcp.common.model_tool``; this module only puts them
together, with the resource templates (``mcp.resources``) and the tasks extension
(``mcp.tasks``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from shellyard.mcp.environments import environment_tools
from shellyard.mcp.executions import execution_tools
from shellyard.mcp.files import file_tools
from shellyard.mcp.interactive import interactive_tools
from shellyard.mcp.ports import port_tools
from shellyard.mcp.resources import add_resources
from shellyard.mcp.runners import runner_tools
from shellyard.mcp.stdio import run_stdio
from shellyard.mcp.tasks import TasksExtension
from shellyard.mcp.timers import timer_tools
from shellyard.mcp.toolsets import ALL_TOOLS, ToolsetServer, parse_toolsets
from shellyard.sdk.client import AsyncClient

INSTRUCTIONS = """\
shellyard runs each command as a fresh process in a sandbox inside your workspace.
Nothing carries over between commands (no cwd, no exported variables): cd and export inside
the same command, or write a script. A foreground run_shell waits at most wait_ms (a
response budget, not a timeout) and then returns the execution id with state 'running'; the
command keeps running. Poll it with execution_status, read its output with execution_logs
(continue from next_offset), stop it with execution_cancel. Only execution_cancel stops a
job. Long jobs and servers: background=true. Install packages with environment_create /
environment_install and pass environment_id to run_shell, not with pip inside a command (the
environment is mounted read-only). Files on another runner or in a child's workspace reach
you with workspace_transfer; only then can you declare them with artifact_declare.
When a background execution or a transfer finishes or a reminder (timer_create) fires, a
notice lands in your inbox (inbox_list) and, if you are idle, starts a new turn: no need to
poll in a loop while you wait.
A server's clients (curl, tests) run with read_only=true in the same workspace, beside the
server, and reach it at localhost:PORT; a person's browser on the runner's host: workspace_port.
"""


__all__ = ["build_server", "local_network", "parse_toolsets", "serve_stdio"]


def build_server(
    backend: AsyncClient,
    *,
    network: str = "off",
    enabled: Callable[[], frozenset[str]] = lambda: frozenset(ALL_TOOLS),
) -> ToolsetServer:
    """Every tool over ``backend`` (the REST client: the stdio server's of the home, /mcp's
    of the request's principal), listed and called as far as ``enabled()`` names them
    (``mcp.toolsets``; the doors pass the session's choice). ``network`` is the local
    runner's network mode: run_shell's openWorldHint."""
    tools = (
        execution_tools(backend, network=network)
        + timer_tools(backend)
        + file_tools(backend)  # files, snapshots, transfers, artifacts
        + environment_tools(backend)
        + runner_tools(backend)
        + port_tools(backend)  # R5: ports for the host
        + interactive_tools(backend)  # E13: input and screens
    )
    server = ToolsetServer(
        enabled=enabled,
        name="shellyard",
        instructions=INSTRUCTIONS,
        tools=tools,
        extensions=[TasksExtension(backend)],
    )
    add_resources(server, backend)
    return server


def local_network(home: Path) -> str:
    """The local runner's network mode as the control plane of ``home`` sees it."""
    from shellyard.config import Settings

    return Settings.from_env(home=home).local_policy.network


async def serve_stdio(
    home: Path, agent_id: str | None = None, token: str | None = None, tools: str | None = None
) -> None:
    """Serve the ``tools`` toolsets (``mcp.toolsets``; None: ``default``) for ``agent_id``
    (the default session's main agent when None), with ``token`` (a session or agent token)
    or else the home's admin token."""
    from shellyard.home import ensure_server

    enabled = parse_toolsets(tools)
    info = ensure_server(home)
    client = AsyncClient(info.url, token or info.token, agent_id=agent_id)
    try:
        server = build_server(client, network=local_network(home), enabled=lambda: enabled)
        await run_stdio(server)  # one thread hop per answer (mcp/stdio.py)
    finally:
        await client.aclose()

"""The MCP server (§3): tools with the contract's exact names, JSON results, ToolError
messages that say what was wrong and what to do. ``shellyard mcp`` serves it over stdio as a
client of the home's control plane (started on demand)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from shellyard.errors import ShellyardError
from shellyard.model import ExecutionView, LogsResult, RunShellResult

if TYPE_CHECKING:
    from shellyard.interfaces.mcp_timers import ShellyardBackend

INSTRUCTIONS = """\
shellyard runs each command as a fresh process in a sandbox inside your workspace.
Nothing carries over between commands (no cwd, no exported variables). A foreground
run_shell waits at most wait_ms (a response budget, not a timeout) and then returns the
execution id with state 'running'; poll it with execution_status / execution_logs, stop it
with execution_cancel. Only execution_cancel stops a job. Install packages with
environment_install, not with pip inside a command (the environment is mounted read-only).
When a background execution finishes or a reminder (timer_create) fires, a notice lands in
your inbox (inbox_list) and, if you are idle, starts a new turn.
"""


class ExecutionBackend(Protocol):
    async def run(self, command: str | None = None, **options: Any) -> RunShellResult: ...
    async def status(self, execution_id: str) -> ExecutionView: ...
    async def logs(
        self,
        execution_id: str,
        stream: str = "stdout",
        offset: int = 0,
        limit: int = 65536,
        tail: int | None = None,
    ) -> LogsResult: ...
    async def cancel(self, execution_id: str, wait_s: float = 0.0) -> ExecutionView: ...


def tool_error(exc: ShellyardError) -> ToolError:
    # A plain exception reaches the client only as "Error executing tool X" (mcp 2.x).
    return ToolError(f"{exc.code}: {exc.message}")


def build_server(backend: ShellyardBackend) -> MCPServer:
    server = MCPServer(name="shellyard", instructions=INSTRUCTIONS)

    @server.tool(
        description=(
            "Run a shell command (bash -c) or a workspace script in the sandbox, at the "
            "workspace root. Give exactly one of command or script_path. wait_ms (0..30000, "
            "default 10000) is how long to wait for the result before returning the running "
            "execution's id; background=true returns at once. To add packages use "
            "environment_install: the environment is read-only inside commands."
        )
    )
    async def run_shell(
        command: str | None = None,
        script_path: str | None = None,
        runner_id: str | None = None,
        environment_id: str | None = None,
        wait_ms: int = 10_000,
        background: bool = False,
        max_output_length: int = 30_000,
        idempotency_key: str | None = None,
        queue: bool = False,
    ) -> dict[str, Any]:
        try:
            result = await backend.run(
                command,
                script_path=script_path,
                runner_id=runner_id,
                environment_id=environment_id,
                wait_ms=wait_ms,
                background=background,
                max_output_length=max_output_length,
                idempotency_key=idempotency_key,
                queue=queue,
            )
        except ShellyardError as exc:
            raise tool_error(exc) from None
        return result.model_dump(mode="json")

    @server.tool(description="State, exit code and environment revision of an execution.")
    async def execution_status(execution_id: str) -> dict[str, Any]:
        try:
            return (await backend.status(execution_id)).model_dump(mode="json")
        except ShellyardError as exc:
            raise tool_error(exc) from None

    @server.tool(
        description=(
            "Read an execution's log (stream 'stdout' or 'stderr') from byte offset, at most "
            "limit bytes, or the last tail bytes. Continue from next_offset; complete=true "
            "means the execution ended and everything was read."
        )
    )
    async def execution_logs(
        execution_id: str,
        stream: str = "stdout",
        offset: int = 0,
        limit: int = 65536,
        tail: int | None = None,
    ) -> dict[str, Any]:
        try:
            chunk = await backend.logs(execution_id, stream, offset, limit, tail)
        except ShellyardError as exc:
            raise tool_error(exc) from None
        return chunk.model_dump(mode="json")

    @server.tool(
        description=(
            "Cancel a running execution: SIGTERM, then the whole sandbox is killed after a "
            "grace period. Returns the record; a finished execution is returned unchanged."
        )
    )
    async def execution_cancel(execution_id: str, wait_s: float = 10.0) -> dict[str, Any]:
        try:
            return (await backend.cancel(execution_id, wait_s)).model_dump(mode="json")
        except ShellyardError as exc:
            raise tool_error(exc) from None

    from shellyard.interfaces.mcp_timers import add_timer_tools  # it imports this module

    add_timer_tools(server, backend)
    # Files, snapshots, transfers, artifacts: when the backend serves them (AsyncClient does).
    from shellyard.interfaces.mcp_files import FilesBackend, add_file_tools

    if isinstance(backend, FilesBackend):
        add_file_tools(server, backend)
    return server


async def serve_stdio(home: Path, agent_id: str | None = None) -> None:
    """Serve the tools for ``agent_id`` (the default session's main agent when None)."""
    from shellyard.interfaces.client import AsyncClient
    from shellyard.interfaces.home import ensure_server

    info = ensure_server(home)
    client = AsyncClient(info.url, info.token, agent_id=agent_id)
    try:
        await build_server(client).run_stdio_async()
    finally:
        await client.aclose()

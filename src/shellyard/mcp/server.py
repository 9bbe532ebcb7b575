"""The MCP server (§3): tools with the contract's exact names, JSON results, ToolError
messages that say what was wrong and what to do. ``shellyard mcp`` serves it over stdio as a
client of the home's control plane (started on demand)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from shellyard.contract.executions import ExecutionView, LogsResult, RunShellResult
from shellyard.errors import ShellyardError

if TYPE_CHECKING:
    from shellyard.mcp.timers import ShellyardBackend

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
            "Run a shell command (bash -c) or a workspace script (.py, .R, .sh or a shebang) in "
            "the sandbox, as a fresh process in /workspace (its HOME): no cwd or variables carry "
            "over from earlier commands. Give exactly one of command or script_path. wait_ms "
            "(0..30000, default 10000) is a budget for this answer, not a timeout: if the "
            "command is still going, you get its execution_id with state 'running' and it "
            "keeps running; follow it with execution_status and execution_logs, stop it with "
            "execution_cancel. background=true returns at once (a notice tells you when it "
            "ends). Output is capped at max_output_length characters (head and tail kept); "
            "execution_logs has everything. To add packages use environment_install and pass "
            "environment_id: the environment is read-only inside commands, so pip install in "
            "a command fails. A busy workspace is refused at once unless queue=true."
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

    @server.tool(
        description=(
            "State of an execution (queued, running, then completed, cancelled, failed or "
            "unknown), its exit_code (null until completed) and the environment revision it "
            "used. Starts nothing and never waits; to see output use execution_logs."
        )
    )
    async def execution_status(execution_id: str) -> dict[str, Any]:
        try:
            return (await backend.status(execution_id)).model_dump(mode="json")
        except ShellyardError as exc:
            raise tool_error(exc) from None

    @server.tool(
        description=(
            "Read an execution's log (stream 'stdout' or 'stderr') from byte offset, at most "
            "limit bytes, or the last tail bytes, while it runs or after. Continue from "
            "next_offset; complete=true means the execution ended and everything was read. "
            "Prefer this over re-running a command to see its output."
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
            "Cancel an execution: SIGTERM to its processes, then the whole sandbox is killed "
            "after a grace period; the only way a job stops before it ends. Waits up to wait_s "
            "for state 'cancelled' (files written so far are kept in a snapshot). A finished "
            "execution is returned unchanged."
        )
    )
    async def execution_cancel(execution_id: str, wait_s: float = 10.0) -> dict[str, Any]:
        try:
            return (await backend.cancel(execution_id, wait_s)).model_dump(mode="json")
        except ShellyardError as exc:
            raise tool_error(exc) from None

    # Runners and their health, when the backend serves them (AsyncClient does).
    if hasattr(backend, "runners"):

        @server.tool(
            description=(
                "The runners run_shell's runner_id may name: each one's state (up, or "
                "unreachable since when), version, sandbox (network policy), limits and "
                "running executions."
            )
        )
        async def runner_list() -> dict[str, Any]:
            try:
                views = await backend.runners()
            except ShellyardError as exc:
                raise tool_error(exc) from None
            return {"runners": [view.model_dump(mode="json") for view in views]}

    from shellyard.mcp.timers import add_timer_tools  # it imports this module

    add_timer_tools(server, backend)
    # Files, snapshots, transfers, artifacts: when the backend serves them (AsyncClient does).
    from shellyard.mcp.files import FilesBackend, add_file_tools

    if isinstance(backend, FilesBackend):
        add_file_tools(server, backend)
    # Managed environments: environment_create / _install / _uninstall / _list / _show.
    from shellyard.mcp.environments import EnvironmentsBackend, add_environment_tools

    if isinstance(backend, EnvironmentsBackend):
        add_environment_tools(server, backend)
    return server


async def serve_stdio(home: Path, agent_id: str | None = None, token: str | None = None) -> None:
    """Serve the tools for ``agent_id`` (the default session's main agent when None), with
    ``token`` (a session or agent token) or else the home's admin token."""
    from shellyard.home import ensure_server
    from shellyard.sdk.client import AsyncClient

    info = ensure_server(home)
    client = AsyncClient(info.url, token or info.token, agent_id=agent_id)
    try:
        await build_server(client).run_stdio_async()
    finally:
        await client.aclose()

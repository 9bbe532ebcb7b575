"""MCP tools of executions (E1–E7): ``run_shell``, ``execution_status``, ``execution_logs``,
``execution_cancel``. Arguments are the contract's request models (``contract.executions``).

A foreground ``run_shell`` whose call carries a progress token waits here in short slices
(never longer than the caller's ``wait_ms`` in all) and sends a progress notification after
each: the elapsed time and the bytes of output so far, so a host can show the command is
alive. The result is the same as one wait of ``wait_ms``."""

from __future__ import annotations

import time
import uuid
from typing import Any

import anyio
import pydantic_core
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.tools import Tool
from mcp_types import CallToolResult, TextContent, ToolAnnotations

from shellyard.contract.executions import (
    AGENT_CANCEL_WAIT_S,
    ExecutionCancelRequest,
    ExecutionLogsRequest,
    ExecutionStatusRequest,
    LogsResult,
    RunShellRequest,
    RunShellResult,
)
from shellyard.contract.executions import ExecutionView as ExecutionViewModel
from shellyard.mcp.common import READ, model_tool
from shellyard.mcp.resources import log_links
from shellyard.sdk.client import AsyncClient

#: Between two progress notifications of a foreground wait.
PROGRESS_SLICE_MS = 1000

RUN_SHELL_DESCRIPTION = (
    "Run a shell command (bash -c) or a workspace script (.py, .R, .sh, shebang) in the "
    "sandbox, a fresh process in /workspace (or cwd): only files and ~ carry over. wait_ms "
    "(0..30000) bounds this answer, not the command (timeout_ms does): one still going "
    "returns execution_id, state 'running' (execution_status / execution_logs / "
    "execution_cancel). background=true returns at once; a notice tells the end. Output is "
    "capped at max_output_length (head and tail kept). Packages: environment_install, then "
    "environment_id. A busy workspace is refused unless queue=true. A server: background=true, "
    "its clients read_only=true; a browser reaches it through workspace_port. A program that "
    "asks (prompt, REPL): interactive=true or tty=true, then execution_input."
)


def run_options(request: RunShellRequest, **override: Any) -> dict[str, Any]:
    """The backend's keyword arguments for ``request`` (the tasks extension reuses them)."""
    options = request.model_dump(exclude={"command"})
    options.update(override)
    return options


async def _output_bytes(backend: AsyncClient, execution_id: str) -> int:
    total = 0
    for stream in ("stdout", "stderr"):
        total += (await backend.logs(execution_id, stream, 0, 0)).size
    return total


async def run_with_progress(
    backend: AsyncClient, request: RunShellRequest, ctx: Context
) -> RunShellResult:
    """Run ``request``. A foreground call carrying a progress token is made in two calls of
    one idempotency key (the caller's, or one minted here): ``wait_ms=0`` to learn the
    execution id, then the rest of the budget, during which progress is reported every
    PROGRESS_SLICE_MS. E10 makes the second call answer for the same execution, with the
    same result one call of ``wait_ms`` gives."""
    meta = ctx.request_context.meta
    token = meta.get("progress_token") if meta else None
    if token is None or request.background or request.wait_ms <= PROGRESS_SLICE_MS:
        return await backend.run(request.command, **run_options(request))
    started = time.monotonic()
    key = request.idempotency_key or f"mcp-progress-{uuid.uuid4().hex}"
    first = await backend.run(
        request.command, **run_options(request, wait_ms=0, idempotency_key=key)
    )
    if first.state.terminal:
        return await backend.run(request.command, **run_options(request, idempotency_key=key))
    box: list[RunShellResult] = []
    async with anyio.create_task_group() as group:

        async def finish() -> None:
            left_ms = max(0, request.wait_ms - int((time.monotonic() - started) * 1000))
            options = run_options(request, wait_ms=left_ms, idempotency_key=key)
            box.append(await backend.run(request.command, **options))
            group.cancel_scope.cancel()

        group.start_soon(finish)
        while True:
            await anyio.sleep(PROGRESS_SLICE_MS / 1000)
            elapsed = time.monotonic() - started
            output = await _output_bytes(backend, first.execution_id)
            await ctx.report_progress(
                round(elapsed, 3),
                request.wait_ms / 1000,
                f"{first.execution_id} running for {elapsed:.1f} s, {output} bytes of output",
            )
    return box[0]


def run_result(result: RunShellResult) -> dict[str, Any] | CallToolResult:
    """run_shell's answer: the result as today, plus (E12) links to the whole logs when the
    inline output was cut. The text block is the SDK's own rendering of the dict."""
    data = result.model_dump(mode="json")
    if not result.output_truncated:
        return data
    text = pydantic_core.to_json(data, fallback=str, indent=2).decode()
    return CallToolResult(
        content=[TextContent(type="text", text=text), *log_links(result.execution_id)],
        structured_content=data,
    )


def execution_tools(backend: AsyncClient, *, network: str = "off") -> list[Tool]:
    async def run_shell(request: RunShellRequest, ctx: Context) -> dict[str, Any] | CallToolResult:
        result = await run_with_progress(backend, request, ctx)
        return run_result(result)

    async def execution_status(request: ExecutionStatusRequest, ctx: Context) -> dict[str, Any]:
        return (await backend.status(request.execution_id)).model_dump(mode="json")

    async def execution_logs(request: ExecutionLogsRequest, ctx: Context) -> dict[str, Any]:
        chunk = await backend.logs(
            request.execution_id, request.stream, request.offset, request.limit, request.tail
        )
        return chunk.model_dump(mode="json")

    async def execution_cancel(request: ExecutionCancelRequest, ctx: Context) -> dict[str, Any]:
        return (await backend.cancel(request.execution_id, request.wait_s)).model_dump(mode="json")

    return [
        model_tool(
            "run_shell",
            RunShellRequest,
            run_shell,
            title="Run a shell command",
            description=RUN_SHELL_DESCRIPTION,
            # A command may change anything in the workspace (not destructive of history:
            # every command ends in a snapshot); it reaches the network when the runner does.
            annotations=ToolAnnotations(
                read_only_hint=False,
                destructive_hint=False,
                idempotent_hint=False,
                open_world_hint=network != "off",
            ),
            output=RunShellResult,
        ),
        model_tool(
            "execution_status",
            ExecutionStatusRequest,
            execution_status,
            title="Execution status",
            description=(
                "State of an execution (queued, running, completed, cancelled, failed, unknown), "
                "its exit_code and environment revision. Never waits; output: execution_logs."
            ),
            annotations=READ,
            output=ExecutionViewModel,
        ),
        model_tool(
            "execution_logs",
            ExecutionLogsRequest,
            execution_logs,
            title="Read execution logs",
            description=(
                "Read an execution's log (stdout, stderr, or stdin: what was typed) from byte "
                "offset, at most limit bytes, or the last tail bytes, while it runs or after. "
                "Continue from next_offset; complete=true: it ended and all was read. Prefer "
                "this over re-running a command."
            ),
            annotations=READ,
            output=LogsResult,
        ),
        model_tool(
            "execution_cancel",
            ExecutionCancelRequest,
            execution_cancel,
            title="Cancel an execution",
            description=(
                "Cancel an execution: SIGTERM, then the whole sandbox is killed after a grace "
                "period. Waits up to wait_s for state 'cancelled' (files written so far are kept "
                "in a snapshot). A finished execution is returned unchanged."
            ),
            annotations=ToolAnnotations(
                read_only_hint=False,
                destructive_hint=True,
                idempotent_hint=True,
                open_world_hint=False,
            ),
            output=ExecutionViewModel,
            defaults={"wait_s": AGENT_CANCEL_WAIT_S},
        ),
    ]


__all__ = ["execution_tools", "run_options", "run_with_progress"]

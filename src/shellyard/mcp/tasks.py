"""The MCP tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663) through the SDK's
extension interface (SEP-2133): a ``tools/call`` interceptor and the ``tasks/get``,
``tasks/update`` and ``tasks/cancel`` request methods.

A client that declares the extension on a ``tools/call`` (2026-07-28 protocol) gets, from
``run_shell``, ``environment_install`` / ``environment_uninstall`` and ``workspace_transfer``
with action ``start``, a task instead of a result when the work outlives the call: the tool
runs exactly as for any client, and if what it returns is still queued or running, the
answer is a ``CreateTaskResult`` whose ``taskId`` is the record's own id (``ex_…``, ``chg_…``,
``tr_…``). The record was committed before the tool returned, so ``tasks/get`` resolves at
once, and since it lives in the control plane's database the task id stays valid across a
kill -9 and a restart of the control plane (and of this MCP server). A client that does not
declare the extension, or speaks an older protocol, gets today's result unchanged.

``tasks/get`` maps the record's state: queued and running are ``working`` with a status
message; a finished execution is ``completed`` with run_shell's result (a non-zero exit code
or a failed sandbox are tool outcomes, so still ``completed``); cancelled is ``cancelled``;
``unknown`` while the runner is still asked about it (it could not confirm the outcome,
E11) is ``working`` with a message saying so; a final ``unknown`` (its runner removed, its
sandbox lost) is ``completed`` with run_shell's result, whose error says why. ``failed`` is
reserved for protocol errors and never produced from a record.
``tasks/cancel`` is ``execution_cancel`` (or the transfer's cancel). The SDK's
``subscriptions/listen`` carries only its own event kinds (tools, prompts, resources), so
there are no ``notifications/tasks`` pushes: clients poll at ``pollIntervalMs``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    RequestParams,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from shellyard.contract.executions import DEFAULT_MAX_OUTPUT, ExecutionState
from shellyard.errors import NotFound, ShellyardError
from shellyard.mcp.common import for_model
from shellyard.mcp.executions import run_result
from shellyard.sdk.client import AsyncClient

TASKS = "io.modelcontextprotocol/tasks"
#: How often a client should poll ``tasks/get``.
POLL_INTERVAL_MS = 1000
#: How long a task is promised to stay answerable (its record is kept at least this long;
#: shellyard keeps execution records until an operator deletes them).
TASK_TTL_MS = 30 * 24 * 3600 * 1000
#: The tools that may answer with a task, and the field of their result naming the record.
TASK_TOOLS = {
    "run_shell": "execution_id",
    "environment_install": "change_id",
    "environment_uninstall": "change_id",
    "workspace_transfer": "transfer_id",
}
_PENDING = {"queued", "running", "waiting"}


class TaskParams(RequestParams):
    task_id: str = Field(alias="taskId")


class UpdateTaskParams(TaskParams):
    input_responses: dict[str, Any] | None = Field(default=None, alias="inputResponses")


def declares_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this request's client capabilities name the extension (SEP-2663 is per
    request: a declaration on an earlier request does not count)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    meta = ctx.meta or {}
    capabilities = meta.get(CLIENT_CAPABILITIES_META_KEY)
    if not isinstance(capabilities, dict):
        return False
    extensions = capabilities.get("extensions")
    return isinstance(extensions, dict) and TASKS in extensions


def tool_result(tool: str, data: dict[str, Any] | CallToolResult) -> dict[str, Any]:
    """``tool``'s result as the tool call puts it on the wire (``for_model``'s text block
    and the structured result)."""
    return for_model(tool, data).model_dump(by_alias=True, mode="json", exclude_none=True)


def _iso(timestamp: float | None) -> str:
    moment = datetime.fromtimestamp(timestamp if timestamp is not None else time.time(), UTC)
    return moment.isoformat().replace("+00:00", "Z")


def _task(
    task_id: str,
    status: str,
    created: float | None,
    updated: float | None,
    message: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    task: dict[str, Any] = {
        "taskId": task_id,
        "status": status,
        "createdAt": _iso(created),
        "lastUpdatedAt": _iso(updated if updated is not None else created),
        "ttlMs": TASK_TTL_MS,
        "pollIntervalMs": POLL_INTERVAL_MS,
    }
    if message is not None:
        task["statusMessage"] = message
    task.update(extra)
    return task


class TasksExtension(Extension):
    identifier = TASKS

    def __init__(self, backend: AsyncClient) -> None:
        self.backend = backend

    def methods(self) -> Sequence[MethodBinding]:
        return (
            MethodBinding("tasks/get", TaskParams, self._get),
            MethodBinding("tasks/update", UpdateTaskParams, self._update),
            MethodBinding("tasks/cancel", TaskParams, self._cancel),
        )

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        result = await call_next(ctx)
        field = TASK_TOOLS.get(params.name)
        if field is None or not isinstance(result, CallToolResult) or result.is_error:
            return result
        data = result.structured_content
        if not isinstance(data, dict) or data.get("state") not in _PENDING:
            return result
        if (
            params.name == "workspace_transfer"
            and (params.arguments or {}).get("action") != "start"
        ):
            return result
        if not declares_tasks(ctx):
            return result
        # The record is committed (the tool returned its id), so tasks/get resolves now.
        task = await self._describe(str(data[field]))
        return {"resultType": "task", **task}

    # ------------------------------------------------------------------ methods

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
        if not declares_tasks(ctx):
            require_client_extension(ctx, TASKS)
        return await self._describe(params.task_id)

    async def _update(
        self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams
    ) -> HandlerResult:
        if not declares_tasks(ctx):
            require_client_extension(ctx, TASKS)
        # No shellyard task ever asks for input: every response is for no outstanding key.
        await self._describe(params.task_id)
        return {}

    async def _cancel(
        self, ctx: ServerRequestContext[Any, Any], params: TaskParams
    ) -> HandlerResult:
        if not declares_tasks(ctx):
            require_client_extension(ctx, TASKS)
        task_id = params.task_id
        try:
            if task_id.startswith("ex_"):
                await self.backend.cancel(task_id, 0.0)
            elif task_id.startswith("tr_"):
                await self.backend.transfer_cancel(task_id, 0.0)
            else:
                # An environment change is not cancellable (it would leave a half-made
                # revision): acknowledged, as the spec allows, and it runs to its end.
                await self._describe(task_id)
        except NotFound as exc:
            raise _not_found(task_id, exc) from None
        return {}

    # ------------------------------------------------------------------ mapping

    async def _describe(self, task_id: str) -> dict[str, Any]:
        try:
            if task_id.startswith("ex_"):
                return await self._execution(task_id)
            if task_id.startswith("chg_"):
                return await self._change(task_id)
            if task_id.startswith("tr_"):
                return await self._transfer(task_id)
        except NotFound as exc:
            raise _not_found(task_id, exc) from None
        except ShellyardError as exc:
            raise MCPError(code=INVALID_PARAMS, message=f"{exc.code}: {exc.message}") from None
        raise _not_found(task_id, None)

    async def _execution(self, task_id: str) -> dict[str, Any]:
        view = await self.backend.status(task_id)
        created, updated = view.created_at, view.finished_at or view.started_at
        state = view.state
        if state is ExecutionState.queued:
            why = f" behind {view.waiting_for}" if view.waiting_for else ""
            return _task(task_id, "working", created, updated, f"queued{why}")
        if state is ExecutionState.running:
            since = time.time() - (view.started_at or view.created_at)
            return _task(task_id, "working", created, updated, f"running for {since:.0f} s")
        if state is ExecutionState.unknown and view.finished_at is None:
            return _task(
                task_id,
                "working",
                created,
                updated,
                "the outcome could not be confirmed yet: the runner did not answer; "
                "shellyard keeps asking (execution_status shows the same)",
            )
        if state is ExecutionState.cancelled:
            return _task(task_id, "cancelled", created, updated, "cancelled")
        # completed, whatever the exit code, failed (the sandbox could not run it) and a
        # final unknown (its runner removed or its sandbox lost: nobody asks any more, E9):
        # all are run_shell results, whose state and error say which, so the task completed
        # (SEP-2663: failed is for protocol errors only).
        result = await self.backend.run_result(task_id, DEFAULT_MAX_OUTPUT)
        wire = tool_result("run_shell", run_result(result))
        message = f"{state.value}, exit code {view.exit_code}"
        return _task(task_id, "completed", created, updated, message, result=wire)

    async def _change(self, task_id: str) -> dict[str, Any]:
        change = await self.backend.environment_change_status(task_id, 0.0)
        data = change.model_dump(mode="json")
        created = data.get("created_at")
        updated = data.get("finished_at") or data.get("started_at")
        if change.state in _PENDING:
            message: str = change.state
            if change.waiting_for:
                message += " for " + ", ".join(change.waiting_for)
            return _task(task_id, "working", created, updated, message)
        result = tool_result("environment_install", data)
        return _task(task_id, "completed", created, updated, change.state, result=result)

    async def _transfer(self, task_id: str) -> dict[str, Any]:
        view = await self.backend.transfer(task_id)
        data = view.model_dump(mode="json")
        created, updated = view.created_at, view.finished_at or view.started_at
        if view.state in _PENDING:
            done = f"{view.files_copied + view.files_unchanged}/{view.files_total} files"
            return _task(task_id, "working", created, updated, f"{view.state}, {done}")
        if view.state == "cancelled":
            return _task(task_id, "cancelled", created, updated, "cancelled")
        result = tool_result("workspace_transfer", data)
        return _task(task_id, "completed", created, updated, view.state, result=result)


def _not_found(task_id: str, exc: ShellyardError | None) -> MCPError:
    why = f": {exc.message}" if exc is not None else ""
    return MCPError(
        code=INVALID_PARAMS, message=f"Failed to retrieve task {task_id!r}: task not found{why}"
    )


__all__ = ["TASKS", "TASK_TOOLS", "TasksExtension", "declares_tasks"]

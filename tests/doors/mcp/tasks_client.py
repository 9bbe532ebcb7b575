"""A client side of the MCP tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663)
for the SDK's ``Client(extensions=[...])``: it claims ``resultType: "task"`` and, when asked
to resolve one, polls ``tasks/get`` until the task is terminal. Tests also send ``tasks/get``
and ``tasks/cancel`` themselves through ``task_get`` / ``task_cancel``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import anyio
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.session import ClientSession
from mcp_types import CallToolResult, Request, RequestParams, Result
from pydantic import ConfigDict, Field, TypeAdapter

TASKS = "io.modelcontextprotocol/tasks"
_ANY: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


class TaskParams(RequestParams):
    task_id: str = Field(alias="taskId")


class GetTask(Request[TaskParams, Literal["tasks/get"]]):
    name_param = "taskId"


class CancelTask(Request[TaskParams, Literal["tasks/cancel"]]):
    name_param = "taskId"


class CreateTaskResult(Result):
    """SEP-2663's CreateTaskResult: ``Result & Task``."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    result_type: Literal["task"] = Field(alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str
    status_message: str | None = Field(default=None, alias="statusMessage")
    created_at: str = Field(alias="createdAt")
    last_updated_at: str = Field(alias="lastUpdatedAt")
    ttl_ms: int | None = Field(alias="ttlMs")
    poll_interval_ms: int | None = Field(default=None, alias="pollIntervalMs")


async def task_get(session: ClientSession, task_id: str) -> dict[str, Any]:
    request = GetTask(method="tasks/get", params=TaskParams(taskId=task_id))
    return await session.send_request(request, _ANY)


async def task_cancel(session: ClientSession, task_id: str) -> dict[str, Any]:
    request = CancelTask(method="tasks/cancel", params=TaskParams(taskId=task_id))
    return await session.send_request(request, _ANY)


async def wait_terminal(
    session: ClientSession, task_id: str, timeout_s: float = 60
) -> dict[str, Any]:
    with anyio.fail_after(timeout_s):
        while True:
            task = await task_get(session, task_id)
            if task["status"] in ("completed", "cancelled", "failed"):
                return task
            await anyio.sleep(task.get("pollIntervalMs", 1000) / 1000)


class TasksClient(ClientExtension):
    identifier = TASKS

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=self._resolve)]

    async def _resolve(self, task: CreateTaskResult, ctx: ClaimContext) -> CallToolResult:
        done = await wait_terminal(ctx.session, task.task_id)
        if done["status"] != "completed":
            raise RuntimeError(f"task {task.task_id} ended {done['status']}")
        return CallToolResult.model_validate(done["result"])

"""MCP tools of timers (N5–N7) and the inbox: ``timer_create``, ``timer_list``, ``timer_cancel``
(the contract's names), ``inbox_list`` and ``inbox_mark_read``. ``build_server`` adds them."""

from __future__ import annotations

from typing import Any, Protocol

from mcp.server.mcpserver import MCPServer

from shellyard.contract.sessions import NoticeView, TimerView
from shellyard.errors import ShellyardError
from shellyard.mcp.server import ExecutionBackend, tool_error


class TimerBackend(Protocol):
    async def timer_create(
        self,
        text: str,
        after_ms: int | None = None,
        at: str | None = None,
        execution_id: str | None = None,
    ) -> TimerView: ...
    async def timer_list(self, state: str | None = None) -> list[TimerView]: ...
    async def timer_cancel(self, timer_id: str) -> TimerView: ...
    async def inbox(self, unread_only: bool = False) -> list[NoticeView]: ...
    async def mark_read(self, notice_ids: list[str] | None = None) -> int: ...


class ShellyardBackend(ExecutionBackend, TimerBackend, Protocol):
    """What the MCP server calls (``AsyncClient`` is one)."""


def add_timer_tools(server: MCPServer, backend: TimerBackend) -> None:
    @server.tool(
        description=(
            "Set a one-time reminder: its text comes back to you as a notice (and wakes you if "
            "you are idle) at the time given by exactly one of after_ms (milliseconds from now) "
            "or at (ISO-8601 with an offset, e.g. 2030-06-01T09:00:00+02:00 or ...Z, or a local "
            "time with an IANA zone, e.g. 2030-06-01T09:00:00[Europe/Paris]). A naive time, "
            "or anything recurring (cron, intervals), is refused. With execution_id the reminder "
            "is cancelled if that execution finishes first. It runs nothing."
        )
    )
    async def timer_create(
        text: str,
        after_ms: int | None = None,
        at: str | None = None,
        execution_id: str | None = None,
    ) -> dict[str, Any]:
        try:
            timer = await backend.timer_create(text, after_ms, at, execution_id)
        except ShellyardError as exc:
            raise tool_error(exc) from None
        return timer.model_dump(mode="json")

    @server.tool(
        description=(
            "Your timers with their state (pending, fired, cancelled) and fire time in UTC; "
            "state filters them."
        )
    )
    async def timer_list(state: str | None = None) -> dict[str, Any]:
        try:
            timers = await backend.timer_list(state)
        except ShellyardError as exc:
            raise tool_error(exc) from None
        return {"timers": [t.model_dump(mode="json") for t in timers]}

    @server.tool(
        description="Cancel a pending timer. A fired or cancelled one is returned unchanged."
    )
    async def timer_cancel(timer_id: str) -> dict[str, Any]:
        try:
            return (await backend.timer_cancel(timer_id)).model_dump(mode="json")
        except ShellyardError as exc:
            raise tool_error(exc) from None

    @server.tool(
        description=(
            "Your inbox: notices of finished background executions, transfers and fired "
            "reminders (unread ones by default). Mark what you handled with inbox_mark_read."
        )
    )
    async def inbox_list(unread_only: bool = True) -> dict[str, Any]:
        try:
            notices = await backend.inbox(unread_only)
        except ShellyardError as exc:
            raise tool_error(exc) from None
        return {
            "notices": [n.model_dump(mode="json") for n in notices],
            "unread": sum(1 for n in notices if n.read_at is None),
        }

    @server.tool(description="Mark inbox notices read: the given notice_ids, or every unread one.")
    async def inbox_mark_read(notice_ids: list[str] | None = None) -> dict[str, Any]:
        try:
            return {"marked": await backend.mark_read(notice_ids)}
        except ShellyardError as exc:
            raise tool_error(exc) from None

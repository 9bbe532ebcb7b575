"""MCP tools of timers (N5–N7) and the inbox: ``timer_create``, ``timer_list``, ``timer_cancel``
(the contract's names), ``inbox_list`` and ``inbox_mark_read``. ``build_server`` adds them."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.tools import Tool
from pydantic import BaseModel

from shellyard.contract.sessions import (
    DEFAULT_LIST_PAGE,
    InboxListRequest,
    MarkReadRequest,
    NoticeView,
    TimerCancelRequest,
    TimerCreateRequest,
    TimerListRequest,
    TimerView,
)
from shellyard.mcp.common import READ, hints, model_tool
from shellyard.sdk.client import AsyncClient


class TimerList(BaseModel):
    timers: list[TimerView]


class NoticeList(BaseModel):
    notices: list[NoticeView]
    unread: int


class Marked(BaseModel):
    marked: int


def _more(ids: list[str]) -> dict[str, Any]:
    """A full page says where the next one starts (docs/security.md "Limits at each door")."""
    if len(ids) < DEFAULT_LIST_PAGE:
        return {}
    return {"next_after": ids[-1], "more": "this is one page: call again with after=next_after"}


def timer_tools(backend: AsyncClient) -> list[Tool]:
    async def timer_create(request: TimerCreateRequest, ctx: Context) -> dict[str, Any]:
        timer = await backend.timer_create(
            request.text, request.after_ms, request.at, request.execution_id
        )
        return timer.model_dump(mode="json")

    async def timer_list(request: TimerListRequest, ctx: Context) -> dict[str, Any]:
        timers = await backend.timer_list(request.state, request.after)
        return {"timers": [t.model_dump(mode="json") for t in timers]} | _more(
            [t.timer_id for t in timers]
        )

    async def timer_cancel(request: TimerCancelRequest, ctx: Context) -> dict[str, Any]:
        return (await backend.timer_cancel(request.timer_id)).model_dump(mode="json")

    async def inbox_list(request: InboxListRequest, ctx: Context) -> dict[str, Any]:
        notices = await backend.inbox(request.unread_only, request.after)
        return {
            "notices": [n.model_dump(mode="json") for n in notices],
            "unread": sum(1 for n in notices if n.read_at is None),
        } | _more([n.notice_id for n in notices])

    async def inbox_mark_read(request: MarkReadRequest, ctx: Context) -> dict[str, Any]:
        return {"marked": await backend.mark_read(request.notice_ids)}

    return [
        model_tool(
            "timer_create",
            TimerCreateRequest,
            timer_create,
            title="Set a reminder",
            description=(
                "Set a one-time reminder: its text comes back as a notice (waking you if idle) "
                "after after_ms, or at `at` (ISO-8601 with an offset, e.g. "
                "2030-06-01T09:00:00+02:00, or with an IANA zone, e.g. "
                "2030-06-01T09:00:00[Europe/Paris]); naive or recurring times are refused. "
                "With execution_id it is cancelled if that execution ends first."
            ),
            annotations=hints(),
            output=TimerView,
        ),
        model_tool(
            "timer_list",
            TimerListRequest,
            timer_list,
            title="List reminders",
            description=(
                "Your timers with their state (pending, fired, cancelled) and fire time in UTC; "
                "state filters them."
            ),
            annotations=READ,
            output=TimerList,
        ),
        model_tool(
            "timer_cancel",
            TimerCancelRequest,
            timer_cancel,
            title="Cancel a reminder",
            description="Cancel a pending timer. A fired or cancelled one is returned unchanged.",
            annotations=hints(destructive=True, idempotent=True),
            output=TimerView,
        ),
        model_tool(
            "inbox_list",
            InboxListRequest,
            inbox_list,
            title="Read your inbox",
            description=(
                "Your inbox: notices of finished background executions, transfers and fired "
                "reminders (unread ones by default). Mark what you handled with inbox_mark_read."
            ),
            annotations=READ,
            output=NoticeList,
        ),
        model_tool(
            "inbox_mark_read",
            MarkReadRequest,
            inbox_mark_read,
            title="Mark notices read",
            description="Mark inbox notices read: the given notice_ids, or every unread one.",
            annotations=hints(idempotent=True),
            output=Marked,
        ),
    ]


__all__ = ["timer_tools"]

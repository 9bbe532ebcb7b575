"""REST endpoints of sessions, agents (the host's turn protocol), the inbox, wakes (webhook
registration, a server-sent events stream per session) and timers. ``create_app`` mounts them
behind the same bearer token. Agent-level calls (inbox, timers) act for the agent named in the
``X-Shellyard-Agent`` header, the default session's main agent without it.

No ``from __future__ import annotations`` here: FastAPI must resolve ``Depends(known_session)``,
a local function, when the routes are declared."""

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent

from shellyard.api.auth import AgentHeader, PrincipalDep, admin_only
from shellyard.api.bodies import body_of
from shellyard.api.docs import JSON_ERROR_RESPONSES, body_doc
from shellyard.api.forward import Forward, add_routes
from shellyard.contract.sessions import (
    DEFAULT_LIST_PAGE,
    MAX_LIST_PAGE,
    AgentView,
    DeliveryView,
    InboxSummary,
    MarkReadRequest,
    MarkReadResult,
    NoticeView,
    ResumeResult,
    SessionEventView,
    SessionView,
    TimerCreateRequest,
    TimerView,
    WakeView,
    WebhookRequest,
    WebhookView,
)
from shellyard.control.plane import ControlPlane
from shellyard.errors import NotFound

#: A list's page size (docs/security.md "Limits at each door").
PageLimit = Annotated[int, Query(ge=1, le=MAX_LIST_PAGE)]
PAGE_AFTER = "the last id of the previous page (its X-Shellyard-Next-After), for the next page"
#: Set on a full page: the id to pass as ``after`` for the next one.
NEXT_AFTER_HEADER = "X-Shellyard-Next-After"


def _next(response: Response, ids: list[str], limit: int) -> None:
    if len(ids) >= limit:
        response.headers[NEXT_AFTER_HEADER] = ids[-1]


#: The routes that hand their path ids (and the acting agent) to a service unchanged.
SESSION_ROUTES = (
    Forward("POST", "/v1/sessions", "create_session", "sessions.create", SessionView,
            dependencies=[Depends(admin_only)]),
    Forward("GET", "/v1/sessions/{session_id}", "get_session", "sessions.get", SessionView),
    Forward("POST", "/v1/sessions/{session_id}/stop", "stop_session", "sessions.stop",
            SessionView),
    Forward("POST", "/v1/sessions/{session_id}/archive", "archive_session", "sessions.archive",
            SessionView),
    Forward("POST", "/v1/sessions/{session_id}/restore", "restore_session", "sessions.restore",
            SessionView),
    Forward("POST", "/v1/sessions/{session_id}/resume", "resume_session", "sessions.resume",
            ResumeResult),
    Forward("POST", "/v1/sessions/{session_id}/requests", "user_request", "sessions.user_request",
            ResumeResult),
    Forward("GET", "/v1/sessions/{session_id}/events", "session_events", "sessions.events",
            list[SessionEventView]),
    Forward("GET", "/v1/agents/{agent_id}", "get_agent", "sessions.get_agent", AgentView),
    Forward("POST", "/v1/agents/{agent_id}/turn/begin", "turn_begin", "sessions.turn_begin",
            AgentView),
    Forward("POST", "/v1/agents/{agent_id}/turn/end", "turn_end", "sessions.turn_end", AgentView),
    Forward("POST", "/v1/agents/{agent_id}/stop", "stop_agent", "sessions.stop_agent", AgentView),
    Forward("POST", "/v1/agents/{agent_id}/resume", "resume_agent", "sessions.resume_agent",
            AgentView),
    Forward("GET", "/v1/inbox/summary", "inbox_summary", "inbox.summary", InboxSummary,
            agent=True),
    Forward("POST", "/v1/timers", "timer_create", "timers.create", TimerView, agent=True,
            body=TimerCreateRequest),
    Forward("GET", "/v1/timers/{timer_id}", "timer_get", "timers.get", TimerView, agent=True),
    Forward("POST", "/v1/timers/{timer_id}/cancel", "timer_cancel", "timers.cancel", TimerView,
            agent=True),
    Forward("GET", "/v1/wakes/{wake_id}/deliveries", "wake_deliveries", "wakes.deliveries",
            list[DeliveryView]),
)  # fmt: skip


def sessions_router(plane: ControlPlane) -> APIRouter:
    router = APIRouter()
    add_routes(router, plane, SESSION_ROUTES)

    async def known_session(session_id: str, who: PrincipalDep) -> str:
        plane.tokens.check_session(who, session_id)
        await plane.sessions.session_record(session_id)  # NotFound before a stream starts
        return session_id

    # ------------------------------------------------------------------ sessions

    @router.get("/v1/sessions")
    async def list_sessions(who: PrincipalDep) -> list[SessionView]:
        """Admin: every session; a session or agent token: its own."""
        found = await plane.sessions.list_sessions()
        return [s for s in found if who.is_admin or s.session_id == who.session_id]

    @router.get("/v1/sessions/{session_id}/wakes")
    async def list_wakes(
        session_id: Annotated[str, Depends(known_session)],
        after: Annotated[int, Query(ge=0)] = 0,
    ) -> list[WakeView]:
        return await plane.wakes.list_wakes(session_id, after)

    @router.get(
        "/v1/sessions/{session_id}/wakes/stream",
        response_class=EventSourceResponse,
        responses=JSON_ERROR_RESPONSES,  # errors are JSON, not events
    )
    async def stream_wakes(
        session_id: Annotated[str, Depends(known_session)],
        after: Annotated[int | None, Query(ge=0)] = None,
        last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    ) -> AsyncIterator[ServerSentEvent]:
        """Server-sent events: one ``wake`` event per wake of the session, its ``id`` the wake's
        seq. Reconnect with Last-Event-ID (or ``after``) to get the ones missed meanwhile."""
        if last_event_id is not None and last_event_id.strip().isdigit():
            after = int(last_event_id)
        async for wake in plane.wakes.stream(session_id, after):
            yield ServerSentEvent(data=wake.model_dump(mode="json"), event="wake", id=str(wake.seq))

    # ------------------------------------------------------------------ agents

    @router.post("/v1/agents/{agent_id}/children")
    async def create_child(agent_id: str) -> AgentView:
        return await plane.sessions.create_child(agent_id)

    # ------------------------------------------------------------------ inbox

    @router.get("/v1/inbox")
    async def inbox(
        response: Response,
        agent: AgentHeader = None,
        unread_only: bool = False,
        after: Annotated[str | None, Query(description=PAGE_AFTER)] = None,
        limit: PageLimit = DEFAULT_LIST_PAGE,
    ) -> list[NoticeView]:
        """One page, oldest first; a full page may have more: ask again with ``after``."""
        page = await plane.inbox.notices(agent, unread_only, after, limit)
        _next(response, [n.notice_id for n in page], limit)
        return page

    @router.post("/v1/inbox/read", openapi_extra=body_doc(MarkReadRequest))
    async def inbox_read(
        *, agent: AgentHeader = None, request: Annotated[MarkReadRequest, body_of(MarkReadRequest)]
    ) -> MarkReadResult:
        return MarkReadResult(marked=await plane.inbox.mark_read(agent, request.notice_ids))

    # ------------------------------------------------------------------ timers

    @router.get("/v1/timers")
    async def timer_list(
        response: Response,
        agent: AgentHeader = None,
        state: str | None = None,
        after: Annotated[str | None, Query(description=PAGE_AFTER)] = None,
        limit: PageLimit = DEFAULT_LIST_PAGE,
    ) -> list[TimerView]:
        """One page by firing time; a full page may have more: ask again with ``after``."""
        page = await plane.timers.list_timers(agent, state, after, limit)
        _next(response, [t.timer_id for t in page], limit)
        return page

    # ------------------------------------------------------------------ webhooks

    # A session or agent token registers webhooks for its own session only (default: it).

    @router.post("/v1/webhooks", openapi_extra=body_doc(WebhookRequest))
    async def add_webhook(
        who: PrincipalDep, request: Annotated[WebhookRequest, body_of(WebhookRequest)]
    ) -> WebhookView:
        if not who.is_admin:
            request.session_id = request.session_id or who.session_id
            plane.tokens.check_session(who, str(request.session_id))
        return await plane.wakes.add_webhook(request)

    @router.get("/v1/webhooks")
    async def list_webhooks(who: PrincipalDep) -> list[WebhookView]:
        found = await plane.wakes.list_webhooks()
        return [w for w in found if who.is_admin or w.session_id == who.session_id]

    @router.delete("/v1/webhooks/{webhook_id}")
    async def remove_webhook(webhook_id: str, who: PrincipalDep) -> WebhookView:
        if not who.is_admin:
            mine = {w.webhook_id for w in await list_webhooks(who)}
            if webhook_id not in mine:
                raise NotFound(f"no webhook {webhook_id!r}; list them with GET /v1/webhooks")
        return await plane.wakes.remove_webhook(webhook_id)

    return router

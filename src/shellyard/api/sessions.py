"""REST endpoints of sessions, agents (the host's turn protocol), the inbox, wakes (webhook
registration, a server-sent events stream per session) and timers. ``create_app`` mounts them
behind the same bearer token. Agent-level calls (inbox, timers) act for the agent named in the
``X-Shellyard-Agent`` header, the default session's main agent without it.

No ``from __future__ import annotations`` here: FastAPI must resolve ``Depends(known_session)``,
a local function, when the routes are declared."""

from collections.abc import AsyncIterator
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Header, Query, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent
from pydantic import BaseModel, ValidationError

from shellyard.api.auth import AgentHeader, PrincipalDep, admin_only
from shellyard.api.docs import JSON_ERROR_RESPONSES, body_doc
from shellyard.contract import rawjson
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
from shellyard.errors import InvalidInput, NotFound, validation_message

M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], body: dict[str, Any]) -> M:
    """Validate a request body into one clear InvalidInput (a lone surrogate too; a name's
    raw bytes, U+DC80..U+DCFF, pass: docs/files-and-transfers.md)."""
    rawjson.refuse_surrogates(body, raw_bytes=True)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise InvalidInput(validation_message(exc)) from None


#: A list's page size (docs/security.md "Limits at each door").
PageLimit = Annotated[int, Query(ge=1, le=MAX_LIST_PAGE)]
PAGE_AFTER = "the last id of the previous page (its X-Shellyard-Next-After), for the next page"
#: Set on a full page: the id to pass as ``after`` for the next one.
NEXT_AFTER_HEADER = "X-Shellyard-Next-After"


def _next(response: Response, ids: list[str], limit: int) -> None:
    if len(ids) >= limit:
        response.headers[NEXT_AFTER_HEADER] = ids[-1]


def sessions_router(plane: ControlPlane) -> APIRouter:
    router = APIRouter()

    async def known_session(session_id: str, who: PrincipalDep) -> str:
        plane.tokens.check_session(who, session_id)
        await plane.sessions.session_row(session_id)  # NotFound before a stream starts
        return session_id

    # ------------------------------------------------------------------ sessions

    @router.post("/v1/sessions", dependencies=[Depends(admin_only)])
    async def create_session() -> SessionView:
        return await plane.sessions.create()

    @router.get("/v1/sessions")
    async def list_sessions(who: PrincipalDep) -> list[SessionView]:
        """Admin: every session; a session or agent token: its own."""
        found = await plane.sessions.list_sessions()
        return [s for s in found if who.is_admin or s.session_id == who.session_id]

    @router.get("/v1/sessions/{session_id}")
    async def get_session(session_id: str) -> SessionView:
        return await plane.sessions.get(session_id)

    @router.post("/v1/sessions/{session_id}/stop")
    async def stop_session(session_id: str) -> SessionView:
        return await plane.sessions.stop(session_id)

    @router.post("/v1/sessions/{session_id}/archive")
    async def archive_session(session_id: str) -> SessionView:
        return await plane.sessions.archive(session_id)

    @router.post("/v1/sessions/{session_id}/restore")
    async def restore_session(session_id: str) -> SessionView:
        return await plane.sessions.restore(session_id)

    @router.post("/v1/sessions/{session_id}/resume")
    async def resume_session(session_id: str) -> ResumeResult:
        return await plane.sessions.resume(session_id)

    @router.post("/v1/sessions/{session_id}/requests")
    async def user_request(session_id: str) -> ResumeResult:
        return await plane.sessions.user_request(session_id)

    @router.get("/v1/sessions/{session_id}/events")
    async def session_events(session_id: str) -> list[SessionEventView]:
        return await plane.sessions.events(session_id)

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

    @router.get("/v1/agents/{agent_id}")
    async def get_agent(agent_id: str) -> AgentView:
        return await plane.sessions.get_agent(agent_id)

    @router.post("/v1/agents/{agent_id}/children")
    async def create_child(agent_id: str) -> AgentView:
        return await plane.sessions.create_child(agent_id)

    @router.post("/v1/agents/{agent_id}/turn/begin")
    async def turn_begin(agent_id: str) -> AgentView:
        return await plane.sessions.turn_begin(agent_id)

    @router.post("/v1/agents/{agent_id}/turn/end")
    async def turn_end(agent_id: str) -> AgentView:
        return await plane.sessions.turn_end(agent_id)

    @router.post("/v1/agents/{agent_id}/stop")
    async def stop_agent(agent_id: str) -> AgentView:
        return await plane.sessions.stop_agent(agent_id)

    @router.post("/v1/agents/{agent_id}/resume")
    async def resume_agent(agent_id: str) -> AgentView:
        return await plane.sessions.resume_agent(agent_id)

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

    @router.get("/v1/inbox/summary")
    async def inbox_summary(agent: AgentHeader = None) -> InboxSummary:
        return await plane.inbox.summary(agent)

    @router.post("/v1/inbox/read", openapi_extra=body_doc(MarkReadRequest))
    async def inbox_read(body: dict[str, Any], agent: AgentHeader = None) -> MarkReadResult:
        request = parse(MarkReadRequest, body)
        return MarkReadResult(marked=await plane.inbox.mark_read(agent, request.notice_ids))

    # ------------------------------------------------------------------ timers

    @router.post("/v1/timers", openapi_extra=body_doc(TimerCreateRequest))
    async def timer_create(body: dict[str, Any], agent: AgentHeader = None) -> TimerView:
        return await plane.timers.create(agent, parse(TimerCreateRequest, body))

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

    @router.get("/v1/timers/{timer_id}")
    async def timer_get(timer_id: str, agent: AgentHeader = None) -> TimerView:
        return await plane.timers.get(agent, timer_id)

    @router.post("/v1/timers/{timer_id}/cancel")
    async def timer_cancel(timer_id: str, agent: AgentHeader = None) -> TimerView:
        return await plane.timers.cancel(agent, timer_id)

    # ------------------------------------------------------------------ webhooks

    # A session or agent token registers webhooks for its own session only (default: it).

    @router.post("/v1/webhooks", openapi_extra=body_doc(WebhookRequest))
    async def add_webhook(body: dict[str, Any], who: PrincipalDep) -> WebhookView:
        request = parse(WebhookRequest, body)
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

    @router.get("/v1/wakes/{wake_id}/deliveries")
    async def wake_deliveries(wake_id: str) -> list[DeliveryView]:
        return await plane.wakes.deliveries(wake_id)

    return router

"""Client operations of sessions, agents, the inbox, wakes and timers, mixed into ``Client`` and
``AsyncClient``. Each operation is described once (a ``_Call`` built by ``Calls``); the two
mixins only send it. Agent-level operations (inbox, timers) act for the client's agent
(``agent_id=`` or ``as_agent``); host operations name their session or agent explicitly."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Self, TypeVar

import httpx
from pydantic import TypeAdapter

from shellyard.session_model import (
    AgentView,
    DeliveryView,
    InboxSummary,
    MarkReadResult,
    NoticeView,
    ResumeResult,
    SessionEventView,
    SessionView,
    TimerView,
    WakeView,
    WebhookView,
)

if TYPE_CHECKING:
    from shellyard.interfaces.client import _Call

T = TypeVar("T")

_SESSION = TypeAdapter(SessionView)
_SESSIONS = TypeAdapter(list[SessionView])
_RESUME = TypeAdapter(ResumeResult)
_EVENTS = TypeAdapter(list[SessionEventView])
_AGENT = TypeAdapter(AgentView)
_NOTICES = TypeAdapter(list[NoticeView])
_SUMMARY = TypeAdapter(InboxSummary)
_MARKED = TypeAdapter(MarkReadResult)
_TIMER = TypeAdapter(TimerView)
_TIMERS = TypeAdapter(list[TimerView])
_WEBHOOK = TypeAdapter(WebhookView)
_WEBHOOKS = TypeAdapter(list[WebhookView])
_DELIVERIES = TypeAdapter(list[DeliveryView])
_WAKES = TypeAdapter(list[WakeView])


def _call(
    method: str,
    path: str,
    result: TypeAdapter[T],
    params: dict[str, Any] | None = None,
    body: Any = None,
) -> _Call[T]:
    from shellyard.interfaces.client import _Call  # client.py imports this module

    return _Call(method, path, result, params=params or {}, body=body)


def _present(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if v is not None}


class Calls:
    """The REST call of each operation."""

    @staticmethod
    def session(session_id: str, action: str = "") -> _Call[SessionView]:
        method = "POST" if action else "GET"
        return _call(method, f"/v1/sessions/{session_id}{action and '/' + action}", _SESSION)

    @staticmethod
    def resume(session_id: str, action: str) -> _Call[ResumeResult]:
        return _call("POST", f"/v1/sessions/{session_id}/{action}", _RESUME)

    @staticmethod
    def agent(agent_id: str, action: str = "") -> _Call[AgentView]:
        method = "POST" if action else "GET"
        return _call(method, f"/v1/agents/{agent_id}{action and '/' + action}", _AGENT)

    @staticmethod
    def timer_create(
        text: str, after_ms: int | None, at: str | None, execution_id: str | None
    ) -> _Call[TimerView]:
        body = {"text": text, "after_ms": after_ms, "at": at, "execution_id": execution_id}
        return _call("POST", "/v1/timers", _TIMER, body=_present(body))

    @staticmethod
    def timer_list(state: str | None) -> _Call[list[TimerView]]:
        return _call("GET", "/v1/timers", _TIMERS, params={"state": state} if state else None)

    @staticmethod
    def inbox(unread_only: bool) -> _Call[list[NoticeView]]:
        return _call("GET", "/v1/inbox", _NOTICES, params={"unread_only": unread_only})

    @staticmethod
    def mark_read(notice_ids: list[str] | None) -> _Call[MarkReadResult]:
        return _call("POST", "/v1/inbox/read", _MARKED, body={"notice_ids": notice_ids})

    @staticmethod
    def add_webhook(url: str, secret: str | None, session_id: str | None) -> _Call[WebhookView]:
        body = {"url": url, "secret": secret, "session_id": session_id}
        return _call("POST", "/v1/webhooks", _WEBHOOK, body=_present(body))


def parse_sse(lines: Iterable[str]) -> Iterator[dict[str, str]]:
    """Server-sent events (``event``, ``id``, ``data``) from a stream's lines."""
    event: dict[str, str] = {}
    for line in lines:
        if not line:
            if "data" in event:
                yield event
            event = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            event[key] = event[key] + "\n" + value if key == "data" and key in event else value


def _wake(event: dict[str, str]) -> WakeView | None:
    if event.get("event") != "wake":
        return None
    return WakeView.model_validate(json.loads(event["data"]))


def _stream_params(after: int | None) -> dict[str, Any]:
    return {} if after is None else {"after": after}


class SessionCalls:
    """Sessions, agents, inbox, wakes and timers for the synchronous ``Client``."""

    _http: httpx.Client

    def _send(self, call: _Call[T]) -> T:
        raise NotImplementedError

    def as_agent(self, agent_id: str) -> Self:
        """The same server, acting for ``agent_id`` (inbox, timers, executions)."""
        clone = copy.copy(self)
        clone._http = httpx.Client(
            base_url=self._http.base_url,
            headers={**self._http.headers, "X-Shellyard-Agent": agent_id},
            timeout=self._http.timeout,
        )
        return clone

    # sessions
    def create_session(self) -> SessionView:
        return self._send(_call("POST", "/v1/sessions", _SESSION))

    def sessions(self) -> list[SessionView]:
        return self._send(_call("GET", "/v1/sessions", _SESSIONS))

    def session(self, session_id: str) -> SessionView:
        return self._send(Calls.session(session_id))

    def stop_session(self, session_id: str) -> SessionView:
        return self._send(Calls.session(session_id, "stop"))

    def archive_session(self, session_id: str) -> SessionView:
        return self._send(Calls.session(session_id, "archive"))

    def restore_session(self, session_id: str) -> SessionView:
        return self._send(Calls.session(session_id, "restore"))

    def resume_session(self, session_id: str) -> ResumeResult:
        return self._send(Calls.resume(session_id, "resume"))

    def user_request(self, session_id: str) -> ResumeResult:
        """N9: a new user request: resumes a stopped session, begins the main agent's turn,
        and returns the summary of its unread notices."""
        return self._send(Calls.resume(session_id, "requests"))

    def session_events(self, session_id: str) -> list[SessionEventView]:
        return self._send(_call("GET", f"/v1/sessions/{session_id}/events", _EVENTS))

    # agents
    def agent(self, agent_id: str) -> AgentView:
        return self._send(Calls.agent(agent_id))

    def create_child(self, parent_id: str) -> AgentView:
        return self._send(Calls.agent(parent_id, "children"))

    def turn_begin(self, agent_id: str) -> AgentView:
        return self._send(Calls.agent(agent_id, "turn/begin"))

    def turn_end(self, agent_id: str) -> AgentView:
        return self._send(Calls.agent(agent_id, "turn/end"))

    def stop_agent(self, agent_id: str) -> AgentView:
        return self._send(Calls.agent(agent_id, "stop"))

    def resume_agent(self, agent_id: str) -> AgentView:
        return self._send(Calls.agent(agent_id, "resume"))

    # inbox
    def inbox(self, unread_only: bool = False) -> list[NoticeView]:
        return self._send(Calls.inbox(unread_only))

    def inbox_summary(self) -> InboxSummary:
        return self._send(_call("GET", "/v1/inbox/summary", _SUMMARY))

    def mark_read(self, notice_ids: list[str] | None = None) -> int:
        return self._send(Calls.mark_read(notice_ids)).marked

    # timers
    def timer_create(
        self,
        text: str,
        after_ms: int | None = None,
        at: str | None = None,
        execution_id: str | None = None,
    ) -> TimerView:
        return self._send(Calls.timer_create(text, after_ms, at, execution_id))

    def timer_list(self, state: str | None = None) -> list[TimerView]:
        return self._send(Calls.timer_list(state))

    def timer_get(self, timer_id: str) -> TimerView:
        return self._send(_call("GET", f"/v1/timers/{timer_id}", _TIMER))

    def timer_cancel(self, timer_id: str) -> TimerView:
        return self._send(_call("POST", f"/v1/timers/{timer_id}/cancel", _TIMER))

    # wakes
    def add_webhook(
        self, url: str, secret: str | None = None, session_id: str | None = None
    ) -> WebhookView:
        return self._send(Calls.add_webhook(url, secret, session_id))

    def webhooks(self) -> list[WebhookView]:
        return self._send(_call("GET", "/v1/webhooks", _WEBHOOKS))

    def remove_webhook(self, webhook_id: str) -> WebhookView:
        return self._send(_call("DELETE", f"/v1/webhooks/{webhook_id}", _WEBHOOK))

    def wake_deliveries(self, wake_id: str) -> list[DeliveryView]:
        return self._send(_call("GET", f"/v1/wakes/{wake_id}/deliveries", _DELIVERIES))

    def wakes(self, session_id: str, after: int = 0) -> list[WakeView]:
        return self._send(
            _call("GET", f"/v1/sessions/{session_id}/wakes", _WAKES, params={"after": after})
        )

    def wake_stream(self, session_id: str, after: int | None = None) -> Iterator[WakeView]:
        """The session's wakes as they happen (server-sent events); ``after`` a seq first
        replays the recorded ones after it. Runs until the server or the caller closes it."""
        from shellyard.interfaces.client import _decode

        path = f"/v1/sessions/{session_id}/wakes/stream"
        timeout = httpx.Timeout(30.0, read=None)
        with self._http.stream("GET", path, params=_stream_params(after), timeout=timeout) as r:
            if r.status_code >= 400:
                r.read()
                _decode(r, _call("GET", path, _WAKES))
            for event in parse_sse(r.iter_lines()):
                wake = _wake(event)
                if wake is not None:
                    yield wake


class AsyncSessionCalls:
    """For ``AsyncClient``: what an agent's tools and a host's loop use (sessions, turns,
    inbox, timers, the wake stream)."""

    _http: httpx.AsyncClient

    async def _send(self, call: _Call[T]) -> T:
        raise NotImplementedError

    def as_agent(self, agent_id: str) -> Self:
        clone = copy.copy(self)
        clone._http = httpx.AsyncClient(
            base_url=self._http.base_url,
            headers={**self._http.headers, "X-Shellyard-Agent": agent_id},
            timeout=self._http.timeout,
        )
        return clone

    async def create_session(self) -> SessionView:
        return await self._send(_call("POST", "/v1/sessions", _SESSION))

    async def session(self, session_id: str) -> SessionView:
        return await self._send(Calls.session(session_id))

    async def stop_session(self, session_id: str) -> SessionView:
        return await self._send(Calls.session(session_id, "stop"))

    async def user_request(self, session_id: str) -> ResumeResult:
        return await self._send(Calls.resume(session_id, "requests"))

    async def turn_begin(self, agent_id: str) -> AgentView:
        return await self._send(Calls.agent(agent_id, "turn/begin"))

    async def turn_end(self, agent_id: str) -> AgentView:
        return await self._send(Calls.agent(agent_id, "turn/end"))

    async def inbox(self, unread_only: bool = False) -> list[NoticeView]:
        return await self._send(Calls.inbox(unread_only))

    async def mark_read(self, notice_ids: list[str] | None = None) -> int:
        return (await self._send(Calls.mark_read(notice_ids))).marked

    async def timer_create(
        self,
        text: str,
        after_ms: int | None = None,
        at: str | None = None,
        execution_id: str | None = None,
    ) -> TimerView:
        return await self._send(Calls.timer_create(text, after_ms, at, execution_id))

    async def timer_list(self, state: str | None = None) -> list[TimerView]:
        return await self._send(Calls.timer_list(state))

    async def timer_cancel(self, timer_id: str) -> TimerView:
        return await self._send(_call("POST", f"/v1/timers/{timer_id}/cancel", _TIMER))

    async def wake_stream(
        self, session_id: str, after: int | None = None
    ) -> AsyncIterator[WakeView]:
        from shellyard.interfaces.client import _decode

        path = f"/v1/sessions/{session_id}/wakes/stream"
        timeout = httpx.Timeout(30.0, read=None)
        async with self._http.stream(
            "GET", path, params=_stream_params(after), timeout=timeout
        ) as r:
            if r.status_code >= 400:
                await r.aread()
                _decode(r, _call("GET", path, _WAKES))
            buffer: list[str] = []
            async for line in r.aiter_lines():
                buffer.append(line)
                if line == "":
                    for event in parse_sse(buffer):
                        wake = _wake(event)
                        if wake is not None:
                            yield wake
                    buffer = []

"""Client operations of sessions, agents, the inbox, wakes and timers, shared by ``Client`` and
``AsyncClient``. Each JSON operation is an ``Op`` (described once, sent by either client); only
the wake stream (server-sent events) is written per client. Agent-level operations (inbox,
timers) act for the client's agent (``agent_id=`` or ``as_agent``); host operations name their
session or agent explicitly."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import httpx
from pydantic import TypeAdapter

from shellyard.contract.sessions import (
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
from shellyard.errors import ShellyardError
from shellyard.sdk.answer_clock import MAX_JSON_BYTES
from shellyard.sdk.base import (
    AsyncSender,
    Op,
    SyncSender,
    _Call,
    call,
    error_abody,
    error_body,
    parse,
    raise_for,
)

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


def _session_action(action: str) -> Op[[str], SessionView]:
    def build(session_id: str) -> _Call[SessionView]:
        return call("POST", f"/v1/sessions/{session_id}/{action}", _SESSION)

    return Op(build)


def _resume_action(action: str, doc: str) -> Op[[str], ResumeResult]:
    def build(session_id: str) -> _Call[ResumeResult]:
        return call("POST", f"/v1/sessions/{session_id}/{action}", _RESUME)

    build.__doc__ = doc
    return Op(build)


def _agent_action(action: str) -> Op[[str], AgentView]:
    def build(agent_id: str) -> _Call[AgentView]:
        return call("POST", f"/v1/agents/{agent_id}/{action}", _AGENT)

    return Op(build)


def _get_session(session_id: str) -> _Call[SessionView]:
    return call("GET", f"/v1/sessions/{session_id}", _SESSION)


def _session_events(session_id: str) -> _Call[list[SessionEventView]]:
    return call("GET", f"/v1/sessions/{session_id}/events", _EVENTS)


def _get_agent(agent_id: str) -> _Call[AgentView]:
    return call("GET", f"/v1/agents/{agent_id}", _AGENT)


def _inbox(
    unread_only: bool = False, after: str | None = None, limit: int | None = None
) -> _Call[list[NoticeView]]:
    """One page of notices, oldest first (the server's page: 1000); a full page may have
    more: call again with ``after`` = its last notice id."""
    params = {"unread_only": unread_only, "after": after, "limit": limit}
    return call("GET", "/v1/inbox", _NOTICES, params)


def _mark_read(notice_ids: list[str] | None = None) -> _Call[MarkReadResult]:
    """Mark notices read (all of the agent's without ids); the result counts them."""
    return call("POST", "/v1/inbox/read", _MARKED, body={"notice_ids": notice_ids})


def _timer_create(
    text: str, after_ms: int | None = None, at: str | None = None, execution_id: str | None = None
) -> _Call[TimerView]:
    """A one-time reminder: after ``after_ms``, at ``at`` (ISO 8601 with a zone), or when an
    execution ends (``execution_id``)."""
    body = {"text": text, "after_ms": after_ms, "at": at, "execution_id": execution_id}
    return call("POST", "/v1/timers", _TIMER, body={k: v for k, v in body.items() if v is not None})


def _timer_list(
    state: str | None = None, after: str | None = None, limit: int | None = None
) -> _Call[list[TimerView]]:
    """One page of timers by firing time (1000); a full page may have more: call again with
    ``after`` = its last timer id."""
    return call("GET", "/v1/timers", _TIMERS, {"state": state, "after": after, "limit": limit})


def _timer_get(timer_id: str) -> _Call[TimerView]:
    return call("GET", f"/v1/timers/{timer_id}", _TIMER)


def _timer_cancel(timer_id: str) -> _Call[TimerView]:
    return call("POST", f"/v1/timers/{timer_id}/cancel", _TIMER)


def _add_webhook(
    url: str, secret: str | None = None, session_id: str | None = None
) -> _Call[WebhookView]:
    body = {"url": url, "secret": secret, "session_id": session_id}
    return call(
        "POST", "/v1/webhooks", _WEBHOOK, body={k: v for k, v in body.items() if v is not None}
    )


def _remove_webhook(webhook_id: str) -> _Call[WebhookView]:
    return call("DELETE", f"/v1/webhooks/{webhook_id}", _WEBHOOK)


def _wake_deliveries(wake_id: str) -> _Call[list[DeliveryView]]:
    return call("GET", f"/v1/wakes/{wake_id}/deliveries", _DELIVERIES)


def _wakes(session_id: str, after: int = 0) -> _Call[list[WakeView]]:
    return call("GET", f"/v1/sessions/{session_id}/wakes", _WAKES, {"after": after})


class SessionOps:
    """Sessions, agents, the host's turn protocol, the inbox, timers and webhooks."""

    # sessions
    create_session = Op(lambda: call("POST", "/v1/sessions", _SESSION))
    sessions = Op(lambda: call("GET", "/v1/sessions", _SESSIONS))
    session = Op(_get_session)
    stop_session = _session_action("stop")
    archive_session = _session_action("archive")
    restore_session = _session_action("restore")
    resume_session = _resume_action("resume", "Resume a stopped session.")
    user_request = _resume_action(
        "requests",
        "N9: a new user request: resumes a stopped session, begins the main agent's turn, "
        "and returns the summary of its unread notices.",
    )
    session_events = Op(_session_events)

    # agents
    agent = Op(_get_agent)
    create_child = _agent_action("children")
    turn_begin = _agent_action("turn/begin")
    turn_end = _agent_action("turn/end")
    stop_agent = _agent_action("stop")
    resume_agent = _agent_action("resume")

    # inbox
    inbox = Op(_inbox)
    inbox_summary = Op(lambda: call("GET", "/v1/inbox/summary", _SUMMARY))
    mark_notices_read = Op(_mark_read)

    # timers
    timer_create = Op(_timer_create)
    timer_list = Op(_timer_list)
    timer_get = Op(_timer_get)
    timer_cancel = Op(_timer_cancel)

    # wakes
    add_webhook = Op(_add_webhook)
    webhooks = Op(lambda: call("GET", "/v1/webhooks", _WEBHOOKS))
    remove_webhook = Op(_remove_webhook)
    wake_deliveries = Op(_wake_deliveries)
    wakes = Op(_wakes)


#: Most bytes of one server-sent event (its lines up to the blank line that ends it): a wake's
#: ``data`` is a JSON answer, so it has a JSON answer's bound (sdk/bounds.py). Without it, a
#: line without end or an event without its blank line (the stream has no read timeout: it
#: waits for wakes) grew the client's memory for ever (docs/security.md "Attack pass
#: (session 49)").
MAX_EVENT_BYTES = MAX_JSON_BYTES


class SseLines:
    """A byte stream's lines (``\r\n``, ``\n`` or ``\r`` ends one, as the SSE format says),
    at most :data:`MAX_EVENT_BYTES` from the end of one event to the end of the next."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = MAX_EVENT_BYTES if limit is None else limit
        self._pending = bytearray()
        self._event = 0  # bytes of the event's lines so far

    def feed(self, data: bytes) -> list[str]:
        pending = self._pending
        pending += data
        if len(pending) + self._event > self.limit:
            raise ShellyardError(
                f"a server-sent event of the wake stream passed {self.limit:,} bytes, the "
                "SDK's bound on one (a wake is a JSON answer); the stream was closed. Check "
                "the server's URL"
            )
        if b"\n" not in data and b"\r" not in data:
            return []  # a line still going: nothing to split (no quadratic re-scan)
        # a last \r waits for the next read: it may be the first half of a \r\n
        cut = len(pending) - 1 if pending.endswith(b"\r") else len(pending)
        lines = bytes(pending[:cut]).splitlines(keepends=True)
        held = bytes(pending[cut:])
        if lines and not lines[-1].endswith((b"\n", b"\r")):
            held = lines.pop() + held
        out: list[str] = []
        for line in lines:
            text = line.rstrip(b"\r\n")
            self._event = self._event + len(line) if text else 0
            out.append(text.decode("utf-8", "replace"))
        self._pending = bytearray(held)
        return out


def parse_sse(lines: Iterable[str]) -> Iterator[dict[str, str]]:
    """Server-sent events (``event``, ``id``, ``data``) from a stream's lines."""
    event: dict[str, str] = {}
    data: list[str] = []  # joined once: appending to a string copied it per line
    for line in lines:
        if not line:
            if data:
                yield {**event, "data": "\n".join(data)}
            event, data = {}, []
        elif not line.startswith(":"):
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if key == "data":
                data.append(value)
            else:
                event[key] = value


def _wake(event: dict[str, str]) -> WakeView | None:
    if event.get("event") != "wake":
        return None
    # parse: an event that is not a wake (not JSON, another shape) is the SDK's one error for
    # an answer it cannot read, never json's or pydantic's (docs/security.md, session 50)
    return parse(_WAKE, event["data"].encode())


_WAKE = TypeAdapter(WakeView)


def _stream_args(session_id: str, after: int | None) -> dict[str, Any]:
    return {
        "method": "GET",
        "url": f"/v1/sessions/{session_id}/wakes/stream",
        "params": {} if after is None else {"after": after},
        "timeout": httpx.Timeout(30.0, read=None),
    }


class SessionStreams(SyncSender):
    """The wake stream and ``mark_read`` for the synchronous ``Client``."""

    def mark_read(self, notice_ids: list[str] | None = None) -> int:
        """Mark notices read (all of the agent's without ids); returns how many."""
        return self._send(_mark_read(notice_ids)).marked

    def wake_stream(self, session_id: str, after: int | None = None) -> Iterator[WakeView]:
        """The session's wakes as they happen (server-sent events); ``after`` a seq first
        replays the recorded ones after it. Runs until the server or the caller closes it."""
        with self._http.stream(**_stream_args(session_id, after)) as response:
            if response.status_code >= 400:
                raise_for(response.status_code, error_body(response.iter_bytes()))
            # an event ends with a blank line: a last line without its end ends none
            lines = SseLines()
            chunks = (line for data in response.iter_bytes() for line in lines.feed(data))
            for event in parse_sse(chunks):
                wake = _wake(event)
                if wake is not None:
                    yield wake


class AsyncSessionStreams(AsyncSender):
    """The same for ``AsyncClient``."""

    async def mark_read(self, notice_ids: list[str] | None = None) -> int:
        return (await self._send(_mark_read(notice_ids))).marked

    async def wake_stream(
        self, session_id: str, after: int | None = None
    ) -> AsyncIterator[WakeView]:
        async with self._http.stream(**_stream_args(session_id, after)) as response:
            if response.status_code >= 400:
                raise_for(response.status_code, await error_abody(response.aiter_bytes()))
            lines, buffer = SseLines(), list[str]()
            async for data in response.aiter_bytes():
                for line in lines.feed(data):
                    buffer.append(line)
                    if line == "":
                        for event in parse_sse(buffer):
                            wake = _wake(event)
                            if wake is not None:
                                yield wake
                        buffer = []

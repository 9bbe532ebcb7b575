"""Request and result models of sessions, agents, the inbox, wakes and timers (N1–N11), shared
by every interface (REST, MCP, SDK, CLI) like ``contract.executions``."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SessionState(StrEnum):
    active = "active"
    stopped = "stopped"
    archived = "archived"


class TimerState(StrEnum):
    pending = "pending"
    fired = "fired"
    cancelled = "cancelled"


class AgentView(BaseModel):
    agent_id: str
    session_id: str
    parent_id: str | None
    is_main: bool
    #: ``idle`` or ``busy`` (in a turn: begun by the host, or by a wake).
    state: str
    #: The agent's wake gate: ``open``, or ``closed`` while it is stopped (N8, N10).
    gate: str
    created_at: float


class SessionView(BaseModel):
    session_id: str
    state: SessionState
    main_agent_id: str
    is_default: bool
    created_at: float
    agents: list[AgentView] = Field(default_factory=list)


class SessionEventView(BaseModel):
    seq: int
    session_id: str
    agent_id: str | None
    kind: str
    detail: dict[str, Any] | None
    created_at: float


class NoticeView(BaseModel):
    """One entry of an agent's durable inbox (N1)."""

    notice_id: str
    agent_id: str
    #: ``execution``, ``reminder``, ``transfer``, ... (any kind another part posts).
    kind: str
    subject_id: str
    summary: str
    payload: dict[str, Any] | None = None
    created_at: float
    read_at: float | None = None
    woke_at: float | None = None
    wake_id: str | None = None


class InboxSummary(BaseModel):
    """What a resumed session hands back (N9): the main agent's unread notices."""

    agent_id: str
    unread: int
    by_kind: dict[str, int]
    notices: list[NoticeView]
    #: The same as a few lines of text, ready to put in front of a model.
    text: str


class ResumeResult(BaseModel):
    session: SessionView
    #: False when the session was already active.
    resumed: bool
    summary: InboxSummary


class MarkReadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    notice_ids: list[str] | None = Field(
        default=None, description="the notices to mark read (default: every unread one)"
    )


class MarkReadResult(BaseModel):
    marked: int


class WakeView(BaseModel):
    """A wake (N2): the agent to start a turn for and the notices that caused it. Every
    channel (webhook body, SSE ``data``, Python callback) gets exactly this."""

    type: str = "wake"
    wake_id: str
    seq: int
    session_id: str
    agent_id: str
    parent_agent_id: str | None
    is_main: bool
    #: What let it out: ``notice``, ``turn_end``, ``resume``, ``channel`` or ``start``.
    reason: str
    created_at: float
    notices: list[NoticeView]


class WebhookRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=2000)
    #: The HMAC-SHA256 key; generated (and returned once) when not given.
    secret: str | None = Field(default=None, min_length=16, max_length=256)
    #: Only this session's wakes; None: every session's.
    session_id: str | None = None

    @model_validator(mode="after")
    def _check(self) -> WebhookRequest:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, not {self.url!r}")
        return self


class WebhookView(BaseModel):
    webhook_id: str
    url: str
    session_id: str | None
    active: bool
    created_at: float
    #: Only in the answer to the registration.
    secret: str | None = None


class DeliveryAttemptView(BaseModel):
    number: int
    started_at: float
    finished_at: float | None
    status_code: int | None
    error: str | None


class DeliveryView(BaseModel):
    delivery_id: str
    wake_id: str
    webhook_id: str
    #: ``pending`` (being tried), ``delivered`` or ``failed`` (attempts exhausted).
    state: str
    attempts: int
    delivered_at: float | None
    last_error: str | None
    attempt_log: list[DeliveryAttemptView]


#: Keys that ask for a recurring timer; refused with a clear message (N5).
RECURRING_KEYS = ("every", "interval", "cron", "repeat", "recurring", "rrule", "schedule")


class TimerCreateRequest(BaseModel):
    """N5: ``text`` and exactly one of ``after_ms`` or ``at``; optional ``execution_id``."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=10_000, description="what the reminder says")
    after_ms: int | None = Field(default=None, description="fire this many ms from now")
    at: str | None = Field(
        default=None,
        description="fire at this ISO-8601 time with an offset (or ...[Area/City] zone)",
    )
    execution_id: str | None = Field(
        default=None, description="cancel the reminder if this execution finishes first"
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_recurring(cls, data: Any) -> Any:
        if isinstance(data, dict):
            asked = [key for key in RECURRING_KEYS if key in data]
            if asked:
                raise ValueError(
                    f"timers are one-time only ({', '.join(asked)} is not supported); create "
                    "one timer with after_ms or at, and a new one when it has fired"
                )
        return data


#: Notices or timers in one page of a list (docs/security.md "Limits at each door").
DEFAULT_LIST_PAGE = 1000
MAX_LIST_PAGE = 5000
_AFTER = "the last id of the previous page (its next_after), for the next page"


class TimerListRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    state: str | None = Field(default=None, description="only pending, fired or cancelled ones")
    after: str | None = Field(default=None, description=_AFTER)


class TimerCancelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    timer_id: str = Field(description="a timer id (tm_...) from timer_create")


class InboxListRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # The MCP tool shows unread notices by default (what an agent acts on); REST's
    # GET /v1/inbox lists all unless asked, as it did before this model existed.
    unread_only: bool = Field(default=True, description="only notices not yet marked read")
    after: str | None = Field(default=None, description=_AFTER)


class TimerView(BaseModel):
    timer_id: str
    agent_id: str
    session_id: str
    text: str
    #: What the caller asked for: {"after_ms": n} or {"at": "..."}.
    spec: dict[str, Any]
    fire_at: float
    #: ``fire_at`` as ISO-8601 UTC, for people and models.
    fire_at_utc: str
    execution_id: str | None
    state: TimerState
    #: Fired after the service was down at its time, or far behind it (N7).
    late: bool
    cancel_reason: str | None
    created_at: float
    fired_at: float | None
    cancelled_at: float | None

"""Result models of the session-wide reads behind the web page's session file panel (docs/web.md),
shared by any door that wants them: executions of every agent of a session, paged newest
first, and what changed in a session (the live stream's events)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from shellyard.contract.executions import ExecutionView

#: Largest page of ``GET /v1/sessions/{id}/executions``.
MAX_EXECUTION_PAGE = 500
#: Parts of the panel a change event can name.
PANEL_PARTS = (
    "session",
    "agents",
    "executions",
    "transfers",
    "timers",
    "notices",
    "files",
    "artifacts",
)


class ExecutionPage(BaseModel):
    """One page of a session's executions, newest first."""

    session_id: str
    executions: list[ExecutionView]
    #: Pass as ``before_seq`` for the next (older) page; None on the last page.
    next_before_seq: int | None = None
    #: Executions of the session (visible to the caller) per state, and in all.
    counts: dict[str, int] = Field(default_factory=dict)
    total: int = 0


class PanelChange(BaseModel):
    """One event of ``GET /v1/sessions/{id}/panel/stream``: the parts that changed since the
    previous event (every part in the first event of a connection: read them all)."""

    session_id: str
    parts: list[str]
    #: True on the first event of a connection (also after a reconnect).
    initial: bool = False

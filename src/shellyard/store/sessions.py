"""Sessions and their agents (N8–N11): lifecycle, events, and a user's request."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shellyard.errors import Conflict
from shellyard.store.db import Database, Row, fetch_all, fetch_one, insert_returning, new_id
from shellyard.store.notices import Notice
from shellyard.store.owners import Agent, Session, insert_agent
from shellyard.store.records import from_row, from_rows, maybe
from shellyard.store.schema import (
    agents,
    notices,
    session_events,
    sessions,
    timers,
)
from shellyard.store.wakes import PayloadBuilder, record_wake


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionEvent:
    """A ``session_events`` row: what changed a session or one of its agents, in order."""

    seq: int
    session_id: str
    agent_id: str | None
    kind: str
    detail: dict[str, Any] | None
    created_at: float


class SessionRecords(Database):
    """Sessions, agents' state, session events."""

    async def create_session(self) -> tuple[Session, Agent]:
        """A new session with its main agent; both recorded as events."""
        session, agent = await self.run(_create_session)
        return from_row(Session, session), from_row(Agent, agent)

    async def get_session(self, session_id: str) -> Session | None:
        row = await self.one(sa.select(sessions).where(sessions.c.id == session_id))
        return maybe(Session, row)

    async def list_sessions(self) -> list[Session]:
        return from_rows(
            Session, await self.all(sa.select(sessions).order_by(sessions.c.created_at))
        )

    async def list_agents(self, session_id: str) -> list[Agent]:
        rows = await self.all(
            sa.select(agents).where(agents.c.session_id == session_id).order_by(agents.c.created_at)
        )
        return from_rows(Agent, rows)

    async def create_child(self, parent: Agent) -> Agent:
        return from_row(Agent, await self.run(_create_child, parent))

    async def change_session(
        self, session_id: str, to_state: str, event_kind: str, cancel_timers: str | None
    ) -> Session:
        """Move a session to ``to_state`` and record the event; with ``cancel_timers`` (the
        reason) its pending timers are cancelled in the same transaction (N8)."""
        row = await self.run(_change_session, session_id, to_state, event_kind, cancel_timers)
        return from_row(Session, row)

    async def change_agent(
        self, agent_id: str, values: dict[str, Any], event_kind: str | None = None
    ) -> Agent:
        return from_row(Agent, await self.run(_change_agent, agent_id, values, event_kind))

    async def user_request(
        self, session_id: str, build_payload: PayloadBuilder
    ) -> tuple[Session, bool, list[Notice]]:
        """N9: resume the session, open the main agent's gate and begin its turn; return
        (session, resumed, its unread notices). The unread notices no wake delivered yet are
        delivered by this summary (a wake with reason ``summary``), so none wakes later."""
        return await self.run(_user_request, session_id, build_payload)

    async def session_events(self, session_id: str) -> list[SessionEvent]:
        rows = await self.all(
            sa.select(session_events)
            .where(session_events.c.session_id == session_id)
            .order_by(session_events.c.seq)
        )
        return from_rows(SessionEvent, rows)


# ---------------------------------------------------------------------- operations
# Each runs inside one transaction on ``conn``.


def _event(
    conn: Connection,
    session_id: str,
    kind: str,
    agent_id: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    conn.execute(
        session_events.insert().values(
            session_id=session_id,
            agent_id=agent_id,
            kind=kind,
            detail=detail,
            created_at=time.time(),
        )
    )


def _create_session(conn: Connection) -> tuple[Row, Row]:
    now = time.time()
    session_id, agent_id = new_id("ses"), new_id("agt")
    conn.execute(
        sessions.insert().values(
            id=session_id, state="active", main_agent_id=agent_id, is_default=False, created_at=now
        )
    )
    agent = insert_returning(
        conn,
        agents,
        {
            "id": agent_id,
            "session_id": session_id,
            "parent_id": None,
            "state": "idle",
            "gate": "open",
            "created_at": now,
        },
    )
    _event(conn, session_id, "session_created", agent_id)
    session = fetch_one(conn, sa.select(sessions).where(sessions.c.id == session_id))
    assert session is not None
    return session, agent


def _create_child(conn: Connection, parent: Agent) -> Row:
    child = insert_agent(conn, parent.session_id, parent.id)
    _event(conn, parent.session_id, "agent_created", str(child["id"]), {"parent": parent.id})
    return child


def _change_session(
    conn: Connection, session_id: str, to_state: str, event_kind: str, cancel_timers: str | None
) -> Row:
    now = time.time()
    detail: dict[str, Any] = {}
    if cancel_timers is not None:
        cancelled = conn.execute(
            timers.update()
            .where(timers.c.session_id == session_id, timers.c.state == "pending")
            .values(state="cancelled", cancel_reason=cancel_timers, cancelled_at=now)
        )
        detail["timers_cancelled"] = cancelled.rowcount
    if to_state != "active":  # no turn runs in a stopped or archived session
        conn.execute(agents.update().where(agents.c.session_id == session_id).values(state="idle"))
    conn.execute(sessions.update().where(sessions.c.id == session_id).values(state=to_state))
    _event(conn, session_id, event_kind, None, detail or None)
    row = fetch_one(conn, sa.select(sessions).where(sessions.c.id == session_id))
    assert row is not None
    return row


def _change_agent(
    conn: Connection, agent_id: str, values: dict[str, Any], event_kind: str | None
) -> Row:
    conn.execute(agents.update().where(agents.c.id == agent_id).values(**values))
    row = fetch_one(conn, sa.select(agents).where(agents.c.id == agent_id))
    assert row is not None
    if event_kind is not None:
        _event(conn, str(row["session_id"]), event_kind, agent_id)
    return row


def _user_request(
    conn: Connection, session_id: str, build_payload: PayloadBuilder
) -> tuple[Session, bool, list[Notice]]:
    found = fetch_one(conn, sa.select(sessions).where(sessions.c.id == session_id))
    assert found is not None
    session = from_row(Session, found)
    if session.state == "archived":
        raise Conflict(
            f"session {session_id} is archived; restore it first (shellyard session restore "
            f"{session_id}), then send the request"
        )
    resumed = session.state == "stopped"
    if resumed:
        session = from_row(
            Session, _change_session(conn, session_id, "active", "session_resumed", None)
        )
    main_id = session.main_agent_id
    main = fetch_one(conn, sa.select(agents).where(agents.c.id == main_id))
    assert main is not None
    if main["gate"] != "open":  # the user talks to the main agent: that reopens it
        _change_agent(conn, main_id, {"gate": "open"}, "agent_resumed")
    agent = from_row(Agent, _change_agent(conn, main_id, {"state": "busy"}, None))
    _event(conn, session_id, "user_request", main_id, {"resumed": resumed})
    unread = from_rows(
        Notice,
        fetch_all(
            conn,
            sa.select(notices)
            .where(notices.c.agent_id == main_id, notices.c.read_at.is_(None))
            .order_by(notices.c.created_at, notices.c.id),
        ),
    )
    fresh = [n for n in unread if n.woke_at is None]
    recorded = record_wake(conn, "summary", session, agent, fresh, build_payload) if fresh else None
    if recorded is not None:
        claimed = {n.id: n for n in recorded[1]}
        unread = [claimed.get(n.id, n) for n in unread]
    return session, resumed, unread

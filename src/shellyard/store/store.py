"""The Store: every read and write of the control plane's records.

One class over SQLAlchemy Core serves SQLite (default, WAL) and PostgreSQL through the same
schema; Alembic migrations run on ``open()``. Each operation is a synchronous function of a
``Connection`` run as one transaction by ``_run``:

- on SQLite it runs directly on the event-loop thread over one connection. A statement takes
  tens of microseconds, far less than a hop to a driver thread (aiosqlite cost ~15 thread
  round trips per execution, the largest share of a round trip: measured in bench/);
- on PostgreSQL it runs through the async driver (psycopg) with ``AsyncConnection.run_sync``,
  so network waits never block the loop.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from shellyard.errors import Conflict, InvalidInput
from shellyard.store import schema
from shellyard.store.schema import (
    agents,
    delivery_attempts,
    executions,
    notices,
    runners,
    session_events,
    sessions,
    snapshots,
    timers,
    wake_deliveries,
    wakes,
    webhooks,
    workspaces,
)

Row = Mapping[str, Any]
P = ParamSpec("P")
T = TypeVar("T")

TERMINAL_STATES = ("completed", "cancelled", "failed", "unknown")
ACTIVE_STATES = ("queued", "running")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


def normalize_url(database_url: str) -> tuple[str, bool]:
    """(SQLAlchemy URL, is_sqlite) for a plain URL, with the drivers this project ships."""
    if database_url.startswith("sqlite:///"):
        return database_url, True
    for plain in ("postgresql://", "postgres://", "postgresql+psycopg://"):
        if database_url.startswith(plain):
            return "postgresql+psycopg://" + database_url[len(plain) :], False
    raise InvalidInput(
        f"unsupported database URL {database_url!r}: use sqlite:///PATH or "
        "postgresql://USER@HOST:PORT/DB"
    )


class Store:
    def __init__(
        self,
        *,
        sync_engine: Engine | None = None,
        async_engine: AsyncEngine | None = None,
        schema_name: str | None = None,
    ) -> None:
        self._sync = sync_engine
        self._async = async_engine
        self.schema_name = schema_name
        self.is_sqlite = sync_engine is not None
        #: Called with the agent id after ``add_notice`` posted a notice (wakes hook in, N2).
        self.notice_listeners: list[Callable[[str], Awaitable[Any]]] = []

    # ------------------------------------------------------------------ setup

    @classmethod
    async def open(cls, database_url: str, *, schema_name: str | None = None) -> Store:
        """Connect and apply migrations. ``schema_name`` (PostgreSQL only) keeps a test run's
        tables apart from every other run's."""
        url, is_sqlite = normalize_url(database_url)
        if is_sqlite:
            # One connection: SQLite allows one writer at a time anyway, and a single
            # connection never meets SQLITE_BUSY from its own process.
            engine = sa.create_engine(
                url, pool_size=1, max_overflow=0, connect_args={"timeout": 30}
            )
            event.listen(engine, "connect", _sqlite_pragmas)
            store = cls(sync_engine=engine)
        else:
            options: dict[str, Any] = {}
            if schema_name:
                options["connect_args"] = {"options": f"-csearch_path={schema_name}"}
            async_engine = create_async_engine(url, pool_size=10, max_overflow=20, **options)
            store = cls(async_engine=async_engine, schema_name=schema_name)
        await store._run(_migrate, schema_name)
        return store

    async def close(self) -> None:
        if self._sync is not None:
            self._sync.dispose()
        if self._async is not None:
            await self._async.dispose()

    async def _run(
        self, operation: Callable[Concatenate[Connection, P], T], *args: P.args, **kw: P.kwargs
    ) -> T:
        """Run ``operation(conn, ...)`` as one transaction (rolled back if it raises)."""
        if self._sync is not None:
            with self._sync.begin() as conn:
                return operation(conn, *args, **kw)
        assert self._async is not None
        async with self._async.begin() as aconn:
            return await aconn.run_sync(lambda conn: operation(conn, *args, **kw))

    async def _one(self, stmt: sa.Select[Any]) -> Row | None:
        return await self._run(_fetch_one, stmt)

    async def _all(self, stmt: sa.Select[Any]) -> list[Row]:
        return await self._run(_fetch_all, stmt)

    # ------------------------------------------------------------------ owners

    async def default_owner(self) -> tuple[Row, Row]:
        """The default session and its main agent, created on first use."""
        return await self._run(_default_owner)

    async def create_agent(self, session_id: str, parent_id: str | None = None) -> Row:
        """A child agent (or another agent of a session); the full lifecycle is a later issue."""
        return await self._run(_create_agent, session_id, parent_id)

    async def get_agent(self, agent_id: str) -> Row | None:
        return await self._one(sa.select(agents).where(agents.c.id == agent_id))

    # ------------------------------------------------------------------ runners

    async def upsert_runner(
        self, runner_id: str, kind: str, address: str | None, token: str | None
    ) -> Row:
        return await self._run(_upsert_runner, runner_id, kind, address, token)

    async def get_runner(self, runner_id: str) -> Row | None:
        return await self._one(sa.select(runners).where(runners.c.id == runner_id))

    async def list_runners(self) -> list[Row]:
        return await self._all(sa.select(runners).order_by(runners.c.created_at))

    # ------------------------------------------------------------------ workspaces

    async def workspace_for(self, agent_id: str, runner_id: str) -> tuple[Row, bool]:
        """The (agent, runner) workspace, created on first use. Returns (row, created)."""
        return await self._run(_workspace_for, agent_id, runner_id)

    async def get_workspace(self, workspace_id: str) -> Row | None:
        return await self._one(sa.select(workspaces).where(workspaces.c.id == workspace_id))

    async def release_writer(self, workspace_id: str, holder_id: str) -> bool:
        return await self._run(_release_writer, workspace_id, holder_id)

    async def take_writer(self, workspace_id: str, kind: str, holder_id: str) -> bool:
        return await self._run(_take_writer, workspace_id, kind, holder_id)

    async def record_snapshot(
        self,
        workspace_id: str,
        seq: int,
        root_hash: str,
        files: int,
        size: int,
        made_by_kind: str,
        made_by_id: str | None,
    ) -> None:
        """W3: the head only moves forward; a late update never moves it back."""
        await self._run(
            _record_snapshot, workspace_id, seq, root_hash, files, size, made_by_kind, made_by_id
        )

    async def list_snapshots(self, workspace_id: str) -> list[Row]:
        return await self._all(
            sa.select(snapshots)
            .where(snapshots.c.workspace_id == workspace_id)
            .order_by(snapshots.c.seq)
        )

    # ------------------------------------------------------------------ executions

    async def submit_execution(
        self, values: dict[str, Any], *, queue: bool
    ) -> tuple[Row, str | None]:
        """Insert the record and take the workspace writer in one transaction (W1).

        Returns (record, holder). When the writer is held and ``queue`` is false nothing is
        recorded and the holder's id comes back; with ``queue`` the record stays ``queued``.
        """
        try:
            return await self._run(_submit, values, queue)
        except _Refused as refused:
            return values, refused.holder

    async def get_execution(self, execution_id: str) -> Row | None:
        return await self._one(sa.select(executions).where(executions.c.id == execution_id))

    async def find_idempotent(self, agent_id: str, key: str) -> Row | None:
        return await self._one(
            sa.select(executions).where(
                executions.c.agent_id == agent_id, executions.c.idempotency_key == key
            )
        )

    async def update_execution(
        self, execution_id: str, *, from_states: Sequence[str] = ACTIVE_STATES, **values: Any
    ) -> bool:
        """Update only while the record is in ``from_states``: a terminal record is never
        rewritten by a late update (W3, E7 "returns its terminal record unchanged")."""
        return await self._run(_update_execution, execution_id, tuple(from_states), values)

    async def start_execution(self, execution_id: str, started_at: float) -> Row | None:
        """Mark a record running and return it, in one transaction."""
        return await self._run(_start_execution, execution_id, started_at)

    async def finish_execution(
        self,
        row: Row,
        values: dict[str, Any],
        notice_summary: str,
        notice_read: bool,
        from_states: Sequence[str],
    ) -> tuple[Row | None, Row | None]:
        """Make a record terminal, post its notice, release its writer and find the next
        queued writer of its workspace: one transaction. Returns (final record or None when
        it was already terminal, next queued record)."""
        return await self._run(
            _finish_execution, row, values, notice_summary, notice_read, tuple(from_states)
        )

    async def next_queued(self, workspace_id: str) -> Row | None:
        return await self._run(_next_queued, workspace_id)

    async def active_executions(self) -> list[Row]:
        return await self._all(
            sa.select(executions)
            .where(executions.c.state.in_(ACTIVE_STATES))
            .order_by(executions.c.seq)
        )

    async def list_executions(self, agent_id: str | None = None, limit: int = 100) -> list[Row]:
        stmt = sa.select(executions).order_by(executions.c.seq.desc()).limit(limit)
        if agent_id is not None:
            stmt = stmt.where(executions.c.agent_id == agent_id)
        return await self._all(stmt)

    # ------------------------------------------------------------------ notices

    async def add_notice(
        self,
        agent_id: str,
        kind: str,
        subject_id: str,
        summary: str,
        payload: dict[str, Any] | None = None,
    ) -> None:
        """N1: one notice per (kind, subject); a repeated post is a no-op."""
        await self._run(_add_notice, agent_id, kind, subject_id, summary, payload, None)
        for listener in self.notice_listeners:
            await listener(agent_id)

    async def mark_notice_read(self, kind: str, subject_id: str) -> None:
        await self._run(_mark_notice_read, kind, subject_id)

    async def list_notices(self, agent_id: str, unread_only: bool = False) -> list[Row]:
        stmt = sa.select(notices).where(notices.c.agent_id == agent_id)
        if unread_only:
            stmt = stmt.where(notices.c.read_at.is_(None))
        return await self._all(stmt.order_by(notices.c.created_at))

    # ------------------------------------------------------------------ sessions (N8–N11)

    async def create_session(self) -> tuple[Row, Row]:
        """A new session with its main agent; both recorded as events."""
        return await self._run(_create_session)

    async def get_session(self, session_id: str) -> Row | None:
        return await self._one(sa.select(sessions).where(sessions.c.id == session_id))

    async def list_sessions(self) -> list[Row]:
        return await self._all(sa.select(sessions).order_by(sessions.c.created_at))

    async def list_agents(self, session_id: str) -> list[Row]:
        return await self._all(
            sa.select(agents).where(agents.c.session_id == session_id).order_by(agents.c.created_at)
        )

    async def create_child(self, parent: Row) -> Row:
        return await self._run(_create_child, parent)

    async def change_session(
        self, session_id: str, to_state: str, event_kind: str, cancel_timers: str | None
    ) -> Row:
        """Move a session to ``to_state`` and record the event; with ``cancel_timers`` (the
        reason) its pending timers are cancelled in the same transaction (N8)."""
        return await self._run(_change_session, session_id, to_state, event_kind, cancel_timers)

    async def change_agent(
        self, agent_id: str, values: dict[str, Any], event_kind: str | None = None
    ) -> Row:
        return await self._run(_change_agent, agent_id, values, event_kind)

    async def user_request(
        self, session_id: str, build_payload: PayloadBuilder
    ) -> tuple[Row, bool, list[Row]]:
        """N9: resume the session, open the main agent's gate and begin its turn; return
        (session, resumed, its unread notices). The unread notices no wake delivered yet are
        delivered by this summary (a wake with reason ``summary``), so none wakes later."""
        return await self._run(_user_request, session_id, build_payload)

    async def session_events(self, session_id: str) -> list[Row]:
        return await self._all(
            sa.select(session_events)
            .where(session_events.c.session_id == session_id)
            .order_by(session_events.c.seq)
        )

    async def mark_notices_read(self, agent_id: str, notice_ids: Sequence[str] | None) -> int:
        """Mark the agent's unread notices read (all of them when ``notice_ids`` is None)."""
        return await self._run(_mark_notices_read, agent_id, notice_ids)

    # ------------------------------------------------------------------ wakes (N2–N4)

    async def emit_wake(
        self,
        agent_id: str,
        reason: str,
        live_sessions: frozenset[str] | None,
        build_payload: PayloadBuilder,
    ) -> tuple[Row, list[str]] | None:
        """Claim the agent's unread, not yet woken notices for one wake and mark the agent busy,
        if it is idle and both gates are open and a channel listens (a session in
        ``live_sessions``, None meaning all, or a webhook). Returns (wake, delivery ids)."""
        try:
            return await self._run(_emit_wake, agent_id, reason, live_sessions, build_payload)
        except _NoWake:
            return None

    async def agents_to_wake(self) -> list[str]:
        """Idle agents with open gates and notices no wake delivered yet."""
        return await self._run(_agents_to_wake)

    async def list_wakes(self, session_id: str, after_seq: int = 0, limit: int = 1000) -> list[Row]:
        return await self._all(
            sa.select(wakes)
            .where(
                wakes.c.session_id == session_id,
                wakes.c.seq > after_seq,
                wakes.c.reason != "summary",
            )
            .order_by(wakes.c.seq)
            .limit(limit)
        )

    async def add_webhook(self, values: dict[str, Any]) -> Row:
        return await self._run(_insert_returning, webhooks, values)

    async def list_webhooks(self) -> list[Row]:
        """The active webhooks."""
        return await self._all(
            sa.select(webhooks).where(webhooks.c.active.is_(True)).order_by(webhooks.c.created_at)
        )

    async def deactivate_webhook(self, webhook_id: str) -> Row | None:
        return await self._run(_deactivate_webhook, webhook_id)

    async def pending_deliveries(self) -> list[str]:
        """Deliveries to (re)start; attempts a dead process left open are closed as interrupted."""
        return await self._run(_pending_deliveries)

    async def delivery_job(self, delivery_id: str) -> Row | None:
        """A delivery with its webhook's url and secret and the wake's payload."""
        return await self._one(
            sa.select(
                wake_deliveries,
                webhooks.c.url,
                webhooks.c.secret,
                webhooks.c.active,
                wakes.c.payload,
                wakes.c.seq,
            )
            .join(webhooks, webhooks.c.id == wake_deliveries.c.webhook_id)
            .join(wakes, wakes.c.id == wake_deliveries.c.wake_id)
            .where(wake_deliveries.c.id == delivery_id)
        )

    async def begin_attempt(self, delivery_id: str) -> int:
        """Record the start of the next attempt (before the request); returns its number."""
        return await self._run(_begin_attempt, delivery_id)

    async def end_attempt(
        self,
        delivery_id: str,
        number: int,
        status_code: int | None,
        error: str | None,
        state: str,
        next_attempt_at: float | None,
    ) -> None:
        await self._run(
            _end_attempt, delivery_id, number, status_code, error, state, next_attempt_at
        )

    async def wake_deliveries(self, wake_id: str) -> list[tuple[Row, list[Row]]]:
        return await self._run(_wake_deliveries, wake_id)

    # ------------------------------------------------------------------ timers (N5–N7)

    async def create_timer(self, values: dict[str, Any]) -> Row:
        return await self._run(_insert_returning, timers, values)

    async def get_timer(self, timer_id: str) -> Row | None:
        return await self._one(sa.select(timers).where(timers.c.id == timer_id))

    async def list_timers(self, agent_id: str, state: str | None = None) -> list[Row]:
        stmt = sa.select(timers).where(timers.c.agent_id == agent_id)
        if state is not None:
            stmt = stmt.where(timers.c.state == state)
        return await self._all(stmt.order_by(timers.c.fire_at, timers.c.id))

    async def cancel_timers(
        self, reason: str, *, timer_id: str | None = None, execution: Row | None = None
    ) -> list[Row]:
        """Cancel pending timers: one by id, or those naming a finished execution that had not
        come due when it finished (N6). Fired or cancelled timers never change."""
        return await self._run(_cancel_timers, reason, timer_id, execution)

    async def pending_timer_executions(self) -> set[str]:
        rows = await self._all(
            sa.select(timers.c.execution_id).where(
                timers.c.state == "pending", timers.c.execution_id.is_not(None)
            )
        )
        return {str(r["execution_id"]) for r in rows}

    async def due_timers(self, now: float) -> tuple[list[str], float | None]:
        """(ids of pending timers due at ``now`` in fire order, fire_at of the next one)."""
        return await self._run(_due_timers, now)

    async def fire_timer(self, timer_id: str, late_if_due_before: float) -> tuple[Row | None, bool]:
        """N7 exactly once: claim the pending timer (pending → fired) and post its reminder
        notice in one transaction; it is late if it was due before ``late_if_due_before``. A
        timer naming an execution that finished before the timer came due is cancelled
        instead (N6). Returns (timer after, whether it fired)."""
        return await self._run(_fire_timer, timer_id, late_if_due_before)


# ---------------------------------------------------------------------- operations
# Each runs inside one transaction on ``conn``.


def _fetch_one(conn: Connection, stmt: sa.Select[Any]) -> Row | None:
    row = conn.execute(stmt).mappings().first()
    return dict(row) if row is not None else None


def _fetch_all(conn: Connection, stmt: sa.Select[Any]) -> list[Row]:
    return [dict(r) for r in conn.execute(stmt).mappings().all()]


def _default_owner(conn: Connection) -> tuple[Row, Row]:
    session = _fetch_one(conn, sa.select(sessions).where(sessions.c.is_default.is_(True)))
    if session is None:
        now = time.time()
        session_id, agent_id = new_id("ses"), new_id("agt")
        conn.execute(
            sessions.insert().values(
                id=session_id,
                state="active",
                main_agent_id=agent_id,
                is_default=True,
                created_at=now,
            )
        )
        conn.execute(
            agents.insert().values(
                id=agent_id,
                session_id=session_id,
                parent_id=None,
                state="idle",
                gate="open",
                created_at=now,
            )
        )
        session = _fetch_one(conn, sa.select(sessions).where(sessions.c.id == session_id))
    assert session is not None
    agent = _fetch_one(conn, sa.select(agents).where(agents.c.id == session["main_agent_id"]))
    assert agent is not None
    return session, agent


def _create_agent(conn: Connection, session_id: str, parent_id: str | None) -> Row:
    agent_id = new_id("agt")
    conn.execute(
        agents.insert().values(
            id=agent_id,
            session_id=session_id,
            parent_id=parent_id,
            state="idle",
            gate="open",
            created_at=time.time(),
        )
    )
    row = _fetch_one(conn, sa.select(agents).where(agents.c.id == agent_id))
    assert row is not None
    return row


def _upsert_runner(
    conn: Connection, runner_id: str, kind: str, address: str | None, token: str | None
) -> Row:
    values = {"kind": kind, "address": address, "token": token, "state": "active"}
    updated = conn.execute(runners.update().where(runners.c.id == runner_id).values(**values))
    if not updated.rowcount:
        conn.execute(runners.insert().values(id=runner_id, created_at=time.time(), **values))
    row = _fetch_one(conn, sa.select(runners).where(runners.c.id == runner_id))
    assert row is not None
    return row


def _workspace_for(conn: Connection, agent_id: str, runner_id: str) -> tuple[Row, bool]:
    stmt = sa.select(workspaces).where(
        workspaces.c.agent_id == agent_id, workspaces.c.runner_id == runner_id
    )
    row = _fetch_one(conn, stmt)
    if row is not None:
        return row, False
    conn.execute(
        workspaces.insert().values(
            id=new_id("ws"),
            agent_id=agent_id,
            runner_id=runner_id,
            head_seq=0,
            created_at=time.time(),
        )
    )
    row = _fetch_one(conn, stmt)
    assert row is not None
    return row, True


def _take_writer(conn: Connection, workspace_id: str, kind: str, holder: str) -> bool:
    result = conn.execute(
        workspaces.update()
        .where(workspaces.c.id == workspace_id, workspaces.c.writer_id.is_(None))
        .values(writer_kind=kind, writer_id=holder)
    )
    return bool(result.rowcount)


def _release_writer(conn: Connection, workspace_id: str, holder_id: str) -> bool:
    result = conn.execute(
        workspaces.update()
        .where(workspaces.c.id == workspace_id, workspaces.c.writer_id == holder_id)
        .values(writer_kind=None, writer_id=None)
    )
    return bool(result.rowcount)


def _record_snapshot(
    conn: Connection,
    workspace_id: str,
    seq: int,
    root_hash: str,
    files: int,
    size: int,
    made_by_kind: str,
    made_by_id: str | None,
) -> None:
    exists = conn.execute(
        sa.select(snapshots.c.seq).where(
            snapshots.c.workspace_id == workspace_id, snapshots.c.seq == seq
        )
    ).first()
    if exists is None:
        conn.execute(
            snapshots.insert().values(
                workspace_id=workspace_id,
                seq=seq,
                root_hash=root_hash,
                made_by_kind=made_by_kind,
                made_by_id=made_by_id,
                files=files,
                bytes=size,
                created_at=time.time(),
            )
        )
    conn.execute(
        workspaces.update()
        .where(workspaces.c.id == workspace_id, workspaces.c.head_seq < seq)
        .values(head_seq=seq)
    )


class _Refused(Exception):
    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


def _submit(conn: Connection, values: dict[str, Any], queue: bool) -> tuple[Row, str | None]:
    next_seq = conn.execute(
        sa.select(sa.func.coalesce(sa.func.max(executions.c.seq), 0))
    ).scalar_one()
    values = {**values, "seq": next_seq + 1, "state": "queued", "created_at": time.time()}
    conn.execute(executions.insert().values(**values))
    queued_ahead = conn.execute(
        sa.select(executions.c.id)
        .where(
            executions.c.workspace_id == values["workspace_id"],
            executions.c.state == "queued",
            executions.c.id != values["id"],
        )
        .limit(1)
    ).first()
    taken = queued_ahead is None and _take_writer(
        conn, values["workspace_id"], "execution", values["id"]
    )
    holder = None
    if not taken:
        holder = (
            conn.execute(
                sa.select(workspaces.c.writer_id).where(workspaces.c.id == values["workspace_id"])
            ).scalar_one_or_none()
            or "a queued writer"
        )
        if not queue:
            raise _Refused(holder)  # rolls the insert back: nothing recorded half-way
    row = _fetch_one(conn, sa.select(executions).where(executions.c.id == values["id"]))
    assert row is not None
    return row, holder


def _update_execution(
    conn: Connection, execution_id: str, from_states: tuple[str, ...], values: dict[str, Any]
) -> bool:
    result = conn.execute(
        executions.update()
        .where(executions.c.id == execution_id, executions.c.state.in_(from_states))
        .values(**values)
    )
    return bool(result.rowcount)


def _start_execution(conn: Connection, execution_id: str, started_at: float) -> Row | None:
    _update_execution(
        conn, execution_id, ACTIVE_STATES, {"state": "running", "started_at": started_at}
    )
    return _fetch_one(conn, sa.select(executions).where(executions.c.id == execution_id))


def _next_queued(conn: Connection, workspace_id: str) -> Row | None:
    return _fetch_one(
        conn,
        sa.select(executions)
        .where(executions.c.workspace_id == workspace_id, executions.c.state == "queued")
        .order_by(executions.c.seq)
        .limit(1),
    )


def _finish_execution(
    conn: Connection,
    row: Row,
    values: dict[str, Any],
    notice_summary: str,
    notice_read: bool,
    from_states: tuple[str, ...],
) -> tuple[Row | None, Row | None]:
    execution_id, workspace_id = str(row["id"]), str(row["workspace_id"])
    final = None
    if _update_execution(conn, execution_id, from_states, values):
        final = _fetch_one(conn, sa.select(executions).where(executions.c.id == execution_id))
        assert final is not None
        _add_notice(
            conn,
            str(row["agent_id"]),
            "execution",
            execution_id,
            notice_summary,
            {"state": final["state"], "exit_code": final["exit_code"]},
            time.time() if notice_read else None,
        )
    _release_writer(conn, workspace_id, execution_id)
    return final, _next_queued(conn, workspace_id)


def _add_notice(
    conn: Connection,
    agent_id: str,
    kind: str,
    subject_id: str,
    summary: str,
    payload: dict[str, Any] | None,
    read_at: float | None,
) -> None:
    exists = conn.execute(
        sa.select(notices.c.id).where(notices.c.kind == kind, notices.c.subject_id == subject_id)
    ).first()
    if exists is not None:
        return
    conn.execute(
        notices.insert().values(
            id=new_id("ntc"),
            agent_id=agent_id,
            kind=kind,
            subject_id=subject_id,
            summary=summary,
            payload=payload,
            created_at=time.time(),
            read_at=read_at,
        )
    )


def _mark_notice_read(conn: Connection, kind: str, subject_id: str) -> None:
    conn.execute(
        notices.update()
        .where(
            notices.c.kind == kind,
            notices.c.subject_id == subject_id,
            notices.c.read_at.is_(None),
        )
        .values(read_at=time.time())
    )


def _migrate(conn: Connection, schema_name: str | None) -> None:
    if schema_name and conn.dialect.name != "sqlite":
        conn.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{schema_name}"'))
    config = Config()
    config.set_main_option("script_location", str(Path(schema.__file__).parent / "migrations"))
    config.attributes["connection"] = conn
    # "heads": feature branches of the schema may each add a revision on top of 0001.
    command.upgrade(config, "heads")


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # Freed pages can go back to the file system (store/retention.py); effective only before
    # the first table exists: an older file is converted once at start-up.
    cursor.execute("PRAGMA auto_vacuum=INCREMENTAL")
    # WAL: readers never block the writer; NORMAL: a commit survives a process crash
    # (kill -9) without an fsync per transaction; only power loss can drop the last ones.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


# ---------------------------------------------------------------------- sessions, wakes, timers
# (N1–N11)

#: Terminal states in which the command is known to have ended (not ``unknown``): N6.
FINISHED_STATES = ("completed", "cancelled", "failed")

#: Builds a wake's payload from (wake id, reason, session, agent, its notices, now).
PayloadBuilder = Callable[[str, str, Row, Row, list[Row], float], dict[str, Any]]


def _insert_returning(conn: Connection, table: sa.Table, values: dict[str, Any]) -> Row:
    conn.execute(table.insert().values(**values))
    row = _fetch_one(conn, sa.select(table).where(table.c.id == values["id"]))
    assert row is not None
    return row


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
    agent = _insert_returning(
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
    session = _fetch_one(conn, sa.select(sessions).where(sessions.c.id == session_id))
    assert session is not None
    return session, agent


def _create_child(conn: Connection, parent: Row) -> Row:
    child = _create_agent(conn, str(parent["session_id"]), str(parent["id"]))
    _event(
        conn, str(parent["session_id"]), "agent_created", str(child["id"]), {"parent": parent["id"]}
    )
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
    row = _fetch_one(conn, sa.select(sessions).where(sessions.c.id == session_id))
    assert row is not None
    return row


def _change_agent(
    conn: Connection, agent_id: str, values: dict[str, Any], event_kind: str | None
) -> Row:
    conn.execute(agents.update().where(agents.c.id == agent_id).values(**values))
    row = _fetch_one(conn, sa.select(agents).where(agents.c.id == agent_id))
    assert row is not None
    if event_kind is not None:
        _event(conn, str(row["session_id"]), event_kind, agent_id)
    return row


def _user_request(
    conn: Connection, session_id: str, build_payload: PayloadBuilder
) -> tuple[Row, bool, list[Row]]:
    session = _fetch_one(conn, sa.select(sessions).where(sessions.c.id == session_id))
    assert session is not None
    if session["state"] == "archived":
        raise Conflict(
            f"session {session_id} is archived; restore it first (shellyard session restore "
            f"{session_id}), then send the request"
        )
    resumed = session["state"] == "stopped"
    if resumed:
        session = _change_session(conn, session_id, "active", "session_resumed", None)
    main_id = str(session["main_agent_id"])
    main = _fetch_one(conn, sa.select(agents).where(agents.c.id == main_id))
    assert main is not None
    if main["gate"] != "open":  # the user talks to the main agent: that reopens it
        _change_agent(conn, main_id, {"gate": "open"}, "agent_resumed")
    main = _change_agent(conn, main_id, {"state": "busy"}, None)
    _event(conn, session_id, "user_request", main_id, {"resumed": resumed})
    unread = _fetch_all(
        conn,
        sa.select(notices)
        .where(notices.c.agent_id == main_id, notices.c.read_at.is_(None))
        .order_by(notices.c.created_at, notices.c.id),
    )
    fresh = [n for n in unread if n["woke_at"] is None]
    recorded = _record_wake(conn, "summary", session, main, fresh, build_payload) if fresh else None
    if recorded is not None:
        claimed = {str(n["id"]): n for n in recorded[1]}
        unread = [claimed.get(str(n["id"]), n) for n in unread]
    return session, resumed, unread


def _mark_notices_read(conn: Connection, agent_id: str, notice_ids: Sequence[str] | None) -> int:
    stmt = notices.update().where(notices.c.agent_id == agent_id, notices.c.read_at.is_(None))
    if notice_ids is not None:
        stmt = stmt.where(notices.c.id.in_(list(notice_ids)))
    return int(conn.execute(stmt.values(read_at=time.time())).rowcount)


class _NoWake(Exception):
    """Rolls back the claim on an agent when another transaction took its notices first."""


def _record_wake(
    conn: Connection,
    reason: str,
    session: Row,
    agent: Row,
    pending: list[Row],
    build_payload: PayloadBuilder,
) -> tuple[Row, list[Row]] | None:
    """Claim ``pending`` notices (those still unclaimed) for a new wake row; None if none."""
    now, wake_id = time.time(), new_id("wk")
    ids = [str(n["id"]) for n in pending]
    conn.execute(
        notices.update()
        .where(notices.c.id.in_(ids), notices.c.woke_at.is_(None))
        .values(woke_at=now, wake_id=wake_id)
    )
    claimed = _fetch_all(
        conn,
        sa.select(notices)
        .where(notices.c.wake_id == wake_id)
        .order_by(notices.c.created_at, notices.c.id),
    )
    if not claimed:
        return None
    payload = build_payload(wake_id, reason, session, agent, claimed, now)
    conn.execute(
        wakes.insert().values(
            id=wake_id,
            session_id=session["id"],
            agent_id=agent["id"],
            reason=reason,
            payload=payload,
            created_at=now,
        )
    )
    wake = _fetch_one(conn, sa.select(wakes).where(wakes.c.id == wake_id))
    assert wake is not None
    return wake, claimed


def _emit_wake(
    conn: Connection,
    agent_id: str,
    reason: str,
    live_sessions: frozenset[str] | None,
    build_payload: PayloadBuilder,
) -> tuple[Row, list[str]] | None:
    agent = _fetch_one(conn, sa.select(agents).where(agents.c.id == agent_id))
    if agent is None or agent["state"] != "idle" or agent["gate"] != "open":
        return None
    session = _fetch_one(conn, sa.select(sessions).where(sessions.c.id == agent["session_id"]))
    if session is None or session["state"] != "active":
        return None
    hooks = _fetch_all(
        conn,
        sa.select(webhooks.c.id).where(
            webhooks.c.active.is_(True),
            sa.or_(webhooks.c.session_id.is_(None), webhooks.c.session_id == session["id"]),
        ),
    )
    if not hooks and live_sessions is not None and session["id"] not in live_sessions:
        return None  # nobody listens: the notices wait, unwoken, for a channel
    pending = _fetch_all(
        conn,
        sa.select(notices)
        .where(
            notices.c.agent_id == agent_id,
            notices.c.read_at.is_(None),
            notices.c.woke_at.is_(None),
        )
        .order_by(notices.c.created_at, notices.c.id),
    )
    if not pending:
        return None
    # The claim on the agent serialises concurrent wakes of one agent (PostgreSQL row lock).
    claimed = conn.execute(
        agents.update()
        .where(agents.c.id == agent_id, agents.c.state == "idle", agents.c.gate == "open")
        .values(state="busy")
    )
    if not claimed.rowcount:
        return None
    recorded = _record_wake(conn, reason, session, agent, pending, build_payload)
    if recorded is None:
        raise _NoWake  # rolls back the claim on the agent
    wake = recorded[0]
    delivery_ids = []
    for hook in hooks:
        delivery_id = new_id("dlv")
        conn.execute(
            wake_deliveries.insert().values(
                id=delivery_id,
                wake_id=wake["id"],
                webhook_id=hook["id"],
                state="pending",
                attempts=0,
                next_attempt_at=wake["created_at"],
            )
        )
        delivery_ids.append(delivery_id)
    return wake, delivery_ids


def _agents_to_wake(conn: Connection) -> list[str]:
    rows = conn.execute(
        sa.select(notices.c.agent_id)
        .distinct()
        .join(agents, agents.c.id == notices.c.agent_id)
        .join(sessions, sessions.c.id == agents.c.session_id)
        .where(
            notices.c.read_at.is_(None),
            notices.c.woke_at.is_(None),
            agents.c.state == "idle",
            agents.c.gate == "open",
            sessions.c.state == "active",
        )
    ).all()
    return [str(r[0]) for r in rows]


def _deactivate_webhook(conn: Connection, webhook_id: str) -> Row | None:
    conn.execute(webhooks.update().where(webhooks.c.id == webhook_id).values(active=False))
    conn.execute(
        wake_deliveries.update()
        .where(wake_deliveries.c.webhook_id == webhook_id, wake_deliveries.c.state == "pending")
        .values(state="failed", last_error="the webhook was removed")
    )
    return _fetch_one(conn, sa.select(webhooks).where(webhooks.c.id == webhook_id))


def _pending_deliveries(conn: Connection) -> list[str]:
    conn.execute(
        delivery_attempts.update()
        .where(delivery_attempts.c.finished_at.is_(None))
        .values(error="interrupted: the control plane stopped during the attempt")
    )
    rows = conn.execute(
        sa.select(wake_deliveries.c.id)
        .where(wake_deliveries.c.state == "pending")
        .order_by(wake_deliveries.c.next_attempt_at)
    ).all()
    return [str(r[0]) for r in rows]


def _begin_attempt(conn: Connection, delivery_id: str) -> int:
    conn.execute(
        wake_deliveries.update()
        .where(wake_deliveries.c.id == delivery_id)
        .values(attempts=wake_deliveries.c.attempts + 1)
    )
    number = int(
        conn.execute(
            sa.select(wake_deliveries.c.attempts).where(wake_deliveries.c.id == delivery_id)
        ).scalar_one()
    )
    conn.execute(
        delivery_attempts.insert().values(
            delivery_id=delivery_id, number=number, started_at=time.time()
        )
    )
    return number


def _end_attempt(
    conn: Connection,
    delivery_id: str,
    number: int,
    status_code: int | None,
    error: str | None,
    state: str,
    next_attempt_at: float | None,
) -> None:
    now = time.time()
    conn.execute(
        delivery_attempts.update()
        .where(delivery_attempts.c.delivery_id == delivery_id, delivery_attempts.c.number == number)
        .values(finished_at=now, status_code=status_code, error=error)
    )
    conn.execute(
        wake_deliveries.update()
        .where(wake_deliveries.c.id == delivery_id, wake_deliveries.c.state == "pending")
        .values(
            state=state,
            last_error=error,
            next_attempt_at=next_attempt_at,
            delivered_at=now if state == "delivered" else None,
        )
    )


def _wake_deliveries(conn: Connection, wake_id: str) -> list[tuple[Row, list[Row]]]:
    found = []
    for delivery in _fetch_all(
        conn, sa.select(wake_deliveries).where(wake_deliveries.c.wake_id == wake_id)
    ):
        attempts = _fetch_all(
            conn,
            sa.select(delivery_attempts)
            .where(delivery_attempts.c.delivery_id == delivery["id"])
            .order_by(delivery_attempts.c.number),
        )
        found.append((delivery, attempts))
    return found


def _cancel_timers(
    conn: Connection, reason: str, timer_id: str | None, execution: Row | None
) -> list[Row]:
    stmt = timers.update().where(timers.c.state == "pending")
    if timer_id is not None:
        stmt = stmt.where(timers.c.id == timer_id)
        where = timers.c.id == timer_id
    else:
        assert execution is not None
        # N6: only the timers that had not come due when the execution finished; one that
        # came due first (the service was down) still fires, late.
        finished_at = execution["finished_at"] or time.time()
        where = timers.c.execution_id == execution["id"]
        stmt = stmt.where(where, timers.c.fire_at > finished_at)
    conn.execute(stmt.values(state="cancelled", cancel_reason=reason, cancelled_at=time.time()))
    return _fetch_all(conn, sa.select(timers).where(where))


def _due_timers(conn: Connection, now: float) -> tuple[list[str], float | None]:
    due = conn.execute(
        sa.select(timers.c.id)
        .where(timers.c.state == "pending", timers.c.fire_at <= now)
        .order_by(timers.c.fire_at, timers.c.created_at)
    ).all()
    upcoming = conn.execute(
        sa.select(sa.func.min(timers.c.fire_at)).where(
            timers.c.state == "pending", timers.c.fire_at > now
        )
    ).scalar()
    return [str(r[0]) for r in due], upcoming


def _fire_timer(
    conn: Connection, timer_id: str, late_if_due_before: float
) -> tuple[Row | None, bool]:
    now = time.time()
    timer = _fetch_one(conn, sa.select(timers).where(timers.c.id == timer_id))
    if timer is None or timer["state"] != "pending":
        return timer, False
    if timer["execution_id"] is not None:
        execution = _fetch_one(
            conn, sa.select(executions).where(executions.c.id == timer["execution_id"])
        )
        finished_at = execution["finished_at"] if execution is not None else None
        if (
            execution is not None
            and execution["state"] in FINISHED_STATES
            and (finished_at is None or finished_at < timer["fire_at"])
        ):
            reason = f"execution {timer['execution_id']} finished before the reminder was due"
            _cancel_timers(conn, reason, timer_id, None)
            return _fetch_one(conn, sa.select(timers).where(timers.c.id == timer_id)), False
    late = bool(timer["fire_at"] < late_if_due_before)
    claimed = conn.execute(
        timers.update()
        .where(timers.c.id == timer_id, timers.c.state == "pending")
        .values(state="fired", fired_at=now, late=late)
    )
    if not claimed.rowcount:  # another control plane fired it first
        return _fetch_one(conn, sa.select(timers).where(timers.c.id == timer_id)), False
    payload = {
        "timer_id": timer_id,
        "text": timer["text"],
        "fire_at": timer["fire_at"],
        "fired_at": now,
        "late": late,
        "execution_id": timer["execution_id"],
    }
    summary = f"reminder{' (late)' if late else ''}: {timer['text']}"
    _add_notice(conn, str(timer["agent_id"]), "reminder", timer_id, summary, payload, None)
    return _fetch_one(conn, sa.select(timers).where(timers.c.id == timer_id)), True

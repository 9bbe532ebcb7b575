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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from shellyard.errors import InvalidInput
from shellyard.store import schema
from shellyard.store.schema import (
    agents,
    executions,
    notices,
    runners,
    sessions,
    snapshots,
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

    async def mark_notice_read(self, kind: str, subject_id: str) -> None:
        await self._run(_mark_notice_read, kind, subject_id)

    async def list_notices(self, agent_id: str, unread_only: bool = False) -> list[Row]:
        stmt = sa.select(notices).where(notices.c.agent_id == agent_id)
        if unread_only:
            stmt = stmt.where(notices.c.read_at.is_(None))
        return await self._all(stmt.order_by(notices.c.created_at))


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
    # WAL: readers never block the writer; NORMAL: a commit survives a process crash
    # (kill -9) without an fsync per transaction; only power loss can drop the last ones.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()

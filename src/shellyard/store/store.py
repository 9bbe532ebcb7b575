"""The Store: every read and write of the control plane's records.

One class over SQLAlchemy Core's async engine serves SQLite (default, WAL) and PostgreSQL
(``postgresql://``) through the same schema; Alembic migrations run on ``open()``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import AsyncAdaptedQueuePool

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

TERMINAL_STATES = ("completed", "cancelled", "failed", "unknown")
ACTIVE_STATES = ("queued", "running")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


def async_url(database_url: str) -> str:
    """Map a plain URL onto the async driver this project ships."""
    for plain, driver in (
        ("sqlite:///", "sqlite+aiosqlite:///"),
        ("postgresql://", "postgresql+psycopg://"),
        ("postgres://", "postgresql+psycopg://"),
    ):
        if database_url.startswith(plain):
            return driver + database_url[len(plain) :]
    if database_url.startswith(("sqlite+aiosqlite://", "postgresql+psycopg://")):
        return database_url
    raise InvalidInput(
        f"unsupported database URL {database_url!r}: use sqlite:///PATH or "
        "postgresql://USER@HOST:PORT/DB"
    )


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


class Store:
    def __init__(self, engine: AsyncEngine, *, schema_name: str | None = None) -> None:
        self.engine = engine
        self.schema_name = schema_name
        self.is_sqlite = engine.dialect.name == "sqlite"

    # ------------------------------------------------------------------ setup

    @classmethod
    async def open(cls, database_url: str, *, schema_name: str | None = None) -> Store:
        """Connect and apply migrations. ``schema_name`` (PostgreSQL only) keeps a test run's
        tables apart from every other run's."""
        url = async_url(database_url)
        if url.startswith("sqlite"):
            # One connection: SQLite allows one writer at a time anyway, and a single
            # connection never meets SQLITE_BUSY from its own process.
            engine = create_async_engine(
                url,
                poolclass=AsyncAdaptedQueuePool,
                pool_size=1,
                max_overflow=0,
                connect_args={"timeout": 30},
            )
            event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        else:
            options: dict[str, Any] = {}
            if schema_name:
                options["connect_args"] = {"options": f"-csearch_path={schema_name}"}
            engine = create_async_engine(url, pool_size=10, max_overflow=20, **options)
        store = cls(engine, schema_name=schema_name)
        await store._migrate()
        return store

    async def _migrate(self) -> None:
        async with self.engine.begin() as conn:
            if self.schema_name and not self.is_sqlite:
                await conn.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{self.schema_name}"'))
            await conn.run_sync(_run_alembic_upgrade)

    async def close(self) -> None:
        await self.engine.dispose()

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[AsyncConnection]:
        async with self.engine.begin() as conn:
            yield conn

    async def _one(self, stmt: sa.Executable) -> Row | None:
        async with self._tx() as conn:
            row = (await conn.execute(stmt)).mappings().first()
        return dict(row) if row is not None else None

    async def _all(self, stmt: sa.Executable) -> list[Row]:
        async with self._tx() as conn:
            return [dict(r) for r in (await conn.execute(stmt)).mappings().all()]

    # ------------------------------------------------------------------ owners

    async def default_owner(self) -> tuple[Row, Row]:
        """The default session and its main agent, created on first use."""
        existing = await self._one(sa.select(sessions).where(sessions.c.is_default.is_(True)))
        if existing is None:
            now = time.time()
            session_id, agent_id = new_id("ses"), new_id("agt")
            try:
                async with self._tx() as conn:
                    await conn.execute(
                        sessions.insert().values(
                            id=session_id,
                            state="active",
                            main_agent_id=agent_id,
                            is_default=True,
                            created_at=now,
                        )
                    )
                    await conn.execute(
                        agents.insert().values(
                            id=agent_id,
                            session_id=session_id,
                            parent_id=None,
                            state="idle",
                            gate="open",
                            created_at=now,
                        )
                    )
            except sa.exc.IntegrityError:
                pass  # another replica created it first
            existing = await self._one(sa.select(sessions).where(sessions.c.is_default.is_(True)))
        assert existing is not None
        agent = await self.get_agent(str(existing["main_agent_id"]))
        assert agent is not None
        return existing, agent

    async def create_agent(self, session_id: str, parent_id: str | None = None) -> Row:
        """A child agent (or another agent of a session); the full lifecycle is a later issue."""
        agent_id = new_id("agt")
        async with self._tx() as conn:
            await conn.execute(
                agents.insert().values(
                    id=agent_id,
                    session_id=session_id,
                    parent_id=parent_id,
                    state="idle",
                    gate="open",
                    created_at=time.time(),
                )
            )
        row = await self.get_agent(agent_id)
        assert row is not None
        return row

    async def get_agent(self, agent_id: str) -> Row | None:
        return await self._one(sa.select(agents).where(agents.c.id == agent_id))

    # ------------------------------------------------------------------ runners

    async def upsert_runner(
        self, runner_id: str, kind: str, address: str | None, token: str | None
    ) -> Row:
        async with self._tx() as conn:
            found = (
                await conn.execute(sa.select(runners).where(runners.c.id == runner_id))
            ).first()
            values = {"kind": kind, "address": address, "token": token, "state": "active"}
            if found is None:
                await conn.execute(
                    runners.insert().values(id=runner_id, created_at=time.time(), **values)
                )
            else:
                await conn.execute(
                    runners.update().where(runners.c.id == runner_id).values(**values)
                )
        row = await self.get_runner(runner_id)
        assert row is not None
        return row

    async def get_runner(self, runner_id: str) -> Row | None:
        return await self._one(sa.select(runners).where(runners.c.id == runner_id))

    async def list_runners(self) -> list[Row]:
        return await self._all(sa.select(runners).order_by(runners.c.created_at))

    # ------------------------------------------------------------------ workspaces

    async def workspace_for(self, agent_id: str, runner_id: str) -> tuple[Row, bool]:
        """The (agent, runner) workspace, created on first use. Returns (row, created)."""
        stmt = sa.select(workspaces).where(
            workspaces.c.agent_id == agent_id, workspaces.c.runner_id == runner_id
        )
        row = await self._one(stmt)
        if row is not None:
            return row, False
        try:
            async with self._tx() as conn:
                await conn.execute(
                    workspaces.insert().values(
                        id=new_id("ws"),
                        agent_id=agent_id,
                        runner_id=runner_id,
                        head_seq=0,
                        created_at=time.time(),
                    )
                )
        except sa.exc.IntegrityError:
            pass
        row = await self._one(stmt)
        assert row is not None
        return row, True

    async def get_workspace(self, workspace_id: str) -> Row | None:
        return await self._one(sa.select(workspaces).where(workspaces.c.id == workspace_id))

    async def release_writer(self, workspace_id: str, holder_id: str) -> bool:
        async with self._tx() as conn:
            result = await conn.execute(
                workspaces.update()
                .where(workspaces.c.id == workspace_id, workspaces.c.writer_id == holder_id)
                .values(writer_kind=None, writer_id=None)
            )
        return bool(result.rowcount)

    async def take_writer(self, workspace_id: str, kind: str, holder_id: str) -> bool:
        async with self._tx() as conn:
            return await _take_writer(conn, workspace_id, kind, holder_id)

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
        async with self._tx() as conn:
            exists = (
                await conn.execute(
                    sa.select(snapshots.c.seq).where(
                        snapshots.c.workspace_id == workspace_id, snapshots.c.seq == seq
                    )
                )
            ).first()
            if exists is None:
                await conn.execute(
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
            await conn.execute(
                workspaces.update()
                .where(workspaces.c.id == workspace_id, workspaces.c.head_seq < seq)
                .values(head_seq=seq)
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
            async with self._tx() as conn:
                return await _submit(conn, values, queue=queue)
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
        async with self._tx() as conn:
            result = await conn.execute(
                executions.update()
                .where(executions.c.id == execution_id, executions.c.state.in_(from_states))
                .values(**values)
            )
        return bool(result.rowcount)

    async def next_queued(self, workspace_id: str) -> Row | None:
        return await self._one(
            sa.select(executions)
            .where(executions.c.workspace_id == workspace_id, executions.c.state == "queued")
            .order_by(executions.c.seq)
            .limit(1)
        )

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
        try:
            async with self._tx() as conn:
                await conn.execute(
                    notices.insert().values(
                        id=new_id("ntc"),
                        agent_id=agent_id,
                        kind=kind,
                        subject_id=subject_id,
                        summary=summary,
                        payload=payload,
                        created_at=time.time(),
                    )
                )
        except sa.exc.IntegrityError:
            pass

    async def mark_notice_read(self, kind: str, subject_id: str) -> None:
        async with self._tx() as conn:
            await conn.execute(
                notices.update()
                .where(
                    notices.c.kind == kind,
                    notices.c.subject_id == subject_id,
                    notices.c.read_at.is_(None),
                )
                .values(read_at=time.time())
            )

    async def list_notices(self, agent_id: str, unread_only: bool = False) -> list[Row]:
        stmt = sa.select(notices).where(notices.c.agent_id == agent_id)
        if unread_only:
            stmt = stmt.where(notices.c.read_at.is_(None))
        return await self._all(stmt.order_by(notices.c.created_at))


class _Refused(Exception):
    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


async def _submit(
    conn: AsyncConnection, values: dict[str, Any], *, queue: bool
) -> tuple[Row, str | None]:
    next_seq = (
        await conn.execute(sa.select(sa.func.coalesce(sa.func.max(executions.c.seq), 0)))
    ).scalar_one() + 1
    values = {**values, "seq": next_seq, "state": "queued", "created_at": time.time()}
    await conn.execute(executions.insert().values(**values))
    queued_ahead = (
        await conn.execute(
            sa.select(executions.c.id)
            .where(
                executions.c.workspace_id == values["workspace_id"],
                executions.c.state == "queued",
                executions.c.id != values["id"],
            )
            .limit(1)
        )
    ).first()
    taken = queued_ahead is None and await _take_writer(
        conn, values["workspace_id"], "execution", values["id"]
    )
    holder = None
    if not taken:
        holder = (
            await conn.execute(
                sa.select(workspaces.c.writer_id).where(workspaces.c.id == values["workspace_id"])
            )
        ).scalar_one_or_none() or "a queued writer"
        if not queue:
            raise _Refused(holder)  # rolls the insert back: nothing recorded half-way
    row = (
        (await conn.execute(sa.select(executions).where(executions.c.id == values["id"])))
        .mappings()
        .one()
    )
    return dict(row), holder


async def _take_writer(conn: AsyncConnection, workspace_id: str, kind: str, holder: str) -> bool:
    result = await conn.execute(
        workspaces.update()
        .where(workspaces.c.id == workspace_id, workspaces.c.writer_id.is_(None))
        .values(writer_kind=kind, writer_id=holder)
    )
    return bool(result.rowcount)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL: readers never block the writer; NORMAL: a commit survives a process crash
    # (kill -9) without an fsync per transaction; only power loss can drop the last ones.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _run_alembic_upgrade(connection: Connection) -> None:
    config = Config()
    config.set_main_option("script_location", str(Path(schema.__file__).parent / "migrations"))
    config.attributes["connection"] = connection
    command.upgrade(config, "head")

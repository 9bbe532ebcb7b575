"""The database under the Store: engines, migrations and one transaction per operation.

SQLAlchemy Core serves SQLite (default, WAL) and PostgreSQL through the same schema; Alembic
migrations run on ``open()``. Each operation is a synchronous function of a ``Connection``
run as one transaction by ``Database.run``:

- on SQLite it runs directly on the event-loop thread over one connection. A statement takes
  tens of microseconds, far less than a hop to a driver thread (aiosqlite cost ~15 thread
  round trips per execution, the largest share of a round trip: measured in bench/);
- on PostgreSQL it runs through the async driver (psycopg) with ``AsyncConnection.run_sync``,
  so network waits never block the loop.

The records of each concept (``owners``, ``workspaces``, ``executions``, ``notices``,
``sessions``, ``wakes``, ``timers``, and ``files``, ``environments``, ``tokens``) are written
as such operations over this class.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, Self, TypeVar

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from shellyard import filemodes
from shellyard.errors import InvalidInput, StoreFull
from shellyard.store import schema
from shellyard.store.ballast import Ballast

Row = Mapping[str, Any]
P = ParamSpec("P")
T = TypeVar("T")


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


class Database:
    """One database, SQLite or PostgreSQL, and the transactions run on it."""

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
        #: Room kept beside a SQLite file for a full volume (store/ballast.py).
        self.ballast: Ballast | None = None
        if sync_engine is not None and sync_engine.url.database:
            database = Path(sync_engine.url.database)
            self.ballast = Ballast(database.with_name(database.name + "-reserve"))

    @classmethod
    async def open(cls, database_url: str, *, schema_name: str | None = None) -> Self:
        """Connect and apply migrations. ``schema_name`` (PostgreSQL only) keeps a test run's
        tables apart from every other run's."""
        url, is_sqlite = normalize_url(database_url)
        if is_sqlite:
            # 0600 before SQLite opens it: its -wal and -shm files take the database file's
            # mode (docs/security.md "The home's files"); older files are narrowed here.
            path = Path(url.removeprefix("sqlite:///"))
            if path.parent.is_dir():
                filemodes.create_private(path)
                filemodes.private_files(path.with_name(path.name + s) for s in ("", "-wal", "-shm"))
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
        await store.run(_migrate, schema_name)
        if store.ballast is not None:
            store.ballast.ensure()
        return store

    async def close(self) -> None:
        if self._sync is not None:
            self._sync.dispose()
        if self._async is not None:
            await self._async.dispose()

    async def run(
        self, operation: Callable[Concatenate[Connection, P], T], *args: P.args, **kw: P.kwargs
    ) -> T:
        """Run ``operation(conn, ...)`` as one transaction (rolled back if it raises).

        A full volume (SQLITE_FULL, PostgreSQL's disk_full) raises ``StoreFull`` (507,
        retry later); on SQLite the room kept for it is released first and the
        transaction tried once more (store/ballast.py)."""
        if self._sync is not None:
            try:
                with self._sync.begin() as conn:
                    return operation(conn, *args, **kw)
            except sa.exc.OperationalError as exc:
                if not _is_full(exc):
                    raise
                if self.ballast is None or not self.ballast.release():
                    raise _store_full(exc) from None
            try:
                with self._sync.begin() as conn:
                    return operation(conn, *args, **kw)
            except sa.exc.OperationalError as exc:
                if _is_full(exc):
                    raise _store_full(exc) from None
                raise
        assert self._async is not None
        try:
            async with self._async.begin() as aconn:
                return await aconn.run_sync(lambda conn: operation(conn, *args, **kw))
        except sa.exc.OperationalError as exc:
            if _is_full(exc):
                raise _store_full(exc) from None
            raise

    async def run_statement(
        self, operation: Callable[Concatenate[Connection, P], T], *args: P.args, **kw: P.kwargs
    ) -> T:
        """``run`` for an operation that writes in a single statement (reads after it are
        allowed: each is a statement of its own). On PostgreSQL it runs without BEGIN and
        COMMIT (autocommit): the server commits the statement before it answers, so the
        change is as durable as with COMMIT (E11), in one round trip instead of three. On
        SQLite it is ``run``."""
        if self._async is None:
            return await self.run(operation, *args, **kw)
        try:
            async with self._async.connect() as aconn:
                # Client-side only with psycopg: no round trip to set or reset it.
                await aconn.execution_options(isolation_level="AUTOCOMMIT")
                return await aconn.run_sync(lambda conn: operation(conn, *args, **kw))
        except sa.exc.OperationalError as exc:
            if _is_full(exc):
                raise _store_full(exc) from None
            raise

    async def one(self, stmt: sa.Select[Any]) -> Row | None:
        return await self.run(fetch_one, stmt)

    async def all(self, stmt: sa.Select[Any]) -> list[Row]:
        return await self.run(fetch_all, stmt)


def _is_full(exc: sa.exc.OperationalError) -> bool:
    orig = exc.orig
    if getattr(orig, "sqlite_errorcode", None) == 13:  # SQLITE_FULL
        return True
    return getattr(orig, "sqlstate", None) == "53100"  # PostgreSQL disk_full


def _store_full(exc: sa.exc.OperationalError) -> StoreFull:
    return StoreFull(
        f"the service's database could not write: its volume is full ({exc.orig}). Nothing "
        f"was recorded; free space (delete files in a workspace, run gc, or grow the "
        f"volume) and retry"
    )


# ---------------------------------------------------------------------- operations


def fetch_one(conn: Connection, stmt: sa.Select[Any]) -> Row | None:
    row = conn.execute(stmt).mappings().first()
    return dict(row) if row is not None else None


def fetch_all(conn: Connection, stmt: sa.Select[Any]) -> list[Row]:
    return [dict(r) for r in conn.execute(stmt).mappings().all()]


def insert_returning(conn: Connection, table: sa.Table, values: dict[str, Any]) -> Row:
    conn.execute(table.insert().values(**values))
    row = fetch_one(conn, sa.select(table).where(table.c.id == values["id"]))
    assert row is not None
    return row


def upsert(conn: Connection, table: sa.Table) -> Any:
    """The dialect's INSERT for ``table``, which knows ON CONFLICT (both databases do)."""
    if conn.dialect.name == "sqlite":
        return sqlite.insert(table)
    return postgresql.insert(table)


#: The PostgreSQL advisory lock that serialises migrations of replicas starting at once.
MIGRATION_LOCK = 0x5E11_9A2D


def _migrate(conn: Connection, schema_name: str | None) -> None:
    if conn.dialect.name != "sqlite":
        # Replicas starting together on a fresh database (docs/operations.md): one migrates, the
        # others wait for its commit and then find every head applied. Held until this transaction
        # ends.
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
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

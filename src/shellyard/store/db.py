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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, Self, TypeVar

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.sql.elements import ClauseElement

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
        #: SQLite: the one connection every transaction runs on, checked out of the engine's
        #: pool once (``connection``). A checkout and return per transaction cost ~80 µs of
        #: the loop's CPU (its events, and the rollback the pool sends on every return after
        #: the commit already ended the transaction): 3 a run (docs/benchmarks.md §38).
        self._held: Connection | None = None
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

    def connection(self) -> Connection:
        """SQLite: the connection the store's transactions run on, for work outside one (the
        engine's pool holds a single connection: a second checkout would wait for this one)."""
        assert self._sync is not None
        held = self._held
        if held is None or held.closed:
            held = self._held = self._sync.connect()
        return held

    def _idle(self) -> Connection:
        """The held connection with no transaction open: what the pool's reset on return
        guaranteed to each ``engine.begin()`` before (never expected to roll anything back)."""
        conn = self.connection()
        if conn.in_transaction():
            conn.rollback()
        return conn

    async def close(self) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None
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
            # Synchronous on the loop's thread: no other transaction can be open on the held
            # connection here (a begun one ends, committed or rolled back, before this returns).
            conn = self._idle()
            try:
                with conn.begin():
                    return operation(conn, *args, **kw)
            except sa.exc.OperationalError as exc:
                if not _is_full(exc):
                    raise
                if self.ballast is None or not self.ballast.release():
                    raise _store_full(exc) from None
            conn = self._idle()  # a failed commit may leave its transaction to roll back
            try:
                with conn.begin():
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


# ---------------------------------------------------------------------- statements compiled once
#
# The hot path's statements on SQLite, compiled once and sent to the DBAPI cursor
# (docs/benchmarks.md §33).
#
# An execution's submit, start and finish send nine statements on SQLite. Through
# ``Connection.execute`` each costs ~60 µs of SQLAlchemy's Python over ~12 µs of SQLite's own
# (its execution context, parameter processing, the compiled cache's lookup, the result's
# metadata and rows), more than half of the store's CPU per execution. Here the same Core
# statement is compiled once per set of parameter names with the connection's dialect, and
# each execution binds its values in the compiled order through the types' own bind
# processors, runs on the transaction's own DBAPI connection and turns the returned rows into
# dicts through the types' result processors: the same SQL, the same values stored, the same
# rows read, in the same transaction (``Database.run``'s), so nothing about what is committed
# and when changes (E1–E3, E11).
#
# Kept as SQLAlchemy does it: column defaults a statement omits (a scalar ``default=``) are
# sent; the engine's ``before_cursor_execute`` / ``after_cursor_execute`` listeners are
# called (tests count statements through them); a DBAPI error is raised as SQLAlchemy's
# (``sa.exc.OperationalError`` and so on, ``.orig`` the driver's: ``Database.run`` knows a full
# volume by it). Any other dialect runs ``conn.execute``.

Processor = Callable[[Any], Any] | None


class Done:
    """What a statement gave back: the rows it returned (dicts of column name to value, as
    ``Result.mappings()`` gives) and how many rows it changed."""

    __slots__ = ("rowcount", "rows")

    def __init__(self, rowcount: int, rows: list[dict[str, Any]]) -> None:
        self.rowcount = rowcount
        self.rows = rows

    def first(self) -> dict[str, Any] | None:
        return self.rows[0] if self.rows else None

    def scalar(self) -> Any:
        return next(iter(self.rows[0].values())) if self.rows else None


class _Prepared:
    """One statement compiled for one dialect and one set of parameter names."""

    __slots__ = (
        "binders",
        "columns",
        "constants",
        "defaults",
        "fixed",
        "names",
        "needed",
        "pairs",
        "readers",
        "sql",
    )

    def __init__(self, stmt: ClauseElement, conn: Connection, keys: Sequence[str]) -> None:
        dialect = conn.dialect
        compiled: Any = stmt.compile(dialect=dialect, column_keys=list(keys))
        if compiled.positiontup is None:  # not a positional paramstyle: not ours to bind
            raise TypeError(f"{dialect.name}'s paramstyle is not positional")
        self.sql: str = compiled.string
        self.names: tuple[str, ...] = tuple(compiled.positiontup)
        # values of the statement's own literals (``.values(kind="execution")``, ``LIMIT 1``)
        self.fixed: dict[str, Any] = {
            name: bind.effective_value for name, bind in compiled.binds.items() if not bind.required
        }
        # columns the statement omits whose default SQLAlchemy evaluates in Python
        self.defaults: dict[str, Any] = {}
        for column in [*compiled.insert_prefetch, *compiled.update_prefetch]:
            default = column.default
            if default is None or not default.is_scalar:
                raise TypeError(f"column {column.key}'s default is not a constant")
            self.defaults[column.key] = default.arg
        #: what the caller must give (SQLAlchemy refuses a statement missing one)
        self.needed = frozenset(self.names) - self.fixed.keys() - self.defaults.keys()
        self.binders: tuple[Processor, ...] = tuple(
            compiled.binds[name].type.bind_processor(dialect) for name in self.names
        )
        # Merged once, not per statement: ``arguments`` runs for every statement on the
        # loop's thread (~7 per execution), and its three-way merge and two generators
        # showed in the loop's profile (docs/benchmarks.md §72).
        self.constants: dict[str, Any] = {**self.fixed, **self.defaults}
        self.pairs: tuple[tuple[str, Processor], ...] = tuple(
            zip(self.names, self.binders, strict=True)
        )
        selected: list[Any] = list(
            stmt.selected_columns
            if isinstance(stmt, sa.Select)
            else (compiled.effective_returning or ())
        )
        self.columns: tuple[str, ...] = tuple(column.key for column in selected)
        self.readers: tuple[Processor, ...] = tuple(
            column.type.result_processor(dialect, None) for column in selected
        )

    def arguments(self, params: Mapping[str, Any]) -> tuple[Any, ...]:
        if not self.needed <= params.keys():
            missing = sorted(self.needed - params.keys())
            raise sa.exc.InvalidRequestError(f"a value is required for {missing} ({self.sql})")
        values = {**self.constants, **params}  # the caller's values win, as before
        get = values.get
        return tuple(
            [get(name) if binder is None else binder(get(name)) for name, binder in self.pairs]
        )

    def row(self, raw: Sequence[Any]) -> dict[str, Any]:
        return {
            name: value if reader is None or value is None else reader(value)
            for name, reader, value in zip(self.columns, self.readers, raw, strict=True)
        }


_CACHE: dict[tuple[int, str, tuple[str, ...]], tuple[ClauseElement, _Prepared]] = {}


def execute_prepared(conn: Connection, stmt: ClauseElement, params: Mapping[str, Any]) -> Done:
    """``conn.execute(stmt, params)`` for a statement built once (module level: it is cached
    by identity, so never pass one built per call), its rows read whole."""
    if conn.dialect.name != "sqlite":
        result = conn.execute(stmt, dict(params))  # type: ignore[call-overload]
        rows = [dict(m) for m in result.mappings()] if result.returns_rows else []
        return Done(result.rowcount if not result.returns_rows else len(rows), rows)
    key = (id(stmt), conn.dialect.name, tuple(params))
    found = _CACHE.get(key)
    if found is None or found[0] is not stmt:
        found = _CACHE[key] = (stmt, _Prepared(stmt, conn, tuple(params)))
    prepared = found[1]
    arguments = prepared.arguments(params)
    dbapi: Any = conn.connection.driver_connection
    cursor = dbapi.cursor()
    dispatch: Any = conn.dispatch
    try:
        if dispatch.before_cursor_execute:
            dispatch.before_cursor_execute(conn, cursor, prepared.sql, arguments, None, False)
        try:
            cursor.execute(prepared.sql, arguments)
            raw_rows = cursor.fetchall() if prepared.columns else []
        except conn.dialect.loaded_dbapi.Error as exc:
            raise sa.exc.DBAPIError.instance(
                prepared.sql,
                arguments,
                exc,
                conn.dialect.loaded_dbapi.Error,
                dialect=conn.dialect,
            ) from exc
        if dispatch.after_cursor_execute:
            dispatch.after_cursor_execute(conn, cursor, prepared.sql, arguments, None, False)
        return Done(cursor.rowcount, [prepared.row(raw) for raw in raw_rows])
    finally:
        cursor.close()

"""Execution records (E1–E8): submitted with the workspace writer taken (a read-only one
without it, W2), finished once."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shellyard.store import one_trip
from shellyard.store.db import Database, Row, execute_prepared
from shellyard.store.leases import EXECUTION, LeaseTerms, delete_lease, insert_lease
from shellyard.store.notices import add_notice
from shellyard.store.records import from_row, from_rows, maybe
from shellyard.store.schema import (
    executions,
    foreground_waits,
    timers,
    workspaces,
)
from shellyard.store.workspaces import release_writer

TERMINAL_STATES = ("completed", "cancelled", "failed", "unknown")
ACTIVE_STATES = ("queued", "running")


#: Terminal states in which the command is known to have ended (not ``unknown``): N6.
FINISHED_STATES = ("completed", "cancelled", "failed")


@dataclass(frozen=True, slots=True, kw_only=True)
class Execution:
    """An ``executions`` row as the control plane reads it (docs/architecture.md "Records at
    the store boundary"); the columns are described in store/schema.py."""

    id: str
    #: Submission order (W1).
    seq: int
    agent_id: str
    workspace_id: str
    runner_id: str
    environment_id: str | None
    environment_revision: int | None
    #: V5: the environment change a queued execution waits for.
    waiting_for: str | None
    command: str | None
    script_path: str | None
    background: bool
    idempotency_key: str | None
    #: an ``ExecutionState`` value
    state: str
    exit_code: int | None
    error: str | None
    cancel_requested: bool = False
    #: E9: consecutive retryable status-query failures, and whether it was ever unknown.
    query_failures: int = 0
    was_unknown: bool = False
    snapshot_seq: int | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    #: JSON of the sandbox policy it ran under.
    sandbox_policy: str | None
    logs_pruned_at: float | None
    #: W2: a reader beside the writer.
    read_only: bool = False
    #: R2: the limit that ended it, and what its cgroup measured.
    ended_by_limit: str | None
    peak_memory_bytes: int | None
    cpu_seconds: float | None
    #: E1 options: JSON text of timeout_ms, env, cwd, args (control/executions/options.py).
    run_options: str | None
    #: E9: the runner's state id a start whose answer never came was sent to (revision
    #: 0015_runner_state; control/executions/unstarted.py).
    runner_state: str | None = None
    #: N6 folded into the finishing transaction: how many reminders it cancelled; None when
    #: the end did not ask (not a column).
    timers_cancelled: int | None = None


class ExecutionRecords(Database):
    """Executions of commands."""

    async def submit_execution(
        self, values: dict[str, Any], *, queue: bool, lease: LeaseTerms | None = None
    ) -> tuple[Execution | None, str | None]:
        """Insert the record and take the workspace writer in one transaction (W1).

        Returns (record, holder). When the writer is held and ``queue`` is false nothing is
        recorded (None) and the holder's id comes back; with ``queue`` the record stays
        ``queued``.
        A read-only record (``values["read_only"]``) neither takes nor waits for the writer.
        ``lease``: the execution's lease is taken too when it is to start now (not queued).
        """
        try:
            row, holder = await self.run_statement(_submit, values, queue, lease)
        except _Refused as refused:
            return None, refused.holder
        return from_row(Execution, row), holder

    async def get_execution(self, execution_id: str) -> Execution | None:
        return maybe(Execution, await self.run(_get, execution_id))

    async def find_idempotent(self, agent_id: str, key: str) -> Execution | None:
        row = await self.one(
            sa.select(executions).where(
                executions.c.agent_id == agent_id, executions.c.idempotency_key == key
            )
        )
        return maybe(Execution, row)

    async def update_execution(
        self, execution_id: str, *, from_states: Sequence[str] = ACTIVE_STATES, **values: Any
    ) -> bool:
        """Update only while the record is in ``from_states``: a terminal record is never
        rewritten by a late update (W3, E7 "returns its terminal record unchanged")."""
        return await self.run(_update_execution, execution_id, tuple(from_states), values)

    async def start_execution(
        self, execution_id: str, started_at: float, values: dict[str, Any] | None = None
    ) -> Execution | None:
        """Mark a record running (with ``values`` written too) and return it, in one
        transaction."""
        row = await self.run_statement(_start_execution, execution_id, started_at, values or {})
        return maybe(Execution, row)

    async def finish_execution(
        self,
        execution: Execution,
        values: dict[str, Any],
        notice_summary: str,
        notice_read: bool,
        from_states: Sequence[str],
        lease_holder: str | None = None,
        cancel_timers: bool = False,
    ) -> tuple[Execution | None, Execution | None, bool]:
        """Make a record terminal, post its notice, release its writer and find the next
        queued writer of its workspace: one transaction. ``cancel_timers``: N6 in the same
        transaction (the pending reminders naming it that had not come due are cancelled;
        how many is the final record's ``timers_cancelled``). The notice is posted read when
        ``notice_read`` (a caller of this replica waits) or, on PostgreSQL, when a live
        foreground wait of another replica names the execution (N3). Returns (final record
        or None when it was already terminal, next queued record, whether the notice was
        posted read). ``lease_holder``: that replica's lease of the execution goes too."""
        final, queued, read = await self.run(
            _finish_execution,
            execution, values, notice_summary, notice_read, tuple(from_states), lease_holder,
            cancel_timers,
        )  # fmt: skip
        return maybe(Execution, final), maybe(Execution, queued), read

    # N3 across replicas: a foreground caller on a replica that does not watch the execution.

    async def add_foreground_wait(
        self, execution_id: str, waiter_id: str, expires_at: float
    ) -> None:
        """Record a caller waiting for the execution (PostgreSQL only: SQLite is one
        replica, whose finalizer knows its own waiters)."""
        await self.run(_add_foreground_wait, execution_id, waiter_id, expires_at)

    async def renew_foreground_wait(
        self, execution_id: str, waiter_id: str, expires_at: float
    ) -> bool:
        """Push the wait's expiry forward; False: its row is gone (the finalizer took it,
        so the execution ended)."""
        return await self.run(_renew_foreground_wait, execution_id, waiter_id, expires_at)

    async def drop_foreground_wait(self, execution_id: str, waiter_id: str) -> None:
        """The wait is over. Blocks while a finalizer that saw the row has not committed, so
        the caller's next read of the record sees what that finalizer wrote."""
        await self.run(_drop_foreground_wait, execution_id, waiter_id)

    async def next_queued(self, workspace_id: str) -> Execution | None:
        return maybe(Execution, await self.run(_next_queued, workspace_id))

    async def queued_readers(self, workspace_id: str) -> list[Execution]:
        """Read-only records not started yet (behind an environment change, V5, or left by
        a crash between submit and start): they wait for no writer (W2)."""
        rows = await self.all(
            sa.select(executions)
            .where(
                executions.c.workspace_id == workspace_id,
                executions.c.state == "queued",
                executions.c.read_only,
            )
            .order_by(executions.c.seq)
        )
        return from_rows(Execution, rows)

    async def active_executions(self) -> list[Execution]:
        rows = await self.all(
            sa.select(executions)
            .where(executions.c.state.in_(ACTIVE_STATES))
            .order_by(executions.c.seq)
        )
        return from_rows(Execution, rows)

    async def unsettled_on_runner(self, runner_id: str) -> list[Execution]:
        """The runner's executions whose outcome is unknown and still asked about (E9: a
        final unknown has its end); only the runner can settle them."""
        rows = await self.all(
            sa.select(executions)
            .where(
                executions.c.runner_id == runner_id,
                executions.c.state == "unknown",
                executions.c.finished_at.is_(None),
            )
            .order_by(executions.c.seq)
        )
        return from_rows(Execution, rows)

    async def list_executions(
        self, agent_id: str | None = None, limit: int = 100
    ) -> list[Execution]:
        stmt = sa.select(executions).order_by(executions.c.seq.desc()).limit(limit)
        if agent_id is not None:
            stmt = stmt.where(executions.c.agent_id == agent_id)
        return from_rows(Execution, await self.all(stmt))


# ---------------------------------------------------------------------- operations
# Each runs inside one transaction on ``conn``.


class _Refused(Exception):
    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


# Built once (docs/benchmarks.md "CPU per execution"): building a Core statement and its
# cache key costs about three times its execution on SQLite; these take bind parameters.
_INSERT = (
    executions.insert()
    .values(
        # Submission order (W1), taken in the insert itself: one statement fewer.
        seq=sa.select(sa.func.coalesce(sa.func.max(executions.c.seq), 0) + 1).scalar_subquery()
    )
    .returning(*executions.c)
)
_BY_ID = sa.select(executions).where(executions.c.id == sa.bindparam("b_id"))
#: ``finished_at IS NULL``: a final ``unknown`` shares its state with one still asked about
#: (E9), and a late answer about it (a watcher on another replica, a lease taken over after a
#: runner's removal ended it) must not reopen it: its writer is let go, its end posted.
_UPDATE = (
    executions.update()
    .where(
        executions.c.id == sa.bindparam("b_id"),
        executions.c.state.in_(sa.bindparam("b_from", expanding=True)),
        executions.c.finished_at.is_(None),
    )
    .returning(*executions.c)
)
#: SQLite (``execute_prepared``, store/db.py): ``_UPDATE`` with one parameter per state, by
#: their count (an expanding ``IN`` is rendered per call).
_UPDATES: dict[int, sa.Update] = {}


def _update_of(count: int) -> sa.Update:
    stmt = _UPDATES.get(count)
    if stmt is None:
        states: list[sa.BindParameter[str]] = [
            sa.bindparam(f"b_from_{i}", type_=sa.String()) for i in range(count)
        ]
        stmt = _UPDATES[count] = (
            executions.update()
            .where(
                executions.c.id == sa.bindparam("b_id"),
                executions.c.state.in_(states),
                executions.c.finished_at.is_(None),
            )
            .returning(*executions.c)
        )
    return stmt


# The writer, unless a writer queued before this one waits for it (W1).
_TAKE_WRITER = (
    workspaces.update()
    .where(
        workspaces.c.id == sa.bindparam("b_workspace"),
        workspaces.c.writer_id.is_(None),
        ~sa.exists(
            sa.select(executions.c.id).where(
                executions.c.workspace_id == sa.bindparam("b_workspace"),
                executions.c.state == "queued",
                executions.c.id != sa.bindparam("b_id"),
                sa.not_(executions.c.read_only),
            )
        ),
    )
    .values(writer_kind="execution", writer_id=sa.bindparam("b_id"))
)
_WRITER_OF = sa.select(workspaces.c.writer_id).where(workspaces.c.id == sa.bindparam("b_workspace"))
_NEXT_QUEUED = (
    sa.select(executions)
    .where(
        executions.c.workspace_id == sa.bindparam("b_workspace"),
        executions.c.state == "queued",
        sa.not_(executions.c.read_only),  # a reader never waits for the writer
    )
    .order_by(executions.c.seq)
    .limit(1)
)
_CANCEL_TIMERS = (
    timers.update()
    .where(
        timers.c.execution_id == sa.bindparam("b_id"),
        timers.c.state == "pending",
        timers.c.fire_at > sa.bindparam("b_finished"),
    )
    .values(
        state="cancelled",
        cancel_reason=sa.bindparam("b_reason"),
        cancelled_at=sa.bindparam("b_now"),
    )
)


def _submit(
    conn: Connection, values: dict[str, Any], queue: bool, lease: LeaseTerms | None
) -> tuple[Row, str | None]:
    values = {**values, "state": "queued", "created_at": time.time()}
    if conn.dialect.name != "sqlite":  # one statement, one round trip (store/one_trip.py)
        return _submit_in_one(conn, values, queue, lease)
    # SQLite: the statements compiled once, through the DBAPI cursor (execute_prepared)
    row = execute_prepared(conn, _INSERT, values).first()
    assert row is not None
    holder = None
    # W2: a reader beside the writer takes nothing
    if (
        not values.get("read_only")
        and not execute_prepared(
            conn, _TAKE_WRITER, {"b_workspace": values["workspace_id"], "b_id": values["id"]}
        ).rowcount
    ):
        writer = execute_prepared(conn, _WRITER_OF, {"b_workspace": values["workspace_id"]})
        holder = writer.scalar() or "a queued writer"
        if not queue:
            raise _Refused(holder)  # rolls the insert back: nothing recorded half-way
    if lease is not None and holder is None:  # it starts now: whoever submits watches it
        insert_lease(conn, EXECUTION, values["id"], lease)
    return row, holder


def _submit_in_one(
    conn: Connection, values: dict[str, Any], queue: bool, lease: LeaseTerms | None
) -> tuple[Row, str | None]:
    inserted, starts, seen = one_trip.submit(conn, values, queue, lease)
    if inserted is None:  # refused, nothing written: the holder as it is now, for the message
        writer = conn.execute(_WRITER_OF, {"b_workspace": values["workspace_id"]})
        raise _Refused(writer.scalar_one_or_none() or "a queued writer")
    return inserted, None if starts else (seen or "a queued writer")


def _get(conn: Connection, execution_id: str) -> Row | None:
    return execute_prepared(conn, _BY_ID, {"b_id": execution_id}).first()


def _update_execution(
    conn: Connection, execution_id: str, from_states: tuple[str, ...], values: dict[str, Any]
) -> bool:
    return _updated(conn, execution_id, from_states, values) is not None


def _updated(
    conn: Connection, execution_id: str, from_states: tuple[str, ...], values: dict[str, Any]
) -> Row | None:
    """The record after the update, or None when it was not in ``from_states``."""
    if conn.dialect.name == "sqlite" and values:
        params = {**values, "b_id": execution_id}
        for index, state in enumerate(from_states):
            params[f"b_from_{index}"] = state
        return execute_prepared(conn, _update_of(len(from_states)), params).first()
    params = {**values, "b_id": execution_id, "b_from": list(from_states)}
    row = conn.execute(_UPDATE, params).mappings().first()
    return dict(row) if row is not None else None


def _start_execution(
    conn: Connection, execution_id: str, started_at: float, values: dict[str, Any]
) -> Row | None:
    started = {**values, "state": "running", "started_at": started_at}
    row = _updated(conn, execution_id, ACTIVE_STATES, started)
    if row is None:  # ended meanwhile (cancelled): the record as it is
        row = _get(conn, execution_id)
    return row


def _next_queued(conn: Connection, workspace_id: str) -> Row | None:
    return execute_prepared(conn, _NEXT_QUEUED, {"b_workspace": workspace_id}).first()


def cancel_execution_timers(
    conn: Connection, execution_id: str, finished_at: float | None, reason: str | None = None
) -> int:
    """N6: the pending timers naming the execution that had not come due when it finished
    (``finished_at``) are cancelled; one that came due first (the service was down) still
    fires, late. Returns how many."""
    reason = reason or f"execution {execution_id} finished before the reminder was due"
    cancelled = execute_prepared(
        conn,
        _CANCEL_TIMERS,
        {
            "b_id": execution_id,
            "b_finished": finished_at or time.time(),
            "b_reason": reason,
            "b_now": time.time(),
        },
    )
    return int(cancelled.rowcount)


def _finish_execution(
    conn: Connection,
    execution: Execution,
    values: dict[str, Any],
    notice_summary: str,
    notice_read: bool,
    from_states: tuple[str, ...],
    lease_holder: str | None = None,
    cancel_timers: bool = False,
) -> tuple[Row | None, Row | None, bool]:
    execution_id, workspace_id = execution.id, execution.workspace_id
    final = _updated(conn, execution_id, from_states, values)
    if conn.dialect.name != "sqlite":  # the rest in one statement (store/one_trip.py)
        return one_trip.finish_rest(
            conn,
            (execution_id, workspace_id, execution.agent_id),
            final,
            notice_summary,
            notice_read,
            lease_holder,
            cancel_timers,
        )
    if final is not None:
        if cancel_timers:  # N6 folded in (PostgreSQL's is in one_trip.finish_rest)
            cancelled = cancel_execution_timers(conn, execution_id, final["finished_at"])
            final = {**final, "timers_cancelled": cancelled}
        # No foreground_waits on SQLite (one replica, whose finalizer knows its waiters).
        add_notice(
            conn,
            execution.agent_id,
            "execution",
            execution_id,
            notice_summary,
            {"state": final["state"], "exit_code": final["exit_code"]},
            time.time() if notice_read else None,
        )
    release_writer(conn, workspace_id, execution_id)
    if lease_holder is not None:
        # The record is final: nobody needs to watch it any more (a replica dying before
        # the queue is handed on leaves a stalled workspace, which a lease round dispatches).
        delete_lease(conn, EXECUTION, execution_id, lease_holder)
    return final, _next_queued(conn, workspace_id), final is not None and notice_read


#: Rows expired this long ago are cleared by the next wait's insert (left by a replica killed
#: between its insert and its delete while the execution had already ended: no finalizer
#: comes for them).
FOREGROUND_WAIT_GC_S = 3600.0


def _add_foreground_wait(
    conn: Connection, execution_id: str, waiter_id: str, expires_at: float
) -> None:
    conn.execute(
        foreground_waits.delete().where(
            foreground_waits.c.expires_at < time.time() - FOREGROUND_WAIT_GC_S
        )
    )
    conn.execute(
        foreground_waits.insert().values(
            execution_id=execution_id, waiter_id=waiter_id, expires_at=expires_at
        )
    )


def _renew_foreground_wait(
    conn: Connection, execution_id: str, waiter_id: str, expires_at: float
) -> bool:
    renewed = conn.execute(
        foreground_waits.update()
        .where(
            foreground_waits.c.execution_id == execution_id,
            foreground_waits.c.waiter_id == waiter_id,
        )
        .values(expires_at=expires_at)
    )
    return bool(renewed.rowcount)


def _drop_foreground_wait(conn: Connection, execution_id: str, waiter_id: str) -> None:
    conn.execute(
        foreground_waits.delete().where(
            foreground_waits.c.execution_id == execution_id,
            foreground_waits.c.waiter_id == waiter_id,
        )
    )

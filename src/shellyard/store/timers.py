"""Timers (N5–N7): reminders that fire exactly once, or are cancelled with their execution."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shellyard.store.db import Database, Row, fetch_all, fetch_one, insert_returning
from shellyard.store.executions import FINISHED_STATES, Execution, cancel_execution_timers
from shellyard.store.notices import add_notice
from shellyard.store.records import from_row, from_rows, maybe
from shellyard.store.schema import (
    executions,
    timers,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Timer:
    """A ``timers`` row (N5-N7; docs/architecture.md "Records at the store boundary")."""

    id: str
    agent_id: str
    session_id: str
    text: str
    #: What the caller gave: {"after_ms": n} or {"at": "..."}; ``fire_at`` is the instant.
    spec: dict[str, Any]
    fire_at: float
    #: N6: the execution whose end cancels it, if any.
    execution_id: str | None
    #: a ``TimerState`` value
    state: str
    late: bool = False
    cancel_reason: str | None
    created_at: float
    fired_at: float | None
    cancelled_at: float | None


class TimerRecords(Database):
    """Timers and their reminders."""

    async def create_timer(
        self, values: dict[str, Any], *, announce: tuple[str, str] | None = None
    ) -> Timer:
        """Insert a timer; ``announce`` (PostgreSQL): a (channel, payload) NOTIFY sent by the
        same transaction, so the other replicas hear of exactly the timers that exist."""
        return from_row(Timer, await self.run(_create_timer, values, announce))

    async def get_timer(self, timer_id: str) -> Timer | None:
        return maybe(Timer, await self.one(sa.select(timers).where(timers.c.id == timer_id)))

    async def list_timers(
        self,
        agent_id: str,
        state: str | None = None,
        *,
        after: str | None = None,
        limit: int | None = None,
    ) -> list[Timer]:
        """The agent's timers by firing time; ``after``: only those past that timer (a page's
        cursor), ``limit``: at most that many."""
        stmt = sa.select(timers).where(timers.c.agent_id == agent_id)
        if state is not None:
            stmt = stmt.where(timers.c.state == state)
        if after is not None:
            mark = (
                sa.select(timers.c.fire_at)
                .where(timers.c.id == after, timers.c.agent_id == agent_id)
                .scalar_subquery()
            )
            stmt = stmt.where(
                sa.or_(
                    timers.c.fire_at > mark,
                    sa.and_(timers.c.fire_at == mark, timers.c.id > after),
                )
            )
        stmt = stmt.order_by(timers.c.fire_at, timers.c.id)
        return from_rows(Timer, await self.all(stmt if limit is None else stmt.limit(limit)))

    async def cancel_timers(
        self, reason: str, *, timer_id: str | None = None, execution: Row | None = None
    ) -> list[Timer]:
        """Cancel pending timers: one by id, or those naming a finished execution that had not
        come due when it finished (N6). Fired or cancelled timers never change."""
        return from_rows(Timer, await self.run(_cancel_timers, reason, timer_id, execution))

    async def cancel_execution_timers(self, execution: Execution, reason: str) -> int:
        """N6 at an execution's end, in one statement (it runs at every end on PostgreSQL):
        the pending timers naming it that had not come due. Returns how many."""
        return await self.run(cancel_execution_timers, execution.id, execution.finished_at, reason)

    async def execution_for_new_timer(self, execution_id: str) -> Execution | None:
        """The execution a timer just created names, read with a share lock (PostgreSQL): an
        end whose transaction is under way (it cancels N6 reminders in that transaction,
        which may have run before this timer was committed) is waited for, so either that
        end saw the timer or this read sees the end."""
        row = await self.one(
            sa.select(executions).where(executions.c.id == execution_id).with_for_update(read=True)
        )
        return maybe(Execution, row)

    async def pending_timer_executions(self) -> set[str]:
        rows = await self.all(
            sa.select(timers.c.execution_id).where(
                timers.c.state == "pending", timers.c.execution_id.is_not(None)
            )
        )
        return {str(r["execution_id"]) for r in rows}

    async def due_timers(self, now: float) -> tuple[list[str], float | None]:
        """(ids of pending timers due at ``now`` in fire order, fire_at of the next one)."""
        return await self.run(_due_timers, now)

    async def fire_timer(
        self, timer_id: str, late_if_due_before: float
    ) -> tuple[Timer | None, bool]:
        """N7 exactly once: claim the pending timer (pending → fired) and post its reminder
        notice in one transaction; it is late if it was due before ``late_if_due_before``. A
        timer naming an execution that finished before the timer came due is cancelled
        instead (N6). Returns (timer after, whether it fired)."""
        row, fired = await self.run(_fire_timer, timer_id, late_if_due_before)
        return maybe(Timer, row), fired


# ---------------------------------------------------------------------- operations
# Each runs inside one transaction on ``conn``.


def _create_timer(
    conn: Connection, values: dict[str, Any], announce: tuple[str, str] | None
) -> Row:
    row = insert_returning(conn, timers, values)
    if announce is not None:
        conn.execute(sa.select(sa.func.pg_notify(*announce)))
    return row


def _cancel_timers(
    conn: Connection, reason: str, timer_id: str | None, execution: Row | None
) -> list[Row]:
    if timer_id is None:
        assert execution is not None
        cancel_execution_timers(conn, str(execution["id"]), execution["finished_at"], reason)
        return fetch_all(conn, sa.select(timers).where(timers.c.execution_id == execution["id"]))
    conn.execute(
        timers.update()
        .where(timers.c.state == "pending", timers.c.id == timer_id)
        .values(state="cancelled", cancel_reason=reason, cancelled_at=time.time())
    )
    return fetch_all(conn, sa.select(timers).where(timers.c.id == timer_id))


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
    timer = fetch_one(conn, sa.select(timers).where(timers.c.id == timer_id))
    if timer is None or timer["state"] != "pending":
        return timer, False
    if timer["execution_id"] is not None:
        execution = fetch_one(
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
            return fetch_one(conn, sa.select(timers).where(timers.c.id == timer_id)), False
    late = bool(timer["fire_at"] < late_if_due_before)
    claimed = conn.execute(
        timers.update()
        .where(timers.c.id == timer_id, timers.c.state == "pending")
        .values(state="fired", fired_at=now, late=late)
    )
    if not claimed.rowcount:  # another control plane fired it first
        return fetch_one(conn, sa.select(timers).where(timers.c.id == timer_id)), False
    payload = {
        "timer_id": timer_id,
        "text": timer["text"],
        "fire_at": timer["fire_at"],
        "fired_at": now,
        "late": late,
        "execution_id": timer["execution_id"],
    }
    summary = f"reminder{' (late)' if late else ''}: {timer['text']}"
    add_notice(conn, str(timer["agent_id"]), "reminder", timer_id, summary, payload, None)
    return fetch_one(conn, sa.select(timers).where(timers.c.id == timer_id)), True

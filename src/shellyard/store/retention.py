"""Records retention prunes (docs/operations.md): which executions' logs may go, which old
records, events, wakes, deliveries, timers and notices to delete, and reclaiming the space.

Every function is one short transaction over at most ``batch`` rows, so the event loop (which
runs SQLite statements directly, see store.py) serves requests between two batches.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shellyard.store.db import Database
from shellyard.store.executions import TERMINAL_STATES
from shellyard.store.files import TERMINAL_TRANSFER_STATES
from shellyard.store.schema import (
    agents,
    artifacts,
    delivery_attempts,
    executions,
    notices,
    session_events,
    sessions,
    timers,
    transfer_files,
    transfers,
    wake_deliveries,
    wakes,
)


@dataclass(frozen=True)
class Cutoffs:
    """UNIX times: rows older than these may go. ``archived`` applies to everything of an
    archived session (it is shorter: nobody reads those any more)."""

    logs: float
    records: float
    events: float
    archived: float

    @classmethod
    def from_days(
        cls, log_days: float, record_days: float, event_days: float, archived_days: float
    ) -> Cutoffs:
        now = time.time()

        def before(days: float) -> float:
            return max(0.0, now - days * 86400)  # infinite days: nothing is older than 1970

        return cls(
            logs=before(log_days),
            records=before(record_days),
            events=before(event_days),
            archived=before(archived_days),
        )


def _archived_agent_ids() -> sa.Select[Any]:
    return (
        sa.select(agents.c.id)
        .join(sessions, sessions.c.id == agents.c.session_id)
        .where(sessions.c.state == "archived")
    )


def _prunable_executions(cutoff: float, archived: float | None) -> sa.Select[Any]:
    """Finished executions older than the cutoff that nothing still needs: not an artifact's
    snapshot, no unread (live) notice, no pending reminder naming it. An archived session's
    go after ``archived`` even unread: nobody reads them any more."""
    live_notice = sa.exists().where(
        notices.c.kind == "execution",
        notices.c.subject_id == executions.c.id,
        notices.c.read_at.is_(None),
    )
    wanted = sa.and_(executions.c.finished_at < cutoff, ~live_notice)
    if archived is not None:
        wanted = sa.or_(
            wanted,
            sa.and_(
                executions.c.finished_at < archived,
                executions.c.agent_id.in_(_archived_agent_ids()),
            ),
        )
    artifact = sa.exists().where(
        artifacts.c.workspace_id == executions.c.workspace_id,
        artifacts.c.seq == executions.c.snapshot_seq,
    )
    reminder = sa.exists().where(
        timers.c.execution_id == executions.c.id, timers.c.state == "pending"
    )
    return (
        sa.select(executions.c.id, executions.c.runner_id, executions.c.started_at)
        .where(
            executions.c.state.in_(TERMINAL_STATES),
            executions.c.finished_at.is_not(None),
            wanted,
            ~artifact,
            ~reminder,
        )
        .order_by(executions.c.finished_at)
    )


class RetentionRecords(Database):
    """The store's side of retention; the runner side goes through the Runner protocol."""

    async def log_candidates(
        self, runner_id: str, cutoff: float | None, archived: float | None, batch: int
    ) -> list[str]:
        """Executions on the runner whose logs may go, oldest first; ``cutoff`` None: any
        age (a size budget is exceeded)."""
        stmt = (
            _prunable_executions(time.time() + 1 if cutoff is None else cutoff, archived)
            .where(
                executions.c.runner_id == runner_id,
                executions.c.logs_pruned_at.is_(None),
                executions.c.started_at.is_not(None),
            )
            .limit(batch)
        )
        return [str(r["id"]) for r in await self.all(stmt)]

    async def unread_log_candidates(self, runner_id: str, offset: int, batch: int) -> list[str]:
        """Finished executions on the runner whose logs an unread notice keeps, oldest
        first: under a size budget they are cut to head and tail, never deleted."""
        live_notice = sa.exists().where(
            notices.c.kind == "execution",
            notices.c.subject_id == executions.c.id,
            notices.c.read_at.is_(None),
        )
        stmt = (
            sa.select(executions.c.id)
            .where(
                executions.c.runner_id == runner_id,
                executions.c.state.in_(TERMINAL_STATES),
                executions.c.finished_at.is_not(None),
                executions.c.logs_pruned_at.is_(None),
                live_notice,
            )
            .order_by(executions.c.finished_at)
            .offset(offset)
            .limit(batch)
        )
        return [str(r["id"]) for r in await self.all(stmt)]

    async def record_candidates(
        self, runner_id: str, cutoff: float, archived: float, batch: int
    ) -> list[str]:
        stmt = (
            _prunable_executions(cutoff, archived)
            .where(executions.c.runner_id == runner_id)
            .limit(batch)
        )
        return [str(r["id"]) for r in await self.all(stmt)]

    async def mark_logs_pruned(self, execution_ids: Sequence[str]) -> None:
        await self.run(_mark_logs_pruned, list(execution_ids))

    async def delete_executions(self, execution_ids: Sequence[str]) -> int:
        return await self.run(_delete_executions, list(execution_ids))

    async def prune_transfers(self, cutoffs: Cutoffs, batch: int) -> tuple[int, int]:
        """One batch of finished transfers past ``records`` (archived sessions' past
        ``archived``) whose notice is read: at most ``batch * ENTRY_FACTOR`` of their entries,
        then each transfer left without entries. (transfers deleted, entries deleted); call
        again while it returns anything."""
        return await self.run(_prune_transfers, cutoffs, batch)

    async def prune_events(self, cutoffs: Cutoffs, batch: int) -> dict[str, int]:
        """One batch of each kind; call again while it returns anything."""
        return await self.run(_prune_events, cutoffs, batch)

    def database_path(self) -> Path | None:
        """The SQLite file (None on PostgreSQL)."""
        engine = self._sync
        if engine is None or not engine.url.database:
            return None
        return Path(engine.url.database)

    async def reclaim_pages(self, pages_per_step: int = 2048) -> dict[str, int]:
        """SQLite: give freed pages back to the file system (incremental vacuum, then a WAL
        checkpoint that truncates the log). PostgreSQL's autovacuum does this itself.

        In steps of ``pages_per_step`` (8 MiB) with the event loop free in between: SQLite
        runs on the loop's thread, and freeing 70 MiB in one statement took 2.5 s (measured)."""
        engine = self._sync
        if engine is None:
            return {}
        before = after = 0
        while True:
            # the store's one connection (Database.connection); these PRAGMAs and the
            # script run outside any transaction, so none is left open on it
            driver = self.connection().connection.dbapi_connection
            assert driver is not None
            pages, free = (
                driver.execute("PRAGMA page_count").fetchone()[0],
                driver.execute("PRAGMA freelist_count").fetchone()[0],
            )
            before = before or pages
            after = pages
            if not free:
                driver.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                break
            # It frees one page per step and execute() steps once (measured: 1 of 5,152);
            # executescript steps it to the end.
            driver.executescript(f"PRAGMA incremental_vacuum({int(pages_per_step)});")
            driver.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            await asyncio.sleep(0)
        return {"pages_before": before, "pages_after": after}

    async def prepare_incremental_vacuum(self) -> bool:
        """SQLite: turn a database made before incremental vacuum on (``auto_vacuum`` can
        change only before the first table exists, or by one VACUUM). Returns True if it ran.
        Called once at start-up, before anything else uses the database."""
        engine = self._sync
        if engine is None:
            return False
        conn = self.connection()  # the store's one connection (Database.connection)
        try:
            mode = conn.exec_driver_sql("PRAGMA auto_vacuum").scalar()
            if mode == 2:
                return False
            conn.exec_driver_sql("PRAGMA auto_vacuum=INCREMENTAL")
            conn.commit()
            driver = conn.connection.dbapi_connection
            assert driver is not None
            driver.execute("VACUUM")  # outside any transaction, as VACUUM requires
        finally:
            if conn.in_transaction():  # left as closing a connection of its own left it
                conn.rollback()
        return True


def _mark_logs_pruned(conn: Connection, execution_ids: list[str]) -> None:
    if execution_ids:
        conn.execute(
            executions.update()
            .where(executions.c.id.in_(execution_ids))
            .values(logs_pruned_at=time.time())
        )


def _delete_executions(conn: Connection, execution_ids: list[str]) -> int:
    if not execution_ids:
        return 0
    conn.execute(
        notices.delete().where(
            notices.c.kind == "execution", notices.c.subject_id.in_(execution_ids)
        )
    )
    return int(conn.execute(executions.delete().where(executions.c.id.in_(execution_ids))).rowcount)


#: Entries of transfers deleted per transaction: ``batch`` times this (a transfer holds up to
#: ``transfer_max_entries`` of them; 10,000 rows took ~20 ms to delete here).
ENTRY_FACTOR = 20


def _prune_transfers(conn: Connection, cutoffs: Cutoffs, batch: int) -> tuple[int, int]:
    live_notice = sa.exists().where(
        notices.c.kind == "transfer",
        notices.c.subject_id == transfers.c.id,
        notices.c.read_at.is_(None),
    )
    old = sa.or_(
        sa.and_(transfers.c.finished_at < cutoffs.records, ~live_notice),
        sa.and_(
            transfers.c.finished_at < cutoffs.archived,
            transfers.c.agent_id.in_(_archived_agent_ids()),
        ),
    )
    ids = [
        str(r[0])
        for r in conn.execute(
            sa.select(transfers.c.id)
            .where(
                transfers.c.state.in_(TERMINAL_TRANSFER_STATES),
                transfers.c.finished_at.is_not(None),
                old,
            )
            .order_by(transfers.c.finished_at)
            .limit(batch)
        )
    ]
    budget = batch * ENTRY_FACTOR
    entries = 0
    emptied: list[str] = []
    for transfer_id in ids:
        if budget <= 0:
            break
        of = transfer_files.c.transfer_id == transfer_id
        bound = conn.execute(
            sa.select(transfer_files.c.idx)
            .where(of)
            .order_by(transfer_files.c.idx)
            .offset(budget)
            .limit(1)
        ).scalar()
        gone = conn.execute(
            transfer_files.delete().where(
                of, *([transfer_files.c.idx < bound] if bound is not None else [])
            )
        ).rowcount
        entries += int(gone)
        budget -= int(gone)
        if bound is None:
            emptied.append(transfer_id)
    if emptied:
        conn.execute(
            notices.delete().where(notices.c.kind == "transfer", notices.c.subject_id.in_(emptied))
        )
        conn.execute(transfers.delete().where(transfers.c.id.in_(emptied)))
    return len(emptied), entries


def _older(column: Any, agent_column: Any, cutoffs: Cutoffs) -> Any:
    return sa.or_(
        column < cutoffs.events,
        sa.and_(column < cutoffs.archived, agent_column.in_(_archived_agent_ids())),
    )


def _prune_events(conn: Connection, cutoffs: Cutoffs, batch: int) -> dict[str, int]:
    done: dict[str, int] = {}
    # Wakes whose every delivery is settled (none pending), with their deliveries and attempts.
    pending = sa.exists().where(
        wake_deliveries.c.wake_id == wakes.c.id, wake_deliveries.c.state == "pending"
    )
    wake_ids = [
        str(r[0])
        for r in conn.execute(
            sa.select(wakes.c.id)
            .where(_older(wakes.c.created_at, wakes.c.agent_id, cutoffs), ~pending)
            .order_by(wakes.c.seq)
            .limit(batch)
        )
    ]
    if wake_ids:
        deliveries = sa.select(wake_deliveries.c.id).where(wake_deliveries.c.wake_id.in_(wake_ids))
        conn.execute(
            delivery_attempts.delete().where(delivery_attempts.c.delivery_id.in_(deliveries))
        )
        conn.execute(wake_deliveries.delete().where(wake_deliveries.c.wake_id.in_(wake_ids)))
        conn.execute(wakes.delete().where(wakes.c.id.in_(wake_ids)))
    done["wakes"] = len(wake_ids)
    archived_sessions = sa.select(sessions.c.id).where(sessions.c.state == "archived")
    event_seqs = sa.select(session_events.c.seq).where(
        sa.or_(
            session_events.c.created_at < cutoffs.events,
            sa.and_(
                session_events.c.created_at < cutoffs.archived,
                session_events.c.session_id.in_(archived_sessions),
            ),
        )
    )
    done["session_events"] = _delete_batch(
        conn, session_events, session_events.c.seq, event_seqs, batch
    )
    # Read notices (an unread one is live, unless its session is archived: nobody reads it).
    # An execution's notice goes with its record (a record without one would wake again).
    notice_ids = sa.select(notices.c.id).where(
        notices.c.kind != "execution",
        sa.or_(
            sa.and_(notices.c.created_at < cutoffs.events, notices.c.read_at.is_not(None)),
            sa.and_(
                notices.c.created_at < cutoffs.archived,
                notices.c.agent_id.in_(_archived_agent_ids()),
            ),
        ),
    )
    done["notices"] = _delete_batch(conn, notices, notices.c.id, notice_ids, batch)
    timer_ids = sa.select(timers.c.id).where(
        timers.c.state != "pending", _older(timers.c.created_at, timers.c.agent_id, cutoffs)
    )
    done["timers"] = _delete_batch(conn, timers, timers.c.id, timer_ids, batch)
    return done


def _delete_batch(
    conn: Connection, table: sa.Table, key: Any, candidates: sa.Select[Any], batch: int
) -> int:
    ids = [r[0] for r in conn.execute(candidates.order_by(key).limit(batch))]
    if not ids:
        return 0
    conn.execute(table.delete().where(key.in_(ids)))
    return len(ids)


__all__ = ["Cutoffs", "RetentionRecords"]

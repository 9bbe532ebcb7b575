"""Notices (N1): one per (kind, subject), read or unread; posting one wakes listeners."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from shellyard.store.db import Database, execute_prepared, new_id
from shellyard.store.records import from_rows
from shellyard.store.schema import (
    notices,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Notice:
    """A ``notices`` row (N1; docs/architecture.md "Records at the store boundary"): one per
    (kind, subject); ``read_at`` None while unread, ``woke_at``/``wake_id`` set by the one wake
    that delivered it (N2)."""

    id: str
    agent_id: str
    kind: str
    subject_id: str
    summary: str
    payload: dict[str, Any] | None
    created_at: float
    read_at: float | None
    woke_at: float | None
    wake_id: str | None


class NoticeRecords(Database):
    """Notices of agents."""

    #: Called with the agent id after ``add_notice`` posted a notice (wakes hook in, N2).
    notice_listeners: list[Callable[[str], Awaitable[Any]]]

    async def add_notice(
        self,
        agent_id: str,
        kind: str,
        subject_id: str,
        summary: str,
        payload: dict[str, Any] | None = None,
    ) -> None:
        """N1: one notice per (kind, subject); a repeated post is a no-op."""
        await self.run(add_notice, agent_id, kind, subject_id, summary, payload, None)
        for listener in self.notice_listeners:
            await listener(agent_id)

    async def mark_notice_read(self, kind: str, subject_id: str) -> None:
        await self.run(_mark_notice_read, kind, subject_id)

    async def list_notices(
        self,
        agent_id: str,
        unread_only: bool = False,
        *,
        after: str | None = None,
        limit: int | None = None,
    ) -> list[Notice]:
        """The agent's notices, oldest first; ``after``: only those past that notice (a page's
        cursor), ``limit``: at most that many."""
        stmt = sa.select(notices).where(notices.c.agent_id == agent_id)
        if unread_only:
            stmt = stmt.where(notices.c.read_at.is_(None))
        if after is not None:
            mark = (
                sa.select(notices.c.created_at)
                .where(notices.c.id == after, notices.c.agent_id == agent_id)
                .scalar_subquery()
            )
            stmt = stmt.where(
                sa.or_(
                    notices.c.created_at > mark,
                    sa.and_(notices.c.created_at == mark, notices.c.id > after),
                )
            )
        stmt = stmt.order_by(notices.c.created_at, notices.c.id)
        return from_rows(Notice, await self.all(stmt if limit is None else stmt.limit(limit)))

    async def unread_counts(self, agent_id: str) -> dict[str, int]:
        """How many unread notices the agent has, by kind (one grouped count, no rows)."""
        stmt = (
            sa.select(notices.c.kind, sa.func.count().label("n"))
            .where(notices.c.agent_id == agent_id, notices.c.read_at.is_(None))
            .group_by(notices.c.kind)
        )
        return {str(row["kind"]): int(row["n"]) for row in await self.all(stmt)}

    async def newest_unread(self, agent_id: str, limit: int) -> list[Notice]:
        """The agent's ``limit`` newest unread notices, oldest first."""
        stmt = (
            sa.select(notices)
            .where(notices.c.agent_id == agent_id, notices.c.read_at.is_(None))
            .order_by(notices.c.created_at.desc(), notices.c.id.desc())
            .limit(limit)
        )
        return from_rows(Notice, reversed(await self.all(stmt)))

    async def mark_notices_read(self, agent_id: str, notice_ids: Sequence[str] | None) -> int:
        """Mark the agent's unread notices read (all of them when ``notice_ids`` is None)."""
        return await self.run(_mark_notices_read, agent_id, notice_ids)


# ---------------------------------------------------------------------- operations
# Each runs inside one transaction on ``conn``.


def add_notice(
    conn: Connection,
    agent_id: str,
    kind: str,
    subject_id: str,
    summary: str,
    payload: dict[str, Any] | None,
    read_at: float | None,
) -> None:
    # One statement: a notice for the same subject already posted stays as it is.
    insert = _INSERT_NEW_SQLITE if conn.dialect.name == "sqlite" else _INSERT_NEW_POSTGRESQL
    execute_prepared(  # compiled once (store/db.py): every execution's end posts one
        conn,
        insert,
        {
            "id": new_id("ntc"),
            "agent_id": agent_id,
            "kind": kind,
            "subject_id": subject_id,
            "summary": summary,
            "payload": payload,
            "created_at": time.time(),
            "read_at": read_at,
        },
    )


#: Built once (docs/benchmarks.md "CPU per execution"); ON CONFLICT on uq_notice_subject.
_INSERT_NEW_SQLITE = sqlite.insert(notices).on_conflict_do_nothing(
    index_elements=[notices.c.kind, notices.c.subject_id]
)
_INSERT_NEW_POSTGRESQL = postgresql.insert(notices).on_conflict_do_nothing(
    index_elements=[notices.c.kind, notices.c.subject_id]
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


def _mark_notices_read(conn: Connection, agent_id: str, notice_ids: Sequence[str] | None) -> int:
    stmt = notices.update().where(notices.c.agent_id == agent_id, notices.c.read_at.is_(None))
    if notice_ids is not None:
        stmt = stmt.where(notices.c.id.in_(list(notice_ids)))
    return int(conn.execute(stmt.values(read_at=time.time())).rowcount)

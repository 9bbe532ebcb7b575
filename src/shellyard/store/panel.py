"""Session-wide reads for the web page's session file panel (and any door that wants them):
paged execution lists across the agents of a session, newest first, and a small digest of
everything the panel shows, so a change stream can tell what changed without reading it all.

Every query is bounded (a page, a count, a group-by over a handful of states) and goes through
an index: executions by ``agent_id`` (the idempotency key's unique index starts with it) and
``seq``; timers by ``session_id``'s agents; notices by ``agent_id``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shellyard.store.db import Database
from shellyard.store.executions import Execution
from shellyard.store.files import Artifact
from shellyard.store.notices import Notice
from shellyard.store.owners import Agent, Session
from shellyard.store.records import from_rows
from shellyard.store.schema import (
    agents,
    artifacts,
    executions,
    notices,
    sessions,
    timers,
    transfers,
    workspaces,
)
from shellyard.store.timers import Timer


class PanelRecords(Database):
    async def sessions_newest_first(self, session_id: str | None = None) -> list[Session]:
        stmt = sa.select(sessions).order_by(sessions.c.created_at.desc(), sessions.c.id.desc())
        if session_id is not None:
            stmt = stmt.where(sessions.c.id == session_id)
        return from_rows(Session, await self.all(stmt))

    async def agents_of_sessions(self, session_ids: Sequence[str]) -> list[Agent]:
        rows = await self.all(
            sa.select(agents)
            .where(agents.c.session_id.in_(list(session_ids)))
            .order_by(agents.c.created_at, agents.c.id)
        )
        return from_rows(Agent, rows)

    async def executions_page(
        self, agent_ids: Sequence[str], before_seq: int | None, limit: int
    ) -> list[Execution]:
        """Up to ``limit`` executions of the agents, newest (highest seq) first, older than
        ``before_seq`` when given (the cursor of the previous page)."""
        # Two steps: sort only the seq numbers of the agents' executions, then read the page's
        # rows. Sorting whole rows made a 10,000-execution page 5x slower (no index has seq).
        seqs = (
            sa.select(executions.c.seq)
            .where(executions.c.agent_id.in_(list(agent_ids)))
            .order_by(executions.c.seq.desc())
            .limit(limit)
        )
        if before_seq is not None:
            seqs = seqs.where(executions.c.seq < before_seq)
        rows = await self.all(
            sa.select(executions)
            .where(executions.c.seq.in_(seqs.scalar_subquery()))
            .order_by(executions.c.seq.desc())
        )
        return from_rows(Execution, rows)

    async def execution_counts_of(self, agent_ids: Sequence[str]) -> dict[str, int]:
        """How many executions of the agents are in each state."""
        rows = await self.all(
            sa.select(executions.c.state, sa.func.count().label("n"))
            .where(executions.c.agent_id.in_(list(agent_ids)))
            .group_by(executions.c.state)
        )
        return {str(r["state"]): int(r["n"]) for r in rows}

    async def timers_page(self, agent_ids: Sequence[str], limit: int) -> list[Timer]:
        rows = await self.all(
            sa.select(timers)
            .where(timers.c.agent_id.in_(list(agent_ids)))
            .order_by(timers.c.created_at.desc(), timers.c.id.desc())
            .limit(limit)
        )
        return from_rows(Timer, rows)

    async def notices_page(self, agent_ids: Sequence[str], limit: int) -> list[Notice]:
        rows = await self.all(
            sa.select(notices)
            .where(notices.c.agent_id.in_(list(agent_ids)))
            .order_by(notices.c.created_at.desc(), notices.c.id.desc())
            .limit(limit)
        )
        return from_rows(Notice, rows)

    async def artifacts_of(self, agent_ids: Sequence[str], limit: int) -> list[Artifact]:
        rows = await self.all(
            sa.select(artifacts)
            .where(artifacts.c.agent_id.in_(list(agent_ids)))
            .order_by(artifacts.c.created_at.desc())
            .limit(limit)
        )
        return from_rows(Artifact, rows)

    async def panel_digest(self, session_id: str, agent_ids: Sequence[str]) -> dict[str, Any]:
        """One small, JSON-able value per part of the panel; a part changed when its value did."""
        return await self.run(_digest, session_id, list(agent_ids))


def _digest(conn: Connection, session_id: str, agent_ids: list[str]) -> dict[str, Any]:
    def rows(stmt: sa.Executable) -> list[list[Any]]:
        return [[_plain(v) for v in r] for r in conn.execute(stmt).all()]

    mine = executions.c.agent_id.in_(agent_ids)
    finished = sa.func.coalesce(executions.c.finished_at, 0)
    return {
        "session": rows(sa.select(sessions.c.state).where(sessions.c.id == session_id)),
        "agents": rows(
            sa.select(agents.c.id, agents.c.state, agents.c.gate)
            .where(agents.c.session_id == session_id)
            .order_by(agents.c.id)
        ),
        # A new record, a state change (counts move) or a cancel request.
        "executions": rows(
            sa.select(
                executions.c.state,
                sa.func.count(),
                sa.func.max(executions.c.seq),
                sa.func.max(finished),
                sa.func.sum(sa.cast(executions.c.cancel_requested, sa.Integer)),
            )
            .where(mine)
            .group_by(executions.c.state)
            .order_by(executions.c.state)
        ),
        "transfers": rows(
            sa.select(
                transfers.c.state,
                sa.func.count(),
                sa.func.sum(
                    transfers.c.files_copied
                    + transfers.c.files_unchanged
                    + transfers.c.files_skipped
                    + transfers.c.files_failed
                ),
                sa.func.sum(transfers.c.bytes_done),
            )
            .where(transfers.c.agent_id.in_(agent_ids))
            .group_by(transfers.c.state)
            .order_by(transfers.c.state)
        ),
        "timers": rows(
            sa.select(timers.c.state, sa.func.count())
            .where(timers.c.agent_id.in_(agent_ids))
            .group_by(timers.c.state)
            .order_by(timers.c.state)
        ),
        "notices": rows(
            sa.select(sa.func.count(), sa.func.count(notices.c.read_at)).where(
                notices.c.agent_id.in_(agent_ids)
            )
        ),
        "files": rows(
            sa.select(workspaces.c.id, workspaces.c.head_seq)
            .where(workspaces.c.agent_id.in_(agent_ids))
            .order_by(workspaces.c.id)
        ),
        "artifacts": rows(sa.select(sa.func.count()).where(artifacts.c.agent_id.in_(agent_ids))),
    }


def _plain(value: Any) -> Any:
    """Numbers from either database as JSON numbers (PostgreSQL sums come back as Decimal)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return float(value)


__all__ = ["PanelRecords"]

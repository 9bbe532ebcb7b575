"""Session-wide reads for the web page's session file panel (docs/web.md), usable by any door.

The existing services answer for one acting agent; the panel shows a whole session at once:
the executions of every agent (paged, newest first), their transfers, reminders, notices,
workspaces and artifacts. What a principal sees is its reach: admin and session tokens every
agent of the session, an agent token its own agent only (docs/security.md). Anything outside
it is reported like a missing object.

Live updates: ``changes`` polls a small digest of the session (store/panel.py) and yields the
parts that changed. Polling the record, rather than hooking every service, sees changes made by
any process sharing the database, and survives restarts on both sides (docs/web.md)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from shellyard.contract.executions import ExecutionState
from shellyard.contract.files import ArtifactView, TransferListQuery, TransferView, WorkspaceView
from shellyard.contract.panel import MAX_EXECUTION_PAGE, ExecutionPage, PanelChange
from shellyard.contract.sessions import NoticeView, SessionView, TimerView
from shellyard.control.executions.view import execution_view

# The services' own record-to-view mappings, so the panel reports exactly what they report.
from shellyard.control.files.artifacts import _view as artifact_view
from shellyard.control.notify.sessions import session_view
from shellyard.control.notify.timers import timer_view
from shellyard.control.notify.wakes import notice_view
from shellyard.control.tokens import Principal
from shellyard.errors import InvalidInput, NotFound
from shellyard.store.owners import Agent

if TYPE_CHECKING:
    from shellyard.control.plane import ControlPlane

#: How often ``changes`` looks at the record: a change shows within about this long (docs/web.md:
#: within 2 s). One look costs ~30 ms on SQLite for a 10,000-execution session here.
POLL_S = 1.0


class PanelService:
    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.store = plane.store

    # ------------------------------------------------------------------ reach

    async def agents(self, who: Principal, session_id: str) -> list[Agent]:
        """The session's agents the principal reaches (NotFound outside its reach)."""
        if not who.is_admin and who.session_id != session_id:
            raise NotFound(f"no session {session_id!r}; list yours with GET /v1/sessions")
        await self.plane.sessions.session_record(session_id)
        rows = await self.store.agents_of_sessions([session_id])
        if who.kind == "agent":
            rows = [r for r in rows if r.id == who.agent_id]
        return rows

    async def agent_ids(self, who: Principal, session_id: str) -> list[str]:
        return [r.id for r in await self.agents(who, session_id)]

    async def owner_of_workspace(self, who: Principal, session_id: str, workspace_id: str) -> str:
        """The agent that owns ``workspace_id``, when it is one the principal reaches in the
        session; reads of its files then act as that agent."""
        workspace = await self.plane.store.get_workspace(workspace_id)
        if workspace is None or workspace.agent_id not in await self.agent_ids(who, session_id):
            raise NotFound(
                f"no workspace {workspace_id!r} in session {session_id}; list them with "
                f"GET /v1/sessions/{session_id}/workspaces"
            )
        return workspace.agent_id

    # ------------------------------------------------------------------ reads

    async def sessions(self, who: Principal) -> list[SessionView]:
        """Sessions newest first, each with the agents the principal reaches."""
        rows = await self.store.sessions_newest_first(None if who.is_admin else who.session_id)
        by_session: dict[str, list[Agent]] = {}
        for agent in await self.store.agents_of_sessions([r.id for r in rows]):
            if who.kind != "agent" or agent.id == who.agent_id:
                by_session.setdefault(agent.session_id, []).append(agent)
        return [session_view(row, by_session.get(row.id, [])) for row in rows]

    async def executions(
        self, who: Principal, session_id: str, before_seq: int | None = None, limit: int = 50
    ) -> ExecutionPage:
        if not 1 <= limit <= MAX_EXECUTION_PAGE:
            raise InvalidInput(f"limit must be between 1 and {MAX_EXECUTION_PAGE}, not {limit}")
        ids = await self.agent_ids(who, session_id)
        rows = await self.store.executions_page(ids, before_seq, limit + 1)
        counts = await self.store.execution_counts_of(ids)
        more = len(rows) > limit
        rows = rows[:limit]
        return ExecutionPage(
            session_id=session_id,
            executions=[execution_view(r) for r in rows],
            next_before_seq=rows[-1].seq if more and rows else None,
            counts={s.value: counts.get(s.value, 0) for s in ExecutionState},
            total=sum(counts.values()),
        )

    async def transfers(self, who: Principal, session_id: str, limit: int) -> list[TransferView]:
        found: list[TransferView] = []
        for agent_id in await self.agent_ids(who, session_id):
            found += await self.plane.transfers.list(TransferListQuery(limit=limit), agent_id)
        return sorted(found, key=lambda t: t.created_at, reverse=True)[:limit]

    async def timers(self, who: Principal, session_id: str, limit: int) -> list[TimerView]:
        ids = await self.agent_ids(who, session_id)
        return [timer_view(r) for r in await self.store.timers_page(ids, limit)]

    async def notices(self, who: Principal, session_id: str, limit: int) -> list[NoticeView]:
        ids = await self.agent_ids(who, session_id)
        return [notice_view(r) for r in await self.store.notices_page(ids, limit)]

    async def artifacts(self, who: Principal, session_id: str, limit: int) -> list[ArtifactView]:
        ids = await self.agent_ids(who, session_id)
        return [artifact_view(r) for r in await self.store.artifacts_of(ids, limit)]

    async def workspaces(self, who: Principal, session_id: str) -> list[WorkspaceView]:
        """Every workspace of the agents (each as its owner sees it)."""
        found: list[WorkspaceView] = []
        for agent_id in await self.agent_ids(who, session_id):
            found += [w for w in await self.plane.files.workspaces(agent_id) if w.relation == "own"]
        return found

    # ------------------------------------------------------------------ live

    async def changes(
        self, who: Principal, session_id: str, poll_s: float = POLL_S
    ) -> AsyncIterator[PanelChange]:
        """The parts of the panel that changed, as they change; the first event names every
        part. Runs until the caller stops iterating."""
        last: dict[str, Any] | None = None
        while True:
            ids = await self.agent_ids(who, session_id)
            digest = await self.store.panel_digest(session_id, ids)
            if last is None:
                yield PanelChange(session_id=session_id, parts=list(digest), initial=True)
            else:
                parts = [k for k, v in digest.items() if last.get(k) != v]
                if parts:
                    yield PanelChange(session_id=session_id, parts=parts)
            last = digest
            await asyncio.sleep(poll_s)


__all__ = ["PanelService"]

"""The durable inbox (N1, N3): every background completion, transfer and fired reminder is a
notice in its owner's inbox, stored with an unread/read mark. Results the owner saw through a
tool call are marked read by the executions service; this lists, summarizes and marks read."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from shellyard.contract.sessions import InboxSummary, NoticeView
from shellyard.control.agents import AgentResolver
from shellyard.control.notify.wakes import notice_view
from shellyard.store import Store

#: At most this many notices are listed in a summary (the count covers all of them).
SUMMARY_LIMIT = 50


def summarize(agent_id: str, unread: Sequence[Mapping[str, Any]]) -> InboxSummary:
    """A summary of unread notices (N9), newest last, with a few lines of text for a model."""
    by_kind = dict(Counter(str(n["kind"]) for n in unread))
    shown = [notice_view(n) for n in list(unread)[-SUMMARY_LIMIT:]]
    if not unread:
        text = "No unread notices."
    else:
        kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(by_kind.items()))
        lines = [f"{len(unread)} unread notice{'s' if len(unread) != 1 else ''} ({kinds}):"]
        if len(unread) > len(shown):
            lines.append(f"- ... {len(unread) - len(shown)} older ones not listed")
        lines += [f"- {n.summary}" for n in shown]
        text = "\n".join(lines)
    return InboxSummary(
        agent_id=agent_id, unread=len(unread), by_kind=by_kind, notices=shown, text=text
    )


class InboxService:
    def __init__(self, store: Store, agents: AgentResolver) -> None:
        self.store = store
        self.agents = agents

    async def notices(self, agent_id: str | None, unread_only: bool = False) -> list[NoticeView]:
        agent = await self.agents.row(agent_id)
        rows = await self.store.list_notices(str(agent["id"]), unread_only)
        return [notice_view(r) for r in rows]

    async def summary(self, agent_id: str | None) -> InboxSummary:
        agent = await self.agents.row(agent_id)
        unread = await self.store.list_notices(str(agent["id"]), unread_only=True)
        return summarize(str(agent["id"]), unread)

    async def mark_read(self, agent_id: str | None, notice_ids: Sequence[str] | None) -> int:
        """Mark notices read (every unread one when ``notice_ids`` is None); returns how many
        changed. Ids of other agents' notices are ignored like missing ones."""
        agent = await self.agents.row(agent_id)
        return await self.store.mark_notices_read(str(agent["id"]), notice_ids)

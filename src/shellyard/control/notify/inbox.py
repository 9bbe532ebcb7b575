"""The durable inbox (N1, N3): every background completion, transfer and fired reminder is a
notice in its owner's inbox, stored with an unread/read mark. Results the owner saw through a
tool call are marked read by the executions service; this lists, summarizes and marks read."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from shellyard.contract.sessions import DEFAULT_LIST_PAGE, InboxSummary, NoticeView
from shellyard.control.agents import AgentResolver
from shellyard.control.notify.wakes import notice_view
from shellyard.store import Store
from shellyard.store.notices import Notice

#: At most this many notices are listed in a summary (the count covers all of them).
SUMMARY_LIMIT = 50


def summarize(agent_id: str, unread: Sequence[Notice]) -> InboxSummary:
    """A summary of unread notices (N9), newest last, with a few lines of text for a model."""
    by_kind = dict(Counter(n.kind for n in unread))
    return summarize_counts(agent_id, by_kind, list(unread)[-SUMMARY_LIMIT:])


def summarize_counts(
    agent_id: str, by_kind: dict[str, int], newest: Sequence[Notice]
) -> InboxSummary:
    """The summary from the unread counts by kind and the newest unread notices (so the store
    never hands over every unread row: docs/security.md "Limits at each door")."""
    total = sum(by_kind.values())
    shown = [notice_view(n) for n in list(newest)[-SUMMARY_LIMIT:]]
    if not total:
        text = "No unread notices."
    else:
        kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(by_kind.items()))
        lines = [f"{total} unread notice{'s' if total != 1 else ''} ({kinds}):"]
        if total > len(shown):
            lines.append(f"- ... {total - len(shown)} older ones not listed")
        lines += [f"- {n.summary}" for n in shown]
        text = "\n".join(lines)
    return InboxSummary(agent_id=agent_id, unread=total, by_kind=by_kind, notices=shown, text=text)


async def unread_summary(store: Store, agent_id: str) -> InboxSummary:
    """The agent's unread summary from a grouped count and one bounded page of rows."""
    by_kind = await store.unread_counts(agent_id)
    newest = await store.newest_unread(agent_id, SUMMARY_LIMIT) if by_kind else []
    return summarize_counts(agent_id, by_kind, newest)


class InboxService:
    def __init__(self, store: Store, agents: AgentResolver) -> None:
        self.store = store
        self.agents = agents

    async def notices(
        self,
        agent_id: str | None,
        unread_only: bool = False,
        after: str | None = None,
        limit: int = DEFAULT_LIST_PAGE,
    ) -> list[NoticeView]:
        """One page of the agent's notices, oldest first (a full page: there may be more, from
        ``after`` = its last id)."""
        agent = await self.agents.record(agent_id)
        rows = await self.store.list_notices(agent.id, unread_only, after=after, limit=limit)
        return [notice_view(r) for r in rows]

    async def summary(self, agent_id: str | None) -> InboxSummary:
        agent = await self.agents.record(agent_id)
        return await unread_summary(self.store, agent.id)

    async def mark_read(self, agent_id: str | None, notice_ids: Sequence[str] | None) -> int:
        """Mark notices read (every unread one when ``notice_ids`` is None); returns how many
        changed. Ids of other agents' notices are ignored like missing ones."""
        agent = await self.agents.record(agent_id)
        return await self.store.mark_notices_read(agent.id, notice_ids)

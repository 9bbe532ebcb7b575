"""Inbox pages and the unread summary from the store (N1, N9; docs/security.md "Limits at
each door"), on SQLite and PostgreSQL: pages follow each other by ``after`` without gaps or
repeats, and the summary is built from a grouped count and the newest notices only."""

from __future__ import annotations

from shellyard.control.notify.inbox import SUMMARY_LIMIT, summarize, unread_summary
from shellyard.store import Store


async def test_pages_and_the_summary(store: Store) -> None:
    _session, agent = await store.create_session()
    agent_id = str(agent.id)
    for i in range(SUMMARY_LIMIT + 7):
        await store.add_notice(agent_id, "execution" if i % 3 else "reminder", f"s{i}", f"n{i}")
    everything = await store.list_notices(agent_id)
    seen: list[str] = []
    after = None
    while True:
        page = await store.list_notices(agent_id, after=after, limit=10)
        seen += [str(row.id) for row in page]
        if len(page) < 10:
            break
        after = str(page[-1].id)
    assert seen == [str(row.id) for row in everything]
    bounded = await unread_summary(store, agent_id)
    assert bounded == summarize(agent_id, everything)
    assert bounded.unread == SUMMARY_LIMIT + 7 and len(bounded.notices) == SUMMARY_LIMIT

"""Issue 14 item 5, on SQLite and PostgreSQL: the session-wide reads behind the page
(store/panel.py) page a session's executions newest first without gaps or repeats, count them
per state, keep other sessions out, and their digest changes exactly when a part changes (what
the live stream sends). Runs through the Store only (no browser)."""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from shellyard.store import Store
from shellyard.store.schema import executions


def _insert(conn: sa.Connection, rows: list[dict[str, Any]]) -> None:
    conn.execute(executions.insert(), rows)


def _rows(agent: str, workspace: str, first_seq: int, count: int) -> list[dict[str, Any]]:
    now = time.time()
    return [
        {
            "id": f"ex_{agent[-6:]}{first_seq + i:06d}",
            "seq": first_seq + i,
            "agent_id": agent,
            "workspace_id": workspace,
            "runner_id": "local",
            "command": f"echo {i}",
            "background": False,
            "state": "running" if i % 10 == 0 else "completed",
            "exit_code": None if i % 10 == 0 else 0,
            "cancel_requested": False,
            "query_failures": 0,
            "was_unknown": False,
            "created_at": now + i,
        }
        for i in range(count)
    ]


async def test_pages_counts_and_digest(store: Store) -> None:
    await store.upsert_runner("local", "local", None, None)
    mine, main = await store.create_session()
    theirs, other = await store.create_session()
    ws, _ = await store.workspace_for(str(main.id), "local")
    other_ws, _ = await store.workspace_for(str(other.id), "local")
    # Interleaved seqs: the other session's records sit between this one's.
    await store.run(_insert, _rows(str(main.id), ws.id, 1, 120))
    await store.run(_insert, _rows(str(other.id), other_ws.id, 1000, 30))
    records = store
    agents = [str(main.id)]

    seen: list[int] = []
    before = None
    while True:
        page = await records.executions_page(agents, before, 50)
        if not page:
            break
        seen += [r.seq for r in page]
        before = page[-1].seq
    assert seen == list(range(120, 0, -1))  # newest first, every record once
    assert {r.agent_id for r in await records.executions_page(agents, None, 500)} == set(agents)
    assert await records.execution_counts_of(agents) == {"running": 12, "completed": 108}

    digest = await records.panel_digest(str(mine.id), agents)
    assert digest == await records.panel_digest(str(mine.id), agents)  # stable when nothing moves
    await store.run(
        lambda conn: conn.execute(
            executions.update()
            .where(executions.c.seq == 1)
            .values(state="completed", exit_code=0, finished_at=time.time())
        )
    )
    changed = await records.panel_digest(str(mine.id), agents)
    assert [k for k in digest if digest[k] != changed[k]] == ["executions"]
    # The other session's changes do not touch this session's digest.
    await store.run(_insert, _rows(str(other.id), other_ws.id, 2000, 5))
    assert await records.panel_digest(str(mine.id), agents) == changed
    assert theirs.id != mine.id

"""An execution's submit and finish in the store give the same records on SQLite (plain
statements) and on PostgreSQL (one statement of CTEs each, store/one_trip.py): the writer
taken or not (W1, W2), the lease taken only by what starts now, the terminal record, its
notice (N1), N6's reminder cancel, the writer's and the lease's release, the next queued
writer (not the finishing record itself), and nothing rewritten by a second finish (W3)."""

from __future__ import annotations

import time
from typing import Any

from shellyard.store import Store
from shellyard.store.db import new_id
from shellyard.store.leases import EXECUTION, LeaseTerms

TERMS = LeaseTerms(holder="replica-a", scope=None, ttl_s=60.0)
ENDED = ("queued", "running", "unknown")


async def _values(store: Store, **extra: Any) -> dict[str, Any]:
    _session, agent = await store.default_owner()
    await store.upsert_runner("local", "local", None, None)
    workspace, _ = await store.workspace_for(str(agent.id), "local")
    return {
        "id": new_id("ex"), "agent_id": agent.id, "workspace_id": workspace.id,
        "runner_id": "local", "command": "true", "background": False, **extra,
    }  # fmt: skip


async def _held(store: Store) -> set[str]:
    rows = await store.claim_leases("someone-else", None, 60.0, 100, mode="all")
    for row in rows:  # give them back: only which subjects had a lease matters
        await store.acquire_lease(EXECUTION, str(row.subject_id), "replica-a", None, 0.0)
    return {str(r.subject_id) for r in rows}


async def test_submit_takes_the_writer_and_the_lease_only_for_what_starts(store: Store) -> None:
    """W1: the first writer takes the workspace and its lease; a second one queues behind it
    with no lease, or is refused with nothing recorded. W2: a reader takes neither the writer
    nor waits, and is leased as it starts."""
    first, holder = await store.submit_execution(await _values(store), queue=False, lease=TERMS)
    assert holder is None and first.state == "queued" and first.seq >= 1
    assert first.cancel_requested is False and first.query_failures == 0  # defaults
    workspace = await store.get_workspace(str(first.workspace_id))
    assert workspace is not None and workspace.writer_id == first.id
    refused = await _values(store)
    _row, holder = await store.submit_execution(refused, queue=False, lease=TERMS)
    assert holder == first.id
    assert await store.get_execution(refused["id"]) is None
    queued, holder = await store.submit_execution(await _values(store), queue=True, lease=TERMS)
    assert holder == first.id and queued.seq > first.seq
    reader, holder = await store.submit_execution(
        await _values(store, read_only=True), queue=False, lease=TERMS
    )
    assert holder is None and reader.read_only is True
    assert await _held(store) == {first.id, reader.id}


async def test_finish_writes_the_end_and_hands_the_workspace_on(store: Store) -> None:
    first, _ = await store.submit_execution(await _values(store), queue=False, lease=TERMS)
    queued, _ = await store.submit_execution(await _values(store), queue=True)
    started = await store.start_execution(str(first.id), time.time())
    assert started is not None and started.state == "running"
    agent = await store.get_agent(str(first.agent_id))
    assert agent is not None
    now = time.time()
    timers = []
    for fire_at in (now + 3600, now - 60):  # not due yet: cancelled; came due first: stays
        timer = {
            "id": new_id("tmr"), "agent_id": agent.id, "session_id": agent.session_id,
            "text": "check", "spec": {"after_ms": 3_600_000}, "fire_at": fire_at,
            "execution_id": first.id, "state": "pending", "late": False, "created_at": now,
        }  # fmt: skip
        await store.create_timer(timer)
        timers.append(timer["id"])
    values = {"state": "completed", "exit_code": 3, "finished_at": now}
    final, next_queued, read = await store.finish_execution(
        first, values, "ended", True, ENDED, lease_holder="replica-a", cancel_timers=True
    )
    assert final is not None and final.state == "completed" and final.exit_code == 3
    assert final.timers_cancelled == 1 and read is True
    assert next_queued is not None and next_queued.id == queued.id
    later, due = [await store.get_timer(t) for t in timers]
    assert later is not None and later.state == "cancelled"
    assert str(first.id) in str(later.cancel_reason)
    assert due is not None and due.state == "pending"
    (notice,) = [
        n for n in await store.list_notices(str(first.agent_id)) if n.subject_id == first.id
    ]
    assert notice.summary == "ended" and notice.read_at is not None
    assert notice.payload == {"state": "completed", "exit_code": 3}
    workspace = await store.get_workspace(str(first.workspace_id))
    assert workspace is not None and workspace.writer_id is None
    assert first.id not in await _held(store)
    # W3: a second finish rewrites nothing and posts nothing; the writer stays free.
    again, _next, read_again = await store.finish_execution(
        first, {"state": "failed", "finished_at": time.time()}, "again", False, ENDED
    )
    assert again is None and read_again is False
    record = await store.get_execution(str(first.id))
    assert record is not None and record.state == "completed"


async def test_a_queued_writer_ending_is_not_its_own_next(store: Store) -> None:
    """A writer cancelled while queued ends without the writer; the next queued is the one
    behind it, never itself, and the holder keeps the writer."""
    first, _ = await store.submit_execution(await _values(store), queue=False)
    assert await store.start_execution(str(first.id), time.time()) is not None
    waiting, _ = await store.submit_execution(await _values(store), queue=True)
    behind, _ = await store.submit_execution(await _values(store), queue=True)
    final, next_queued, read = await store.finish_execution(
        waiting, {"state": "cancelled", "finished_at": time.time()}, "cancelled", False, ENDED
    )
    assert final is not None and final.state == "cancelled" and read is False
    assert next_queued is not None and next_queued.id == behind.id
    assert final.timers_cancelled is None  # N6 not asked of this end
    workspace = await store.get_workspace(str(first.workspace_id))
    assert workspace is not None and workspace.writer_id == first.id
    (notice,) = [
        n for n in await store.list_notices(str(waiting.agent_id)) if n.subject_id == waiting.id
    ]
    assert notice.read_at is None and notice.payload == {
        "state": "cancelled",
        "exit_code": None,
    }

"""N3 across replicas in the store (store/executions.py): a recorded foreground wait makes the
finishing transaction post the notice read; an expired one counts for nothing; a waiter that
removes its row while a finalizer that saw it has not committed waits for that commit, so its
next read shows the end. On SQLite no row is ever read or written."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import sqlalchemy as sa

from conftest import POSTGRES_URL
from shellyard.store import Store
from shellyard.store.db import new_id
from shellyard.store.executions import Execution, _finish_execution


async def _running(store: Store) -> Execution:
    _session, agent = await store.default_owner()
    await store.upsert_runner("local", "local", None, None)
    workspace, _ = await store.workspace_for(str(agent.id), "local")
    values = {
        "id": new_id("ex"),
        "agent_id": agent.id,
        "workspace_id": workspace.id,
        "runner_id": "local",
        "command": "true",
        "background": True,
    }
    row, _holder = await store.submit_execution(values, queue=True)  # behind another: fine
    assert row is not None
    assert await store.update_execution(str(row.id), state="running")
    fresh = await store.get_execution(str(row.id))
    assert fresh is not None
    return fresh


async def _finish(store: Store, row: Execution) -> bool:
    final, _queued, read = await store.finish_execution(
        row, {"state": "completed", "exit_code": 0, "finished_at": time.time()}, "done", False,
        ("running",),
    )  # fmt: skip
    assert final is not None
    return read


async def _read_at(store: Store, row: Execution) -> Any:
    notices = await store.list_notices(str(row.agent_id))
    (notice,) = [n for n in notices if n.subject_id == row.id]
    return notice.read_at


async def test_a_live_wait_posts_the_notice_read_an_expired_one_does_not(store: Store) -> None:
    now = time.time()
    seen, unseen, alone = [await _running(store) for _ in range(3)]
    if store.is_sqlite:
        # One replica: its finalizer knows its own waiters; the table is not even read.
        await store.add_foreground_wait(str(seen.id), "w1", now + 60)
        assert not await _finish(store, seen)
        assert await _read_at(store, seen) is None
        return
    await store.add_foreground_wait(str(seen.id), "w1", now + 60)
    await store.add_foreground_wait(str(unseen.id), "w2", now - 1)  # its replica died
    assert await _finish(store, seen)
    assert not await _finish(store, unseen)
    assert not await _finish(store, alone)
    assert await _read_at(store, seen) is not None
    assert await _read_at(store, unseen) is None
    assert await _read_at(store, alone) is None
    # The finalizer took both rows, the live one and the expired one.
    assert not await store.renew_foreground_wait(str(seen.id), "w1", now + 60)
    assert not await store.renew_foreground_wait(str(unseen.id), "w2", now + 60)


async def test_a_waiter_leaving_waits_for_the_finalizer_that_saw_it(pg_schema: str) -> None:
    """The ordering N3 needs: the finalizer's transaction saw the row and has not committed;
    the waiter's delete waits for that commit, and the read after it shows the terminal record
    (so a notice posted read is always one its caller saw)."""
    store = await Store.open(POSTGRES_URL, schema_name=pg_schema)
    engine = sa.create_engine(
        POSTGRES_URL.replace("postgresql://", "postgresql+psycopg://"),
        connect_args={"options": f"-csearch_path={pg_schema}"},
    )
    try:
        row = await _running(store)
        execution_id = str(row.id)
        await store.add_foreground_wait(execution_id, "w1", time.time() + 60)
        saw_it, commit = threading.Event(), threading.Event()
        answer: list[bool] = []

        def finalizer() -> None:
            with engine.begin() as conn:
                values = {"state": "completed", "exit_code": 0, "finished_at": time.time()}
                _final, _queued, read = _finish_execution(
                    conn, row, values, "done", False, ("running",)
                )
                answer.append(read)
                saw_it.set()
                assert commit.wait(30)

        finishing = asyncio.create_task(asyncio.to_thread(finalizer))
        assert await asyncio.to_thread(saw_it.wait, 30)
        leaving = asyncio.create_task(store.drop_foreground_wait(execution_id, "w1"))
        # The waiter's delete is blocked on the finalizer's row lock (seen by PostgreSQL).
        deadline = time.monotonic() + 20
        while not _a_delete_waits_on_a_lock():
            assert time.monotonic() < deadline, "the waiter's delete never waited"
            assert not leaving.done()
            await asyncio.sleep(0.05)
        assert not leaving.done()
        commit.set()
        await finishing
        await leaving
        final = await store.get_execution(execution_id)
        assert final is not None and final.state == "completed"
        assert answer == [True]
        assert await _read_at(store, row) is not None
    finally:
        engine.dispose()
        await store.close()


def _a_delete_waits_on_a_lock(pattern: str = "%DELETE FROM foreground_waits%") -> bool:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query ILIKE %s",
            (pattern,),
        ).fetchall()
    return bool(rows[0][0])


async def test_a_timer_made_while_its_execution_ends_sees_the_end(pg_schema: str) -> None:
    """N6 with the cancel folded into the finishing transaction: that cancel ran before the
    timer existed and the end has not committed; the creation's re-read of its execution waits
    for the commit and sees the end (so the timer service cancels it), instead of reading the
    record from before the end and leaving the reminder pending."""
    store = await Store.open(POSTGRES_URL, schema_name=pg_schema)
    engine = sa.create_engine(
        POSTGRES_URL.replace("postgresql://", "postgresql+psycopg://"),
        connect_args={"options": f"-csearch_path={pg_schema}"},
    )
    cancelled_before, commit = threading.Event(), threading.Event()
    try:
        row = await _running(store)
        execution_id = str(row.id)
        counts: list[int] = []

        def finalizer() -> None:
            with engine.begin() as conn:
                values = {"state": "completed", "exit_code": 0, "finished_at": time.time()}
                final, _queued, _read = _finish_execution(
                    conn, row, values, "done", False, ("running",), cancel_timers=True
                )
                assert final is not None
                counts.append(final["timers_cancelled"])
                cancelled_before.set()
                assert commit.wait(30)

        finishing = asyncio.create_task(asyncio.to_thread(finalizer))
        assert await asyncio.to_thread(cancelled_before.wait, 30)
        agent = await store.get_agent(str(row.agent_id))
        assert agent is not None
        now = time.time()
        await store.create_timer(
            {
                "id": new_id("tmr"), "agent_id": agent.id, "session_id": agent.session_id,
                "text": "check", "spec": {"after_ms": 3_600_000}, "fire_at": now + 3600,
                "execution_id": execution_id, "state": "pending", "late": False,
                "created_at": now,
            }
        )  # fmt: skip
        reading = asyncio.create_task(store.execution_for_new_timer(execution_id))
        deadline = time.monotonic() + 20
        while not _a_delete_waits_on_a_lock("%FROM executions%FOR SHARE%"):
            assert time.monotonic() < deadline, "the re-read never waited for the end"
            assert not reading.done()
            await asyncio.sleep(0.05)
        commit.set()
        await finishing
        seen = await reading
        assert counts == [0]  # the end's cancel ran before the timer existed
        assert seen is not None and seen.state == "completed"
    finally:
        commit.set()  # a failed check above must not leave the finalizer's thread waiting
        engine.dispose()
        await store.close()

"""The store operations behind wakes and timers on SQLite and on PostgreSQL (a fresh schema per
run): migration 0002 matches the schema; a notice is claimed by one wake only, even when two
transactions race (PostgreSQL); a timer is fired by one claim only; a cancelled timer never
fires; the user-request summary delivers notices so no wake repeats them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.engine import Connection

from shellyard.control.notify.wakes import wake_payload
from shellyard.store import Store
from shellyard.store.notices import Notice
from shellyard.store.owners import Agent, Session
from shellyard.store.records import from_row, from_rows
from shellyard.store.schema import metadata
from shellyard.store.timers import Timer


def _diff(conn: Connection) -> list[Any]:
    return list(compare_metadata(MigrationContext.configure(conn), metadata))


async def test_migration_0002_matches_the_schema(store: Store) -> None:
    assert await store.run(_diff) == []


async def _timer(store: Store, agent: Agent, **extra: Any) -> Timer:
    now = time.time()
    return await store.create_timer(
        {
            "id": f"tmr_{time.monotonic_ns()}",
            "agent_id": agent.id,
            "session_id": agent.session_id,
            "text": "t",
            "spec": {"after_ms": 0},
            "fire_at": now - 1,
            "state": "pending",
            "late": False,
            "created_at": now,
            **extra,
        }
    )


async def test_a_notice_is_claimed_by_one_wake_even_when_wakes_race(store: Store) -> None:
    """N2: concurrent wakes of one agent (two control planes) emit one wake; a later wake
    carries only notices no wake claimed; a busy agent is not woken."""
    _session, agent = await store.create_session()
    agent_id = str(agent.id)
    await store.add_notice(agent_id, "execution", "ex_a", "a done")
    await store.add_notice(agent_id, "execution", "ex_b", "b done")
    results = await asyncio.gather(
        *(store.emit_wake(agent_id, "notice", None, wake_payload) for _ in range(4))
    )
    emitted = [r for r in results if r is not None]
    assert len(emitted) == 1
    wake, deliveries = emitted[0]
    assert deliveries == []
    assert [n["subject_id"] for n in wake.payload["notices"]] == ["ex_a", "ex_b"]
    await store.add_notice(agent_id, "execution", "ex_c", "c done")
    assert await store.emit_wake(agent_id, "notice", None, wake_payload) is None  # busy
    await store.change_agent(agent_id, {"state": "idle"})
    again = await store.emit_wake(agent_id, "turn_end", None, wake_payload)
    assert again is not None
    assert [n["subject_id"] for n in again[0].payload["notices"]] == ["ex_c"]
    await store.change_agent(agent_id, {"state": "idle"})
    assert await store.emit_wake(agent_id, "turn_end", None, wake_payload) is None
    woken = {n.subject_id: n.wake_id for n in await store.list_notices(agent_id)}
    assert woken == {"ex_a": wake.id, "ex_b": wake.id, "ex_c": again[0].id}


async def test_no_wake_without_a_listening_channel_or_with_a_closed_gate(
    store: Store,
) -> None:
    _session, agent = await store.create_session()
    agent_id, session_id = str(agent.id), str(agent.session_id)
    await store.add_notice(agent_id, "reminder", "tmr_1", "reminder: x")
    assert await store.emit_wake(agent_id, "notice", frozenset(), wake_payload) is None
    await store.change_agent(agent_id, {"gate": "closed"})
    assert await store.emit_wake(agent_id, "notice", None, wake_payload) is None
    await store.change_agent(agent_id, {"gate": "open"})
    await store.change_session(session_id, "stopped", "session_stopped", "stopped")
    assert await store.emit_wake(agent_id, "notice", None, wake_payload) is None
    session, resumed, unread = await store.user_request(session_id, wake_payload)
    assert resumed and session.state == "active"
    assert [n.subject_id for n in unread] == ["tmr_1"] and unread[0].woke_at is not None
    await store.change_agent(agent_id, {"state": "idle"})
    assert await store.emit_wake(agent_id, "turn_end", None, wake_payload) is None


async def test_a_timer_fires_once_even_when_claims_race(store: Store) -> None:
    """N7: concurrent fire attempts (control planes racing) post one reminder notice."""
    _session, agent = await store.create_session()
    timer = await _timer(store, agent)
    results = await asyncio.gather(
        *(store.fire_timer(str(timer.id), time.time()) for _ in range(4))
    )
    assert sum(fired for _row, fired in results) == 1
    notices = await store.list_notices(str(agent.id))
    assert [(n.kind, n.summary) for n in notices] == [("reminder", "reminder (late): t")]


async def test_cancelled_timers_never_fire(store: Store) -> None:
    """N8, N11: stopping the session cancels pending timers; nothing brings them back."""
    _session, agent = await store.create_session()
    timer = await _timer(store, agent)
    await store.change_session(str(agent.session_id), "stopped", "session_stopped", "stop")
    await store.change_session(str(agent.session_id), "active", "session_resumed", None)
    row, fired = await store.fire_timer(str(timer.id), time.time())
    assert not fired and row is not None and row.state == "cancelled"
    due, _next = await store.due_timers(time.time())
    assert due == []
    assert await store.list_notices(str(agent.id)) == []


@pytest.mark.parametrize("finished_first", [True, False])
async def test_n6_by_recorded_times(store: Store, finished_first: bool) -> None:
    """N6 when both happened while the plane was down: the reminder is cancelled only if the
    execution finished before the reminder was due; otherwise it fires (late)."""
    _session, agent = await store.create_session()
    await store.upsert_runner("local", "local", None, None)
    workspace, _ = await store.workspace_for(str(agent.id), "local")
    now = time.time()
    values = {
        "id": f"ex_{time.monotonic_ns()}",
        "agent_id": agent.id,
        "workspace_id": workspace.id,
        "runner_id": "local",
        "command": "true",
        "background": True,
    }
    execution, _ = await store.submit_execution(values, queue=False)
    finished_at = now - 10 if finished_first else now - 1
    await store.update_execution(str(execution.id), state="completed", finished_at=finished_at)
    timer = await _timer(store, agent, execution_id=execution.id, fire_at=now - 5)
    row, fired = await store.fire_timer(str(timer.id), now)
    assert fired == (not finished_first)
    assert row is not None and row.state == ("cancelled" if finished_first else "fired")


async def test_a_notice_read_after_the_wake_looked_is_not_claimed(store: Store) -> None:
    """N3 against a race: a wake reads the unread notices, then the owner sees the result (its
    notice is marked read) before the wake claims them: the claim skips it, and with nothing
    left no wake is recorded."""
    from shellyard.store.db import fetch_all, fetch_one
    from shellyard.store.schema import agents, notices, sessions
    from shellyard.store.wakes import record_wake

    _session, agent = await store.create_session()
    agent_id = str(agent.id)
    await store.add_notice(agent_id, "execution", "ex_seen", "seen done")
    await store.add_notice(agent_id, "execution", "ex_unseen", "unseen done")

    def looked(conn: Connection) -> tuple[Session, Agent, list[Notice]]:
        agent_row = fetch_one(conn, sa.select(agents).where(agents.c.id == agent_id))
        assert agent_row is not None
        session = fetch_one(
            conn, sa.select(sessions).where(sessions.c.id == agent_row["session_id"])
        )
        assert session is not None
        pending = fetch_all(conn, sa.select(notices).where(notices.c.agent_id == agent_id))
        return from_row(Session, session), from_row(Agent, agent_row), from_rows(Notice, pending)

    session, agent_row, pending = await store.run(looked)
    await store.mark_notice_read("execution", "ex_seen")  # between the look and the claim
    recorded = await store.run(
        lambda conn: record_wake(conn, "notice", session, agent_row, pending, wake_payload)
    )
    assert recorded is not None
    _wake, claimed = recorded
    assert [n.subject_id for n in claimed] == ["ex_unseen"]
    await store.mark_notice_read("execution", "ex_unseen")
    assert (
        await store.run(
            lambda conn: record_wake(conn, "notice", session, agent_row, pending, wake_payload)
        )
        is None
    )

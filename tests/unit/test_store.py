"""The Store on SQLite and on PostgreSQL (a fresh schema per run), through one schema and
the same Alembic migrations: owners, the single writer (W1), idempotent submission (E10),
terminal records never rewritten (W3), monotonic snapshot heads, notices (N1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import POSTGRES_URL
from shellyard.contract.executions import ExecutionState, RunShellRequest
from shellyard.store import Store
from shellyard.store.db import new_id


async def _execution(store: Store, **extra: Any) -> dict[str, Any]:
    _session, agent = await store.default_owner()
    await store.upsert_runner("local", "local", None, None)
    workspace, _ = await store.workspace_for(str(agent.id), "local")
    return {
        "id": new_id("ex"),
        "agent_id": agent.id,
        "workspace_id": workspace.id,
        "runner_id": "local",
        "command": "true",
        "background": False,
        **extra,
    }


async def test_default_owner_is_created_once(store: Store) -> None:
    first = await store.default_owner()
    second = await store.default_owner()
    assert first[0].id == second[0].id
    assert first[1].id == first[0].main_agent_id


async def test_workspace_per_agent_and_runner(store: Store) -> None:
    session, agent = await store.default_owner()
    await store.upsert_runner("local", "local", None, None)
    a, created = await store.workspace_for(str(agent.id), "local")
    b, created_again = await store.workspace_for(str(agent.id), "local")
    assert created and not created_again and a.id == b.id
    child = await store.create_agent(str(session.id), parent_id=str(agent.id))
    c, _ = await store.workspace_for(str(child.id), "local")
    assert c.id != a.id


async def test_single_writer_refuses_or_queues(store: Store) -> None:
    """W1: the insert and the writer are one transaction; a refusal records nothing."""
    first, holder = await store.submit_execution(await _execution(store), queue=False)
    assert holder is None
    assert await store.update_execution(str(first.id), state="running")
    refused_values = await _execution(store)
    _, holder = await store.submit_execution(refused_values, queue=False)
    assert holder == first.id
    assert await store.get_execution(refused_values["id"]) is None
    queued, holder = await store.submit_execution(await _execution(store), queue=True)
    assert holder == first.id and queued.state == "queued"
    next_queued = await store.next_queued(str(first.workspace_id))
    assert next_queued is not None and next_queued.id == queued.id
    assert await store.release_writer(str(first.workspace_id), str(first.id))
    assert not await store.release_writer(str(first.workspace_id), str(first.id))
    assert await store.take_writer(str(first.workspace_id), "execution", str(queued.id))


async def test_idempotency_key_is_unique_per_agent(store: Store) -> None:
    """E10: a second record with the same key cannot exist."""
    values = await _execution(store, idempotency_key="call-7")
    await store.submit_execution(values, queue=True)
    found = await store.find_idempotent(str(values["agent_id"]), "call-7")
    assert found is not None and found.id == values["id"]
    with pytest.raises(Exception, match=r"(?i)unique|duplicate"):
        await store.submit_execution(await _execution(store, idempotency_key="call-7"), queue=True)


async def test_terminal_record_is_never_rewritten(store: Store) -> None:
    """W3 / E7: a late update from an older operation does not replace a final record."""
    row, _ = await store.submit_execution(await _execution(store), queue=False)
    assert await store.update_execution(str(row.id), state="completed", exit_code=0)
    assert not await store.update_execution(str(row.id), state="running", exit_code=None)
    final = await store.get_execution(str(row.id))
    assert final is not None and final.state == "completed" and final.exit_code == 0


async def test_a_final_unknown_is_never_reopened(store: Store) -> None:
    """E9 (docs/security.md "Attack pass (session 52)"): a final ``unknown`` (its runner
    removed) shares its state with one still asked about; a late answer written from
    ("running", "unknown") turned it ``running`` again, and a late end ended it twice."""
    row, _ = await store.submit_execution(await _execution(store), queue=False)
    assert await store.update_execution(str(row.id), state="unknown", was_unknown=True)
    asked = await store.get_execution(str(row.id))
    assert asked is not None and asked.finished_at is None
    ended, _, _ = await store.finish_execution(
        asked, {"state": "unknown", "error": "removed", "finished_at": 5.0}, "ended", False,
        ("unknown",),
    )  # fmt: skip
    assert ended is not None and ended.finished_at == 5.0
    running = {"state": "running", "error": None}
    assert not await store.update_execution(
        str(row.id), from_states=("running", "unknown"), **running
    )
    again, _, _ = await store.finish_execution(
        asked, {"state": "completed", "exit_code": 0, "finished_at": 9.0}, "again", False,
        ("queued", "running", "unknown"),
    )  # fmt: skip
    assert again is None
    final = await store.get_execution(str(row.id))
    assert final is not None and (final.state, final.error, final.finished_at) == (
        "unknown",
        "removed",
        5.0,
    )


async def test_snapshot_head_only_moves_forward(store: Store) -> None:
    values = await _execution(store)
    workspace_id = str(values["workspace_id"])
    await store.record_snapshot(workspace_id, 2, "b" * 64, 1, 10, "execution", "ex_2")
    await store.record_snapshot(workspace_id, 1, "a" * 64, 1, 10, "execution", "ex_1")
    workspace = await store.get_workspace(workspace_id)
    assert workspace is not None and workspace.head_seq == 2
    assert [s.seq for s in await store.list_snapshots(workspace_id)] == [1, 2]


async def test_notice_once_per_subject_and_read_marks(store: Store) -> None:
    """N1: one notice per completion, stored durably; read marks."""
    _session, agent = await store.default_owner()
    await store.add_notice(str(agent.id), "execution", "ex_1", "done")
    await store.add_notice(str(agent.id), "execution", "ex_1", "done again")
    assert len(await store.list_notices(str(agent.id), unread_only=True)) == 1
    await store.mark_notice_read("execution", "ex_1")
    assert await store.list_notices(str(agent.id), unread_only=True) == []


async def test_migrations_are_idempotent_on_reopen(home: Path) -> None:
    url = f"sqlite:///{home / 'again.db'}"
    first = await Store.open(url)
    _session, agent = await first.default_owner()
    await first.close()
    second = await Store.open(url)
    assert (await second.default_owner())[1].id == agent.id
    await second.close()


async def test_control_plane_on_postgresql(home: Path, pg_schema: str) -> None:
    """--database-url postgresql://…: the same executions path on PostgreSQL."""
    from shellyard.config import Settings
    from shellyard.control.plane import ControlPlane

    settings = Settings(home=home / "pg-home", database_url=POSTGRES_URL, database_schema=pg_schema)
    async with ControlPlane.running(settings) as plane:
        first = await plane.executions.run_shell(
            RunShellRequest(command="sleep 0.5; echo a >> f", background=True)
        )
        second = await plane.executions.run_shell(
            RunShellRequest(command="echo b >> f; cat f", queue=True)
        )
        assert second.state == ExecutionState.completed
        assert second.stdout == "a\nb\n"
        assert (await plane.executions.status(first.execution_id)).exit_code == 0


async def test_get_runner_reads_the_one_row_asked_for(store: Store) -> None:
    """A runner's record by its id, as the registry's ``removed`` reads it: a registered one,
    a removed one (its row stays: past executions name it), and none for an id never added."""
    await store.upsert_runner("local", "local", None, None)
    await store.upsert_runner("far", "direct", "https://far:7070", "key")
    await store.upsert_runner("gone", "direct", "https://gone:7070", "key")
    await store.upsert_runner("gone", "removed", None, None)
    far = await store.get_runner("far")
    assert far is not None
    assert (far.id, far.kind, far.address, far.token) == (
        "far",
        "direct",
        "https://far:7070",
        "key",
    )
    gone = await store.get_runner("gone")
    assert gone is not None and (gone.kind, gone.address, gone.token) == ("removed", None, None)
    assert await store.get_runner("never") is None

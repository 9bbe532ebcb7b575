"""E1, E11: what a submit costs the store does not grow with the executions a home ever ran.
Each submit takes its ``seq`` (W1's submission order) as ``max(seq) + 1`` in its insert; with
no index on it that read every row of ``executions`` (on SQLite ~14 ms at 100,000 rows,
docs/benchmarks.md, the section on the server's CPU per call, session 49). Counted in SQLite's
virtual-machine steps (its progress handler), not in time; on PostgreSQL the index is there."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from conftest import POSTGRES_URL
from shellyard.store import Store
from shellyard.store.db import new_id
from shellyard.store.schema import executions


async def _submit_steps(store: Store, agent: str, workspace: str) -> int:
    """SQLite's VM steps for one submit (with the writer: W1) and its end."""
    raw = store.connection().connection.driver_connection
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0  # go on

    values = {
        "id": new_id("ex"), "agent_id": agent, "workspace_id": workspace, "runner_id": "local",
        "command": "true", "background": False,
    }  # fmt: skip
    raw.set_progress_handler(count, 1)
    try:
        row, holder = await store.submit_execution(values, queue=False)
    finally:
        raw.set_progress_handler(None, 1)
    assert row is not None and holder is None
    await store.finish_execution(
        row, {"state": "completed", "exit_code": 0}, "done", False, ("queued",)
    )
    return steps


async def _many(store: Store, agent: str, workspace: str, count: int) -> None:
    """``count`` ended executions of an older day, in one transaction."""
    now = time.time()
    rows = [
        {"id": f"ex_old{i:08d}", "seq": i + 1, "agent_id": agent, "workspace_id": workspace,
         "runner_id": "local", "command": "true", "background": False, "state": "completed",
         "exit_code": 0, "created_at": now - 86400, "finished_at": now - 86400}
        for i in range(count)
    ]  # fmt: skip

    def insert(conn: sa.Connection) -> None:
        conn.execute(executions.insert(), rows)

    await store.run(insert)


async def test_a_submit_reads_no_more_with_20000_executions_behind_it(tmp_path: Path) -> None:
    store = await Store.open(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        _session, main = await store.default_owner()
        await store.upsert_runner("local", "local", None, None)
        workspace, _ = await store.workspace_for(str(main.id), "local")
        agent, ws = str(main.id), str(workspace.id)
        await _submit_steps(store, agent, ws)  # statements compiled, pages read once
        few = await _submit_steps(store, agent, ws)
        await _many(store, agent, ws, 20_000)
        many = await _submit_steps(store, agent, ws)
        # Without the index the insert's max(seq) stepped through every row: ~20,000 × a few
        # steps more than ``few``; with it the B-tree's depth adds a handful.
        assert many < few + 200, (few, many)
    finally:
        await store.close()


@pytest.mark.postgres
async def test_postgresql_has_the_index_too(pg_schema: str) -> None:
    store = await Store.open(POSTGRES_URL, schema_name=pg_schema)
    try:

        def indexes(conn: sa.Connection) -> list[str]:
            found = conn.execute(
                sa.text("SELECT indexname FROM pg_indexes WHERE tablename = 'executions' "
                        "AND schemaname = :schema"),
                {"schema": pg_schema},
            )  # fmt: skip
            return [str(r[0]) for r in found]

        assert "ix_executions_seq" in await store.run(indexes)
    finally:
        await store.close()

"""Retention of what grows (issue 18; docs/operations.md): execution logs by age and by size
budget through the Runner protocol (local and direct runners), old records, events and
notices; what is never pruned (an artifact's snapshot and logs, a live notice); the SQLite
file shrinking after a large prune; ``shellyard gc`` through a served home."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from conftest import Yard, sy
from shellyard.config import RetentionSettings, Settings
from shellyard.contract.executions import ExecutionCancelQuery, ExecutionLogsQuery, ExecutionState
from shellyard.contract.maintenance import GcRequest
from shellyard.control.plane import ControlPlane
from shellyard.errors import Conflict
from shellyard.runner.protocol import LogPruneRequest
from shellyard.store.schema import executions, session_events

pytestmark = pytest.mark.timeout(300)


def _no_snapshots(**fields: Any) -> GcRequest:
    return GcRequest(snapshots=False, **fields)


async def _finished_unread(yard: Yard, command: str) -> str:
    """A background execution nobody looked at: its notice stays unread (live)."""
    started = await yard.run(command, background=True)
    store = yard.plane.store
    for _ in range(600):
        row = await store.get_execution(started.execution_id)
        if row is not None and ExecutionState(row.state).terminal:
            return started.execution_id
        await asyncio.sleep(0.05)
    raise AssertionError("the execution did not finish")


async def test_logs_past_their_age_are_pruned_and_the_record_says_so(yard: Yard) -> None:
    """E11 reads after retention: a finished execution whose logs passed ``log_days`` reads
    as a record with ``logs_pruned_at`` and an empty, complete log instead of an error; its
    runner folder keeps only result.json; an unread (live) notice keeps its execution's logs;
    a running execution is never touched."""
    plane = yard.plane
    old = [await yard.run(f"echo old {i}; echo err >&2") for i in range(3)]
    live = await _finished_unread(yard, "echo unread")
    running = await yard.run("sleep 30", background=True)
    report = await plane.retention.run(_no_snapshots(log_days=0))
    assert report.logs_pruned == 3 and report.log_bytes_freed > 0, report
    for result in old:
        logs = await plane.executions.logs(result.execution_id, ExecutionLogsQuery(stream="stdout"))
        assert logs.logs_pruned_at is not None and logs.data == "" and logs.complete
        assert (
            await plane.executions.logs(result.execution_id, ExecutionLogsQuery(stream="stderr"))
        ).logs_pruned_at
        view = await plane.executions.status(result.execution_id)
        assert view.state == "completed" and view.exit_code == 0
        assert view.logs_pruned_at is not None and view.snapshot_seq == result.snapshot_seq
    assert (
        await plane.executions.logs(live, ExecutionLogsQuery(stream="stdout"))
    ).data == "unread\n"
    assert (await plane.executions.status(running.execution_id)).logs_pruned_at is None
    # the runner answers a read of pruned logs clearly too (never through the control plane's
    # own files: the Runner protocol)
    with pytest.raises(Exception, match="deleted by retention"):
        await yard.runner.read_log(old[0].execution_id, "stdout", 0, 10)
    if yard.runner_id == "local":
        folder = yard.home / "home" / "runners" / "local" / "executions" / old[0].execution_id
        assert sorted(p.name for p in folder.iterdir()) == ["result.json"]
    # reading its logs above read its notice (N3): now nothing keeps them
    again = await plane.retention.run(_no_snapshots(log_days=0))
    assert again.logs_pruned == 1  # the formerly unread one, read above
    await plane.executions.cancel(running.execution_id, ExecutionCancelQuery(wait_s=30))


async def test_size_budget_prunes_oldest_first(yard: Yard) -> None:
    """Within ``log_budget_bytes`` per runner: the oldest logs go first until the runner's
    execution folders fit; younger ones stay."""
    plane = yard.plane
    made = [await yard.run(f"head -c 200000 /dev/zero | tr '\\0' '{i}'") for i in range(4)]
    held = (await yard.runner.prune_logs(LogPruneRequest())).bytes_held
    assert held is not None and held >= 800_000
    budget = held - 300_000  # two of the 200 kB logs must go
    report = await plane.retention.run(_no_snapshots(log_budget_bytes=budget, log_days=365))
    assert report.logs_pruned == 2, report
    assert report.runner_log_bytes[yard.runner_id] <= budget
    states = [(await plane.executions.status(m.execution_id)).logs_pruned_at for m in made]
    assert [s is not None for s in states] == [True, True, False, False]


async def test_an_artifacts_snapshot_and_logs_are_never_pruned(home: Path) -> None:
    """T5 + retention: with every limit at zero and one snapshot kept per workspace, the
    execution whose snapshot an artifact names keeps its record, logs and snapshot; the
    others lose their logs and records."""
    settings = Settings(home=home / "home", retention=RetentionSettings(keep_last=1))
    async with ControlPlane.running(settings) as plane:
        made = await plane.executions.run_shell(_request("echo result > out.txt; echo made"))
        artifact = await plane.artifacts.declare("out.txt")
        assert artifact.seq == made.snapshot_seq
        others = [await plane.executions.run_shell(_request(f"echo {i} > n{i}")) for i in range(3)]
        report = await plane.retention.run(
            GcRequest(log_days=0, record_days=0, event_days=0, archived_days=0)
        )
        assert report.records_deleted == 3, report
        assert report.snapshots is not None
        view = await plane.executions.status(made.execution_id)
        assert view.logs_pruned_at is None
        assert (
            await plane.executions.logs(made.execution_id, ExecutionLogsQuery())
        ).data == "made\n"
        seqs = [s.seq for s in await plane.runners.get("local").list_snapshots(made.workspace_id)]
        assert made.snapshot_seq in seqs
        opened = await plane.artifacts.open(artifact.artifact_id)
        assert b"".join([c async for c in opened.chunks]) == b"result\n"
        for other in others:
            with pytest.raises(Exception, match="no execution"):
                await plane.executions.status(other.execution_id)
            assert not (settings.local_runner_root / "executions" / other.execution_id).exists()


def _request(command: str) -> Any:
    from shellyard.contract.executions import RunShellRequest

    return RunShellRequest(command=command)


async def test_database_file_shrinks_after_a_large_prune(home: Path) -> None:
    """SQLite gives freed pages back (incremental vacuum, then a WAL checkpoint): 20,000 old
    records and 20,000 session events pruned make the file much smaller."""
    settings = Settings(home=home / "home")
    async with ControlPlane.running(settings) as plane:
        first = await plane.executions.run_shell(_request("true"))
        store = plane.store
        row = await store.get_execution(first.execution_id)
        assert row is not None
        agent = await store.get_agent(row.agent_id)
        assert agent is not None
        session_id = agent.session_id
        old = time.time() - 400 * 86400
        await store.run(_fill, dataclasses.asdict(row), session_id, old, 20_000)
        db = settings.home / "shellyard.db"
        before = plane.retention._database_bytes()
        assert before is not None and before > 10 << 20
        report = await plane.retention.run(_no_snapshots())  # the default policy: 90/30 days
        assert (
            report.records_deleted == 20_000 and report.events_deleted["session_events"] >= 20_000
        )
        after = db.stat().st_size
        assert report.database_bytes_after is not None
        assert after < before / 3 and report.database_bytes_after < before / 3, (before, after)
        # the record that is young stays, and so does the database's auto_vacuum mode
        assert (await plane.executions.status(first.execution_id)).state == "completed"
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA auto_vacuum").fetchone() == (2,)


def _fill(conn: sa.Connection, row: dict[str, Any], session_id: str, at: float, n: int) -> None:
    base = {k: row[k] for k in ("agent_id", "workspace_id", "runner_id", "background")}
    conn.execute(
        executions.insert(),
        [
            {
                **base,
                "id": f"ex_old{i:08d}",
                "seq": 10_000_000 + i,
                "command": "x" * 400,
                "state": "completed",
                "exit_code": 0,
                "cancel_requested": False,
                "query_failures": 0,
                "was_unknown": False,
                "created_at": at,
                "started_at": at,
                "finished_at": at,
            }
            for i in range(n)
        ],
    )
    conn.execute(
        session_events.insert(),
        [
            {
                "session_id": session_id,
                "kind": "note",
                "detail": {"pad": "y" * 200},
                "created_at": at,
            }
            for _ in range(n)
        ],
    )


def test_shellyard_gc_through_a_served_home(served_home: Path) -> None:
    """``shellyard gc`` runs the policy on the serving control plane (admin), with overrides."""
    assert sy(served_home, "run", "--", "echo one").returncode == 0
    done = sy(served_home, "gc", "--log-days", "0", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["logs_pruned"] == 1 and report["snapshots"] is not None
    listing = json.loads(sy(served_home, "status", "--json").stdout)
    logs = sy(served_home, "logs", listing[0]["execution_id"])
    assert logs.returncode == 0 and logs.stdout == ""
    text = sy(served_home, "gc")
    assert text.returncode == 0 and "pruned the logs of 0 executions" in text.stdout


async def test_retention_on_postgresql_and_on_its_schedule(home: Path, pg_schema: str) -> None:
    """The same queries on PostgreSQL, run by the service's own schedule (``interval_s``):
    logs, then records past their age go without anyone calling gc."""
    from conftest import POSTGRES_URL

    policy = RetentionSettings(interval_s=0.5, log_days=0, record_days=None, event_days=0)
    settings = Settings(
        home=home / "home", database_url=POSTGRES_URL, database_schema=pg_schema, retention=policy
    )
    async with ControlPlane.running(settings) as plane:
        made = [await plane.executions.run_shell(_request(f"echo {i}")) for i in range(2)]
        for _ in range(100):
            views = [await plane.executions.status(m.execution_id) for m in made]
            if all(v.logs_pruned_at is not None for v in views):
                break
            await asyncio.sleep(0.1)
        assert all(v.logs_pruned_at is not None for v in views), views
        # The schedule's own pass may hold the maintenance lock right now: as its message
        # says, try again when it is done.
        for _ in range(100):
            try:
                report = await plane.retention.run(_no_snapshots(record_days=0))
                break
            except Conflict:
                await asyncio.sleep(0.1)
        assert report.records_deleted == 2 and report.database_bytes_after is None
        for result in made:
            with pytest.raises(Exception, match="no execution"):
                await plane.executions.status(result.execution_id)

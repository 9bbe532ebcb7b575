"""What one foreground execution costs the database: transactions and statements per
``run_shell(true)``, counted with SQLAlchemy's engine events on a real SQLite file and a real
PostgreSQL schema (docs/benchmarks.md, "CPU per execution"). Ceilings, so a regression that
adds a round trip to the hot path fails here; durability (E11) is tested by the kill -9 tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from runner_daemon_fixture import start_daemon
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.pool import Pool

from conftest import POSTGRES_URL
from shellyard.config import Settings
from shellyard.contract.executions import RunShellRequest
from shellyard.control.plane import build
from shellyard.runner.protocol import SandboxPolicy

#: (transactions, statements) a foreground run_shell(true) may cost at most, per database;
#: a transaction is one that sends BEGIN and COMMIT (a single statement in autocommit commits
#: by itself, ``Database.run_statement``). Measured: SQLite 3 transactions / 7 statements
#: (submit with the writer, start, finish with the notice and the writer's release; the
#: lease is held in memory, no row: control/replicas/leases.py), where it was 3 / 9 with a
#: lease row written and deleted per run; PostgreSQL 1 / 4 (submit and start each one
#: autocommit statement, the finish its terminal update and one statement of CTEs for the
#: rest: store/one_trip.py),
#: 6 round trips, where it was 3 / 11 (17 round trips). Before that: 7 / 18 on SQLite.
CEILINGS = {"sqlite": (3, 7), "postgresql": (1, 4)}


class Counter:
    def __init__(self) -> None:
        self.transactions = 0
        self.statements: list[str] = []
        self.checkouts = 0

    def begin(self, conn: Any) -> None:
        if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            self.transactions += 1

    def checkout(self, *_args: Any) -> None:
        self.checkouts += 1

    def statement(self, _conn: Any, _cursor: Any, sql: str, *_rest: Any) -> None:
        self.statements.append(" ".join(sql.split())[:80])


@contextmanager
def counting() -> Iterator[Counter]:
    """Every transaction begun and statement sent by any engine of this process meanwhile."""
    counter = Counter()
    event.listen(Engine, "begin", counter.begin)
    event.listen(Engine, "before_cursor_execute", counter.statement)
    event.listen(Pool, "checkout", counter.checkout)
    try:
        yield counter
    finally:
        event.remove(Engine, "begin", counter.begin)
        event.remove(Engine, "before_cursor_execute", counter.statement)
        event.remove(Pool, "checkout", counter.checkout)


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
async def test_a_foreground_run_costs_few_transactions(
    database: str, home: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E1–E3: a foreground run_shell(true) records its submit, start and end (E11: each a
    committed state change) in at most the ceiling's transactions and statements, on SQLite
    with the local runner and on PostgreSQL with a runner daemon (where each statement, BEGIN
    and COMMIT is a round trip)."""
    # No lease round (renewal, claims) runs within the counted runs: only theirs are counted.
    monkeypatch.setenv("SHELLYARD_LEASE_TTL_S", "3600")
    settings = Settings(home=home / "home", local_policy=SandboxPolicy())
    daemon = None
    if database == "postgresql":
        settings.database_url = POSTGRES_URL
        settings.database_schema = request.getfixturevalue("pg_schema")
    plane = await build(settings)
    try:
        runner_id = "local"
        if database == "postgresql":
            daemon = await start_daemon(home / "daemon", SandboxPolicy())
            await plane.runners.add_direct("remote", daemon.url, daemon.token)
            runner_id = "remote"
        for _ in range(3):  # warm: the workspace exists, the agent is known
            warm = await plane.executions.run_shell(
                RunShellRequest(command="true", runner_id=runner_id)
            )
            assert warm.state == "completed", warm
        runs = 5
        with counting() as counter:
            for _ in range(runs):
                result = await plane.executions.run_shell(
                    RunShellRequest(command="true", runner_id=runner_id)
                )
                assert result.state == "completed" and result.exit_code == 0, result
        transactions, statements = counter.transactions / runs, len(counter.statements) / runs
        print(f"{database}: {transactions} transactions, {statements} statements per run")
        print("\n".join(counter.statements[: len(counter.statements) // runs]))
        most_transactions, most_statements = CEILINGS[database]
        assert transactions <= most_transactions, counter.statements
        assert statements <= most_statements, counter.statements
        if database == "sqlite":
            # The transactions run on the store's one held connection (store/db.py
            # ``Database.connection``): no pool checkout and return (with its reset) each.
            assert counter.checkouts == 0, counter.checkouts
        # The end is committed and the notice the caller saw is read (N3): nothing skipped.
        record = await plane.store.get_execution(result.execution_id)
        assert record is not None and record.state == "completed"
        notices = await plane.store.list_notices(str(record.agent_id))
        (notice,) = [n for n in notices if n.subject_id == result.execution_id]
        assert notice.read_at is not None
        held = await plane.store.lease_counts(plane.leases.replica_id)
        assert held.get("execution", 0) == 0, held  # released with the end
    finally:
        await plane.aclose()
        if daemon is not None:
            await daemon.stop()

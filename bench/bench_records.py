"""The store's read path with typed records (docs/architecture.md "Records at the store
boundary"): what building a frozen dataclass per row (``store/records.py``'s ``from_row``)
adds to a read, against the same read returning the rows as dicts (what the store returned
before), measured in the same run, interleaved round by round on one SQLite store.

- ``list``: ``list_executions`` of ROWS records against ``store.all`` of the same select;
- ``get``: ``get_execution`` of one record against the same statement's dict row.

Target: a page of executions read ≤ 1.5× the dict rows; one record ≤ 1.2× (the statement
and its transaction dominate).

    .venv/bin/python bench/bench_records.py [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import sqlalchemy as sa

from common import cli, make_home, metric, remove_home
from shellyard.store import Store
from shellyard.store.executions import _get
from shellyard.store.schema import executions

ROWS = 1000


def _fill(conn: sa.Connection, agent_id: str, workspace_id: str, n: int) -> None:
    now = time.time()
    conn.execute(
        executions.insert(),
        [
            {
                "id": f"ex_{i:08d}", "seq": i + 1, "agent_id": agent_id,
                "workspace_id": workspace_id, "runner_id": "local", "command": f"echo {i}",
                "background": False, "state": "completed", "exit_code": 0,
                "cancel_requested": False, "query_failures": 0, "was_unknown": False,
                "read_only": False, "created_at": now + i, "started_at": now + i,
                "finished_at": now + i + 1, "run_options": '{"timeout_ms": 1000}',
            }
            for i in range(n)
        ],
    )  # fmt: skip


async def _timed(call: Callable[[], Awaitable[Any]], repeat: int) -> float:
    started = time.perf_counter()
    for _ in range(repeat):
        await call()
    return (time.perf_counter() - started) / repeat * 1000


async def measure(rounds: int) -> dict[str, Any]:
    home = make_home()
    store = await Store.open(f"sqlite:///{home / 'store.db'}")
    try:
        _session, agent = await store.default_owner()
        await store.upsert_runner("local", "local", None, None)
        workspace, _ = await store.workspace_for(str(agent.id), "local")
        await store.run(_fill, str(agent.id), workspace.id, ROWS)
        listed = sa.select(executions).order_by(executions.c.seq.desc()).limit(ROWS)
        sides: dict[str, Callable[[], Awaitable[Any]]] = {
            "list_records": lambda: store.list_executions(str(agent.id), ROWS),
            "list_rows": lambda: store.all(listed.where(executions.c.agent_id == agent.id)),
            "get_record": lambda: store.get_execution("ex_00000500"),
            "get_rows": lambda: store.run(_get, "ex_00000500"),
        }
        for call in sides.values():  # warm-up: statement caches, converters
            await _timed(call, 5)
        samples: dict[str, list[float]] = {name: [] for name in sides}
        for round_no in range(rounds):
            order = list(sides)[round_no % 4 :] + list(sides)[: round_no % 4]
            for name in order:
                repeat = 5 if name.startswith("list") else 200
                samples[name].append(await _timed(sides[name], repeat))
        return {name: statistics.median(values) for name, values in samples.items()}
    finally:
        await store.close()
        remove_home(home)


def run(args: argparse.Namespace) -> dict[str, Any]:
    rounds = 8 if args.quick else 30
    found = asyncio.run(measure(rounds))
    return {
        "title": "Store reads as typed records against dict rows, same run",
        "command": "python bench/bench_records.py" + (" --quick" if args.quick else ""),
        "metrics": [
            metric(
                "records.list",
                f"list_executions of {ROWS} records, ms (median of {rounds} rounds)",
                found["list_records"], "ms", target="≤ 1.5× the dict rows", kind="ratio_max",
                limit=1.5, baseline_label="the same select as dict rows, ms",
                baseline_value=found["list_rows"],
            ),
            metric(
                "records.get",
                "get_execution of one record, ms",
                found["get_record"], "ms", target="≤ 1.2× the dict row", kind="ratio_max",
                limit=1.2, baseline_label="the same statement as a dict row, ms",
                baseline_value=found["get_rows"],
            ),
        ],
        "details": {"rows": ROWS, "rounds": rounds, "medians_ms": found},
    }  # fmt: skip


if __name__ == "__main__":
    cli("records", run, __doc__ or "", None)

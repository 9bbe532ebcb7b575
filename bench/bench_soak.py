"""Soak (issue 18): 50,000 executions across 50 workspaces through the SDK against a
``shellyard serve`` process, mixing file writes (every command writes one), status polls,
log reads, reminders and transfers, with ``shellyard gc`` (POST /v1/gc, a log budget) after
every report. Every 5,000 executions it reports the server's RSS and open fds (from /proc,
outside the server), its asyncio tasks and tracked structures (GET /v1/debug/sizes, admin),
the database size and the runner folder size.

Targets (issue 18): RSS within +10% of its value after the first report; fds and tasks
flat; the runner folder within the retention budget plus the snapshots.

    .venv/bin/python bench/bench_soak.py [--quick] [--executions N] [--out PATH]

Not in CI (hours at full size); ``--quick`` runs 2,000 with a report every 500.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from common import MIB, make_home, metric, remove_home, rss_bytes, start_server, stop_server
from shellyard.config import Settings
from shellyard.home import read_info
from shellyard.sdk.client import AsyncClient
from shellyard.store import Store

COMMAND = "python bench/bench_soak.py"
WORKSPACES = 50
#: The log budget ``gc`` applies after every report (per runner).
LOG_BUDGET = 20 * MIB


async def create_agents(settings: Settings, count: int) -> list[str]:
    """Children of the default agent: its transfers may target their workspaces."""
    store = await Store.open(settings.effective_database_url)
    try:
        session, main = await store.default_owner()
        return [
            str((await store.create_agent(str(session.id), str(main.id))).id) for _ in range(count)
        ]
    finally:
        await store.close()


def folder_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512  # on disk
            except OSError:
                continue
    return total


async def one(client: AsyncClient, n: int) -> None:
    background = n % 3 == 0
    result = await client.run(f"echo {n} > f{n % 10}.txt; echo out {n}", background=background)
    if background:
        await client.status(result.execution_id)
        await client.wait(result.execution_id, 30)
    logs = await client.logs(result.execution_id)
    assert logs.data == f"out {n}\n", logs


async def extras(main: AsyncClient, agents: list[AsyncClient], source_ws: str, n: int) -> None:
    done = await main.run("echo 1 > t.txt")
    await main.timer_create("check", after_ms=1, execution_id=done.execution_id)
    target = agents[n % len(agents)]
    target_ws = (await target.run("true")).workspace_id
    started = await main.transfer_start(source_ws, ["t.txt"], target_ws, f"in{n}", queue=True)
    await main.transfer_wait(started.transfer_id, 30)


def sample(
    home: Path, pid: int, sizes: dict[str, int], done: int, started: float
) -> dict[str, Any]:
    db = home / "shellyard.db"
    db_bytes = sum(p.stat().st_size for p in (db, Path(f"{db}-wal")) if p.exists())
    return {
        "executions": done,
        "elapsed_s": round(time.monotonic() - started, 1),
        "rss_mib": round(rss_bytes(pid) / MIB, 1),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "tasks": sizes.get("asyncio_tasks"),
        "db_mib": round(db_bytes / MIB, 2),
        "runner_mib": round(folder_bytes(home / "runners" / "local") / MIB, 2),
        "executions_folder_mib": round(
            folder_bytes(home / "runners" / "local" / "executions") / MIB, 2
        ),
        "per_object": {
            k: v
            for k, v in sizes.items()
            if v and k not in ("asyncio_tasks", "open_fds", "rss_bytes")
        },
    }


async def soak(home: Path, total: int, every: int) -> dict[str, Any]:
    settings = Settings(home=home)
    agent_ids = await create_agents(settings, WORKSPACES - 1)
    pid = start_server(home)
    info = read_info(home)
    assert info is not None
    main = AsyncClient(info.url, info.token)
    agents = [main.as_agent(a) for a in agent_ids]
    clients = [main, *agents]
    source_ws = (await main.run("echo 1 > t.txt")).workspace_id
    reports: list[dict[str, Any]] = []
    started = time.monotonic()
    done = 0
    while done < total:
        batch = min(every, total - done)
        for start in range(done, done + batch, len(clients)):
            count = min(len(clients), done + batch - start)
            await asyncio.gather(*(one(clients[i], start + i) for i in range(count)))
            if (start // len(clients)) % 20 == 0:
                await extras(main, agents, source_ws, start)
        done += batch
        await main._send(_gc_call())
        sizes = await main._send(_sizes_call())
        reports.append(sample(home, pid, sizes, done, started))
        print(json.dumps(reports[-1]), file=sys.stderr, flush=True)
    for client in clients:
        await client.aclose()
    return {"reports": reports, "pid": pid}


def _gc_call() -> Any:
    from pydantic import TypeAdapter

    from shellyard.control.retention import GcReport
    from shellyard.sdk.base import call

    return call(
        "POST",
        "/v1/gc",
        TypeAdapter(GcReport),
        body={"log_budget_bytes": LOG_BUDGET},
        timeout_s=600,
    )


def _sizes_call() -> Any:
    from pydantic import TypeAdapter

    from shellyard.sdk.base import call

    return call("GET", "/v1/debug/sizes", TypeAdapter(dict[str, int]))


def run(args: argparse.Namespace) -> dict[str, Any]:
    total = args.executions or (2000 if args.quick else 50_000)
    every = max(WORKSPACES, total // 10)
    home = make_home()
    try:
        result = asyncio.run(soak(home, total, every))
    finally:
        stop_server(home)
        remove_home(home)
    reports = result["reports"]
    first, last = reports[0], reports[-1]
    metrics = [
        metric(
            "rss_growth",
            f"server RSS after {last['executions']} vs after {first['executions']}",
            last["rss_mib"],
            "MiB",
            baseline_label=f"after {first['executions']}",
            baseline_value=first["rss_mib"],
            target="≤ 1.10×",
            kind="ratio_max",
            limit=1.10,
        ),
        metric(
            "fds_growth",
            "server open fds, last vs first report",
            last["fds"],
            "fds",
            baseline_label="first report",
            baseline_value=first["fds"],
            target="≤ 1.0×",
            kind="ratio_max",
            limit=1.0,
        ),
        metric(
            "tasks_growth",
            "server asyncio tasks, last vs first report",
            last["tasks"],
            "tasks",
            baseline_label="first report",
            baseline_value=first["tasks"],
            target="≤ 1.0×",
            kind="ratio_max",
            limit=1.0,
        ),
        metric(
            "executions_folder",
            "execution folders after the last gc",
            last["executions_folder_mib"],
            "MiB",
            target=f"≤ the {LOG_BUDGET // MIB} MiB log budget",
            kind="abs_max",
            limit=LOG_BUDGET / MIB,
        ),
    ]
    return {
        "title": f"Soak: {total} executions across {WORKSPACES} workspaces",
        "command": COMMAND + (" --quick" if args.quick else ""),
        "metrics": metrics,
        "details": {"reports": reports, "log_budget_bytes": LOG_BUDGET},
    }


def main() -> None:
    parser_hook = argparse.ArgumentParser(add_help=False)
    parser_hook.add_argument("--executions", type=int, default=None)
    known, rest = parser_hook.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    from common import cli

    def go(args: argparse.Namespace) -> dict[str, Any]:
        args.executions = known.executions
        return run(args)

    cli("soak", go, "50,000 executions across 50 workspaces; flat memory, bounded disk")


if __name__ == "__main__":
    main()

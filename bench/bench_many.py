"""Benchmark 5: 1,000 concurrent background ``sleep 60`` executions through a server process
(``shellyard serve``): the server's peak RSS (sampled every 20 ms throughout), and the latency
of ``execution_status`` (REST, client side) while all of them run. Then every one is cancelled
and the benchmark checks that no process of theirs is left (SHELLYARD_EXECUTION_ID in
/proc/*/environ). Targets: RSS ≤ 500 MiB; status p99 ≤ 20 ms.

One agent per execution: W1 allows one writer per workspace, and a workspace belongs to an
agent, so 1,000 concurrent executions need 1,000 workspaces. (``queue: true`` in one workspace
would run them one after another, not concurrently.) The REST API has no agent-creation
endpoint yet, so the agents are created with ``Store.create_agent`` on the home's database
before the server starts; requests name their agent with the ``X-Shellyard-Agent`` header.

    .venv/bin/python bench/bench_many.py [--quick] [--out PATH] [--profile DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Any

import httpx

from common import (
    MIB,
    PySpy,
    RssSampler,
    cli,
    make_home,
    metric,
    remove_home,
    rss_bytes,
    sandbox_processes,
    start_server,
    stop_server,
    summarize_collapsed,
    summary_ms,
)
from shellyard.config import Settings
from shellyard.home import read_info
from shellyard.store import Store

COMMAND = "python bench/bench_many.py"
SLEEP_S = 60
CONCURRENCY = 8  # requests in flight while submitting and cancelling


async def create_agents(home_settings: Settings, count: int) -> list[str]:
    store = await Store.open(home_settings.effective_database_url)
    try:
        session, _main = await store.default_owner()
        return [str((await store.create_agent(str(session.id))).id) for _ in range(count)]
    finally:
        await store.close()


async def bounded(items: list[Any], worker: Any, limit: int) -> list[Any]:
    semaphore = asyncio.Semaphore(limit)

    async def one(item: Any) -> Any:
        async with semaphore:
            return await worker(item)

    return await asyncio.gather(*(one(i) for i in items))


async def health_latency(http: httpx.AsyncClient, url: str) -> dict[str, Any]:
    """GET /health (no database, no work) on the client's keep-alive connection and on a
    fresh connection per request: a gap of ~40 ms between them is Nagle's algorithm on the
    server's socket meeting the client's delayed ACK (TCP_NODELAY not set)."""
    keepalive: list[float] = []
    for _ in range(30):
        start = time.perf_counter()
        (await http.get("/health")).raise_for_status()
        keepalive.append(time.perf_counter() - start)
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    fresh: list[float] = []
    for _ in range(30):
        start = time.perf_counter()
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        data = b""
        while not data.rstrip().endswith(b"}"):
            chunk = await reader.read(65536)
            if not chunk:
                break
            data += chunk
        fresh.append(time.perf_counter() - start)
        writer.close()
    return {
        "health_keepalive_ms": summary_ms(keepalive),
        "health_fresh_connection_ms": summary_ms(fresh),
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    count = 200 if args.quick else 1000
    status_samples = 200 if args.quick else 500
    home = make_home()
    settings = Settings(home=home)
    profiles: dict[str, Any] = {}
    started = time.perf_counter()
    agent_ids = await create_agents(settings, count)
    agents_s = time.perf_counter() - started
    pid = start_server(home)
    idle_rss = rss_bytes(pid)
    sampler = RssSampler(pid, 0.02)
    info = read_info(home)
    assert info is not None
    http = httpx.AsyncClient(
        base_url=info.url,
        headers={"Authorization": f"Bearer {info.token}"},
        timeout=120,
        limits=httpx.Limits(max_connections=CONCURRENCY * 2),
    )
    ids: dict[str, str] = {}  # execution id → agent id
    submit_lat: list[float] = []
    status_lat: list[float] = []
    details: dict[str, Any] = {"executions": count, "sleep_s": SLEEP_S}
    try:
        # Warm up the server's request path once.
        await http.get("/health")
        details.update(await health_latency(http, info.url))

        async def submit(agent_id: str) -> None:
            start = time.perf_counter()
            response = await http.post(
                "/v1/executions",
                json={"command": f"sleep {SLEEP_S}", "background": True},
                headers={"X-Shellyard-Agent": agent_id},
            )
            submit_lat.append(time.perf_counter() - start)
            response.raise_for_status()
            body = response.json()
            if body["state"] != "running":
                raise RuntimeError(f"background sleep came back {body['state']}: {body['error']}")
            ids[body["execution_id"]] = agent_id

        start = time.perf_counter()
        await bounded(agent_ids, submit, CONCURRENCY)
        submit_s = time.perf_counter() - start
        details["submit_all_s"] = round(submit_s, 2)
        details["submit_latency_ms"] = summary_ms(submit_lat)
        alive = sandbox_processes(set(ids))
        details["sandboxes_alive_after_submit"] = len(set(alive.values()))
        details["sandbox_processes_after_submit"] = len(alive)
        details["rss_after_submit_mib"] = round(rss_bytes(pid) / MIB, 1)

        async def status(execution_id: str) -> str:
            start = time.perf_counter()
            response = await http.get(
                f"/v1/executions/{execution_id}",
                headers={"X-Shellyard-Agent": ids[execution_id]},
            )
            status_lat.append(time.perf_counter() - start)
            response.raise_for_status()
            return str(response.json()["state"])

        chooser = random.Random(7)
        pool = list(ids)
        for _ in range(20):  # warm-up, not counted
            await status(chooser.choice(pool))
        status_lat.clear()
        start = time.perf_counter()
        states = [await status(chooser.choice(pool)) for _ in range(status_samples)]
        details["status_sampling_s"] = round(time.perf_counter() - start, 2)
        details["status_states_seen"] = {s: states.count(s) for s in set(states)}
        alive = sandbox_processes(set(ids))
        details["sandboxes_alive_after_status"] = len(set(alive.values()))
        if args.profile:
            raw = args.profile / "many_status_server.txt"
            with PySpy(pid, raw):
                for _ in range(100):
                    await status(chooser.choice(pool))
            profiles["status_server_pyspy"] = summarize_collapsed(raw)
            status_lat[:] = status_lat[:status_samples]  # profiled calls are not counted

        async def cancel(execution_id: str) -> None:
            response = await http.post(
                f"/v1/executions/{execution_id}/cancel",
                headers={"X-Shellyard-Agent": ids[execution_id]},
            )
            response.raise_for_status()

        start = time.perf_counter()
        await bounded(list(ids), cancel, CONCURRENCY)
        details["cancel_requests_s"] = round(time.perf_counter() - start, 2)
        # Every sandbox process gone (seen in /proc), then every record terminal.
        deadline = time.monotonic() + 120
        while sandbox_processes(set(ids)) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        details["cancel_to_no_process_s"] = round(time.perf_counter() - start, 2)
        pending = set(ids)

        async def check(execution_id: str) -> None:
            response = await http.get(
                f"/v1/executions/{execution_id}",
                headers={"X-Shellyard-Agent": ids[execution_id]},
            )
            if response.json()["state"] in ("completed", "cancelled", "failed", "unknown"):
                pending.discard(execution_id)

        while pending and time.monotonic() < deadline:
            await bounded(list(pending), check, CONCURRENCY)
            if pending:
                await asyncio.sleep(0.2)
        details["cancel_to_all_terminal_s"] = round(time.perf_counter() - start, 2)
        details["not_terminal_after_cancel"] = len(pending)
        leftovers = sandbox_processes(set(ids))
        details["leftover_processes"] = len(leftovers)
        if leftovers:
            details["leftover_examples"] = list(leftovers.items())[:10]
    finally:
        peak = sampler.stop()
        await http.aclose()
        stop_server(home)
        remove_home(home)
    details["agents_created_s"] = round(agents_s, 2)
    details["server_idle_rss_mib"] = round(idle_rss / MIB, 1)
    details["status_latency_ms"] = summary_ms(status_lat)
    lat = details["status_latency_ms"]
    metrics = [
        metric(
            "many.rss", f"server peak RSS with {count} sandboxes, MiB", peak / MIB, "MiB",
            baseline_label="server RSS idle after start, MiB", baseline_value=idle_rss / MIB,
            target="≤ 500 MiB", kind="abs_max", limit=500.0,
        ),
        metric(
            "many.status.p99", f"execution_status p99 while {count} run, ms", lat["p99"], "ms",
            target="≤ 20 ms", kind="abs_max", limit=20.0,
        ),
        metric(
            "many.status.p50", f"execution_status p50 while {count} run, ms", lat["p50"], "ms",
            target="—", kind="info",
        ),
        metric(
            "many.leftovers", "processes left after cancelling all", details["leftover_processes"],
            "", target="0", kind="abs_max", limit=0,
        ),
    ]  # fmt: skip
    return {
        "name": "many",
        "title": f"5. {count} concurrent background sleep {SLEEP_S} executions",
        "command": COMMAND + (" --quick" if args.quick else ""),
        "metrics": metrics,
        "details": details,
        "profiles": profiles,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    return asyncio.run(measure(args))


if __name__ == "__main__":
    cli("many", run, __doc__ or "")

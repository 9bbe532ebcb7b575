"""Issue 16's benchmark: completed executions per second with 1, 2 and 3 control-plane
replicas (``shellyard serve`` processes on one PostgreSQL database) over the same two runner
daemons, and ``execution_status`` p99 under that load. Each configuration gets a fresh
database; the 1-replica figure is the baseline of the ratios, measured in the same run.

Load: WORKERS closed-loop clients, each submitting foreground ``true`` (``queue: true``) to its
own workspace through the replicas round-robin; beside them one prober asks
``GET /v1/executions/{id}`` of a recent execution, round-robin, as fast as answers come.
CPU seconds of the replicas, the runner daemons (with their sandboxes) and PostgreSQL over
the window say what limits the figure.

    .venv/bin/python bench/bench_replicas.py [--quick] [--profile FOLDER] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from common import cli, make_home, metric, quantile, remove_home

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from replicas_fixture import Replica, fresh_database, replica_env, start_replicas, stop_all
from runner_daemon_fixture import RunnerDaemon, start_daemon

from shellyard.runner.protocol import SandboxPolicy

TICKS = os.sysconf("SC_CLK_TCK")
#: --profile FILE: py-spy's collapsed stacks of the single replica's measured window.
PROFILE: str | None = None


def cpu_seconds(pid: int) -> float:
    """User + system time of a process and its waited-for children (sandboxes)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / TICKS


def postgres_pids() -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/comm").read_text().strip() == "postgres":
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


async def measure(
    count: int, daemons: list[RunnerDaemon], seconds: float, workers: int
) -> dict[str, Any]:
    async with fresh_database() as url:
        replicas = await start_replicas(url, count, replica_env())
        try:
            return await _load(replicas, daemons, seconds, workers)
        finally:
            stop_all(replicas)


async def _load(
    replicas: list[Replica], daemons: list[RunnerDaemon], seconds: float, workers: int
) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=workers * 2 + 8)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        for i, daemon in enumerate(daemons):
            answer = await http.post(
                replicas[0].url + "/v1/runners",
                json={"runner_id": f"r{i}", "address": daemon.url, "token": daemon.token},
            )
            answer.raise_for_status()
        agents = []
        for _ in range((workers + 1) // 2):
            session = (await http.post(replicas[0].url + "/v1/sessions")).json()
            agents.append(session["main_agent_id"])
        await asyncio.sleep(0.5)  # every replica heard of the runners
        recent: list[tuple[str, str]] = []
        done = 0
        stop_at = 0.0

        async def worker(w: int) -> None:
            nonlocal done
            agent, runner = agents[w // 2], f"r{w % 2}"
            turn = w
            while time.monotonic() < stop_at:
                replica = replicas[turn % len(replicas)]
                turn += 1
                answer = await http.post(
                    replica.url + "/v1/executions",
                    json={"command": "true", "runner_id": runner, "queue": True, "wait_ms": 30000},
                    headers={"X-Shellyard-Agent": agent},
                )
                view = answer.json()
                assert view["state"] == "completed", view
                if time.monotonic() < stop_at:
                    done += 1
                recent.append((agent, view["execution_id"]))
                del recent[:-50]

        status_ms: list[float] = []

        async def prober() -> None:
            turn = 0
            while time.monotonic() < stop_at:
                if not recent:
                    await asyncio.sleep(0.01)
                    continue
                agent, execution_id = recent[-1 - turn % len(recent)]
                replica = replicas[turn % len(replicas)]
                turn += 1
                began = time.perf_counter()
                answer = await http.get(
                    f"{replica.url}/v1/executions/{execution_id}",
                    headers={"X-Shellyard-Agent": agent},
                )
                answer.raise_for_status()
                status_ms.append((time.perf_counter() - began) * 1000)

        # Warm-up (first workspaces, first connections), then the measured window.
        stop_at = time.monotonic() + 3
        await asyncio.gather(*(worker(w) for w in range(workers)))
        done, status_ms[:] = 0, []
        pids = {
            "replicas": [r.process.pid for r in replicas if r.process],
            "runner daemons": [d.process.pid for d in daemons if d.process],
            "postgresql": postgres_pids(),
        }
        cpu0 = {p: cpu_seconds(p) for v in pids.values() for p in v}
        spy = None
        if PROFILE and len(replicas) == 1:  # where a replica's CPU goes (collapsed stacks)
            spy = await asyncio.create_subprocess_exec(
                str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw",
                "-o", PROFILE, "-d", str(int(seconds)), "-p", str(pids["replicas"][0]),
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
        began = time.monotonic()
        stop_at = began + seconds
        await asyncio.gather(prober(), *(worker(w) for w in range(workers)))
        window = time.monotonic() - began
        if spy is not None:
            await spy.wait()
        pids["postgresql"] = postgres_pids()  # backends of connections opened meanwhile too
        cpu = {k: sum(cpu_seconds(p) - cpu0.get(p, 0.0) for p in v) for k, v in pids.items()}
    ordered = sorted(status_ms)
    return {
        "replicas": len(replicas),
        "executions_per_s": done / window,
        "status_p50_ms": quantile(ordered, 0.5),
        "status_p99_ms": quantile(ordered, 0.99),
        "status_samples": len(ordered),
        "cpu_share": {k: round(v / window, 2) for k, v in cpu.items()},
        "cpu_ms_per_execution": {k: round(v * 1000 / max(done, 1), 1) for k, v in cpu.items()},
        "load_average": round(os.getloadavg()[0], 2),
    }


async def measure_all(seconds: float, workers: int) -> list[dict[str, Any]]:
    root = make_home()
    daemons = [
        await start_daemon(root / f"daemon{i}", SandboxPolicy(), subprocess=True) for i in range(2)
    ]
    try:
        return [await measure(n, daemons, seconds, workers) for n in (1, 2, 3)]
    finally:
        for daemon in daemons:
            await daemon.stop()
        remove_home(root)


def run(args: argparse.Namespace) -> dict[str, Any]:
    global PROFILE
    if args.profile:  # a folder of profiles: py-spy's collapsed stacks of the 1-replica window
        args.profile.mkdir(parents=True, exist_ok=True)
        PROFILE = str(args.profile / "replicas-collapsed.txt")
    seconds = 8.0 if args.quick else 20.0
    results = asyncio.run(measure_all(seconds, 16))
    one = results[0]
    metrics = []
    for r in results[1:]:
        metrics.append(
            metric(
                f"replicas.rate_{r['replicas']}",
                f"completed executions/s, {r['replicas']} replicas, 16 clients",
                r["executions_per_s"],
                "/s",
                baseline_label="the same with 1 replica, /s",
                baseline_value=one["executions_per_s"],
                target="— (info: the scaling on this machine)",
                kind="info",
            )
        )
    for r in results:
        metrics.append(
            metric(
                f"replicas.status_p99_{r['replicas']}",
                f"execution_status p99 under that load, {r['replicas']} replicas, ms",
                r["status_p99_ms"],
                "ms",
                target="— (info)",
                kind="info",
            )
        )
    return {
        "name": "replicas",
        "title": "Replicas on one PostgreSQL: executions per second and status p99 (issue 16)",
        "command": "python bench/bench_replicas.py" + (" --quick" if args.quick else ""),
        "metrics": metrics,
        "details": {"seconds": seconds, "workers": 16, "results": results},
    }


if __name__ == "__main__":
    cli("replicas", run, __doc__ or "")

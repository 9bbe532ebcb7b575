"""Benchmark 1: round trip of a foreground ``run_shell`` of ``true`` in a workspace of 100
small files, through the Python API (an in-process ControlPlane) and through MCP stdio (the
official ``mcp`` client spawning ``python -m shellyard mcp``, itself a client of a control-plane
server process), beside a bare ``bwrap … true`` spawn and a bare ``true`` spawn.

All four are measured interleaved (one of each per round, in a rotating order) so the
machine's noise falls on all of them alike. Targets: API p50 ≤ 3× bare bwrap p50; MCP p50 ≤ 4×.

    .venv/bin/python bench/bench_roundtrip.py [--quick] [--out PATH] [--profile DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from common import (
    PYTHON,
    SEED_100_FILES,
    BareBwrap,
    PhaseTimer,
    PySpy,
    bare_true,
    child_pids_matching,
    cli,
    make_home,
    metric,
    remove_home,
    stop_server,
    summarize_collapsed,
    summary_ms,
)
from shellyard.config import Settings
from shellyard.contract.executions import RunShellRequest
from shellyard.control.service import ControlPlane
from shellyard.home import read_info
from shellyard.sdk.client import AsyncClient

COMMAND = "python bench/bench_roundtrip.py"


async def in_loop(fn: Callable[[], float]) -> float:
    """A blocking baseline, timed inside the same event loop as the product's calls."""
    return fn()


async def api_once(plane: ControlPlane) -> float:
    start = time.perf_counter()
    result = await plane.executions.run_shell(RunShellRequest(command="true"))
    elapsed = time.perf_counter() - start
    if result.state != "completed" or result.exit_code != 0:
        raise RuntimeError(f"API run_shell of true ended {result.state}: {result.error}")
    return elapsed


async def mcp_once(session: ClientSession) -> float:
    start = time.perf_counter()
    result = await session.call_tool("run_shell", {"command": "true"})
    elapsed = time.perf_counter() - start
    content = result.structured_content or {}
    if result.is_error or content.get("state") != "completed":
        raise RuntimeError(f"MCP run_shell of true failed: {result.content}")
    return elapsed


async def rest_once(client: AsyncClient) -> float:
    start = time.perf_counter()
    result = await client.run("true")
    elapsed = time.perf_counter() - start
    if result.state != "completed":
        raise RuntimeError(f"REST run of true ended {result.state}")
    return elapsed


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    rounds = 60 if args.quick else 200
    warmup = 10 if args.quick else 30
    api_home, mcp_home, bare_home = make_home(), make_home(), make_home()
    plane = ControlPlane(Settings(home=api_home / "home"))
    await plane.start()
    bare = BareBwrap(bare_home)
    params = StdioServerParameters(
        command=PYTHON,
        args=["-m", "shellyard", "mcp", "--home", str(mcp_home)],
        env={**os.environ, "SHELLYARD_HOME": str(mcp_home)},
    )
    samples: dict[str, list[float]] = {"true": [], "bwrap": [], "api": [], "mcp": [], "rest": []}
    profiles: dict[str, Any] = {}
    try:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            # Both workspaces get the same 100 small files before anything is timed.
            seeded = await plane.executions.run_shell(RunShellRequest(command=SEED_100_FILES))
            assert seeded.exit_code == 0, seeded
            seeded_mcp = await session.call_tool("run_shell", {"command": SEED_100_FILES})
            assert not seeded_mcp.is_error, seeded_mcp.content
            info = read_info(mcp_home)
            assert info is not None
            rest = AsyncClient(info.url, info.token)
            runners: dict[str, Any] = {
                "true": lambda: in_loop(bare_true),
                "bwrap": lambda: in_loop(bare.run),
                "api": lambda: api_once(plane),
                "mcp": lambda: mcp_once(session),
                "rest": lambda: rest_once(rest),
            }
            names = list(runners)
            for _ in range(warmup):
                for name in names:
                    await runners[name]()
            for index in range(rounds):
                shift = index % len(names)
                for name in names[shift:] + names[:shift]:
                    samples[name].append(await runners[name]())
            if args.profile:
                profiles = await profile(args.profile, plane, session, info.pid)
            await rest.aclose()
    finally:
        await plane.aclose()
        stop_server(mcp_home)
        for home in (api_home, mcp_home, bare_home):
            remove_home(home)

    stats = {name: summary_ms(values) for name, values in samples.items()}
    # Calls that took 30 ms more than their path's median: the ~40 ms delayed-ACK stall of a
    # keep-alive connection without TCP_NODELAY shows up here (REST and MCP, not the API).
    stalls = {
        name: round(
            sum(1 for v in values if v * 1000 > stats[name]["p50"] + 30) / max(1, len(values)), 3
        )
        for name, values in samples.items()
    }
    bw = stats["bwrap"]
    metrics = [
        metric(
            "roundtrip.api.p50",
            "Python API run_shell(true), p50",
            stats["api"]["p50"],
            "ms",
            baseline_label="bare bwrap … true, p50",
            baseline_value=bw["p50"],
            target="≤ 3× bare bwrap p50",
            kind="ratio_max",
            limit=3.0,
        ),
        metric(
            "roundtrip.api.p95",
            "Python API run_shell(true), p95",
            stats["api"]["p95"],
            "ms",
            baseline_label="bare bwrap … true, p95",
            baseline_value=bw["p95"],
            target="—",
            kind="info",
        ),
        metric(
            "roundtrip.mcp.p50",
            "MCP stdio run_shell(true), p50",
            stats["mcp"]["p50"],
            "ms",
            baseline_label="bare bwrap … true, p50",
            baseline_value=bw["p50"],
            target="≤ 4× bare bwrap p50",
            kind="ratio_max",
            limit=4.0,
        ),
        metric(
            "roundtrip.mcp.p95",
            "MCP stdio run_shell(true), p95",
            stats["mcp"]["p95"],
            "ms",
            baseline_label="bare bwrap … true, p95",
            baseline_value=bw["p95"],
            target="—",
            kind="info",
        ),
        metric(
            "roundtrip.rest.p50",
            "REST (AsyncClient → server) run(true), p50",
            stats["rest"]["p50"],
            "ms",
            baseline_label="bare bwrap … true, p50",
            baseline_value=bw["p50"],
            target="— (for the MCP breakdown)",
            kind="info",
        ),
        metric(
            "roundtrip.bwrap.p50",
            "bare bwrap … true, p50",
            bw["p50"],
            "ms",
            baseline_label="bare true (subprocess), p50",
            baseline_value=stats["true"]["p50"],
            target="— (baseline)",
            kind="info",
        ),
    ]
    return {
        "name": "roundtrip",
        "title": "1. Round trip of a foreground run_shell(true), workspace of 100 small files",
        "command": COMMAND + (" --quick" if args.quick else ""),
        "metrics": metrics,
        "details": {
            "rounds": rounds,
            "warmup_rounds": warmup,
            "latency_ms": stats,
            "share_30ms_over_median": stalls,
        },
        "profiles": profiles,
    }


async def profile(
    folder: Path, plane: ControlPlane, session: ClientSession, server_pid: int
) -> dict[str, Any]:
    """Where each path's time goes: the wall time one API round trip spends in each phase
    (store transactions, spawn, wait, commit), py-spy of this process's event-loop thread
    during API calls, and py-spy of ``shellyard mcp`` and ``shellyard serve`` during MCP
    calls."""
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    raw_api = folder / "roundtrip_api_plane.txt"
    with PySpy(os.getpid(), raw_api):
        for _ in range(100):
            await api_once(plane)
    out["api_plane_pyspy"] = summarize_collapsed(raw_api)
    timer = PhaseTimer()
    assert plane.store is not None
    timer.patch(plane.store, "store")
    runner = plane.runners.get("local")
    timer.patch(runner, "runner", ["start", "wait", "read_log", "log_size"])
    timer.patch(runner, "snapshot", ["_commit"])
    runs = 100
    total = 0.0
    for _ in range(runs):
        total += await api_once(plane)
    out["api_phases"] = {
        "round_trip_ms": round(1000 * total / runs, 3),
        "rows": [
            ["run_shell round trip (whole)", round(1000 * total / runs, 3), 1.0],
            *timer.report(runs),
        ],
        "note": "ms per run_shell and calls per run_shell; store.* are transactions; "
        "runner.wait runs while the sandbox runs and until its snapshot is committed",
    }
    raw = folder / "roundtrip_mcp_server.txt"
    raw_stdio = folder / "roundtrip_mcp_stdio.txt"
    stdio_pids = child_pids_matching("shellyard mcp")
    with (
        PySpy(server_pid, raw),
        PySpy(stdio_pids[0] if stdio_pids else 0, raw_stdio if stdio_pids else None),
    ):
        start = time.perf_counter()
        calls = 150
        for _ in range(calls):
            await mcp_once(session)
        wall = time.perf_counter() - start
    out["mcp_ms_per_call_while_profiled"] = round(1000 * wall / calls, 3)
    out["mcp_server_pyspy"] = summarize_collapsed(raw)
    out["mcp_stdio_pyspy"] = summarize_collapsed(raw_stdio)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    return asyncio.run(measure(args))


if __name__ == "__main__":
    cli("roundtrip", run, __doc__ or "")

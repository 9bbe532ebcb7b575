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
import cProfile
import os
import pstats
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import (
    PYTHON,
    SEED_100_FILES,
    BareBwrap,
    PySpy,
    bare_true,
    cli,
    make_home,
    metric,
    remove_home,
    stop_server,
    summarize_collapsed,
    summary_ms,
)
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from shellyard.config import Settings
from shellyard.control.service import ControlPlane
from shellyard.interfaces.client import AsyncClient
from shellyard.interfaces.home import read_info
from shellyard.model import RunShellRequest

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
    rounds = 60 if args.quick else 250
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
    bw = stats["bwrap"]
    metrics = [
        metric(
            "roundtrip.api.p50", "Python API run_shell(true), p50", stats["api"]["p50"], "ms",
            baseline_label="bare bwrap … true, p50", baseline_value=bw["p50"],
            target="≤ 3× bare bwrap p50", kind="ratio_max", limit=3.0,
        ),
        metric(
            "roundtrip.api.p95", "Python API run_shell(true), p95", stats["api"]["p95"], "ms",
            baseline_label="bare bwrap … true, p95", baseline_value=bw["p95"],
            target="—", kind="info",
        ),
        metric(
            "roundtrip.mcp.p50", "MCP stdio run_shell(true), p50", stats["mcp"]["p50"], "ms",
            baseline_label="bare bwrap … true, p50", baseline_value=bw["p50"],
            target="≤ 4× bare bwrap p50", kind="ratio_max", limit=4.0,
        ),
        metric(
            "roundtrip.mcp.p95", "MCP stdio run_shell(true), p95", stats["mcp"]["p95"], "ms",
            baseline_label="bare bwrap … true, p95", baseline_value=bw["p95"],
            target="—", kind="info",
        ),
        metric(
            "roundtrip.rest.p50", "REST (AsyncClient → server) run(true), p50",
            stats["rest"]["p50"], "ms",
            baseline_label="bare bwrap … true, p50", baseline_value=bw["p50"],
            target="— (for the MCP breakdown)", kind="info",
        ),
        metric(
            "roundtrip.bwrap.p50", "bare bwrap … true, p50", bw["p50"], "ms",
            baseline_label="bare true (subprocess), p50", baseline_value=stats["true"]["p50"],
            target="— (baseline)", kind="info",
        ),
    ]
    return {
        "name": "roundtrip",
        "title": "1. Round trip of a foreground run_shell(true), workspace of 100 small files",
        "command": COMMAND + (" --quick" if args.quick else ""),
        "metrics": metrics,
        "details": {"rounds": rounds, "warmup_rounds": warmup, "latency_ms": stats},
        "profiles": profiles,
    }


async def profile(
    folder: Path, plane: ControlPlane, session: ClientSession, server_pid: int
) -> dict[str, Any]:
    """Where the time of each path goes: cProfile of in-process API calls (this process), and
    py-spy of the control-plane server while MCP calls run."""
    folder.mkdir(parents=True, exist_ok=True)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(100):
        await api_once(plane)
    profiler.disable()
    stats_file = folder / "roundtrip_api.pstats"
    profiler.dump_stats(stats_file)
    out = {"api_cprofile": top_cprofile(stats_file)}
    raw = folder / "roundtrip_mcp_server.txt"
    with PySpy(server_pid, raw):
        for _ in range(150):
            await mcp_once(session)
    out["mcp_server_pyspy"] = summarize_collapsed(raw)
    return out


def top_cprofile(path: Path, top: int = 15) -> dict[str, Any]:
    stats = pstats.Stats(str(path))
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = []
    entries = stats.stats  # type: ignore[attr-defined]
    for (file, line, func), (_cc, _nc, tt, ct, _callers) in entries.items():
        rows.append((func, file, line, tt, ct))

    def short(file: str) -> str:
        for marker in ("/site-packages/", "/src/"):
            if marker in file:
                return file.split(marker, 1)[1]
        return os.path.basename(file)

    by_own = sorted(rows, key=lambda r: -r[3])[:top]
    by_cum = sorted(
        (r for r in rows if "shellyard" in r[1] or "sqlalchemy" in r[1]), key=lambda r: -r[4]
    )[:top]
    return {
        "total_s": round(total, 3),
        "own_pct": [[f"{short(f)}:{fn}", round(100 * tt / total, 1)] for fn, f, _, tt, _ in by_own],
        "cumulative_pct": [
            [f"{short(f)}:{fn}", round(100 * ct / total, 1)] for fn, f, _, _, ct in by_cum
        ],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    return asyncio.run(measure(args))


if __name__ == "__main__":
    cli("roundtrip", run, __doc__ or "")

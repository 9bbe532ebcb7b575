"""Benchmark 1: round trip of a foreground ``run_shell`` of ``true`` in a workspace of 100
small files, through the Python API (an in-process ControlPlane), REST (``AsyncClient`` to a
``shellyard serve`` process) and MCP stdio (the official ``mcp`` client spawning
``python -m shellyard mcp``, itself a client of that server), beside three baselines:

- the peer: mcp-shell-server 1.1.14 from PyPI (no sandbox, no record, no snapshot) in a venv
  this benchmark builds with uv (``common.peer_server_venv``), driven by the same client over
  stdio, running ``true`` in a folder of 100 small files;
- the minimal sandbox spawn ``bwrap --ro-bind / / --dev /dev --proc /proc --unshare-all true``;
- the product-argv spawn: bwrap with the runner's exact argv (prlimit, hidden folders,
  seccomp, status fd, sandbox uid), no control plane around it (and without the ``nsenter``
  into the workspace's network namespace that the runner puts in front, issue 17);

and a bare ``true``. All are measured interleaved (one of each per round, in a rotating
order) so the machine's noise falls on all of them alike, each call after ``THINK_S`` of idle
time, as an agent's call comes after its model's turn: back to back, what one path's server
does after its answer (the next warm sandbox's making, docs/operations.md "Warm sandboxes")
fell on the next path's call in this one process (the API's plane shares its loop with the
REST client; §55). Back-to-back load is ``bench_throughput.py``'s. Targets: MCP p50 ≤ 2.0× the peer
and ≤ 2.0× the minimal spawn; REST ≤ 1.5× and the API ≤ 1.3× the minimal spawn (lowered from
1.6× and 1.4×, docs/benchmarks.md §56).

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
    PEER_MCP_SERVER,
    PYTHON,
    SEED_100_FILES,
    CleanTable,
    PhaseTimer,
    PySpy,
    bare_true,
    child_pids_matching,
    cli,
    make_home,
    metric,
    mount_count,
    peer_server_venv,
    remove_home,
    stop_server,
    summarize_collapsed,
    summary_ms,
)
from shellyard import loops
from shellyard.config import Settings
from shellyard.contract.executions import RunShellRequest
from shellyard.control.plane import ControlPlane, build
from shellyard.home import read_info
from shellyard.sdk.client import AsyncClient

COMMAND = "python bench/bench_roundtrip.py"
#: Idle time before each timed call (not timed): an agent's think time, at its shortest.
THINK_S = 0.03


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


async def peer_once(session: ClientSession, folder: Path) -> float:
    start = time.perf_counter()
    result = await session.call_tool(
        "shell_execute", {"command": ["true"], "directory": str(folder)}
    )
    elapsed = time.perf_counter() - start
    if result.is_error:
        raise RuntimeError(f"mcp-shell-server true failed: {result.content}")
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
    peer_script = peer_server_venv()
    api_home, mcp_home, bare_home = make_home(), make_home(), make_home()
    peer_folder = bare_home / "peer-workspace"
    peer_folder.mkdir()
    for index in range(1, 101):
        (peer_folder / f"f{index}.txt").write_text(f"small file {index}\n")
    # The baselines spawn from a mount table copied before any plane exists (§77).
    clean = CleanTable(bare_home)
    plane = await build(Settings(home=api_home / "home"))
    params = StdioServerParameters(
        command=PYTHON,
        args=["-m", "shellyard", "mcp", "--home", str(mcp_home)],
        env={**os.environ, "SHELLYARD_HOME": str(mcp_home)},
    )
    peer_params = StdioServerParameters(
        command=str(peer_script), args=[], env={**os.environ, "ALLOW_COMMANDS": "true"}
    )
    samples: dict[str, list[float]] = {
        name: [] for name in ("true", "minimal", "bwrap", "api", "rest", "mcp", "peer")
    }
    profiles: dict[str, Any] = {}
    # The peer logs every call at INFO (its default): kept, but out of our output.
    peer_log = (bare_home / "peer-stderr.log").open("w")
    try:
        async with (
            stdio_client(params) as (read, write),
            ClientSession(read, write) as session,
            stdio_client(peer_params, errlog=peer_log) as (peer_read, peer_write),
            ClientSession(peer_read, peer_write) as peer,
        ):
            await session.initialize()
            await peer.initialize()
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
                "minimal": lambda: in_loop(clean.minimal),
                "bwrap": lambda: in_loop(clean.bare),
                "api": lambda: api_once(plane),
                "mcp": lambda: mcp_once(session),
                "rest": lambda: rest_once(rest),
                "peer": lambda: peer_once(peer, peer_folder),
            }
            names = list(runners)
            for _ in range(warmup):
                for name in names:
                    await asyncio.sleep(THINK_S)
                    await runners[name]()
            for index in range(rounds):
                shift = index % len(names)
                for name in names[shift:] + names[:shift]:
                    await asyncio.sleep(THINK_S)
                    samples[name].append(await runners[name]())
            if args.profile:
                profiles = await profile(args.profile, plane, session, info.pid)
            await rest.aclose()
            tables = {"baselines": clean.mounts(), "planes": mount_count()}
    finally:
        clean.close()
        peer_log.close()
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
    floor, peer_p50 = stats["minimal"]["p50"], stats["peer"]["p50"]
    minimal_label = "minimal bwrap --unshare-all true, p50"
    peer_label = "mcp-shell-server 1.1.14 (same client, stdio), p50"

    def row(
        id: str,
        label: str,
        key: str,
        base_label: str,
        base: float,
        limit: float | None,
        quantile: str = "p50",
    ) -> dict[str, Any]:
        return metric(
            id, label, stats[key][quantile], "ms", baseline_label=base_label,
            baseline_value=base, target=f"≤ {limit}× the baseline" if limit else "—",
            kind="ratio_max" if limit else "info", limit=limit,
        )  # fmt: skip

    metrics = [
        row("roundtrip.mcp.p50", "MCP stdio run_shell(true), p50", "mcp", peer_label,
            peer_p50, 2.0),
        row("roundtrip.mcp.minimal.p50", "MCP stdio run_shell(true), p50", "mcp",
            minimal_label, floor, 2.0),
        row("roundtrip.rest.p50", "REST (AsyncClient → server) run(true), p50", "rest",
            minimal_label, floor, 1.5),
        row("roundtrip.api.p50", "Python API run_shell(true), p50", "api", minimal_label,
            floor, 1.3),
        row("roundtrip.mcp.p95", "MCP stdio run_shell(true), p95", "mcp",
            "mcp-shell-server 1.1.14, p95", stats["peer"]["p95"], None, "p95"),
        row("roundtrip.api.p95", "Python API run_shell(true), p95", "api",
            "minimal bwrap, p95", stats["minimal"]["p95"], None, "p95"),
        row("roundtrip.bwrap.p50", "product-argv bwrap … true (no control plane), p50",
            "bwrap", minimal_label, floor, None),
        row("roundtrip.api.bwrap.p50", "Python API run_shell(true), p50", "api",
            "product-argv bwrap … true, p50", stats["bwrap"]["p50"], None),
        row("roundtrip.minimal.p50", "minimal bwrap --unshare-all true, p50", "minimal",
            "bare true (subprocess), p50", stats["true"]["p50"], None),
    ]  # fmt: skip
    return {
        "name": "roundtrip",
        "title": "1. Round trip of a foreground run_shell(true), workspace of 100 small files",
        "command": COMMAND + (" --quick" if args.quick else ""),
        "metrics": metrics,
        "details": {
            "peer": PEER_MCP_SERVER,
            "rounds": rounds,
            "warmup_rounds": warmup,
            "latency_ms": stats,
            "share_30ms_over_median": stalls,
            # Mount-table lines where the baselines spawn and where the planes' runners do.
            "mount_table": tables,
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
    return loops.run(measure(args))  # the loop `shellyard serve` would run on


if __name__ == "__main__":
    cli("roundtrip", run, __doc__ or "")

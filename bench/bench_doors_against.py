"""REST and MCP stdio ``run_shell(true)`` of this tree against another ``src``, interleaved.

Two homes, each with ``shellyard mcp`` (stdio, the official client) and the ``shellyard serve``
it starts, one running this tree's ``src`` and one ``--against SRC``; for REST an
``httpx.AsyncClient`` on each server, whose transport is each tree's SDK's own: this tree's
``sdk/wire.py`` transport when it has one, httpx's plain one for the other side when its SDK
has none (the other tree's client code cannot be imported beside this one). Batches of BATCH
REST calls then BATCH MCP calls alternate between the sides (which goes first alternates too),
so the load of a shared machine falls on both alike. Per side: p50 wall of each path, the
server's CPU per REST and per MCP call, ``shellyard mcp``'s own CPU per call (utime + stime
from /proc; jiffies, so enough calls are needed).

    PYTHONPATH=src:bench .venv/bin/python bench/bench_doors_against.py --against SRC [--batches N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from common import PYTHON, make_home, remove_home, stop_server, write_result
from shellyard.home import read_info

BATCH = 10


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mcp_pid(home: Path) -> int:
    found = subprocess.run(
        ["pgrep", "-f", f"shellyard mcp --home {home}"], capture_output=True, text=True
    ).stdout.split()
    return int(found[0])


def transport(src: Path) -> httpx.AsyncHTTPTransport:
    """This tree's SDK transport for this tree; for the other, httpx's own unless that tree's
    SDK has ``wire.py`` (then the same one-write transport: it is what its SDK would use)."""
    this = Path(__file__).resolve().parent.parent / "src"
    if src.resolve() == this.resolve() or (src / "shellyard" / "sdk" / "wire.py").exists():
        from shellyard.sdk import wire

        return wire.async_transport()
    return httpx.AsyncHTTPTransport()


async def measure(trees: dict[str, Path], batches: int) -> dict[str, Any]:
    homes = {name: make_home() for name in trees}
    sides: dict[str, dict[str, Any]] = {}
    try:
        async with AsyncExitStack() as stack:
            for name, src in trees.items():
                env = {**os.environ, "PYTHONPATH": str(src), "SHELLYARD_HOME": str(homes[name])}
                params = StdioServerParameters(
                    command=PYTHON, args=["-m", "shellyard", "mcp", "--home", str(homes[name])],
                    env=env,
                )  # fmt: skip
                read, write = await stack.enter_async_context(stdio_client(params))
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                await session.call_tool("run_shell", {"command": "true"})
                info = read_info(homes[name])
                assert info is not None
                http = await stack.enter_async_context(
                    httpx.AsyncClient(
                        base_url=info.url, headers={"Authorization": f"Bearer {info.token}"},
                        transport=transport(src), timeout=60,
                    )
                )  # fmt: skip
                sides[name] = {
                    "session": session, "http": http, "server": info.pid,
                    "mcp": mcp_pid(homes[name]), "rest_s": [], "mcp_s": [],
                    "rest_server_s": 0.0, "mcp_server_s": 0.0, "mcp_own_s": 0.0, "calls": 0,
                }  # fmt: skip

            async def rest(side: dict[str, Any]) -> float:
                began = time.perf_counter()
                answer = await side["http"].post("/v1/executions", json={"command": "true"})
                took = time.perf_counter() - began
                if answer.json().get("state") != "completed":
                    raise RuntimeError(f"REST run of true: {answer.text}")
                return took

            async def mcp(side: dict[str, Any]) -> float:
                began = time.perf_counter()
                result = await side["session"].call_tool("run_shell", {"command": "true"})
                took = time.perf_counter() - began
                if (result.structured_content or {}).get("state") != "completed":
                    raise RuntimeError(f"MCP run of true: {result.content}")
                return took

            for side in sides.values():
                for _ in range(20):
                    await rest(side)
                    await mcp(side)
            names = list(sides)
            for batch in range(batches):
                for name in names if batch % 2 == 0 else names[::-1]:
                    side = sides[name]
                    server0 = cpu_s(side["server"])
                    side["rest_s"] += [await rest(side) for _ in range(BATCH)]
                    server1, own1 = cpu_s(side["server"]), cpu_s(side["mcp"])
                    side["mcp_s"] += [await mcp(side) for _ in range(BATCH)]
                    server2, own2 = cpu_s(side["server"]), cpu_s(side["mcp"])
                    side["rest_server_s"] += server1 - server0
                    side["mcp_server_s"] += server2 - server1
                    side["mcp_own_s"] += own2 - own1
                    side["calls"] += BATCH
    finally:
        for home in homes.values():
            stop_server(home)
            remove_home(home)
    return {
        name: {
            "calls": side["calls"],
            "rest_p50_ms": 1000 * statistics.median(side["rest_s"]),
            "mcp_p50_ms": 1000 * statistics.median(side["mcp_s"]),
            "server_cpu_per_rest_ms": 1000 * side["rest_server_s"] / side["calls"],
            "server_cpu_per_mcp_ms": 1000 * side["mcp_server_s"] / side["calls"],
            "mcp_process_cpu_per_call_ms": 1000 * side["mcp_own_s"] / side["calls"],
        }
        for name, side in sides.items()
    } | {"load_average": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", type=Path, required=True, help="the other tree's src")
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    this = Path(__file__).resolve().parent.parent / "src"
    result = asyncio.run(measure({"this": this, "against": args.against}, args.batches))
    write_result(result, args.out)


if __name__ == "__main__":
    main()

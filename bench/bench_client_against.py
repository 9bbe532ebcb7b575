"""The SDK's own cost per REST call: this tree's ``AsyncClient`` against another tree's, on one
server, interleaved.

One ``shellyard serve`` (this tree) for a fresh home. Each batch starts a client process per
side (``PYTHONPATH`` this tree's ``src`` or ``--against SRC``), which warms up, then makes
CALLS calls of one kind (``run(command="true")`` or ``GET /health``) and reports its own CPU
per call (``time.process_time``: its threads, not the server's) and the p50 wall of a call;
which side goes first alternates, so the load of a shared machine falls on both alike. Also
the server's CPU per call (/proc, jiffies) for each side's batches.

    PYTHONPATH=src:bench .venv/bin/python bench/bench_client_against.py --against SRC \
        [--batches N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
from pathlib import Path
from typing import Any

from common import PYTHON, make_home, remove_home, stop_server, write_result
from shellyard.home import read_info
from shellyard.sdk.client import AsyncClient

CALLS = {"run": 40, "health": 200}

#: The client process: argv url, token, kind, calls; prints its JSON result.
DRIVER = """
import asyncio, json, statistics, sys, time
from shellyard.sdk.client import AsyncClient

async def main():
    url, token, kind, calls = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    client = AsyncClient(url, token)
    call = (lambda: client.run(command="true")) if kind == "run" else (
        lambda: client._http.get("/health"))
    for _ in range(10):
        await call()
    walls = []
    began = time.process_time()
    for _ in range(calls):
        start = time.perf_counter()
        await call()
        walls.append(time.perf_counter() - start)
    cpu = (time.process_time() - began) / calls
    await client.aclose()
    print(json.dumps({"cpu_ms": cpu * 1000, "p50_ms": statistics.median(walls) * 1000}))

asyncio.run(main())
"""


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(trees: dict[str, Path], batches: int) -> dict[str, Any]:
    home = make_home()
    results: dict[str, dict[str, list[dict[str, float]]]] = {
        name: {kind: [] for kind in CALLS} for name in trees
    }
    try:

        async def start() -> None:
            client = AsyncClient.for_home(home)  # starts the server
            await client.run(command="true")
            await client.aclose()

        asyncio.run(start())
        info = read_info(home)
        assert info is not None
        names = list(trees)
        for batch in range(batches):
            for kind, calls in CALLS.items():
                for name in names if batch % 2 == 0 else names[::-1]:
                    env = {**os.environ, "PYTHONPATH": str(trees[name])}
                    server0 = cpu_s(info.pid)
                    done = subprocess.run(
                        [PYTHON, "-c", DRIVER, info.url, info.token, kind, str(calls)],
                        env=env, capture_output=True, text=True, check=True,
                    )  # fmt: skip
                    row = json.loads(done.stdout)
                    # the driver's start-up and warm-up calls are the server's too: a share
                    row["server_cpu_ms"] = (cpu_s(info.pid) - server0) * 1000 / (calls + 10)
                    results[name][kind].append(row)
    finally:
        stop_server(home)
        remove_home(home)
    summary: dict[str, Any] = {}
    for name, kinds in results.items():
        for kind, rows in kinds.items():
            summary[f"{name}.{kind}"] = {
                "batches": len(rows),
                "client_cpu_ms": round(statistics.mean(r["cpu_ms"] for r in rows), 3),
                "p50_ms": round(statistics.median(r["p50_ms"] for r in rows), 3),
                "server_cpu_ms": round(statistics.mean(r["server_cpu_ms"] for r in rows), 3),
            }
    return summary | {"load_average": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", type=Path, required=True, help="the other tree's src")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    this = Path(__file__).resolve().parent.parent / "src"
    result = measure({"this": this, "against": args.against}, args.batches)
    write_result(result, args.out)


if __name__ == "__main__":
    main()

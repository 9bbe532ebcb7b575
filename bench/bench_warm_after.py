"""When the next warm sandbox is made: at the command's start (``SHELLYARD_WARM_AFTER_MS=0``,
the old way) or once it has run 20 ms or ended (the default), for a foreground
``run_shell(true)`` of the in-process API on SQLite + the local runner (docs/benchmarks.md
§55). One plane; the pool's delay is switched call by call in an ABBA order, so both sides
see the same load and the same workspace; GAP seconds pass before each call (a caller that
thinks between commands: every model does), so each call finds a warm sandbox ready.

    PYTHONPATH=src:bench .venv/bin/python bench/bench_warm_after.py [--calls N] [--gap S]
        [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

from common import SEED_100_FILES, make_home, remove_home, write_result
from shellyard.config import Settings
from shellyard.contract.executions import RunShellRequest
from shellyard.control.plane import build

SIDES = {"at the start (0 ms)": 0.0, "after 20 ms or at the end": 0.02}


async def measure(calls: int, gap_s: float) -> dict[str, Any]:
    home = make_home()
    plane = await build(Settings(home=home / "home"))
    try:
        pool = plane.runners.get("local")._runs.warm  # type: ignore[attr-defined]
        request = RunShellRequest(command="true")
        await plane.executions.run_shell(RunShellRequest(command=SEED_100_FILES))
        for _ in range(20):
            await plane.executions.run_shell(request)
        names = list(SIDES)
        samples: dict[str, list[float]] = {name: [] for name in names}
        taken_before = pool.stats["taken"]
        for index in range(2 * calls):
            name = names[(index // 2 + index) % 2]  # A B B A ...
            pool.after_s = SIDES[name]
            await asyncio.sleep(gap_s)
            began = time.perf_counter()
            result = await plane.executions.run_shell(request)
            samples[name].append((time.perf_counter() - began) * 1000)
            if result.exit_code != 0:
                raise RuntimeError(f"true ended {result.state}: {result.error}")
        taken = pool.stats["taken"] - taken_before
    finally:
        await plane.aclose()
        remove_home(home)
    return {
        "calls_per_side": calls,
        "gap_s": gap_s,
        "warm_taken": taken,
        "load_average": os.getloadavg(),
        "sides": {
            name: {
                "p50_ms": round(statistics.median(values), 3),
                "mean_ms": round(statistics.mean(values), 3),
                "p90_ms": round(statistics.quantiles(values, n=10)[-1], 3),
            }
            for name, values in samples.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--gap", type=float, default=0.02)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = asyncio.run(measure(args.calls, args.gap))
    write_result(result, args.out)


if __name__ == "__main__":
    main()

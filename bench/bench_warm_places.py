"""The warm pool's places against 16 agents, alternated inside one plane (docs/benchmarks.md
§65): windows of ``--window`` seconds in ABBA order, the pool's bound switched between them
(``SHELLYARD_WARM_SANDBOXES``'s value, set on the live pool), so the machine's drift falls on
both sides of every pair. Per side: completed executions per second (``bench_throughput``'s
loop), the event loop thread's time on a CPU and waiting for one (``/proc`` schedstat), the
process's CPU and its reaped children's (the sandboxes) per execution, and the share of
starts that found no warm sandbox (cold). The load average is printed with the result.

    .venv/bin/python bench/bench_warm_places.py [--places 8 16] [--rounds 10] [--window 2.5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import threading
import time
from typing import Any

from bench_throughput import AGENTS, product_rate, warm_pool
from common import make_home, remove_home
from shellyard import loops
from shellyard.config import Settings
from shellyard.contract.executions import RunShellRequest
from shellyard.control.plane import build


def clocks(tid: int) -> list[float]:
    """The thread's on-CPU and run-queue seconds, the process's and its children's CPU."""
    with open(f"/proc/self/task/{tid}/schedstat") as file:
        on_cpu, waiting = (int(x) / 1e9 for x in file.read().split()[:2])
    times = os.times()
    return [
        on_cpu,
        waiting,
        times.user + times.system,
        times.children_user + times.children_system,
        time.perf_counter(),
    ]


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    first, second = args.places
    home = make_home()
    plane = await build(Settings(home=home / "home"))
    pool = warm_pool(plane)
    rows: dict[int, list[dict[str, float]]] = {first: [], second: []}
    loop_thread = threading.get_native_id()
    try:
        session, _main = await plane.store.default_owner()
        agents = [str((await plane.store.create_agent(str(session.id))).id) for _ in range(AGENTS)]
        await asyncio.gather(
            *(plane.executions.run_shell(RunShellRequest(command="true"), a) for a in agents)
        )
        await product_rate(plane, agents, 0.5, ramp_s=0.5)
        order: list[int] = []
        for number in range(args.rounds):
            order += [first, second] if number % 2 == 0 else [second, first]
        for places in order:
            pool.count = places
            for workspace_id in list(pool.waiting())[places:]:  # over the new bound: gone
                pool.discard_workspace(workspace_id, "bench")
            await product_rate(plane, agents, 0.3, ramp_s=0.3)  # the pool settles
            taken_before, before = pool.stats["taken"], clocks(loop_thread)
            done, _other, _wall, _lat = await product_rate(plane, agents, args.window, ramp_s=0)
            after, taken = clocks(loop_thread), pool.stats["taken"] - taken_before
            spent = [b - a for a, b in zip(before, after, strict=True)]
            on_cpu, waiting, cpu, children, wall = spent
            count = max(1, done)
            rows[places].append(
                {
                    "rate": done / wall,
                    "loop_cpu_ms": 1000 * on_cpu / count,
                    "loop_runq_ms": 1000 * waiting / count,
                    "process_cpu_ms": 1000 * cpu / count,
                    "children_cpu_ms": 1000 * children / count,
                    "cold_share": max(0.0, 1 - taken / count),
                }
            )
    finally:
        await plane.aclose()
        remove_home(home)
    result: dict[str, Any] = {"agents": AGENTS, "window_s": args.window, "rounds": args.rounds}
    for places, measured in rows.items():
        side = {k: round(statistics.mean(r[k] for r in measured), 3) for k in measured[0]}
        side["rate_sd"] = round(statistics.stdev(r["rate"] for r in measured), 2)
        side["rates"] = [round(r["rate"], 1) for r in measured]
        result[f"places_{places}"] = side
    pairs = [b["rate"] / a["rate"] for a, b in zip(rows[first], rows[second], strict=True)]
    result[f"rate_{second}_over_{first}"] = {
        "mean": round(statistics.mean(pairs), 3),
        "ahead": sum(p > 1 for p in pairs),
        "pairs": len(pairs),
    }
    result["load"] = os.getloadavg()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--places", type=int, nargs=2, default=[8, 16])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--window", type=float, default=2.5)
    args = parser.parse_args()
    print("load before:", os.getloadavg(), flush=True)
    print(json.dumps(loops.run(measure(args)), indent=1))


if __name__ == "__main__":
    main()

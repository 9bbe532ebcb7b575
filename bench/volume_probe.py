"""CPU per execution by where the home is (docs/benchmarks.md §76): 16 agents of one session
each run ``run_shell(true)`` RUNS times on an in-process ControlPlane whose home is made in
``--dir``; prints the rate and, per execution, this process's user and system CPU and the
whole machine's (``/proc/stat``: user, system, idle). Run it under
``perf record -a -g`` to see where the kernel's share goes, and twice in a row to see a
journal-less ext4 volume slowed by the first run's clean-up.

    PYTHONPATH=src:bench .venv/bin/python bench/volume_probe.py [--runs N] [--dir D]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

from common import make_home, remove_home
from shellyard import loops
from shellyard.config import Settings
from shellyard.contract.executions import RunShellRequest
from shellyard.control.plane import build
from shellyard.runner import volume

AGENTS = 16
#: /proc/stat's first line: user nice system idle iowait irq softirq steal (clock ticks)
USER, SYSTEM, IDLE = 0, 2, 3


def machine_ticks() -> list[int]:
    with open("/proc/stat") as handle:
        return [int(v) for v in handle.readline().split()[1:]]


async def measure(runs: int, parent: Path | None) -> str:
    home = make_home(parent=parent)
    plane = await build(Settings(home=home / "home"))
    try:
        session, _main = await plane.store.default_owner()
        agents = [str((await plane.store.create_agent(str(session.id))).id) for _ in range(AGENTS)]
        request = RunShellRequest(command="true")
        await asyncio.gather(*(plane.executions.run_shell(request, a) for a in agents))

        async def loop(agent_id: str) -> None:
            for _ in range(runs):
                await plane.executions.run_shell(request, agent_id)

        ticks, own, start = machine_ticks(), os.times(), time.perf_counter()
        await asyncio.gather(*(loop(a) for a in agents))
        wall = time.perf_counter() - start
        ticks = [b - a for a, b in zip(ticks, machine_ticks(), strict=False)]
        after = os.times()
    finally:
        await plane.aclose()
        remove_home(home)
    n = AGENTS * runs
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    return (
        f"{volume.of(home.parent)}\n{n / wall:.1f} executions/s; per execution: this process "
        f"user {(after.user - own.user) / n * 1000:.2f} ms, system "
        f"{(after.system - own.system) / n * 1000:.2f} ms; the machine user "
        f"{ticks[USER] * tick_ms / n:.2f} ms, system {ticks[SYSTEM] * tick_ms / n:.2f} ms, "
        f"idle {ticks[IDLE] * tick_ms / n:.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=60, help="runs per agent (default 60)")
    parser.add_argument("--dir", type=Path, help="where the home is made (default /tmp)")
    args = parser.parse_args()
    print(loops.run(measure(args.runs, args.dir)))


if __name__ == "__main__":
    main()

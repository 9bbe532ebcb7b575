"""Where the machine's CPU goes per execution, by program, under 16 agents and for the bare
bwrap baseline: ``perf record -p`` of this process samples it and everything it spawns
(bwrap, the launcher, the warm waiter, the shell, the command), so the numbers are this
bench's own whatever else the machine runs (other engineers' tests included), unlike
``/proc/stat`` or ``getrusage`` (the sandboxes' children are not all reaped by us: rusage
showed 4 ms a spawn where perf samples 15-21 ms of bwrap, docs/benchmarks.md §73).

Phases, repeated ``--rounds`` times in this order: the 16 agents of ``bench_throughput.py``
(one in-process plane, the local runner), the bare bwrap spawn of the same module (2 in
parallel) right after them while the plane still holds its workspaces' mounts (overlays and
network namespaces linger a few seconds), and the bare spawn again once those are gone.
Each phase reports CPU ms per completed execution (or spawn) by program, and the host's
mount count at its start (every bwrap copies and reads the whole table, §22).

    PYTHONPATH=src:bench .venv/bin/python bench/bench_cpu_tree.py [--rounds 3] [--out F]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench_throughput import AGENTS, product_rate
from common import BareBwrap, make_home, mount_count, remove_home, write_result
from shellyard import loops
from shellyard.config import Settings
from shellyard.contract.executions import RunShellRequest
from shellyard.control.plane import build

FREQUENCY = 999  # samples per second of CPU: one sample ≈ 1.001 ms


class Sampled:
    """``perf record`` of this process tree for the ``with`` block."""

    def __init__(self, folder: Path, name: str) -> None:
        self.data = folder / f"{name}.data"

    def __enter__(self) -> Sampled:
        self.perf = subprocess.Popen(
            ["perf", "record", "-q", "-F", str(FREQUENCY), "-p", str(os.getpid()),
             "-o", str(self.data)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(0.3)  # perf attaches
        return self

    def __exit__(self, *_exc: object) -> None:
        self.perf.send_signal(2)
        self.perf.wait(timeout=60)

    def by_program(self) -> collections.Counter[str]:
        text = subprocess.run(
            ["perf", "script", "-i", str(self.data), "-F", "comm"],
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
        return collections.Counter(line.strip() for line in text.splitlines() if line.strip())


class Spawners:
    """Two threads spawning bare bwrap back to back while ``running``, made before perf
    attaches: ``perf record -p`` follows the children of the threads it attached to, not
    threads made after (a ``bare_rate`` of new threads sampled nothing)."""

    def __init__(self, bare: BareBwrap, parallel: int = 2) -> None:
        self.bare = bare
        self.go = [threading.Event() for _ in range(parallel)]
        self.stop = threading.Event()
        self.deadline = 0.0
        self.count = [0] * parallel
        self.done = threading.Barrier(parallel + 1)
        self.threads = [
            threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(parallel)
        ]
        for thread in self.threads:
            thread.start()

    def _loop(self, index: int) -> None:
        while True:
            self.go[index].wait()
            self.go[index].clear()
            if self.stop.is_set():
                return
            while time.perf_counter() < self.deadline:
                self.bare.run(tag=f"t{index}")
                self.count[index] += 1
            self.done.wait()

    def run(self, seconds: float) -> tuple[int, float]:
        self.count = [0] * len(self.count)
        start = time.perf_counter()
        self.deadline = start + seconds
        for event in self.go:
            event.set()
        self.done.wait()
        return sum(self.count), time.perf_counter() - start

    def close(self) -> None:
        self.stop.set()
        for event in self.go:
            event.set()


def per_execution(counts: collections.Counter[str], done: int) -> dict[str, float]:
    """ms of CPU per execution by program (the plane's threads are ``python``)."""
    total = sum(counts.values())
    rows = {name: round(n * 1000 / FREQUENCY / done, 2) for name, n in counts.most_common(8)}
    rows["all"] = round(total * 1000 / FREQUENCY / done, 2)
    return rows


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    home, bare_home = make_home(), make_home()
    folder = Path(tempfile.mkdtemp(prefix="cpu-tree-"))
    plane = await build(Settings(home=home / "home"))
    bare = BareBwrap(bare_home)
    spawners = Spawners(bare)
    base_mounts = mount_count()
    rounds: list[dict[str, Any]] = []
    try:
        session, _main = await plane.store.default_owner()
        agents = [str((await plane.store.create_agent(str(session.id))).id) for _ in range(AGENTS)]
        request = RunShellRequest(command="true")
        await asyncio.gather(*(plane.executions.run_shell(request, a) for a in agents))
        await product_rate(plane, agents, 0.5, ramp_s=0.5)
        for index in range(args.rounds):
            row: dict[str, Any] = {"load": os.getloadavg()[0]}
            row["product_mounts"] = mount_count()
            with Sampled(folder, f"product{index}") as sampled:
                done, _other, seconds, _lat = await product_rate(
                    plane, agents, args.window, ramp_s=0.0
                )
            row["product"] = {"rate": round(done / seconds, 2),
                              "ms": per_execution(sampled.by_program(), done)}  # fmt: skip
            row["bare_held_mounts"] = mount_count()
            with Sampled(folder, f"held{index}") as sampled:
                spawns, seconds = spawners.run(args.window)
            row["bare_held"] = {"rate": round(spawns / seconds, 2),
                                "ms": per_execution(sampled.by_program(), spawns)}  # fmt: skip
            deadline = time.monotonic() + 20
            while mount_count() > base_mounts and time.monotonic() < deadline:
                await asyncio.sleep(0.5)  # the plane lets its lingering mounts go
            row["bare_mounts"] = mount_count()
            with Sampled(folder, f"bare{index}") as sampled:
                spawns, seconds = spawners.run(args.window)
            row["bare"] = {"rate": round(spawns / seconds, 2),
                           "ms": per_execution(sampled.by_program(), spawns)}  # fmt: skip
            print(row, flush=True)
            rounds.append(row)
            await product_rate(plane, agents, 0.5, ramp_s=0.5)  # workspaces held again
    finally:
        spawners.close()
        await plane.aclose()
        remove_home(home)
        remove_home(bare_home)
        remove_home(folder)
    return {"name": "cpu_tree", "base_mounts": base_mounts, "rounds": rounds,
            "command": "python bench/bench_cpu_tree.py"}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=4.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    write_result(loops.run(measure(args)), args.out)


if __name__ == "__main__":
    main()

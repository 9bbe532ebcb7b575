"""Benchmark: how long a process's move into its cgroups takes (R2 tenants; docs/limits.md
"Moving into a group under load"), as the sandbox's launcher does it: a forked child writes
itself into the ``cgroup.procs`` of its own memory, pids and cpuacct groups and its workspace's
cpu group (v1). Fresh groups each round, made and removed by the parent. With ``--load N``,
N shell loops fork ``/bin/true`` meanwhile (every fork takes the host's threadgroup lock for
reading unless favordynmods is on). Root and cgroup v1 only.

    sudo .venv/bin/python bench/bench_group_join.py [--rounds 300] [--load 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

from shellyard.runner.limits import host_groups


def _schedstat() -> tuple[int, int]:
    """This thread's CPU time and run-queue wait so far, ns: the clock for the CPU (the
    schedstat's own CPU field lags by the current slice), /proc/thread-self/schedstat for the
    wait (updated each time the thread gets a CPU)."""
    queued = int(Path("/proc/thread-self/schedstat").read_text().split()[1])
    return time.thread_time_ns(), queued


def join_times(rounds: int) -> list[tuple[float, float]]:
    """(wall, blocked) of each join, ms; blocked is the wall less the CPU time and the time
    spent waiting for a CPU: what the writes slept on (a lock, a grace period)."""
    own = host_groups.own_groups()
    roots = {name: Path(f"/sys/fs/cgroup/{name}{own[name]}") / "shellyard-bench-join"
             for name in ("memory", "pids", "cpuacct", "cpu")}  # fmt: skip
    for folder in roots.values():
        folder.mkdir(exist_ok=True)
    (roots["cpu"] / "ws").mkdir(exist_ok=True)
    walls: list[tuple[float, float]] = []
    try:
        for i in range(rounds):
            targets = [roots[name] / f"e{i}" for name in ("memory", "pids", "cpuacct")]
            for folder in targets:
                folder.mkdir()
            targets.append(roots["cpu"] / "ws")
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the launcher's part: join, report the wall, exit
                os.close(read)
                cpu0, queued0 = _schedstat()
                start = time.perf_counter_ns()
                for folder in targets:
                    with open(folder / "cgroup.procs", "w") as procs:
                        procs.write("0")
                wall = time.perf_counter_ns() - start
                cpu1, queued1 = _schedstat()
                blocked = max(0, wall - (cpu1 - cpu0) - (queued1 - queued0))
                os.write(write, f"{wall} {blocked}".encode())
                os._exit(0)
            os.close(write)
            wall_ns, blocked_ns = os.read(read, 64).split()
            walls.append((int(wall_ns) / 1e6, int(blocked_ns) / 1e6))
            os.close(read)
            os.waitpid(pid, 0)
            for folder in targets[:3]:
                folder.rmdir()
    finally:
        for name in ("memory", "pids", "cpuacct"):
            for left in roots[name].glob("e*"):
                left.rmdir()
        (roots["cpu"] / "ws").rmdir()
        for folder in roots.values():
            folder.rmdir()
    return walls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--load", type=int, default=0)
    args = parser.parse_args()
    loops = [subprocess.Popen(["sh", "-c", "while :; do /bin/true; done"])
             for _ in range(args.load)]  # fmt: skip
    try:
        time.sleep(1 if loops else 0)
        times = join_times(args.rounds)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    print(
        f"join of 4 groups, {args.rounds} rounds, {args.load} fork loops, load "
        f"{os.getloadavg()[0]:.1f}: {_spread('wall', [w for w, _ in times])}; "
        f"{_spread('blocked', [b for _, b in times])}"
    )


def _spread(label: str, values: list[float]) -> str:
    values = sorted(values)
    return (
        f"{label} p50 {statistics.median(values):.3f} ms, p90 "
        f"{values[int(len(values) * 0.9)]:.3f} ms, max {values[-1]:.3f} ms"
    )


if __name__ == "__main__":
    main()

"""Benchmark: an execution's cgroups used again against fresh ones each time (R2; docs/limits.md
"Groups used again"), v1 as on these machines.

Per execution, as the runner does it: take the workspace's waiting group (or make one), the
sandbox's launcher joins it and runs ``/bin/true``, then ``finish`` reads its use and hands it
to the removal thread, which either puts it back with counters reset (``reuse``) or removes it
and makes a fresh one ahead (``fresh``, the behaviour before). Batches of each alternate in one
process. Measured per execution: this process's CPU (all threads: the removal thread's
``mkdir``/``rmdir``/resets included), the launcher's CPU (children), and the CPU of the
kernel's own threads (kworker, rcu, ksoftirqd: a removed memory group's offlining and freeing
run there, seen by no process). The kernel threads' CPU includes the rest of the host's:
compare it between batches, not absolutely. Root and cgroup v1 only.

    sudo .venv/bin/python bench/bench_group_reuse.py [--batches 10] [--per 40]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import time
from pathlib import Path

from common import make_home, remove_home
from shellyard.runner.limits import cgroups
from shellyard.runner.sandbox import launch

KERNEL_THREADS = ("kworker", "rcu", "ksoftirqd")


def kernel_threads_cpu() -> float:
    """CPU seconds so far of the kernel's worker threads (children of kthreadd, pid 2)."""
    total = 0
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        if fields[1] == "2" and name.startswith(KERNEL_THREADS):  # ppid kthreadd
            total += int(fields[11]) + int(fields[12])
    return total / tick


def children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # µs, not os.times' clock ticks
    return usage.ru_utime + usage.ru_stime


def batch(tree: cgroups.CgroupTree, launcher: Path, per: int, tag: str) -> dict[str, float]:
    k0, t0, c0, w0 = kernel_threads_cpu(), time.process_time(), children(), time.perf_counter()
    for i in range(per):
        name = tree.ready.take_ready("ws")
        if name is None:
            name = f"{tag}-{i}"
            tree.make("ws", name)
        joins = tree.plan("ws", name)
        argv = launch.prefix(launcher, network=None, ids=(62999, 62999), limits=(), cgroups=joins)
        subprocess.run([*argv, "/bin/true"], check=True)
        tree.finish("ws", name, ahead=True)
        tree.drain()  # one execution's groups handled before the next (as between runs)
    return {
        "runner_ms": 1000 * (time.process_time() - t0) / per,
        "launcher_ms": 1000 * (children() - c0) / per,
        "kernel_threads_ms": 1000 * (kernel_threads_cpu() - k0) / per,
        "wall_ms": 1000 * (time.perf_counter() - w0) / per,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--per", type=int, default=40)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    tree = cgroups.CgroupTree.probe(
        f"shellyard-bench-reuse-{os.getpid()}", cgroups.TenantLimits(256 << 20, 64), "v1"
    )
    if tree is None:
        raise SystemExit("needs root and writable cgroup v1 memory and pids")
    home = make_home()
    launcher = launch.build(home / "bin")
    results: dict[str, list[dict[str, float]]] = {"fresh": [], "reuse": []}
    try:
        for b in range(args.batches):
            for mode in ("fresh", "reuse") if b % 2 == 0 else ("reuse", "fresh"):
                tree.reuse = mode == "reuse"
                results[mode].append(batch(tree, launcher, args.per, f"{mode}{b}"))
    finally:
        tree.close(set())
        remove_home(home)
    summary = {
        mode: {key: round(statistics.median(r[key] for r in runs), 3) for key in runs[0]}
        for mode, runs in results.items()
    }
    ratios = {
        key: round(summary["reuse"][key] / summary["fresh"][key], 3)
        for key in summary["fresh"]
        if summary["fresh"][key]
    }
    document = {
        "load": os.getloadavg(),
        "median_per_execution": summary,
        "reuse_over_fresh": ratios,
    }
    print(json.dumps(document, indent=1))
    if args.out:
        args.out.write_text(json.dumps({**document, "batches": results}, indent=1))


if __name__ == "__main__":
    main()

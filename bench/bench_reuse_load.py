"""An ended execution's cgroups used again under the 16-agent load, by the bound on what may
stay charged to them (recycle.py ``LEFTOVER_BYTES``), and the throughput beside the bare bwrap
rate, all in one plane and one run (docs/benchmarks.md §69).

Per round: half the bare bwrap phases (sequential, then 2 in parallel), a window of 16 agents
per side (``--sides``: ``LEFTOVER_BYTES`` in MiB and ``ready_groups.READY_PER_WORKSPACE``, module
attributes read at each decision, set in this process only; the sides' order reversed every
other round), then the other half of the bare phases in the reverse order. Per window:
completed executions per second (``bench_throughput``'s loop), the spawns that took a group
used again, one made ahead, or none (made their own), every recycle decision with its reason
(the INFO lines recycle.py logs) and what stayed charged (``memory.usage_in_bytes`` read just
before the decision), the loop thread's, the process's and the removal thread's CPU per
execution. The load average is recorded before and after every round.

    PYTHONPATH=src:bench .venv/bin/python bench/bench_reuse_load.py \
        [--sides 1:1 2:1 2:2] [--rounds 6] [--window 4] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import logging
import os
import re
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench_group_reuse import kernel_threads_cpu
from bench_throughput import AGENTS, bare_rate, product_rate, warm_pool
from bench_warm_places import clocks
from common import BareBwrap, make_home, quantile, remove_home, write_result
from shellyard import loops
from shellyard.config import Settings
from shellyard.contract.executions import RunShellRequest
from shellyard.control.plane import ControlPlane, build
from shellyard.runner.limits import cgroups, ready_groups, recycle

MIB = 1 << 20


class Counts(logging.Handler):
    """What the groups did in a window: spawns by the group they got, recycle decisions by
    outcome and reason, the bytes left charged at each decision."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.clear()

    def clear(self) -> None:
        self.spawns: collections.Counter[str] = collections.Counter()
        self.reasons: collections.Counter[str] = collections.Counter()
        self.resets: collections.Counter[bool] = collections.Counter()
        self.leftover: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "again" in message:  # "not using <folder> again: <reason>"
            reason = message.split("again: ", 1)[-1]
            self.reasons[re.sub(r"^\d+ bytes", "N bytes", reason)] += 1

    def summary(self) -> dict[str, Any]:
        spawns = sum(self.spawns.values())
        left = sorted(self.leftover)
        return {
            "spawns": dict(self.spawns),
            "reused_share_of_spawns": round(self.spawns["reused"] / max(1, spawns), 3),
            "resets": {"clean": self.resets[True], "turned_away": self.resets[False]},
            "reasons": dict(self.reasons),
            "leftover_mib": {
                "n": len(left),
                "p10": round(quantile(left, 0.1) / MIB, 3),
                "p50": round(quantile(left, 0.5) / MIB, 3),
                "p90": round(quantile(left, 0.9) / MIB, 3),
                "max": round(left[-1] / MIB, 3) if left else None,
                "over_1mib": sum(x > MIB for x in left),
                "over_2mib": sum(x > 2 * MIB for x in left),
            },
        }


def instrument(tree: cgroups.CgroupTree, counts: Counts) -> None:
    """Count in this process only: the pool's ``take_ready`` and recycle's v1 decision."""
    take = tree.ready.take_ready

    used: set[str] = set()  # a group made ahead is "ahead" at its first take only

    def take_ready(workspace_id: str) -> str | None:
        name = take(workspace_id)
        fresh = name is not None and name.startswith(ready_groups.READY_PREFIX) and name not in used
        kind = "none" if name is None else "ahead" if fresh else "reused"
        if name is not None:
            used.add(name)
        counts.spawns[kind] += 1
        if name is None:  # which spawn found none: a warm sandbox's making or a cold start
            counts.reasons["spawn found none: " + sys._getframe(1).f_code.co_name] += 1
        return name

    tree.ready.take_ready = take_ready  # type: ignore[method-assign]
    remove = tree.remove

    def remove_(workspace_id: str, execution_id: str, *, ahead: bool = False) -> None:
        # An end's group not pooled at once: ``remove`` either queues its reset (a slot
        # free) or removes it because as many groups wait already (not logged by the product).
        if ahead and tree.ready.full(workspace_id):
            counts.reasons["removed at its end: a group waits already"] += 1
        remove(workspace_id, execution_id, ahead=ahead)

    tree.remove = remove_  # type: ignore[method-assign]
    decide = recycle.v1_reset

    def v1_reset(memory: Path, pids: Path, accounting: Path | None) -> bool:
        raw = (memory / "memory.usage_in_bytes").read_text().strip()
        counts.leftover.append(int(raw))
        clean = decide(memory, pids, accounting)
        counts.resets[clean] += 1
        return clean

    recycle.v1_reset = v1_reset  # type: ignore[assignment]
    logging.getLogger(recycle.__name__).addHandler(counts)
    logging.getLogger(recycle.__name__).setLevel(logging.INFO)
    logging.getLogger(cgroups.__name__).addHandler(counts)
    logging.getLogger(cgroups.__name__).setLevel(logging.INFO)


def the_tree(plane: ControlPlane) -> cgroups.CgroupTree:
    runner = plane.runners.get("local")
    tree = getattr(getattr(runner, "_sandboxes", None), "cgroups", None)
    if not isinstance(tree, cgroups.CgroupTree) or tree.mechanism != "v1":
        raise SystemExit("needs the local runner's tenants on cgroup v1 (root)")
    return tree


def removal_thread_cpu() -> float:
    """CPU seconds so far of the cgroups' removal thread (``cgroup-remove``), 0 if none."""
    for thread in threading.enumerate():
        if thread.name == "cgroup-remove" and thread.native_id is not None:
            with contextlib.suppress(OSError):
                raw = Path(f"/proc/self/task/{thread.native_id}/schedstat").read_text()
                return int(raw.split()[0]) / 1e9
    return 0.0


async def window(
    plane: ControlPlane, agents: list[str], counts: Counts, seconds: float
) -> dict[str, Any]:
    thread = threading.get_native_id()
    await product_rate(plane, agents, 0.4, ramp_s=0.2)  # the pool settles at this bound
    counts.clear()
    remover = removal_thread_cpu()
    kernel, before = kernel_threads_cpu(), clocks(thread)
    done, other, _wall, latencies = await product_rate(plane, agents, seconds, ramp_s=0.3)
    on_cpu, waiting, cpu, children, wall = (
        b - a for a, b in zip(before, clocks(thread), strict=True)
    )
    kernel, remover = kernel_threads_cpu() - kernel, removal_thread_cpu() - remover
    count = max(1, done)
    latencies.sort()
    return {
        "rate": round(done / seconds, 2),
        "not_completed": other,
        "p50_ms": round(1000 * quantile(latencies, 0.5), 2),
        "loop_cpu_ms": round(1000 * on_cpu / count, 3),
        "loop_runq_ms": round(1000 * waiting / count, 3),
        "process_cpu_ms": round(1000 * cpu / count, 3),
        "children_cpu_ms": round(1000 * children / count, 3),
        "removal_thread_cpu_ms": round(1000 * remover / count, 3),
        # kworker/rcu/ksoftirqd: a removed memory group's offlining, and the host's rest
        "kernel_threads_cpu_ms": round(1000 * kernel / count, 3),
        "wall_s": round(wall, 2),
        **counts.summary(),
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    home, bare_home = make_home(), make_home()
    plane = await build(Settings(home=home / "home"))
    bare = BareBwrap(bare_home)
    counts = Counts()
    defaults = recycle.LEFTOVER_BYTES, ready_groups.READY_PER_WORKSPACE
    rounds: list[dict[str, Any]] = []
    sides = [tuple(float(x) for x in side.split(":")) for side in args.sides]
    try:
        session, _main = await plane.store.default_owner()
        agents = [str((await plane.store.create_agent(str(session.id))).id) for _ in range(AGENTS)]
        await asyncio.gather(
            *(plane.executions.run_shell(RunShellRequest(command="true"), a) for a in agents)
        )
        instrument(the_tree(plane), counts)
        pool = warm_pool(plane)
        await product_rate(plane, agents, 0.5, ramp_s=0.5)
        bare_rate(bare, 1, 0.5)
        for number in range(args.rounds):
            load_before = os.getloadavg()
            seq_a = bare_rate(bare, 1, args.bare)
            par_a = bare_rate(bare, 2, args.bare)
            row: dict[str, Any] = {"round": number, "at": time.strftime("%H:%M:%S")}
            for bound_mib, ready in sides if number % 2 == 0 else sides[::-1]:
                recycle.LEFTOVER_BYTES = int(bound_mib * MIB)
                ready_groups.READY_PER_WORKSPACE = int(ready)
                taken = pool.stats["taken"] if pool is not None else 0
                side = await window(plane, agents, counts, args.window)
                side["warm_taken"] = (pool.stats["taken"] if pool is not None else 0) - taken
                row[f"bound_{bound_mib:g}MiB_ready_{ready:g}"] = side
            par_b = bare_rate(bare, 2, args.bare)
            seq_b = bare_rate(bare, 1, args.bare)
            seq = (seq_a[0] + seq_b[0]) / (seq_a[1] + seq_b[1])
            par = (par_a[0] + par_b[0]) / (par_a[1] + par_b[1])
            row["bare"] = {"sequential": round(seq, 2), "parallel_2": round(par, 2)}
            for key, side in row.items():
                if key.startswith("bound_"):
                    side["over_bare"] = round(side["rate"] / max(seq, par), 3)
            row["load"] = {"before": load_before, "after": os.getloadavg()}
            rounds.append(row)
            print(json.dumps(row), flush=True)
    finally:
        recycle.LEFTOVER_BYTES, ready_groups.READY_PER_WORKSPACE = defaults
        await plane.aclose()
        remove_home(home)
        remove_home(bare_home)
    keys = [k for k in rounds[0] if k.startswith("bound_")]
    summary: dict[str, Any] = {}
    for key in keys:
        summary[key] = {
            field: round(statistics.mean(r[key][field] for r in rounds), 3)
            for field in (
                "rate", "over_bare", "reused_share_of_spawns", "loop_cpu_ms", "loop_runq_ms",
                "process_cpu_ms", "children_cpu_ms", "removal_thread_cpu_ms",
                "kernel_threads_cpu_ms",
            )
        }  # fmt: skip
        summary[key]["over_bare_range"] = [
            min(r[key]["over_bare"] for r in rounds),
            max(r[key]["over_bare"] for r in rounds),
        ]
    a = keys[0]
    for b in keys[1:]:
        pairs = [r[b]["rate"] / r[a]["rate"] for r in rounds]
        summary[f"rate_{b}_over_{a}"] = {
            "mean": round(statistics.mean(pairs), 3),
            "ahead": sum(p > 1 for p in pairs),
            "rounds": len(pairs),
        }
    return {
        "name": "reuse_load",
        "command": "PYTHONPATH=src:bench .venv/bin/python bench/bench_reuse_load.py",
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "agents": AGENTS,
        "summary": summary,
        "rounds": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--sides",
        nargs="+",
        default=["1:1", "2:1"],
        help="LEFTOVER_BYTES in MiB : READY_PER_WORKSPACE, one window each per round",
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--window", type=float, default=4.0, help="seconds per bound")
    parser.add_argument("--bare", type=float, default=1.0, help="seconds per bare phase half")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    write_result(loops.run(measure(args)), args.out)


if __name__ == "__main__":
    main()

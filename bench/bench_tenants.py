"""Benchmark: what tenants cost and what they buy (R2; docs/limits.md "Tenants").

- spawn cost: CPU time of making an execution's cgroups (the workspace's exists) and of
  reading and removing them at its end, per execution (``CgroupTree.start`` + ``finish``);
- throughput: run_shell(true) from 16 agents, tenants on (cgroups and a uid per workspace)
  and off (rlimits, one uid), in alternating windows on control planes in this process, with
  the server's and the children's CPU per run; a third plane, tenants on with the runner's
  cgroup folder left at the kernel's default CPU weight (one process's worth for the whole
  tree, as before docs/benchmarks.md §34), shows what the per-workspace weight buys; with
  ``--fresh`` a fourth, tenants on with an ended execution's groups always removed and fresh
  ones made (before docs/limits.md "Groups used again"), what using them again buys (off by
  default: a fourth plane changes the windows' order against earlier runs);
- fairness: B's CPU-bound second (1 s of CPU) while A runs 8 busy loops, each in a session of
  its own, over B's idle time (wall), and A's CPU over B's in that window; tenants on and off.
Targets: spawn ≤ 0.5 ms CPU, throughput ≥ 0.95× off, fairness ≤ 2× idle.

    .venv/bin/python bench/bench_tenants.py [--quick] [--fresh] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench_throughput import AGENTS, product_rate
from common import cli, make_home, metric, remove_home
from shellyard.config import Settings
from shellyard.contract.executions import (
    ExecutionCancelQuery,
    ExecutionLogsQuery,
    ExecutionWait,
    RunShellRequest,
)
from shellyard.control.plane import ControlPlane, build
from shellyard.runner.limits import cgroups
from shellyard.runner.local import LocalRunner
from shellyard.runner.protocol import SandboxPolicy

COMMAND = "python bench/bench_tenants.py"
ON = SandboxPolicy(uid_range="62300-62399")
OFF = SandboxPolicy(uid_range="off", cgroups="off")
FLAT = SandboxPolicy(uid_range="62400-62499")
FRESH = SandboxPolicy(uid_range="62500-62599")
TIMED = (
    "python3 -c 'import time\nw = time.monotonic(); t = time.process_time()\n"
    "while time.process_time() - t < 1: pass\nprint(time.monotonic() - w)'"
)
BUSY = "id -u; for i in 1 2 3 4 5 6 7 8; do setsid sh -c 'while :; do :; done' & done; sleep 600"


def spawn_cost(samples: int) -> dict[str, Any]:
    tree = cgroups.CgroupTree.probe(
        "shellyard-bench-tenants", cgroups.TenantLimits(256 << 20, 64), "auto"
    )
    if tree is None:
        return {"mechanism": "rlimits", "start_ms": None, "finish_ms": None}
    tree.start("ws", "warm")
    tree.finish("ws", "warm")
    starts: list[float] = []
    finishes: list[float] = []
    for i in range(samples):
        c0 = time.process_time()
        tree.start("ws", f"e{i}")
        c1 = time.process_time()
        tree.finish("ws", f"e{i}")
        c2 = time.process_time()
        starts.append(c1 - c0)
        finishes.append(c2 - c1)
    tree.close(set())
    return {
        "mechanism": tree.mechanism,
        "start_ms": round(1000 * statistics.mean(starts), 4),
        "finish_ms": round(1000 * statistics.mean(finishes), 4),
    }


async def open_plane(
    home: Path, policy: SandboxPolicy, *, flat: bool = False, fresh: bool = False
) -> tuple[ControlPlane, list[str]]:
    plane = await build(Settings(home=home / "home", local_policy=policy))
    for runner in gc.get_objects() if flat or fresh else ():
        if isinstance(runner, LocalRunner) and runner.root.is_relative_to(home):
            tree = runner._sandboxes.cgroups  # a bench's look inside
            if tree is not None and flat:  # the kernel's default weight (before §34)
                tree.weight.path = None
            if tree is not None and fresh:  # groups never used again (before §50)
                tree.reuse = False
    session, _main = await plane.store.default_owner()
    agents = [str((await plane.store.create_agent(str(session.id))).id) for _ in range(AGENTS)]
    await asyncio.gather(
        *(plane.executions.run_shell(RunShellRequest(command="true"), a) for a in agents)
    )
    return plane, agents


def cpu_of_uid(uid: int) -> float:
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


async def fairness(plane: ControlPlane, agents: list[str]) -> dict[str, float]:
    async def timed(agent: str) -> float:
        result = await plane.executions.run_shell(
            RunShellRequest(command=TIMED, wait_ms=30_000), agent
        )
        return float(result.stdout)

    idle = await timed(agents[1])
    busy = await plane.executions.run_shell(
        RunShellRequest(command=BUSY, background=True), agents[0]
    )
    try:
        uid = None
        for _ in range(300):
            logs = await plane.executions.logs(
                busy.execution_id, ExecutionLogsQuery(stream="stdout"), agents[0]
            )
            if logs.data.strip():
                uid = int(logs.data.split()[0])
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(1)
        before = cpu_of_uid(uid) if uid is not None else 0.0
        loaded = await timed(agents[1])
        a_cpu = cpu_of_uid(uid) - before if uid is not None else float("nan")
    finally:
        await plane.executions.cancel(busy.execution_id, ExecutionCancelQuery(wait_s=30), agents[0])
        await plane.executions.wait(busy.execution_id, ExecutionWait(timeout_s=30), agents[0])
    return {"idle_s": idle, "loaded_s": loaded, "ratio": loaded / idle, "a_cpu_per_b_cpu": a_cpu}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    spawn = spawn_cost(50 if args.quick else 300)
    names: tuple[str, ...] = ("on", "off", "flat", "fresh") if args.fresh else ("on", "off", "flat")
    homes = {name: make_home() for name in names}
    planes: dict[str, tuple[ControlPlane, list[str]]] = {}
    try:
        policies = {"on": ON, "off": OFF, "flat": FLAT, "fresh": FRESH}
        for name in names:
            policy = policies[name]
            planes[name] = await open_plane(
                homes[name], policy, flat=name == "flat", fresh=name == "fresh"
            )
        counts = dict.fromkeys(names, 0)
        seconds = dict.fromkeys(names, 0.0)
        server = dict.fromkeys(names, 0.0)
        children = dict.fromkeys(names, 0.0)
        window = 1.5 if args.quick else 2.0
        for name in [*names, *names[::-1]] * (1 if args.quick else 2):
            plane, agents = planes[name]
            before = os.times()
            done, _other, elapsed, _lat = await product_rate(plane, agents, window, ramp_s=0.5)
            after = os.times()
            counts[name] += done
            seconds[name] += elapsed
            # CPU of the ramp too (and of the calls in flight at the ends): per run, an upper
            # bound alike for every plane
            server[name] += after.user + after.system - before.user - before.system
            children[name] += (
                after.children_user + after.children_system
                - before.children_user - before.children_system
            )  # fmt: skip
        rates = {name: counts[name] / seconds[name] for name in counts}
        cpu_ms = {
            name: {
                "server": round(1000 * server[name] / max(1, counts[name]), 2),
                "children": round(1000 * children[name] / max(1, counts[name]), 2),
            }
            for name in names
        }
        fair = {name: await fairness(*planes[name]) for name in ("on", "off", "flat")}
    finally:
        for plane, _agents in planes.values():
            await plane.aclose()
        for home in homes.values():
            remove_home(home)
    metrics = [
        metric(
            "tenants.spawn_cpu", f"cgroup per execution ({spawn['mechanism']}): make, CPU ms",
            spawn["start_ms"] or 0.0, "ms", target="≤ 0.5 ms", kind="abs_max", limit=0.5,
        ),
        metric(
            "tenants.finish_cpu", "read use and remove the groups at the end, CPU ms",
            spawn["finish_ms"] or 0.0, "ms", target="— (info)", kind="info",
        ),
        metric(
            "tenants.throughput", "run_shell(true), 16 agents, tenants on (cgroups, uids), /s",
            rates["on"], "/s", baseline_label="the same, off (rlimits, one uid), /s",
            baseline_value=rates["off"], target="≥ 0.95× off", kind="ratio_min", limit=0.95,
        ),
        metric(
            "tenants.throughput_flat",
            "the same, the runner's folder at the kernel's default weight (before §34), /s",
            rates["flat"], "/s", baseline_label="tenants off, /s",
            baseline_value=rates["off"], target="— (info: what the weight buys)", kind="info",
        ),
        *([metric(
            "tenants.throughput_fresh",
            "the same, tenants on, an ended execution's groups never used again (before §50), /s",
            rates["fresh"], "/s", baseline_label="tenants off, /s",
            baseline_value=rates["off"], target="— (info: what using groups again buys)",
            kind="info",
        )] if args.fresh else []),
        metric(
            "tenants.fairness", "B's CPU second beside A's 8 busy loops / idle, tenants on",
            fair["on"]["ratio"], "×", target="≤ 2×", kind="abs_max", limit=2.0,
        ),
        metric(
            "tenants.fairness_off", "the same, tenants off (rlimits, one uid)",
            fair["off"]["ratio"], "×", target="— (info: the finding)", kind="info",
        ),
        metric(
            "tenants.fairness_flat", "the same, tenants on, the runner's folder at default weight",
            fair["flat"]["ratio"], "×", target="— (info: before §34)", kind="info",
        ),
        metric(
            "tenants.share", "A's CPU / B's CPU in that window, tenants on",
            fair["on"]["a_cpu_per_b_cpu"], "×", target="— (info: 1 is equal)", kind="info",
        ),
        metric(
            "tenants.share_off", "A's CPU / B's CPU in that window, tenants off",
            fair["off"]["a_cpu_per_b_cpu"], "×", target="— (info: 8 is per process)", kind="info",
        ),
    ]  # fmt: skip
    return {
        "name": "tenants",
        "title": "Tenants: cgroup spawn cost, throughput with limits on and off, CPU fairness",
        "command": COMMAND
        + (" --quick" if args.quick else "")
        + (" --fresh" if args.fresh else ""),
        "metrics": metrics,
        "details": {
            "spawn": spawn,
            "throughput_per_s": rates,
            "cpu_ms_per_run": cpu_ms,
            "fairness": fair,
            "load": os.getloadavg(),
        },
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    return asyncio.run(measure(args))


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fresh", action="store_true", help="a fourth plane: groups never used again"
    )


if __name__ == "__main__":
    cli("tenants", run, __doc__ or "", options)

"""Benchmark 7: what the runner's limits cost (issue 12; docs/limits.md), measured in one run
against the same service with the limits off (workspace quota 0, log limit 0):

- throughput: run_shell(true) from 16 agents (benchmark 2's loop), limits on and off in
  alternating windows (on, off, off, on, …) on two control planes in this process;
- 1 GiB of stdout (benchmark 4's command), limits on (10 GiB quota, 1 GiB log limit: the
  defaults) and off, interleaved run by run; and the same with a 64 MiB log limit, where the
  cap cuts the live log the whole time;
- the quota's overshoot: a command writing 400 MB under a 50 MB quota and 3 GB under 1 GiB,
  how far past the quota the workspace got before the command was stopped;
- the cost of one look: a walk of a 10,000-file tree, one statvfs.
Targets: ≤ 2% on throughput and on the 1 GiB output.

    .venv/bin/python bench/bench_limits.py [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench_throughput import AGENTS, product_rate
from common import MIB, cli, make_home, metric, remove_home
from shellyard.config import Settings
from shellyard.contract.executions import ExecutionWait, RunShellRequest
from shellyard.control.plane import ControlPlane, build
from shellyard.runner.limits.quota import tree_usage
from shellyard.runner.protocol import SandboxPolicy

COMMAND = "python bench/bench_limits.py"
GIB = 1 << 30
OFF = SandboxPolicy(workspace_quota_bytes=0, log_limit_bytes=0)
ON = SandboxPolicy()  # the defaults: 10 GiB quota, 1 GiB log limit, 2 GiB / 5% reserve


async def open_plane(home: Path, policy: SandboxPolicy) -> tuple[ControlPlane, list[str]]:
    plane = await build(Settings(home=home / "home", local_policy=policy))
    session, _main = await plane.store.default_owner()
    agents = [str((await plane.store.create_agent(str(session.id))).id) for _ in range(AGENTS)]
    await asyncio.gather(
        *(plane.executions.run_shell(RunShellRequest(command="true"), a) for a in agents)
    )
    return plane, agents


async def throughput(homes: dict[str, Path], window_s: float, rounds: int) -> dict[str, Any]:
    planes = {
        name: await open_plane(homes[name], policy) for name, policy in (("on", ON), ("off", OFF))
    }
    counts = {"on": 0, "off": 0}
    seconds = {"on": 0.0, "off": 0.0}
    busy = {"on": 0.0, "off": 0.0}  # wall time each plane was running commands, ramps included
    try:
        for plane, agents in planes.values():
            await product_rate(plane, agents, 0.5, ramp_s=0.5)
        guard = guard_of(planes["on"][0])
        spent_before = guard.spent_s
        order = ["on", "off", "off", "on"] * rounds
        for name in order:
            plane, agents = planes[name]
            begun = time.perf_counter()
            done, _other, elapsed, _lat = await product_rate(plane, agents, window_s, ramp_s=0.5)
            busy[name] += time.perf_counter() - begun
            counts[name] += done
            seconds[name] += elapsed
        spent = guard.spent_s - spent_before
    finally:
        for plane, _agents in planes.values():
            await plane.aclose()
    rates = {name: counts[name] / seconds[name] for name in counts}
    return rates | {
        "windows": len(order),
        "limits_spent_s": round(spent, 4),
        "limits_share_of_wall": round(spent / busy["on"], 5),
        "limits_ms_per_execution": round(1000 * spent / max(1, counts["on"]), 4),
    }


def guard_of(plane: ControlPlane) -> Any:
    """The local runner's limits watcher, whose ``spent_s`` sums its own time."""
    return plane.runners.get("local")._guard  # type: ignore[attr-defined]


async def big_output(homes: dict[str, Path], repeats: int) -> dict[str, Any]:
    policies = {"on": ON, "off": OFF, "cut": SandboxPolicy(log_limit_bytes=64 * MIB)}
    planes: dict[str, ControlPlane] = {}
    times: dict[str, list[float]] = {name: [] for name in policies}
    stored: dict[str, int] = {}
    try:
        for name, policy in policies.items():
            planes[name] = await build(Settings(home=homes[name] / "home", local_policy=policy))
        guards = {name: guard_of(plane) for name, plane in planes.items()}
        order = ["on", "off", "cut", "off", "on", "cut"] * repeats
        for name in order:
            plane = planes[name]
            os.sync()
            start = time.perf_counter()
            result = await plane.executions.run_shell(
                RunShellRequest(command=f"head -c {GIB} /dev/zero", wait_ms=30_000)
            )
            view: Any = result
            while not view.state.terminal:
                view = await plane.executions.wait(result.execution_id, ExecutionWait(timeout_s=30))
            times[name].append(time.perf_counter() - start)
            if view.exit_code != 0:
                raise RuntimeError(f"1 GiB run ({name}) ended {view.state}: {view.error}")
            log = plane.settings.local_runner_root / "executions" / result.execution_id / "stdout"
            stored[name] = log.stat().st_blocks * 512
            log.unlink()  # as benchmark 4 does: later runs write into freed blocks alike
        spent = {name: round(guard.spent_s, 4) for name, guard in guards.items()}
    finally:
        for plane in planes.values():
            await plane.aclose()
    shares = {name: round(spent[name] / sum(times[name]), 5) for name in times}
    return {"times": times, "stored_bytes": stored, "limits_spent_s": spent, "share": shares}


async def overshoot(home: Path, quota: int, write: int) -> dict[str, Any]:
    plane = await build(
        Settings(home=home / "home", local_policy=SandboxPolicy(workspace_quota_bytes=quota))
    )
    try:
        start = time.perf_counter()
        result = await plane.executions.run_shell(
            RunShellRequest(command=f"head -c {write} /dev/zero > big", wait_ms=30_000)
        )
        view: Any = await plane.executions.wait(result.execution_id, ExecutionWait(timeout_s=120))
        elapsed = time.perf_counter() - start
        runner = plane.runners.get("local")
        entry = await runner.stat_path(view.workspace_id, view.snapshot_seq, "big")
        size = entry.size if entry is not None else 0
        return {
            "quota": quota,
            "written_before_stop": size,
            "over_quota": size - quota,
            "seconds": round(elapsed, 3),
            "error": view.error,
        }
    finally:
        await plane.aclose()


def walk_cost(folder: Path) -> dict[str, float]:
    tree = folder / "tree"
    for d in range(100):
        sub = tree / f"d{d:03d}"
        sub.mkdir(parents=True)
        for f in range(100):
            (sub / f"f{f:03d}").write_bytes(b"x" * 4000)
    samples = []
    for _ in range(7):
        start = time.perf_counter()
        _usage, entries = tree_usage(tree)
        samples.append(time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(10_000):
        os.statvfs(folder)
    return {
        "walk_10k_ms": round(statistics.median(samples) * 1000, 2),
        "entries": entries,
        "statvfs_us": round((time.perf_counter() - start) * 100, 2),
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    homes = {name: make_home() for name in ("on", "off", "cut", "q1", "q2", "walk")}
    try:
        tp = await throughput(homes, 1.5 if args.quick else 2.0, 1 if args.quick else 4)
        out = await big_output(homes, 1 if args.quick else 2)
        small = await overshoot(homes["q1"], 50_000_000, 400_000_000)
        large = await overshoot(homes["q2"], GIB, 3_000_000_000)
        look = walk_cost(homes["walk"])
    finally:
        for home in homes.values():
            remove_home(home)
    on_s = statistics.median(out["times"]["on"])
    off_s = statistics.median(out["times"]["off"])
    cut_s = statistics.median(out["times"]["cut"])
    metrics = [
        metric(
            "limits.throughput", "run_shell(true), 16 agents, limits on (defaults), /s",
            tp["on"], "/s", baseline_label="the same, quota and log limit off, /s",
            baseline_value=tp["off"], target="≥ 0.98× limits off", kind="ratio_min", limit=0.98,
        ),
        metric(
            "limits.output", "1 GiB stdout, limits on (defaults), median s", on_s, "s",
            baseline_label="the same, limits off, median s", baseline_value=off_s,
            target="≤ 1.02× limits off", kind="ratio_max", limit=1.02,
        ),
        metric(
            "limits.own_time_throughput",
            "limits watcher's own time / wall time, throughput (limits on)",
            100 * tp["limits_share_of_wall"], "%", target="≤ 2%", kind="abs_max", limit=2.0,
        ),
        metric(
            "limits.own_time_output",
            "limits watcher's own time / wall time, 1 GiB stdout (limits on)",
            100 * out["share"]["on"], "%", target="≤ 2%", kind="abs_max", limit=2.0,
        ),
        metric(
            "limits.output_cut", "1 GiB stdout cut live to a 64 MiB log limit, median s",
            cut_s, "s", baseline_label="limits off, median s", baseline_value=off_s,
            target="— (info)", kind="info",
        ),
        metric(
            "limits.overshoot_50mb", "400 MB written under a 50 MB quota: MB past the quota",
            small["over_quota"] / 1e6, "MB", target="— (the documented margin)", kind="info",
        ),
        metric(
            "limits.overshoot_1gib", "3 GB written under a 1 GiB quota: MB past the quota",
            large["over_quota"] / 1e6, "MB", target="— (the documented margin)", kind="info",
        ),
        metric(
            "limits.walk", "quota walk of a 10,000-file tree, ms", look["walk_10k_ms"], "ms",
            target="— (info)", kind="info",
        ),
    ]  # fmt: skip
    return {
        "name": "limits",
        "title": "7. Cost of the limits (quota and log-cap checks), with and without",
        "command": COMMAND + (" --quick" if args.quick else ""),
        "metrics": metrics,
        "details": {
            "throughput_per_s": {k: round(v, 2) for k, v in tp.items()},
            "output_s": {k: [round(x, 3) for x in v] for k, v in out["times"].items()},
            "output_stored_log_bytes": out["stored_bytes"],
            "output_limits_spent_s": out["limits_spent_s"],
            "output_limits_share_of_wall": out["share"],
            "overshoot": [small, large],
            "look": look,
        },
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    return asyncio.run(measure(args))


if __name__ == "__main__":
    cli("limits", run, __doc__ or "")

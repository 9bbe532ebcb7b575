"""Where the tenants' cost per execution goes (R2; docs/benchmarks.md §13, by hand).

Two measures, each against its baseline in the same run, rounds alternating:

- the runner's own CPU per run_shell(true) (this process's CPU time, all threads) and its
  children's, one agent at a time, on four control planes: cgroups and a uid per workspace
  (``both``), cgroups only (``cg``), uids only (``uid``), neither (``off``);
- the launcher's wall time for ``true`` with and without joining an execution's v1 groups
  (the kernel's part: each ``cgroup.procs`` write takes the threadgroup lock for writing).

For a profile of the first, run it under ``py-spy record --threads -f raw``.

    .venv/bin/python bench/profile_tenants.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from common import make_home, remove_home
from shellyard.config import Settings
from shellyard.contract.executions import RunShellRequest
from shellyard.control.plane import ControlPlane, build
from shellyard.runner.limits import cgroups
from shellyard.runner.local import LocalRunner
from shellyard.runner.protocol import SandboxPolicy
from shellyard.runner.sandbox import launch

POLICIES = {
    "both": SandboxPolicy(uid_range="62300-62399"),
    # the same, an ended execution's groups never used again (before docs/limits.md "Groups
    # used again"): removed and fresh ones made
    "fresh": SandboxPolicy(uid_range="62500-62599"),
    "cg": SandboxPolicy(uid_range="off"),
    "uid": SandboxPolicy(uid_range="62400-62499", cgroups="off"),
    "off": SandboxPolicy(uid_range="off", cgroups="off"),
}


def tree_of(home: Path) -> cgroups.CgroupTree | None:
    for runner in gc.get_objects():
        if isinstance(runner, LocalRunner) and runner.root.is_relative_to(home):
            return runner._sandboxes.cgroups  # a profile's look inside
    return None


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # µs, not os.times' clock ticks
    return usage.ru_utime + usage.ru_stime


async def runner_cpu(rounds: int) -> dict[str, dict[str, float]]:
    homes = {name: make_home() for name in POLICIES}
    planes: dict[str, tuple[ControlPlane, str]] = {}
    trees: dict[str, cgroups.CgroupTree | None] = {}
    samples: dict[str, dict[str, list[float]]] = {
        name: {"cpu": [], "children": [], "wall": []} for name in POLICIES
    }
    try:
        for name, policy in POLICIES.items():
            plane = await build(Settings(home=homes[name] / "home", local_policy=policy))
            trees[name] = tree_of(homes[name])
            if name == "fresh" and trees[name] is not None:
                trees[name].reuse = False  # type: ignore[union-attr]
            session, _main = await plane.store.default_owner()
            agent = str((await plane.store.create_agent(str(session.id))).id)
            for _ in range(3):  # warm: the workspace, its groups, its uid
                await plane.executions.run_shell(RunShellRequest(command="true"), agent)
            planes[name] = (plane, agent)
        names = list(POLICIES)
        for i in range(rounds):
            for name in names if i % 2 == 0 else names[::-1]:
                plane, agent = planes[name]
                wall, cpu, before = time.perf_counter(), time.process_time(), children_cpu()
                await plane.executions.run_shell(RunShellRequest(command="true"), agent)
                samples[name]["wall"].append(time.perf_counter() - wall)
                # what the run left to do (its next warm sandbox, its groups' removal or
                # reset) counts to it, not to the next plane's run
                await asyncio.sleep(0.02)
                tree = trees[name]
                if tree is not None:
                    tree.drain()
                samples[name]["cpu"].append(time.process_time() - cpu)
                samples[name]["children"].append(children_cpu() - before)
    finally:
        for plane, _agent in planes.values():
            await plane.aclose()
        for home in homes.values():
            remove_home(home)
    return {
        name: {
            "runner_cpu_ms": round(1000 * statistics.mean(s["cpu"]), 3),
            "children_cpu_ms": round(1000 * statistics.mean(s["children"]), 3),
            "wall_p50_ms": round(1000 * statistics.median(s["wall"]), 2),
        }
        for name, s in samples.items()
    }


def join_cost(rounds: int) -> dict[str, float] | None:
    tree = cgroups.CgroupTree.probe(
        "shellyard-profile-tenants", cgroups.TenantLimits(256 << 20, 64), "v1"
    )
    if tree is None:
        return None
    home = make_home()
    launcher = launch.build(home / "bin")
    walls: dict[str, list[float]] = {"none": [], "joined": []}
    try:
        for i in range(rounds):
            for kind in ("none", "joined") if i % 2 == 0 else ("joined", "none"):
                joins = tree.start("ws", f"e{i}") if kind == "joined" else []
                argv = launch.prefix(
                    launcher, network=None, ids=(62999, 62999), limits=(), cgroups=joins
                )
                started = time.perf_counter()
                subprocess.run([*argv, "/bin/true"], check=True)
                walls[kind].append(time.perf_counter() - started)
                if joins:
                    tree.remove("ws", f"e{i}")
    finally:
        tree.close(set())
        remove_home(home)
    return {kind: round(1000 * statistics.median(v), 3) for kind, v in walls.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    result: dict[str, Any] = {
        "load": os.getloadavg(),
        "per_execution": asyncio.run(runner_cpu(args.rounds)),
        "launcher_true_p50_ms": join_cost(args.rounds),
    }
    print(result)


if __name__ == "__main__":
    main()

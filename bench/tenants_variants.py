"""Tenants on/off throughput: where the ratio comes from (R2; docs/benchmarks.md §39, by hand).

bench_tenants.py's throughput windows (run_shell(true), 16 agents, alternating windows in one
process) over any set of planes, with what decides the ratio measured per completed run:

- ``loop``: CPU of the control plane's event-loop thread (this process's main thread);
- ``runq``: the time that thread waited on a run queue (``/proc/…/schedstat``), and
  ``preempted``: its involuntary context switches;
- ``reaper``: CPU of the cgroup removal thread (groups removed and made ahead);
- ``units``: the runner folder's CPU weight (weight.py) in units, time-averaged per window
  (``beside``: the last value before it was set aside; its folder holds no workspace).

Planes: ``on`` (tenants as shipped), ``off`` (rlimits, one uid), ``flat`` (the runner's folder
at the kernel's default weight, before §34), ``fixedN`` (the folder held at N units) and
``beside`` (v1: each workspace's cpu group directly below this process's own cpu group, the
folder's weight unused: the kernel weighs each runnable workspace as one process; tried and
not kept, §39). ``--shares S`` first moves this process into a cpu group of its own with
``cpu.shares`` S (v1, root), so the bench's tree meets little of the host's other load: a
stand-in for a quiet machine on a shared one (it takes that much CPU from the others).

    .venv/bin/python bench/tenants_variants.py on,off,flat [--rounds 4] [--shares 65536] [--batch]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import os
import time
from pathlib import Path
from typing import Any

import bench_tenants
from bench_throughput import product_rate
from common import make_home, remove_home
from shellyard.runner.limits import cgroups, weight
from shellyard.runner.local import LocalRunner
from shellyard.runner.protocol import SandboxPolicy

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
#: plane → [(time, units)] of each weight change
WEIGHTS: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
CURRENT = ["-"]
REAL_APPLY = weight.RunnerWeight._apply


def logged_apply(self: weight.RunnerWeight) -> None:
    REAL_APPLY(self)
    WEIGHTS[CURRENT[0]].append((time.perf_counter(), self.value / self.unit))


class Fixed(weight.RunnerWeight):
    """The folder held at ``units``, whatever is in use."""

    def __init__(self, base: weight.RunnerWeight, units: int) -> None:
        super().__init__(base.path, base.unit, base.most)
        if self.path is not None:
            self.path.write_text(str(base.unit * units))
        self._written = base.unit * units

    def _apply(self) -> None:
        WEIGHTS[CURRENT[0]].append((time.perf_counter(), self._written / self.unit))


def tree_of(home: Path) -> cgroups.CgroupTree | None:
    for runner in gc.get_objects():
        if isinstance(runner, LocalRunner) and runner.root.is_relative_to(home):
            return runner._sandboxes.cgroups  # a bench's look inside
    return None


BESIDE: list[tuple[cgroups.CgroupTree, Path]] = []


async def open_plane(home: Path, name: str, index: int) -> tuple[Any, list[str], Any]:
    if name == "off":
        policy = SandboxPolicy(uid_range="off", cgroups="off")
    else:
        policy = SandboxPolicy(uid_range=f"{62300 + 100 * index}-{62399 + 100 * index}")
    plane, agents = await bench_tenants.open_plane(home, policy, flat=name == "flat")
    tree = tree_of(home)
    if tree is not None and name.startswith("fixed"):
        tree.weight = Fixed(tree.weight, int(name[5:]))
    elif tree is not None and name == "beside" and "cpu" in tree.bases:
        base = tree.bases["cpu"]
        BESIDE.append((tree, base))
        # the workspace groups as ``<own cpu group>/<workspace id>``: the warm-up's are
        # made again there; the nested ones stay until the plane closes
        tree.bases["cpu"] = base.parent
        tree.weight.path = None
        for workspace in tree._workspaces:
            (base.parent / workspace).mkdir(exist_ok=True)
    return plane, agents, tree


def loop_stats() -> tuple[float, float, int]:
    """(CPU s, run-queue wait s, involuntary switches) of this process's main thread."""
    task = Path(f"/proc/{os.getpid()}/task/{os.getpid()}")
    run, wait, _slices = (int(v) for v in (task / "schedstat").read_text().split())
    switches = 0
    for line in (task / "status").read_text().splitlines():
        if line.startswith("nonvoluntary_ctxt_switches"):
            switches = int(line.split()[1])
    return run / 1e9, wait / 1e9, switches


def thread_cpu(tid: int | None) -> float:
    if tid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{os.getpid()}/task/{tid}/stat").read_text().rsplit(")", 1)[1]
    except OSError:
        return 0.0
    values = fields.split()
    return (int(values[11]) + int(values[12])) / os.sysconf("SC_CLK_TCK")


def mean_units(samples: list[tuple[float, float]], start: float, end: float) -> float | None:
    """The weight's time-average over [start, end] (the last value before start holds)."""
    before = [u for t, u in samples if t < start]
    value = before[-1] if before else None
    total, at = 0.0, start
    for t, units in samples:
        if start <= t <= end:
            if value is not None:
                total += value * (t - at)
            value, at = units, t
    if value is None:
        return None
    return (total + value * (end - at)) / (end - start)


async def measure(names: list[str], rounds: int) -> dict[str, Any]:
    homes = {name: make_home() for name in names}
    planes: dict[str, tuple[Any, list[str], Any]] = {}
    sums: dict[str, collections.Counter[str]] = {n: collections.Counter() for n in names}
    units: dict[str, list[float]] = {n: [] for n in names}
    load = [os.getloadavg()[0]]
    try:
        for index, name in enumerate(names):
            CURRENT[0] = name
            planes[name] = await open_plane(homes[name], name, index)
        for name in (names + names[::-1]) * rounds:
            CURRENT[0] = name
            plane, agents, tree = planes[name]
            reaper = tree._reaper.native_id if tree is not None and tree._reaper else None
            times, loop, reaped = os.times(), loop_stats(), thread_cpu(reaper)
            done, _other, seconds, _lat = await product_rate(plane, agents, 2.0, ramp_s=0.5)
            end = time.perf_counter()
            after, loop_after = os.times(), loop_stats()
            s = sums[name]
            s["runs"] += done
            s["seconds"] += seconds
            s["server"] += after.user + after.system - times.user - times.system
            s["children"] += (
                after.children_user + after.children_system
                - times.children_user - times.children_system
            )  # fmt: skip
            s["loop"] += loop_after[0] - loop[0]
            s["runq"] += loop_after[1] - loop[1]
            s["preempted"] += loop_after[2] - loop[2]
            s["reaper"] += thread_cpu(reaper) - reaped
            mean = mean_units(WEIGHTS[name], end - seconds, end)
            if mean is not None:
                units[name].append(round(mean, 1))
        load.append(os.getloadavg()[0])
    finally:
        beside = [(base, list(tree._workspaces)) for tree, base in BESIDE]
        for tree, base in BESIDE:
            tree.bases["cpu"] = base  # its close sweeps its own folder, not the host's
        for plane, _agents, _tree in planes.values():
            await plane.aclose()
        for base, workspaces in beside:
            for workspace in workspaces:
                for _ in range(100):  # its last sandboxes are exiting
                    try:
                        (base.parent / workspace).rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.05)
        for home in homes.values():
            remove_home(home)
    off = sums["off"]["runs"] / sums["off"]["seconds"] if "off" in sums else None
    result: dict[str, Any] = {"load": [round(v, 1) for v in load]}
    for name, s in sums.items():
        runs = max(1, s["runs"])
        rate = s["runs"] / s["seconds"]
        result[name] = {
            "per_s": round(rate, 1),
            "per_off": round(rate / off, 3) if off else None,
            **{
                f"{key}_ms": round(1000 * s[key] / runs, 2)
                for key in ("server", "children", "loop", "runq", "reaper")
            },
            "preempted": round(s["preempted"] / runs, 2),
            "units": units[name],
        }
    return result


@contextlib.contextmanager
def own_cpu_group(shares: int | None) -> Any:
    """This process in ``tenants-variants-<pid>`` at ``shares`` while the block runs."""
    if not shares:
        yield
        return
    group = CPU_ROOT / f"tenants-variants-{os.getpid()}"
    group.mkdir()
    (group / "cpu.shares").write_text(str(shares))
    (group / "cgroup.procs").write_text(str(os.getpid()))
    try:
        yield
    finally:
        (CPU_ROOT / "cgroup.procs").write_text(str(os.getpid()))
        for _ in range(100):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("planes", help="comma-separated: on, off, flat, fixedN, beside")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--shares", type=int, default=0)
    parser.add_argument(
        "--batch",
        action="store_true",
        help="the loop thread SCHED_BATCH (its wake-ups preempt no running task; its "
        "children start as SCHED_OTHER): does batching the loop's work pay without the weight?",
    )
    args = parser.parse_args()
    if args.batch:
        os.sched_setscheduler(0, os.SCHED_BATCH | os.SCHED_RESET_ON_FORK, os.sched_param(0))
    weight.RunnerWeight._apply = logged_apply  # type: ignore[method-assign]
    with own_cpu_group(args.shares):
        result = asyncio.run(measure(args.planes.split(","), args.rounds))
    for name, values in result.items():
        print(name, values)


if __name__ == "__main__":
    main()

"""Benchmark: what a workspace's overlay of its own costs (runner/own_mounts.py; R2,
docs/security.md "A mount of its own per workspace").

The same tree twice: one a plain folder (as a runner that is not root keeps it), one under
its overlay (as a root runner keeps it). In one run, interleaved, both see the same machine:

* first commit of the tree into a fresh snapshot store, and an incremental commit after one
  file changed (``SnapshotStore.commit``: the runner's commit goes through the overlay);
* a walk that stats every entry and reads every file (what a command's ``grep -r`` or a test
  run does), as a child process: ``find -type f -exec cat {} +``.

Ratios are overlay / plain (target: ≤ 1.1×). Needs root (the overlay is a root runner's).

    .venv/bin/python bench/bench_own_mounts.py [--files 5000] [--total-mb 20] [--repeats 5]

``--idle N``: instead, a LocalRunner's start → wait of ``true`` (cold: no warm pool, so each
is a bwrap spawn) in one workspace beside N idle ones, with the overlays off, on (mounted
while held: the idle ones are not), and on with every idle workspace held (what the runner
did before: all mounted for its life). off and on interleaved; "all" last, alone, since its
mounts are the host's and would slow the others too (docs/benchmarks.md §27).

    .venv/bin/python bench/bench_own_mounts.py --idle 250 --repeats 5 [--runs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_snapshots import make_tree, timed, touch_one
from shellyard.runner.local import LocalRunner
from shellyard.runner.own_mounts import OwnMounts
from shellyard.runner.protocol import StartRequest
from shellyard.runner.snapshots.store import SnapshotStore

COMMAND = "python bench/bench_own_mounts.py"


def walk(tree: Path) -> float:
    return timed(
        lambda: subprocess.run(
            ["find", str(tree), "-type", "f", "-exec", "cat", "{}", "+"],
            stdout=subprocess.DEVNULL,
            check=True,
        )
    )


async def _runner(root: Path, mode: str, idle: int) -> LocalRunner:
    """A runner with ``idle`` workspaces besides ``active``; ``all``: each one held."""
    os.environ["SHELLYARD_OWN_MOUNTS"] = "off" if mode == "off" else "on"
    runner = LocalRunner(root)
    await runner.startup()
    for index in range(idle):
        await runner.ensure_workspace(f"idle{index}")
        runner.home_path(f"idle{index}")
        if mode == "all":
            runner._mounts.hold(f"idle{index}")
    await runner.ensure_workspace("active")
    return runner


async def _spawns(
    runner: LocalRunner, runs: int, tag: str, first: list[str] | None = None
) -> list[float]:
    """``first``: each start in the next of these workspaces, unused until then (with the
    overlays on, each start mounts its tree and home and its commit walks the tree)."""
    took = []
    for run in range(runs):
        execution_id = f"{tag}-{run}"
        workspace_id = first.pop() if first else "active"
        start = time.perf_counter()
        await runner.start(
            StartRequest(execution_id=execution_id, workspace_id=workspace_id, command="true")
        )
        result = await runner.wait(execution_id, 60)
        took.append(time.perf_counter() - start)
        if result.exit_code != 0:
            raise RuntimeError(f"true ended {result.state}: {result.error}")
    return took


def _mount_count() -> int:
    with open("/proc/self/mountinfo") as lines:
        return sum(1 for _ in lines)


async def idle_main(args: argparse.Namespace) -> dict[str, Any]:
    os.environ["SHELLYARD_WARM_SANDBOXES"] = "0"  # every start a bwrap spawn
    work = Path(tempfile.mkdtemp(prefix="shellyard-bench-idle-"))
    work.chmod(0o711)
    samples: dict[str, list[float]] = {
        "off": [], "on": [], "all": [], "off_first_use": [], "on_first_use": []
    }  # fmt: skip
    mounts: dict[str, int] = {}
    try:
        runners = {mode: await _runner(work / mode, mode, args.idle) for mode in ("off", "on")}
        for mode, runner in runners.items():
            await _spawns(runner, 3, f"{mode}-w")  # warm: page cache, network, cgroups
        unused = {mode: [f"idle{i}" for i in range(args.idle)] for mode in runners}
        for r in range(args.repeats):
            for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                samples[mode] += await _spawns(runners[mode], args.runs, f"{mode}-{r}")
                mounts[mode] = _mount_count()
                runs = min(args.runs, len(unused[mode]))
                samples[f"{mode}_first_use"] += await _spawns(
                    runners[mode], runs, f"{mode}-f{r}", unused[mode]
                )
        for runner in runners.values():
            await runner.aclose()
        held = await _runner(work / "all", "all", args.idle)
        await _spawns(held, 3, "all-w")
        for r in range(args.repeats):
            samples["all"] += await _spawns(held, args.runs, f"all-{r}")
        mounts["all"] = _mount_count()
        for index in range(args.idle):
            held._mounts.let_go(f"idle{index}")
        await held.aclose()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    medians = {k: round(1000 * statistics.median(v), 2) for k, v in samples.items()}
    return {
        "command": f"{COMMAND} --idle {args.idle} --repeats {args.repeats} --runs {args.runs}",
        "idle_workspaces": args.idle,
        "starts_each": args.repeats * args.runs,
        "median_ms": medians,
        "host_mounts_while_timed": mounts,
        "ratios": {
            "on_vs_off": round(medians["on"] / medians["off"], 3),
            "on_first_use_vs_off_first_use": round(
                medians["on_first_use"] / medians["off_first_use"], 3
            ),
            "all_held_vs_off": round(medians["all"] / medians["off"], 3),
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--total-mb", type=int, default=20)
    parser.add_argument("--dirs", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--idle", type=int, default=0)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("bench_own_mounts needs root: the overlay is a root runner's")
    if args.idle:
        result = asyncio.run(idle_main(args))
        print(json.dumps(result, indent=1))
        if args.out:
            args.out.write_text(json.dumps(result, indent=1))
        return result
    work = Path(tempfile.mkdtemp(prefix="shellyard-bench-mounts-"))
    mounts = OwnMounts(work / "overlays", ())
    samples: dict[str, list[float]] = {}
    try:
        plain = work / "workspaces" / "plain"
        over = work / "workspaces" / "over"
        plain.mkdir(parents=True)
        make_tree(plain, args.files, args.total_mb << 20, args.dirs)
        shutil.copytree(plain, over, symlinks=True, dirs_exist_ok=True)
        if not mounts.startup():
            sys.exit("the kernel refused the overlay here (see the log)")
        mounts.mount(over)
        stores = {name: SnapshotStore(work / f"store-{name}-0") for name in ("plain", "over")}
        trees = {"plain": plain, "over": over}
        for tree in trees.values():  # warm: the page cache holds both trees
            walk(tree)
        for r in range(args.repeats):
            for name in ("plain", "over") if r % 2 == 0 else ("over", "plain"):
                tree = trees[name]
                fresh = SnapshotStore(work / f"store-{name}-{r + 1}")
                samples.setdefault(f"first_{name}", []).append(
                    timed(lambda s=fresh, t=tree: s.commit("ws", t))  # type: ignore[misc]
                )
                fresh.close()
                stores[name].commit("ws", tree)
                touch_one(tree, "f0", r)
                samples.setdefault(f"incremental_{name}", []).append(
                    timed(lambda s=stores[name], t=tree: s.commit("ws", t))  # type: ignore[misc]
                )
                samples.setdefault(f"walk_{name}", []).append(walk(tree))
        for store in stores.values():
            store.close()
    finally:
        mounts.unmount(work / "workspaces" / "over")
        shutil.rmtree(work, ignore_errors=True)
    medians = {k: round(1000 * statistics.median(v), 2) for k, v in samples.items()}
    result = {
        "command": COMMAND,
        "files": args.files,
        "total_mb": args.total_mb,
        "median_ms": medians,
        "ratios": {
            part: round(medians[f"{part}_over"] / medians[f"{part}_plain"], 3)
            for part in ("first", "incremental", "walk")
        },
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()

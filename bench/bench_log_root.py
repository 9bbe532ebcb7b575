"""The logs a sandbox inherits: one detached copy of the runner's root for its life
(runner/sandbox/log_root.py) against a copy of each execution's folder per spawn (the path
before, ``own_mounts.open_unnamed``), in the same run, interleaved one of each per round.

- ``runner``: a LocalRunner's own start → wait of ``true`` (cold: no warm sandboxes, so every
  execution is a spawn from the event loop; no control plane), the runner's log opener
  switched each round between its opened copy (``after``) and an unopened one, which opens
  every execution's logs through a copy of their own (``before``: the code before, called as
  it was). Per execution: this process's CPU (the runner, every thread), its waited-for
  children's (bwrap, its init, ``true``: a per-spawn copy is dissolved when the sandbox's
  last descriptor of it closes) and the wall time. Then ``CONCURRENT`` workspaces at once,
  batches alternating between the sides: executions per second.
- ``open``: the opening alone, ``stdout``/``stderr``/``status`` of a fresh folder opened and
  closed, this thread's CPU and the wall time.

Result: the medians of each side, their ratio (after / before) and the median of the
per-round differences (after − before). Root only (the kernel
refuses the copy otherwise: both sides are then the same opens by path).

``--profile FOLDER``: py-spy on this process during the runner part; the event loop's busy
samples spent opening the logs, each side's share.

    .venv/bin/python bench/bench_log_root.py [--quick] [--profile FOLDER] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

from bench_warm import warm_count
from common import PySpy, cli, make_home, metric, remove_home
from shellyard.runner.local import LocalRunner
from shellyard.runner.own_mounts import open_unnamed
from shellyard.runner.protocol import StartRequest
from shellyard.runner.sandbox.log_root import LogRoot

COMMAND = "python bench/bench_log_root.py"
NAMES = ("stdout", "stderr", "status")
FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
#: workspaces running at once in the concurrent part
CONCURRENT = 8


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def _runner_once(
    runner: LocalRunner, execution_id: str, workspace_id: str = "bench"
) -> tuple[float, float, float]:
    """(own CPU, children's CPU, wall) seconds of one start → wait of ``true``."""
    own, kids, wall = time.process_time(), _children_cpu(), time.perf_counter()
    request = StartRequest(execution_id=execution_id, workspace_id=workspace_id, command="true")
    await runner.start(request)
    result = await runner.wait(execution_id, 30)
    if result.exit_code != 0:
        raise RuntimeError(f"start of true ended {result.state}: {result.error}")
    return time.process_time() - own, _children_cpu() - kids, time.perf_counter() - wall


async def runner_part(
    root: Path, rounds: int, warmup: int, profile: Path | None = None
) -> dict[str, Any]:
    with warm_count("0"):
        runner = LocalRunner(root)
    await runner.startup()
    box = runner._sandboxes
    after, before = box.logs, LogRoot(runner.root)  # ``before``: never opened
    assert after._tree is not None, "no copy of the root (not root?)"
    samples: dict[str, dict[str, list[float]]] = {
        side: {"own_ms": [], "children_ms": [], "wall_ms": []} for side in ("after", "before")
    }
    spy = PySpy(os.getpid(), profile / "runner.txt" if profile else None)
    try:
        await runner.ensure_workspace("bench")
        for index in range(warmup + rounds):
            if index == warmup:
                spy.__enter__()
            order = ("after", "before") if index % 2 == 0 else ("before", "after")
            for side in order:
                box.logs = after if side == "after" else before
                own, kids, wall = await _runner_once(runner, f"{side}-{index}")
                if index >= warmup:
                    for part, value in zip(samples[side], (own, kids, wall), strict=True):
                        samples[side][part].append(1000 * value)
        result = _medians(samples)
        result["concurrent"] = await _concurrent(runner, after, before, max(4, rounds // 10))
    finally:
        spy.__exit__()
        box.logs = after
        await runner.aclose()
    if profile is not None:
        result["profile"] = _log_shares(profile / "runner.txt")
    return result


async def _concurrent(
    runner: LocalRunner, after: LogRoot, before: LogRoot, batches: int
) -> dict[str, Any]:
    """CONCURRENT workspaces' start → wait of ``true`` at once, batches alternating between the
    sides: executions per second of each, the event loop blocked in a per-spawn copy's close
    being time no other start is served."""
    spaces = [f"bench-{i}" for i in range(CONCURRENT)]
    for workspace_id in spaces:
        await runner.ensure_workspace(workspace_id)
    walls: dict[str, list[float]] = {"after": [], "before": []}
    for index in range(2 + batches):
        for side in ("after", "before") if index % 2 == 0 else ("before", "after"):
            runner._sandboxes.logs = after if side == "after" else before
            start = time.perf_counter()
            await asyncio.gather(
                *(_runner_once(runner, f"c-{side}-{index}-{ws}", ws) for ws in spaces)
            )
            if index >= 2:  # the first two: warm-up
                walls[side].append(time.perf_counter() - start)
    rate = {side: CONCURRENT * len(w) / sum(w) for side, w in walls.items()}
    return {
        "workspaces": CONCURRENT,
        "batches": batches,
        "after_per_s": round(rate["after"], 1),
        "before_per_s": round(rate["before"], 1),
        "ratio": round(rate["after"] / rate["before"], 3),
    }


def _log_shares(path: Path) -> dict[str, Any]:
    """The event loop's busy samples (py-spy, every side together) spent opening the logs:
    through a copy per call (``open_unnamed``: before) or through the runner's (after)."""
    busy = before = after = 0
    for line in path.read_text(errors="replace").splitlines() if path.exists() else ():
        stack, _, count_text = line.rpartition(" ")
        frames = stack.split(";")
        if not count_text.isdigit() or not frames[0].endswith("MainThread") or len(frames) < 2:
            continue
        idle = frames[-1].startswith(("EpollSelector.select", "select.epoll"))
        if idle or "PySpy.__enter__" in stack:
            continue  # the loop idle in epoll, or the profiler's start
        count = int(count_text)
        busy += count
        if "open_unnamed (" in stack:
            before += count
        elif "open_files (" in stack:
            after += count
    share = 100 / max(1, busy)
    return {
        "busy_samples": busy,
        "before_open_pct": round(before * share, 1),
        "after_open_pct": round(after * share, 1),
    }


def open_part(root: Path, rounds: int, warmup: int) -> dict[str, Any]:
    root.mkdir()
    logs = LogRoot(root)
    logs.open()
    samples: dict[str, dict[str, list[float]]] = {
        side: {"cpu_us": [], "wall_us": []} for side in ("after", "before")
    }
    try:
        for index in range(warmup + rounds):
            order = ("after", "before") if index % 2 == 0 else ("before", "after")
            for side in order:
                folder = root / "executions" / f"{side}-{index}"
                folder.mkdir(parents=True)
                cpu, wall = time.thread_time(), time.perf_counter()
                if side == "after":
                    fds = logs.open_files(folder, NAMES, FLAGS, 0o600)
                else:
                    fds = open_unnamed(folder, NAMES, FLAGS, 0o600)
                for fd in fds:
                    os.close(fd)
                cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
                if index >= warmup:
                    samples[side]["cpu_us"].append(1e6 * cpu)
                    samples[side]["wall_us"].append(1e6 * wall)
    finally:
        logs.close()
    return _medians(samples)


def _medians(samples: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(next(iter(samples["after"].values())))}
    for side, parts in samples.items():
        out[side] = {part: round(statistics.median(values), 3) for part, values in parts.items()}
    out["ratio"] = {
        part: round(out["after"][part] / out["before"][part], 3)
        for part in samples["after"]
        if out["before"][part]
    }
    # the median of the per-round differences (after − before): the load falls on both alike
    out["difference"] = {}
    for part, values in samples["after"].items():
        pairs = zip(values, samples["before"][part], strict=True)
        out["difference"][part] = round(statistics.median(a - b for a, b in pairs), 3)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    if os.geteuid() != 0:
        raise SystemExit("root only: the kernel refuses a detached copy otherwise")
    rounds = 60 if args.quick else 300
    warmup = 10 if args.quick else 30
    home = make_home()
    try:
        opens = open_part(home / "opens", rounds * 4, warmup)
        spawns = asyncio.run(runner_part(home / "runner", rounds, warmup, args.profile))
    finally:
        remove_home(home)
    metrics = [
        metric(
            "log_root.runner_cpu",
            "runner CPU per cold start → wait of true, one copy of the root, ms",
            spawns["after"]["own_ms"],
            "ms",
            baseline_label="a copy of each execution's folder per spawn (before), same run",
            baseline_value=spawns["before"]["own_ms"],
            target="≤ 1.0× (no dearer)",
            kind="ratio_max",
            limit=1.0,
        ),
        metric(
            "log_root.open_cpu",
            "CPU of opening one execution's three logs, one copy of the root, µs",
            opens["after"]["cpu_us"],
            "µs",
            baseline_label="open_unnamed: a copy per call (before), same run",
            baseline_value=opens["before"]["cpu_us"],
            target="info",
            kind="info",
        ),
    ]
    return {
        "name": "log_root",
        "title": "A sandbox's logs through one copy of the runner's root vs one per spawn",
        "command": COMMAND + (" --quick" if args.quick else ""),
        "metrics": metrics,
        "details": {"runner": spawns, "open": opens, "load_average": os.getloadavg()},
    }


if __name__ == "__main__":
    cli("log_root", run, __doc__ or "")

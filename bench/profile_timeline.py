"""Where one foreground ``run_shell(true)`` of the in-process API spends its wall time: the
median offset (ms from the call) at which each step of the run begins (``<``) and ends
(``>``), over RUNS back-to-back runs on SQLite + the local runner, beside a minimal bwrap
spawn's p50 timed in the same process (docs/benchmarks.md §46). Steps are wrapped in place
(store transactions, the runner's start, the warm take and the next one's making, the end's
kill-and-wait, cgroups and result; the snapshot commit sits between ``cgroups_finish>`` and
``result<``); each wrapper costs a few µs.

    PYTHONPATH=src:bench .venv/bin/python bench/profile_timeline.py [RUNS]
"""

from __future__ import annotations

import asyncio
import functools
import statistics
import sys
import time
from typing import Any

from common import SEED_100_FILES, MinimalBwrap, make_home, remove_home
from shellyard.config import Settings
from shellyard.contract.executions import RunShellRequest
from shellyard.control.plane import build
from shellyard.runner.limits import cgroups, watcher
from shellyard.runner.local import LocalRunner
from shellyard.runner.sandbox import supervise, warm
from shellyard.store import Store

marks: list[tuple[str, float]] = []


def _mark(name: str) -> None:
    marks.append((name, time.perf_counter()))


def _wrap(owner: Any, attr: str, name: str) -> None:
    real = getattr(owner, attr)
    if asyncio.iscoroutinefunction(real):

        @functools.wraps(real)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            _mark(name + "<")
            try:
                return await real(*args, **kwargs)
            finally:
                _mark(name + ">")

        setattr(owner, attr, timed_async)
    else:

        @functools.wraps(real)
        def timed(*args: Any, **kwargs: Any) -> Any:
            _mark(name + "<")
            try:
                return real(*args, **kwargs)
            finally:
                _mark(name + ">")

        setattr(owner, attr, timed)


def _instrument() -> None:
    for attr in ("submit_execution", "start_execution", "finish_execution"):
        _wrap(Store, attr, attr)
    _wrap(LocalRunner, "start", "runner_start")
    _wrap(supervise.Supervisor, "launch", "launch")
    _wrap(supervise.Supervisor, "_watch", "pidfd_watch")
    _wrap(supervise.Supervisor, "_finish", "finish")
    _wrap(supervise.Supervisor, "_write_result", "result")
    _wrap(supervise.processes, "kill_and_wait", "kill_wait")
    _wrap(warm.WarmPool, "take", "take")
    _wrap(warm.WarmPool, "_prepare", "prepare_next_warm")
    _wrap(watcher.Guard, "watch", "limits_watch")
    _wrap(cgroups.CgroupTree, "finish", "cgroups_finish")


async def main(runs: int) -> None:
    home = make_home()
    plane = await build(Settings(home=home / "home"))
    minimal, spawns = MinimalBwrap(), []
    request = RunShellRequest(command="true")
    try:
        await plane.executions.run_shell(RunShellRequest(command=SEED_100_FILES))
        for _ in range(20):
            await plane.executions.run_shell(request)
        _instrument()
        offsets: dict[str, list[float]] = {}
        for _ in range(runs):
            spawns.append(minimal.run() * 1000)
            marks.clear()
            began = time.perf_counter()
            await plane.executions.run_shell(request)
            _mark("answered")
            first: dict[str, float] = {}
            for name, at in marks:
                first.setdefault(name, (at - began) * 1000)
            for name, offset in first.items():
                offsets.setdefault(name, []).append(offset)
    finally:
        await plane.aclose()
        remove_home(home)
    for name, values in sorted(offsets.items(), key=lambda item: statistics.median(item[1])):
        print(f"{name:22s} {statistics.median(values):7.2f} ms  (in {len(values)} runs)")
    print(f"minimal bwrap spawn p50 {statistics.median(spawns):.2f} ms")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 200))

"""The in-process API's foreground ``run_shell(true)``, two trees against each other in one
run (docs/benchmarks.md §46): one worker process per tree (this file with ``--worker``, run
from that tree's folder), each a ControlPlane on SQLite + the local runner, driven in
alternating batches so both see the same load. Per run: wall time (p50) beside a minimal bwrap
spawn timed in the same worker (the round trip's baseline), the **event loop thread's CPU**
during the call (the part of the round trip no other core can take), and the worker's whole
CPU per run (the spawns' parent side excluded).

    PYTHONPATH=src:bench .venv/bin/python bench/bench_api_against.py OTHER_TREE [BATCHES] [SIZE]

OTHER_TREE: a folder with ``src`` and ``bench`` (``git archive main src bench | tar -x -C
OTHER_TREE``); this checkout is the other side.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parent.parent


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def worker() -> None:
    from common import SEED_100_FILES, MinimalBwrap, make_home, remove_home
    from shellyard.config import Settings
    from shellyard.contract.executions import RunShellRequest
    from shellyard.control.plane import build

    home = make_home()
    plane = await build(Settings(home=home / "home"))
    minimal = MinimalBwrap()
    request = RunShellRequest(command="true")
    await plane.executions.run_shell(RunShellRequest(command=SEED_100_FILES))
    for _ in range(20):
        await plane.executions.run_shell(request)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    try:
        while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
            api: list[float] = []
            mini: list[float] = []
            loop_cpu = spawn_cpu = 0.0
            began = _cpu()
            for _ in range(int(line)):
                thread, start = time.thread_time(), time.perf_counter()
                result = await plane.executions.run_shell(request)
                api.append(time.perf_counter() - start)
                loop_cpu += time.thread_time() - thread
                if result.state != "completed":
                    raise RuntimeError(f"run of true ended {result.state}: {result.error}")
                before = _cpu()
                # a busy host's rare refusal of the minimal spawn: that sample is dropped
                with contextlib.suppress(RuntimeError):
                    mini.append(minimal.run())
                spawn_cpu += _cpu() - before
            await asyncio.sleep(0.05)  # the batch's last warm sandbox, made
            answer = {"api": api, "mini": mini, "loop_cpu": loop_cpu, "n": len(api)}
            print(json.dumps({**answer, "cpu": _cpu() - began - spawn_cpu}), flush=True)
    finally:
        await plane.aclose()
        remove_home(home)


def _answer(out: IO[str], start: str) -> str:
    while line := out.readline():
        if line.startswith(start):
            return line
    raise RuntimeError("a worker ended early (its stderr is in the worker-*.err files)")


def drive(other: Path, batches: int, size: int) -> dict[str, Any]:
    trees = {"other": other, "this": REPO}
    workers: dict[str, subprocess.Popen[str]] = {}
    for name, tree in trees.items():
        workers[name] = subprocess.Popen(
            [sys.executable, str(REPO / "bench" / "bench_api_against.py"), "--worker"],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": f"{tree}/src:{tree}/bench"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(f"/tmp/bench-api-against-worker-{name}.err", "w"),  # noqa: SIM115
            text=True,
        )
    sums: dict[str, dict[str, Any]] = {
        name: {"api": [], "mini": [], "loop_cpu": 0.0, "cpu": 0.0, "n": 0} for name in trees
    }
    load = [open("/proc/loadavg").read().split()[0]]  # noqa: SIM115
    try:
        for worker_ in workers.values():
            _answer(worker_.stdout, "ready")  # type: ignore[arg-type]
        for batch in range(batches):
            for name in list(trees) if batch % 2 == 0 else list(trees)[::-1]:
                proc = workers[name]
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(f"{size}\n")
                proc.stdin.flush()
                got = json.loads(_answer(proc.stdout, "{"))
                for key in ("api", "mini", "loop_cpu", "cpu", "n"):
                    sums[name][key] += got[key]
    finally:
        for proc in workers.values():
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=60)
    load.append(open("/proc/loadavg").read().split()[0])  # noqa: SIM115
    out: dict[str, Any] = {"load_1min": " -> ".join(load), "at_utc": time.strftime("%H:%M")}
    for name, got in sums.items():
        api, mini = statistics.median(got["api"]) * 1000, statistics.median(got["mini"]) * 1000
        out[name] = {
            "api_p50_ms": round(api, 2),
            "minimal_bwrap_p50_ms": round(mini, 2),
            "api_over_minimal": round(api / mini, 3),
            "loop_thread_cpu_ms": round(got["loop_cpu"] * 1000 / got["n"], 2),
            "process_cpu_ms": round(got["cpu"] * 1000 / got["n"], 2),
            "runs": got["n"],
        }
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        asyncio.run(worker())
    else:
        args = sys.argv[1:]
        batches = int(args[1]) if len(args) > 1 else 30
        size = int(args[2]) if len(args) > 2 else 20
        print(json.dumps(drive(Path(args[0]).resolve(), batches, size)))

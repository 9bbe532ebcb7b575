"""System calls of ``shellyard serve`` per foreground ``run_shell(true)``: ``strace -f`` attached
to the server after WARMUP runs, over RUNS runs driven through the SDK, then detached.

Every thread of the server and every child it forks is followed (``-ff``, one file each); a
child's calls count until its ``execve`` (what the server's fork does before the sandbox's
program runs, reported apart), the program's own (the launcher, bwrap, the shell, all they
clone) do not. strace slows each call, so which runs find their warm sandbox ready differs
from a native run (the number of spawns, ``execve`` of the server's children, is printed), and
the calls that follow the wall clock (a watcher's tick, the loop's waits) are not per run.

    PYTHONPATH=src:bench .venv/bin/python bench/strace_run.py [--runs N] [--src SRC] [--out J]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from common import make_home, remove_home, start_server, stop_server
from shellyard.home import read_info
from shellyard.sdk.client import AsyncClient

WARMUP = 30
CLONED = re.compile(r"= (\d+)\s*$")
CALL = re.compile(r"^(?:\d+:\d+:\d+\.\d+ )?(?:<\.\.\. )?([a-z0-9_]+)[( ]")


def count(
    directory: Path,
) -> tuple[collections.Counter[str], collections.Counter[str], int]:
    """Calls by name of the server's threads, of its children up to their execve, and the
    number of those execve (spawns). A process cloned after an execve (bwrap's sandbox, the
    shell's command) is the sandbox's, as is all it clones in turn."""
    segments: dict[int, tuple[list[str], list[int], list[int]]] = {}
    execs: set[int] = set()
    for path in directory.iterdir():
        own: list[str] = []
        before: list[int] = []
        after: list[int] = []
        execed = False
        for line in path.read_text(errors="replace").splitlines():
            match = CALL.match(line)
            if match is None or line.startswith(("+++", "---")):
                continue
            name = match.group(1)
            child = CLONED.search(line) if name.startswith(("clone", "fork", "vfork")) else None
            if child is not None:
                (after if execed else before).append(int(child.group(1)))
            if name == "execve" and line.rstrip().endswith("= 0"):
                execed = True
            if not execed:
                own.append(name)
        pid = int(path.name.rsplit(".", 1)[1])
        segments[pid] = (own, before, after)
        if execed:
            execs.add(pid)
    foreign: set[int] = set()
    changed = True
    while changed:
        changed = False
        for pid, (_own, before, after) in segments.items():
            found = set(after) | (set(before) if pid in foreign else set())
            if not found <= foreign:
                foreign |= found
                changed = True
    calls: collections.Counter[str] = collections.Counter()
    forks: collections.Counter[str] = collections.Counter()
    for pid, (own, _before, _after) in segments.items():
        if pid not in foreign:
            (forks if pid in execs else calls).update(own)
    return calls, forks, len(execs - foreign)


async def drive(
    runs: int, src: str, out_dir: Path
) -> tuple[collections.Counter[str], collections.Counter[str], int]:
    home = make_home()
    try:
        pid = start_server(home, {"PYTHONPATH": src})
        info = read_info(home)
        assert info is not None
        client = AsyncClient(info.url, info.token)
        for _ in range(WARMUP):
            await client.run("true")
        tracer = subprocess.Popen(
            ["strace", "-f", "-ff", "-qq", "-o", str(out_dir / "t"), "-p", str(pid)],
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # attached to every thread
        for _ in range(runs):
            result = await client.run("true")
            if result.state != "completed":
                raise RuntimeError(f"run of true ended {result.state}")
        await asyncio.sleep(0.5)  # the last end's work
        tracer.send_signal(signal.SIGINT)
        tracer.wait()
        await client.aclose()
    finally:
        stop_server(home)
        remove_home(home)
    return count(out_dir)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--src", default="src")
    parser.add_argument("--out")
    parser.add_argument("--keep", help="a folder to keep the traces in (one file a thread)")
    args = parser.parse_args()
    out_dir = Path(args.keep or tempfile.mkdtemp(prefix="shellyard-strace-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        calls, forks, spawns = asyncio.run(drive(args.runs, os.path.abspath(args.src), out_dir))
    finally:
        if not args.keep:
            shutil.rmtree(out_dir, ignore_errors=True)
    report: dict[str, object] = {"runs": args.runs, "spawns": spawns}
    print(f"{args.runs} runs, {spawns} execve by the server's children")
    for part, counted in (("threads", calls), ("children before execve", forks)):
        per_run = {name: round(n / args.runs, 2) for name, n in counted.most_common()}
        total = sum(counted.values()) / args.runs
        report[part] = {"total_per_run": round(total, 1), "per_run": per_run}
        print(f"{part}: {total:.1f} calls a run")
        print("  " + ", ".join(f"{n} {v}" for n, v in list(per_run.items())[:30]))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

"""Interactive executions (E13): input → echo on the screen latency, on the local runner (an
in-process ControlPlane) and a direct runner daemon (HTTP on loopback), and the memory an open
terminal costs.

One tty execution runs ``cat`` per runner kind. A sample sends a fresh token
(``execution_input``) and asks ``execution_screen`` until the token shows (the line
discipline's echo, copied by the holder into the log, replayed by the runner's pyte screen).
Beside it, in the same rounds, the baseline: the same write and read on a bare pseudo-terminal
of this process (``os.openpty``, no service at all). Target (issue 30): p50 ≤ 10 ms on both
runners. Memory: the holder process's RSS per open terminal (the runner keeps one pyte screen
more, a few KB for 24×80).

    .venv/bin/python bench/bench_interactive.py [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import select
import sys
import time
from pathlib import Path
from typing import Any

from common import cli, make_home, metric, remove_home, rss_bytes, summary_ms

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from runner_daemon_fixture import start_daemon

from shellyard.config import Settings
from shellyard.contract.executions import ExecutionCancelQuery, ExecutionWait, RunShellRequest
from shellyard.contract.interactive import ExecutionInputRequest
from shellyard.control.plane import ControlPlane, build
from shellyard.runner.protocol import SandboxPolicy

COMMAND = "python bench/bench_interactive.py"


async def echo_on_screen(plane: ControlPlane, execution_id: str, token: str) -> float:
    """Seconds from sending ``token`` to seeing it on the screen."""
    executions = plane.executions
    started = time.perf_counter()
    typed = ExecutionInputRequest(text=token, keys=["Enter"])  # a line each: none wraps
    await executions.send_input(execution_id, typed, None)
    while token not in (await executions.screen(execution_id, None)).text:
        if time.perf_counter() - started > 10:
            raise AssertionError(f"{token} never showed on the screen")
    return time.perf_counter() - started


def bare_pty_echo(master: int, token: str) -> float:
    """The baseline: the same echo on a bare terminal (the kernel's line discipline)."""
    started = time.perf_counter()
    os.write(master, token.encode() + b"\r")
    seen = b""
    while token.encode() not in seen:
        select.select([master], [], [], 5)
        seen += os.read(master, 4096)
    return time.perf_counter() - started


def holder_rss(home: Path, execution_id: str) -> int:
    """RSS of the execution's holder process (its pid file in the execution's folder)."""
    for pid_file in home.rglob(f"executions/{execution_id}/holder.pid"):
        return rss_bytes(int(pid_file.read_text().split()[0]))
    return 0


async def measure(rounds: int) -> dict[str, Any]:
    home = make_home()
    plane = await build(Settings(home=home / "home"))
    daemon = await start_daemon(home / "direct", SandboxPolicy(), subprocess=True)
    master, slave = os.openpty()
    samples: dict[str, list[float]] = {"local": [], "direct": [], "bare": []}
    memory: dict[str, int] = {}
    terminals: dict[str, str] = {}
    try:
        await plane.runners.add_direct("direct", daemon.url, daemon.token)
        for kind, runner_id in (("local", None), ("direct", "direct")):
            ran = await plane.executions.run_shell(
                RunShellRequest(command="cat", tty=True, wait_ms=0, runner_id=runner_id)
            )
            terminals[kind] = ran.execution_id
            await echo_on_screen(plane, ran.execution_id, "warm-up")
        for i in range(rounds):
            for kind, execution_id in terminals.items():
                samples[kind].append(await echo_on_screen(plane, execution_id, f"t{i}x"))
            samples["bare"].append(bare_pty_echo(master, f"b{i}x"))
        for kind, execution_id in terminals.items():
            root = home / "home" if kind == "local" else home / "direct"
            memory[kind] = holder_rss(root, execution_id)
            await plane.executions.send_input(
                execution_id, ExecutionInputRequest(keys=["C-d"]), None
            )
            await plane.executions.wait(execution_id, ExecutionWait(timeout_s=20))
    finally:
        for execution_id in terminals.values():  # none left waiting for input
            await plane.executions.cancel(execution_id, ExecutionCancelQuery(wait_s=20))
        os.close(master)
        os.close(slave)
        await plane.aclose()
        await daemon.stop()
        remove_home(home)
    return {"samples": {k: summary_ms(v) for k, v in samples.items()}, "holder_rss": memory}


def run(args: argparse.Namespace) -> dict[str, Any]:
    rounds = 30 if args.quick else 200
    measured = asyncio.run(measure(rounds))
    stats = measured["samples"]
    metrics = [
        metric(
            f"interactive.echo_{kind}",
            f"execution_input → token on execution_screen, {kind} runner, p50 ms",
            stats[kind]["p50"],
            "ms",
            baseline_label="the same echo on a bare pty of this process, p50 ms",
            baseline_value=stats["bare"]["p50"],
            target="≤ 10 ms",
            kind="abs_max",
            limit=10.0,
        )
        for kind in ("local", "direct")
    ]
    for kind, rss in measured["holder_rss"].items():
        metrics.append(
            metric(
                f"interactive.holder_rss_{kind}",
                f"memory per open terminal: the holder's RSS, {kind} runner, MiB",
                rss / (1 << 20),
                "MiB",
                target="— (info)",
                kind="info",
            )
        )
    return {
        "name": "interactive",
        "title": "Interactive executions: input → screen latency, memory per terminal (E13)",
        "command": COMMAND + (" --quick" if args.quick else ""),
        "metrics": metrics,
        "details": {"rounds": rounds, **measured},
    }


if __name__ == "__main__":
    cli("interactive", run, __doc__ or "")

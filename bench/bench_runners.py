"""Benchmark: round trip of a foreground ``run_shell(true)`` on a ``direct`` and on an ``ssh``
runner (each a runner daemon on this host: loopback HTTP, and a Unix socket behind a real
OpenSSH sshd on loopback), beside SWE-ReX's ``RemoteRuntime.execute(true)`` on loopback
(swe-rex from PyPI in a venv this benchmark builds; its server has no sandbox and keeps no
record). Target (issue 15): each ≤ 2.5× SWE-ReX.

A fourth path, ``direct, start answers at once``, is the same direct daemon registered again
with ``start_wait_s = 0``: the protocol's flow before the one-round-trip ``start`` (start,
wait, a log size per stream), measured in the same run for the before/after comparison.
A fifth, ``local``, is the same ``run_shell(true)`` on the control plane's in-process local
runner: the sandbox and the commit without any wire, the floor a remote runner stands on.

All three are measured interleaved, one sample of each per round in a rotating order, so the
machine's noise falls on all of them alike. The SWE-ReX client runs in a child process of
its venv and times each call itself; this process tells it when (one line per call).

    .venv/bin/python bench/bench_runners.py [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import subprocess as sp
import sys
import tempfile
import time
import venv
from pathlib import Path
from typing import Any

from common import cli, make_home, metric, remove_home, summary_ms

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from runner_daemon_fixture import start_daemon
from sshd_fixture import start_sshd

from shellyard.config import Settings
from shellyard.contract.executions import RunShellRequest
from shellyard.control.plane import ControlPlane, build
from shellyard.runner.protocol import SandboxPolicy

COMMAND = "python bench/bench_runners.py"
SWEREX_VENV = Path(tempfile.gettempdir()) / "shellyard-bench-swerex-venv"
#: swe-rex's RemoteRuntime imports aiohttp, which its package does not require.
SWEREX_PACKAGES = ["swe-rex", "aiohttp"]

SWEREX_CLIENT = r"""
import asyncio, sys, time
from swerex.runtime.remote import RemoteRuntime
from swerex.runtime.abstract import Command

async def main():
    rt = RemoteRuntime(host="http://127.0.0.1", port=int(sys.argv[1]), auth_token=sys.argv[2])
    while not await rt.is_alive():
        await asyncio.sleep(0.1)
    print("ready", flush=True)
    for line in sys.stdin:
        t = time.perf_counter()
        r = await rt.execute(Command(command="true", shell=True))
        dt = time.perf_counter() - t
        assert r.exit_code == 0, r
        print(dt, flush=True)
    await rt.close()

asyncio.run(main())
"""


def swerex_python() -> Path:
    """The venv with swe-rex from PyPI (built on first use, then reused)."""
    python = SWEREX_VENV / "bin" / "python"
    if not python.exists():
        venv.create(SWEREX_VENV, with_pip=False)
    done = sp.run([str(python), "-c", "import swerex.runtime.remote"], capture_output=True)
    if done.returncode != 0:
        uv = Path(sys.executable).parent / "uv"
        installer = [str(uv), "pip", "install", "--python", str(python), "-q"]
        sp.run([*installer, *SWEREX_PACKAGES], check=True)
    return python


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SweRex:
    """A ``swerex-remote`` server and a client child that times one execute per line."""

    def __init__(self, python: Path) -> None:
        port, token = free_port(), secrets.token_hex(16)
        server = python.parent / "swerex-remote"
        self.server = sp.Popen(
            [str(server), "--host", "127.0.0.1", "--port", str(port), "--auth-token", token],
            stdout=sp.DEVNULL,
            stderr=sp.DEVNULL,
        )
        self.client = sp.Popen(
            [str(python), "-c", SWEREX_CLIENT, str(port), token],
            stdin=sp.PIPE,
            stdout=sp.PIPE,
            text=True,
        )
        assert self.client.stdout is not None
        if self.client.stdout.readline().strip() != "ready":
            raise RuntimeError("the SWE-ReX client did not get ready")

    def once(self) -> float:
        assert self.client.stdin is not None and self.client.stdout is not None
        self.client.stdin.write("go\n")
        self.client.stdin.flush()
        return float(self.client.stdout.readline())

    def close(self) -> None:
        if self.client.stdin is not None:
            self.client.stdin.close()
        self.client.wait(10)
        self.server.terminate()
        self.server.wait(10)


async def run_once(plane: ControlPlane, runner_id: str) -> float:
    start = time.perf_counter()
    result = await plane.executions.run_shell(RunShellRequest(command="true", runner_id=runner_id))
    elapsed = time.perf_counter() - start
    if result.state != "completed" or result.exit_code != 0:
        raise RuntimeError(f"run_shell(true) on {runner_id} ended {result.state}: {result.error}")
    return elapsed


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    rounds, warmup = (40, 10) if args.quick else (200, 30)
    load = os.getloadavg()
    t0 = time.monotonic()
    home = make_home()
    policy = SandboxPolicy()
    plane = await build(Settings(home=home / "home", local_policy=policy))
    sshd = await start_sshd(home / "sshd")
    direct = await start_daemon(home / "direct", policy, subprocess=True)
    over_ssh = await start_daemon(home / "ssh", policy, subprocess=True, ssh=sshd)
    swerex = SweRex(swerex_python())
    try:
        await plane.runners.add_direct("direct", direct.url, direct.token)
        await plane.runners.add_direct("direct0", direct.url, direct.token)
        plane.runners.get("direct0").start_wait_s = 0.0  # type: ignore[attr-defined]
        await plane.runners.add_ssh(
            "ssh", over_ssh.address, over_ssh.token, sshd.identity, sshd.known_hosts
        )
        paths: dict[str, Any] = {
            "direct": lambda: run_once(plane, "direct"),
            "direct0": lambda: run_once(plane, "direct0"),
            "local": lambda: run_once(plane, "local"),
            "ssh": lambda: run_once(plane, "ssh"),
            "swerex": lambda: asyncio.to_thread(swerex.once),
        }
        samples: dict[str, list[float]] = {name: [] for name in paths}
        order = list(paths)
        for i in range(warmup + rounds):
            order = order[1:] + order[:1]
            for name in order:
                elapsed = await paths[name]()
                if i >= warmup:
                    samples[name].append(elapsed)
    finally:
        swerex.close()
        await plane.aclose()
        await direct.stop()
        await over_ssh.stop()
        sshd.stop()
        remove_home(home)
    stats = {name: summary_ms(values) for name, values in samples.items()}
    base = stats["swerex"]["p50"]
    rows = [
        metric(
            "runner_direct_p50",
            "run_shell(true) on a direct runner (loopback), p50",
            stats["direct"]["p50"],
            "ms",
            target="≤ 2.5× SWE-ReX remote p50",
            kind="ratio_max",
            limit=2.5,
            baseline_label="SWE-ReX RemoteRuntime.execute(true), loopback, p50",
            baseline_value=base,
        ),
        metric(
            "runner_ssh_p50",
            "run_shell(true) on an ssh runner (sshd on loopback), p50",
            stats["ssh"]["p50"],
            "ms",
            target="≤ 2.5× SWE-ReX remote p50",
            kind="ratio_max",
            limit=2.5,
            baseline_label="SWE-ReX RemoteRuntime.execute(true), loopback, p50",
            baseline_value=base,
        ),
        metric(
            "runner_direct_nowait_p50",
            "run_shell(true) on a direct runner, start answering at once (the old flow), p50",
            stats["direct0"]["p50"],
            "ms",
            target="— (info: before the one-round-trip start)",
            kind="info",
            baseline_label="SWE-ReX RemoteRuntime.execute(true), loopback, p50",
            baseline_value=base,
        ),
        metric(
            "runner_local_p50",
            "run_shell(true) on the in-process local runner (no wire), p50",
            stats["local"]["p50"],
            "ms",
            target="— (info: the sandbox and commit alone)",
            kind="info",
            baseline_label="SWE-ReX RemoteRuntime.execute(true), loopback, p50",
            baseline_value=base,
        ),
    ]
    return {
        "title": "Runners on other hosts: run_shell(true) on direct and ssh runners beside SWE-ReX",
        "command": COMMAND,
        "rounds": rounds,
        "warmup": warmup,
        "load_average": [round(x, 2) for x in load],
        "seconds": round(time.monotonic() - t0, 1),
        "stats_ms": stats,
        "metrics": rows,
    }


if __name__ == "__main__":
    cli(
        "runners",
        lambda args: asyncio.run(measure(args)),
        "run_shell(true) on direct and ssh runners beside SWE-ReX remote",
    )

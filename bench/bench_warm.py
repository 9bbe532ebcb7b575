"""Warm sandboxes: a foreground ``run_shell(true)`` through the in-process API and REST
(``AsyncClient`` to a ``shellyard serve`` process) and a bare LocalRunner (start → wait, no
control plane), each with the warm pool (the default) and without it
(``SHELLYARD_WARM_SANDBOXES=0``), beside the minimal bwrap spawn
``bwrap --ro-bind / / --dev /dev --proc /proc --unshare-all true`` measured in the same run.
All seven are interleaved (one of each per round, rotating order). Targets: REST ≤ 1.5× and
the API ≤ 1.3× the minimal spawn.

    .venv/bin/python bench/bench_warm.py [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from bench_roundtrip import api_once, rest_once
from common import MinimalBwrap, cli, make_home, metric, remove_home, stop_server, summary_ms
from shellyard.config import Settings
from shellyard.control.plane import ControlPlane, build
from shellyard.home import ensure_server
from shellyard.runner.local import LocalRunner
from shellyard.runner.protocol import StartRequest
from shellyard.sdk.client import AsyncClient

COMMAND = "python bench/bench_warm.py"


@contextlib.contextmanager
def warm_count(value: str | None) -> Iterator[None]:
    """SHELLYARD_WARM_SANDBOXES for what starts inside (read when a runner is made)."""
    old = os.environ.get("SHELLYARD_WARM_SANDBOXES")
    if value is None:
        os.environ.pop("SHELLYARD_WARM_SANDBOXES", None)
    else:
        os.environ["SHELLYARD_WARM_SANDBOXES"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SHELLYARD_WARM_SANDBOXES", None)
        else:
            os.environ["SHELLYARD_WARM_SANDBOXES"] = old


async def minimal_once(minimal: MinimalBwrap) -> float:
    return minimal.run()


class RunnerOnly:
    """A LocalRunner's own start → wait of ``true``, no control plane (no record, no
    store): what the runner and its sandbox cost, to split the API's time."""

    def __init__(self, root: Path) -> None:
        self.runner = LocalRunner(root)
        self.count = 0

    async def start(self) -> None:
        await self.runner.startup()
        await self.runner.ensure_workspace("bench")

    async def once(self) -> float:
        self.count += 1
        execution_id = f"bench-{self.count}"
        start = time.perf_counter()
        await self.runner.start(
            StartRequest(execution_id=execution_id, workspace_id="bench", command="true")
        )
        result = await self.runner.wait(execution_id, 30)
        elapsed = time.perf_counter() - start
        if result.exit_code != 0:
            raise RuntimeError(f"runner start of true ended {result.state}: {result.error}")
        return elapsed


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    rounds = 40 if args.quick else 200
    warmup = 5 if args.quick else 20
    names = ("api", "api_cold", "rest", "rest_cold", "runner", "runner_cold")
    homes = {name: make_home() for name in names}
    planes: dict[str, ControlPlane] = {}
    bare: dict[str, RunnerOnly] = {}
    clients: dict[str, AsyncClient] = {}
    try:
        for name, count in (("api", None), ("api_cold", "0")):
            with warm_count(count):
                planes[name] = await build(Settings(home=homes[name] / "home"))
        for name, count in (("rest", None), ("rest_cold", "0")):
            with warm_count(count):
                info = ensure_server(homes[name], timeout_s=180)  # a loaded machine
            clients[name] = AsyncClient(info.url, info.token)
        for name, count in (("runner", None), ("runner_cold", "0")):
            with warm_count(count):
                bare[name] = RunnerOnly(homes[name] / "runner")
            await bare[name].start()
        minimal = MinimalBwrap()
        runners: dict[str, Callable[[], Awaitable[float]]] = {
            "minimal": lambda: minimal_once(minimal),
            "api": lambda: api_once(planes["api"]),
            "api_cold": lambda: api_once(planes["api_cold"]),
            "rest": lambda: rest_once(clients["rest"]),
            "rest_cold": lambda: rest_once(clients["rest_cold"]),
            "runner": bare["runner"].once,
            "runner_cold": bare["runner_cold"].once,
        }
        samples: dict[str, list[float]] = {name: [] for name in runners}
        order = list(runners)
        for _ in range(warmup):
            for name in order:
                await runners[name]()
        for index in range(rounds):
            shift = index % len(order)
            for name in order[shift:] + order[:shift]:
                samples[name].append(await runners[name]())
                # an agent reads the result before its next command: the pool's next
                # sandbox is made in that gap (a few ms), as it is between real calls
                await asyncio.sleep(0.005)
        warm_stats = dict(planes["api"].runners.get("local")._runs.warm.stats)
    finally:
        for client in clients.values():
            await client.aclose()
        for plane in planes.values():
            await plane.aclose()
        for only in bare.values():
            await only.runner.aclose()
        for name in ("rest", "rest_cold"):
            stop_server(homes[name])
        for home in homes.values():
            remove_home(home)
    stats = {name: summary_ms(values) for name, values in samples.items()}
    floor = stats["minimal"]["p50"]
    label = "minimal bwrap --unshare-all true, p50"

    def row(id: str, text: str, key: str, limit: float | None) -> dict[str, Any]:
        return metric(
            id, text, stats[key]["p50"], "ms", baseline_label=label, baseline_value=floor,
            target=f"≤ {limit}× the baseline" if limit else "—",
            kind="ratio_max" if limit else "info", limit=limit,
        )  # fmt: skip

    metrics = [
        row("warm.api.p50", "Python API run_shell(true), warm pool, p50", "api", 1.3),
        row("warm.api_cold.p50", "Python API run_shell(true), no warm pool, p50", "api_cold",
            None),
        row("warm.rest.p50", "REST run(true), warm pool, p50", "rest", 1.5),
        row("warm.rest_cold.p50", "REST run(true), no warm pool, p50", "rest_cold", None),
        row("warm.runner.p50", "LocalRunner start → wait (no control plane), warm, p50",
            "runner", None),
        row("warm.runner_cold.p50", "LocalRunner start → wait, no warm pool, p50",
            "runner_cold", None),
    ]  # fmt: skip
    return {
        "name": "warm",
        "title": "Warm sandboxes: run_shell(true) with and without the pool",
        "command": COMMAND + (" --quick" if args.quick else ""),
        "metrics": metrics,
        "details": {"rounds": rounds, "latency_ms": stats, "warm_pool": warm_stats},
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    return asyncio.run(measure(args))


if __name__ == "__main__":
    cli("warm", run, __doc__ or "")

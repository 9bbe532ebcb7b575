"""The warm pool's bound and its memory check (runner/sandbox/warm.py; docs/operations.md
"Warm sandboxes", docs/benchmarks.md §65). Real bubblewrap: the sandboxes counted are made."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
from test_warm_sandbox import _local_runner, _run_direct, warm_processes


async def test_the_default_pool_serves_sixteen_workspaces_and_no_more(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2 (a bounded count per runner), E1: with the default bound, 16 workspaces that ran
    a command each all have their next sandbox waiting (16 agents' commands all start warm;
    with 8 places, half started cold), and a 17th finds the pool full: none is made for it
    while the others are young (no spawn thrown away), so the runner holds at most 16."""
    from shellyard.runner.sandbox import warm

    monkeypatch.delenv("SHELLYARD_WARM_SANDBOXES", raising=False)
    runner = await _local_runner(home / "r")
    pool = runner._runs.warm
    pool.swap_after_s = 3600.0  # every waiting one is young: none makes room
    stamp = f"{os.getpid()}-{time.time_ns()}"
    workspaces = [f"ws-bound-{i}-{stamp}" for i in range(17)]
    try:
        assert pool.count == warm.DEFAULT_COUNT == 16
        for number, workspace in enumerate(workspaces[:16]):
            await _run_direct(runner, workspace, f"bound{number}")
        await _settle(pool, lambda: len(pool.waiting()) >= 16)
        assert set(pool.waiting()) == set(workspaces[:16])
        await _run_direct(runner, workspaces[16], "bound16")
        await _settle(pool, lambda: pool.stats["full"] >= 1)
        assert set(pool.waiting()) == set(workspaces[:16])
        assert pool.stats["full"] == 1 and pool.stats["discarded_full"] == 0
        assert len(set(warm_processes(*workspaces).values())) == 16
    finally:
        await runner.aclose()
    assert not warm_processes(*workspaces)


async def test_the_memory_check_is_read_at_most_every_interval(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2 (warm sandboxes go under memory pressure): /proc/meminfo is read at most once per
    ``MEMORY_CHECK_S`` whatever the number of makings (16 agents made ~80 a second, each read
    it on the event loop's thread), and pressure that comes on is still seen after it."""
    from shellyard.runner.sandbox import warm

    runner = await _local_runner(home / "r")
    pool = runner._runs.warm
    reads: list[bool] = []
    real = warm.memory_low

    def counted() -> bool:
        reads.append(real())
        return reads[-1]

    monkeypatch.setattr(warm, "memory_low", counted)
    try:
        first = pool._memory_low()
        for _ in range(50):
            assert pool._memory_low() == first
        assert len(reads) == 1
        monkeypatch.setattr(warm, "MEMORY_LOW_FRACTION", 1.01)  # every host is short now
        await asyncio.sleep(warm.MEMORY_CHECK_S)
        assert pool._memory_low() is True and len(reads) == 2
    finally:
        await runner.aclose()


async def _settle(pool: Any, done: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)

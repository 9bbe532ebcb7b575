"""Sandboxes run SCHED_BATCH (docs/decisions.md "Sandboxes scheduled SCHED_BATCH",
docs/limits.md), as a command sees it from inside bubblewrap (/proc/$$/sched's ``policy``:
0 SCHED_OTHER, 3 SCHED_BATCH): a cold foreground command, one that took a warm sandbox,
a background one, on the local runner and a direct runner daemon; interactive ones (a pipe,
a terminal) keep the kernel's default, and so does every sandbox with
``SHELLYARD_SANDBOX_SCHED=other``. Real launcher, real bwrap."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from conftest import Yard
from shellyard.config import Settings
from shellyard.contract.executions import (
    ExecutionLogsQuery,
    RunShellRequest,
)
from shellyard.control.plane import build

#: the policy of the command's shell, and a child's (inherited)
POLICY = (
    "sed -n 's/^policy *: *//p' /proc/$$/sched; sh -c 'sed -n s/^policy.*:\\ *//p /proc/$$/sched'"
)
OTHER, BATCH = "0", "3"


async def policies(yard: Yard, execution_id: str) -> list[str]:
    logs = await yard.plane.executions.logs(execution_id, ExecutionLogsQuery())
    return logs.data.replace("\r", "").split()


async def test_foreground_warm_and_background_commands_run_batch(yard: Yard) -> None:
    """The first command (a cold spawn), the next ones (warm sandboxes, made ahead: their
    waiter and bwrap were batch before the command existed), a background one: all batch,
    the shell and what it forks."""
    cold = await yard.run(POLICY)
    assert cold.exit_code == 0 and cold.stdout.split() == [BATCH, BATCH], cold
    taken = 0
    for _ in range(3):
        await asyncio.sleep(0.3)  # the next warm sandbox is made meanwhile
        warm = await yard.run(POLICY)  # the same agent's workspace
        assert warm.exit_code == 0 and warm.stdout.split() == [BATCH, BATCH], warm
        meta = (yard.runner_root / "executions" / warm.execution_id / "meta.json").read_text()
        taken += '"sandbox_id": "warm-' in meta
    assert taken >= 1, "no command took a warm sandbox"
    background = await yard.run(POLICY, background=True)
    assert (await yard.ended(background.execution_id)).exit_code == 0
    assert await policies(yard, background.execution_id) == [BATCH, BATCH]


async def test_interactive_commands_keep_the_default_policy(yard: Yard) -> None:
    """E13: a pipe and a terminal someone types into are not batch (docs/decisions.md)."""
    for tty in (False, True):
        ran = await yard.run(POLICY, interactive=True, tty=tty, wait_ms=0)
        assert (await yard.ended(ran.execution_id)).exit_code == 0
        assert await policies(yard, ran.execution_id) == [OTHER, OTHER], tty


async def test_the_setting_other_keeps_every_sandbox_default(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SHELLYARD_SANDBOX_SCHED=other: cold and warm sandboxes are SCHED_OTHER."""
    monkeypatch.setenv("SHELLYARD_SANDBOX_SCHED", "other")
    plane = await build(Settings(home=home / "home"))
    try:
        seen: list[Any] = []
        for _ in range(3):
            ran = await plane.executions.run_shell(RunShellRequest(command=POLICY))
            assert ran.exit_code == 0, ran
            seen += ran.stdout.split()
            await asyncio.sleep(0.3)
        assert seen == [OTHER] * 6
        assert plane.runners.get("local")._runs.warm.stats["taken"] >= 1
    finally:
        await plane.aclose()

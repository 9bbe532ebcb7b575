"""A full disk is an outcome, not a crash; every input that cannot run gets a terminal
record; records stay bounded (R2, E1, E6, T2; docs/limits.md "Full disk, long commands and
bounded records").

Real bubblewrap sandboxes on the in-process local runner and a runner daemon; the full-disk
cases mount a real tmpfs as the home (root needed, skipped with the reason otherwise)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import Yard
from shellyard.contract.executions import ExecutionState

MIB = 1 << 20


async def settle(yard: Yard, execution_id: str, timeout_s: float = 120) -> Any:
    view = await yard.plane.executions.wait(execution_id, timeout_s)
    assert view.state.terminal, view
    return view


# ---------------------------------------------------------------- E1: long commands


async def test_a_command_longer_than_the_kernel_takes_runs_and_frees_the_writer(
    yard: Yard,
) -> None:
    """E1: a ``bash -c`` text of 300 KiB (over MAX_ARG_STRLEN, 128 KiB: execve refuses it
    with E2BIG) runs like any other command, with the same shell semantics; the workspace's
    writer is free afterwards."""
    filler = "x" * (300 << 10)
    command = f"X='{filler}'\necho ${{#X}} \"$0\"\ncd /tmp && pwd\nexit 3"
    long = await yard.run(command, wait_ms=30000)
    assert long.state == ExecutionState.completed, long
    assert long.exit_code == 3
    assert long.stdout == f"{len(filler)} bash\n/tmp\n"
    after = await yard.run("echo next")
    assert after.state == ExecutionState.completed and after.stdout == "next\n"


async def test_a_spawn_the_kernel_refuses_ends_failed_and_frees_the_writer(
    yard: Yard,
) -> None:
    """Every input that cannot run gets a terminal record: when the spawn itself fails (here
    the sandbox's program is missing: ENOENT from execve) the execution ends ``failed`` with
    the reason, nothing is left queued, and the workspace takes the next command."""
    if yard.daemon is not None:
        pytest.skip("the fault is injected into the in-process runner's spawn")
    first = await yard.run("echo one")
    sandboxes = yard.runner._runs.sandboxes
    saved = sandboxes.launcher, sandboxes.bwrap
    if saved[0] is None:
        pytest.skip("this host runs sandboxes without the launcher (launch.c did not build)")
    # The first program of the spawn's argv is gone: execve fails with ENOENT.
    sandboxes.launcher = Path("/nonexistent/launch")
    try:
        broken = await yard.run("echo never")
    finally:
        sandboxes.launcher, sandboxes.bwrap = saved
    assert broken.state == ExecutionState.failed, broken
    view = await yard.plane.executions.status(broken.execution_id)
    assert view.error is not None and "could not be started" in view.error, view
    assert "No such file or directory" in view.error
    again = await yard.run("echo two")
    assert again.state == ExecutionState.completed and again.stdout == "two\n"
    assert again.workspace_id == first.workspace_id

"""Durability (E9, E11): the control plane is killed with SIGKILL while executions run, a
runner daemon goes away and comes back, a runner forgets an execution."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from runner_daemon_fixture import start_daemon

from conftest import kill_server, open_yard, processes_of
from shellyard.contract.executions import (
    ExecutionCancelQuery,
    ExecutionLogsQuery,
    ExecutionState,
    ExecutionWait,
    RunShellRequest,
)
from shellyard.runner.protocol import SandboxPolicy
from shellyard.sdk.client import Client


@pytest.mark.parametrize("runner", ["local", "direct"])
async def test_kill9_control_plane_while_executions_run(served_home: Path, runner: str) -> None:
    """E11: records, logs, exit codes and snapshots survive; executions finish; nothing ran
    twice. Foreground and background both, plus one that ends while the plane is down."""
    home = served_home
    daemon = None
    runner_id = None
    if runner == "direct":
        daemon = await start_daemon(home / "daemon", SandboxPolicy(), subprocess=True)
        runner_id = "remote"
    client = Client.for_home(home)
    if daemon is not None:
        client._http.post(  # the REST registration the CLI's 'runner add' uses
            "/v1/runners",
            json={"runner_id": "remote", "address": daemon.url, "token": daemon.token},
        ).raise_for_status()
    fg = client.run("sleep 2; echo fg >> runs.txt; echo fg-out", wait_ms=200, runner_id=runner_id)
    assert fg.state == ExecutionState.running
    # A second writer in the same workspace queues behind the first (W1) and must run
    # exactly once across the crash too.
    bg = client.run(
        "sleep 1; echo bg >> runs.txt; echo bg-out; exit 5",
        background=True,
        queue=True,
        runner_id=runner_id,
    )
    kill_server(home)
    if runner == "local":
        assert processes_of(fg.execution_id), "the sandbox must outlive the control plane"
    await asyncio.sleep(2.5)  # fg finishes while nobody watches
    client = Client.for_home(home)  # starts a new control plane on the same home
    fg_view = client.wait(fg.execution_id, 30)
    bg_view = client.wait(bg.execution_id, 30)
    assert fg_view.state == ExecutionState.completed and fg_view.exit_code == 0, fg_view.error
    assert bg_view.state == ExecutionState.completed and bg_view.exit_code == 5, bg_view.error
    assert client.logs(fg.execution_id).data == "fg-out\n"
    assert client.logs(bg.execution_id).data == "bg-out\n"
    assert bg_view.snapshot_seq is not None and fg_view.snapshot_seq is not None
    assert bg_view.snapshot_seq > fg_view.snapshot_seq
    check = client.run("cat runs.txt", runner_id=runner_id)
    assert check.stdout == "fg\nbg\n"  # each ran exactly once, in order
    if daemon is not None:
        await daemon.stop()


async def test_unknown_after_five_failed_queries_then_reconciled(home: Path) -> None:
    """E9: a runner that cannot be asked: retries against the same id, unknown after 5
    consecutive failures, reconciled (with a trace) when the runner answers again."""
    plane, _, _ = await open_yard(home, "local")
    daemon = await start_daemon(home / "daemon", SandboxPolicy(), subprocess=True)
    try:
        await plane.runners.add_direct("remote", daemon.url, daemon.token)
        started = await plane.executions.run_shell(
            RunShellRequest(command="sleep 2; echo done", runner_id="remote", background=True)
        )
        daemon.kill()
        view = await plane.executions.wait(started.execution_id, ExecutionWait(timeout_s=30))
        assert view.state == ExecutionState.unknown
        assert view.was_unknown
        await daemon.restart()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            view = await plane.executions.status(started.execution_id)
            if view.state == ExecutionState.completed:
                break
            await asyncio.sleep(0.1)
        assert view.state == ExecutionState.completed and view.exit_code == 0
        assert view.was_unknown  # the record keeps the trace
        logs = await plane.executions.logs(started.execution_id, ExecutionLogsQuery())
        assert logs.data == "done\n"
    finally:
        await plane.aclose()
        await daemon.stop()


async def test_unknown_when_the_runner_lost_the_execution(home: Path) -> None:
    """E9: the runner's state for a running record is gone: the outcome is unknown, the
    writer is released, and the command is never resubmitted."""
    plane, _, _ = await open_yard(home, "local")
    started = await plane.executions.run_shell(
        RunShellRequest(command="echo once >> runs.txt; sleep 60", background=True)
    )
    await asyncio.sleep(0.5)
    await plane.aclose()
    for pid in processes_of(started.execution_id):
        # killing bwrap's namespace init may already have taken the ones after it along
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(home / "home" / "runners" / "local" / "executions" / started.execution_id)
    plane, _, _ = await open_yard(home, "local")
    try:
        view = await plane.executions.wait(started.execution_id, ExecutionWait(timeout_s=30))
        assert view.state == ExecutionState.unknown
        assert view.error
        after = await plane.executions.run_shell(RunShellRequest(command="cat runs.txt"))
        assert after.stdout == "once\n"
    finally:
        await plane.aclose()


async def test_unknown_turns_running_again_while_the_sandbox_still_runs(home: Path) -> None:
    """E9/R3: an execution that turned unknown during an outage is reported running again as
    soon as its runner answers (not only when it ends), keeps ``was_unknown``, and can be
    cancelled as usual."""
    plane, _, _ = await open_yard(home, "local")
    daemon = await start_daemon(home / "daemon", SandboxPolicy(), subprocess=True)
    try:
        await plane.runners.add_direct("remote", daemon.url, daemon.token)
        started = await plane.executions.run_shell(
            RunShellRequest(command="sleep 60", runner_id="remote", background=True)
        )
        daemon.kill()
        view = await plane.executions.wait(started.execution_id, ExecutionWait(timeout_s=30))
        assert view.state == ExecutionState.unknown
        await daemon.restart()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            view = await plane.executions.status(started.execution_id)
            if view.state != ExecutionState.unknown:
                break
            await asyncio.sleep(0.1)
        assert view.state == ExecutionState.running, view
        assert view.was_unknown and view.error is None
        cancelled = await plane.executions.cancel(
            started.execution_id, ExecutionCancelQuery(wait_s=30)
        )
        assert cancelled.state == ExecutionState.cancelled
        assert cancelled.was_unknown
    finally:
        await plane.aclose()
        await daemon.stop()

"""A runner daemon killed -9 while the control plane's start call is on it (E9, E10, E11, R3).

The start's answer never comes, so the plane cannot know whether the command runs. The record
says so at once (``unknown``, naming the runner and that the start is being asked about), and
once the daemon is back the plane asks it about the same execution id (it never starts the
command again) and records the truth: running (then its real end) when the start happened,
``failed`` with "never started" when the daemon went before it took the start."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from daemon_outage import ended, held_start, killed_on_it, outage_yard, unread_start, until
from runner_daemon_fixture import start_daemon

from shellyard.contract.executions import (
    ExecutionState,
    RunShellRequest,
)
from shellyard.control.executions import unstarted
from shellyard.runner.protocol import NO_TRACE, START_CUT, RunnerExecState, SandboxPolicy

pytestmark = pytest.mark.timeout(120)


async def test_daemon_killed_while_the_start_waits_then_back(home: Path) -> None:
    """E11/R3: the start happened (the daemon held the start's answer while the command
    ran) and the daemon dies before answering: the record is unknown at once, saying the start
    is being asked about; back, the runner's answer makes it running, then completed with
    its real exit code, once (E10: the command ran one time)."""
    plane, daemon, remote = await outage_yard(home)
    try:
        # the daemon holds a foreground start's answer while the command runs: kill it then
        result = await killed_on_it(daemon, await held_start(plane, remote))
        view = await plane.executions.status(result.execution_id)
        assert view.state == ExecutionState.unknown and view.error
        assert "start" in view.error and daemon.url in view.error, view.error
        await daemon.restart()
        began = time.monotonic()
        view = await until(
            plane, result.execution_id, {ExecutionState.completed, ExecutionState.failed}
        )
        assert view.state == ExecutionState.completed, view
        assert view.exit_code == 4 and view.was_unknown
        assert time.monotonic() - began < 20  # resolved once back, not at a restart
        again = await plane.executions.run_shell(
            RunShellRequest(command="cat runs.txt", runner_id="remote")
        )
        assert again.stdout == "run\n"  # E10: never started twice
    finally:
        await plane.aclose()
        await daemon.stop()


async def test_daemon_gone_before_it_took_the_start(home: Path) -> None:
    """E9/E10: the daemon is stopped (SIGSTOP) so the start waits unread on its socket, then
    killed -9: nothing ran. Back, the runner holds no trace of the execution: the record is
    ``failed`` saying it never started (not unknown for ever, not run late), the writer is
    free, and the command never ran."""
    plane, daemon, _ = await outage_yard(home)
    try:
        submit = await unread_start(plane, daemon, "echo run >> runs.txt")
        result = await killed_on_it(daemon, submit)
        view = await plane.executions.status(result.execution_id)
        assert view.state == ExecutionState.unknown and "start" in (view.error or "")
        await daemon.restart()
        view = await until(
            plane, result.execution_id, {ExecutionState.completed, ExecutionState.failed}
        )
        assert view.state == ExecutionState.failed, view
        assert "never started" in (view.error or ""), view.error
        assert view.was_unknown
        after = await plane.executions.run_shell(
            RunShellRequest(command="cat runs.txt || echo none", runner_id="remote")
        )
        assert after.state == ExecutionState.completed  # the writer was released
        assert after.stdout.strip().endswith("none"), after.stdout
    finally:
        await plane.aclose()
        await daemon.stop()


async def test_a_plane_keeps_a_start_cut_in_its_bookkeeping_unknown(home: Path) -> None:
    """E9: as above, but the daemon's folder for the execution is left without a record (as
    when it dies between making the folder and recording the sandbox): back, the runner says
    the start was cut, so the record ends ``unknown`` with that reason (never "running",
    never "never started"), and the writer is free."""
    plane, daemon, _ = await outage_yard(home)
    try:
        result = await killed_on_it(daemon, await unread_start(plane, daemon, "true"))
        (home / "daemon" / "executions" / result.execution_id).mkdir()
        await daemon.restart()
        view = await ended(plane, result.execution_id)  # unknown all along until then
        assert view.state == ExecutionState.unknown and view.error == START_CUT, view
        assert view.started_at is None and view.finished_at is not None
        after = await plane.executions.run_shell(
            RunShellRequest(command="true", runner_id="remote")
        )
        assert after.state == ExecutionState.completed  # the writer was released
    finally:
        await plane.aclose()
        await daemon.stop()


async def test_a_start_cut_in_its_bookkeeping_stays_unknown_not_never_started(home: Path) -> None:
    """E9, never a false outcome: a daemon killed between making an execution's folder and
    recording its sandbox leaves a folder without a record (its restart kills what bwrap had
    reported). The runner then says the start was cut (START_CUT), which the plane keeps
    ``unknown``; only an id with no folder at all reads as "never started" (NO_TRACE)."""
    daemon = await start_daemon(home / "daemon", SandboxPolicy(), subprocess=True)
    try:
        daemon.kill()
        (home / "daemon" / "executions" / "ex_cut").mkdir(parents=True)
        await daemon.restart()
        cut = await daemon.runner.status("ex_cut")
        never = await daemon.runner.status("ex_never")
        assert cut.state == never.state == RunnerExecState.lost
        assert cut.error == START_CUT and not unstarted.never_took(cut)
        assert never.error == NO_TRACE and unstarted.never_took(never)
    finally:
        await daemon.stop()

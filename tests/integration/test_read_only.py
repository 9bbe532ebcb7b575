"""Read-only executions beside the writer (issue 17; W1, W2, E3–E7, DESIGN.md §5), with real
sandboxes on the local runner and on a runner daemon (the ``yard`` fixture).

A read-only execution takes no writer, sees the workspace's last committed snapshot bound
read-only at /workspace, and makes no snapshot; everything else is as for any execution.
"""

from __future__ import annotations

import asyncio
import time

from conftest import Yard
from shellyard.contract.executions import ExecutionState, RunShellResult
from shellyard.errors import WorkspaceBusy


async def _wait_for_log(yard: Yard, execution_id: str, text: str, timeout_s: float = 30) -> None:
    """Until the execution's stdout holds ``text`` (the command reached that point)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        logs = await yard.plane.executions.logs(execution_id)
        if text in logs.data:
            return
        assert not logs.state.terminal, f"{execution_id} ended before printing {text!r}"
        await asyncio.sleep(0.05)
    raise AssertionError(f"{execution_id} did not print {text!r} within {timeout_s} s")


async def _background_writer(yard: Yard) -> RunShellResult:
    """A writer that changes the workspace's files in place, then holds the writer."""
    first = await yard.run("echo committed > data.txt")
    assert first.state == ExecutionState.completed
    writer = await yard.run(
        "echo half-written > data.txt; echo new > fresh.txt; echo changed; sleep 60",
        background=True,
    )
    await _wait_for_log(yard, writer.execution_id, "changed")
    return writer


async def test_reader_runs_beside_the_writer_on_committed_files(yard: Yard) -> None:
    """W1: a read-only execution starts while a background writer holds the workspace, where a
    writer is refused; W2: it reads the committed files, never the writer's half-written ones;
    it makes no snapshot and leaves the writer holding the workspace."""
    writer = await _background_writer(yard)
    workspace = writer.workspace_id
    before = [s.seq for s in await yard.runner.list_snapshots(workspace)]
    try:
        reader = await yard.run(
            "cat data.txt; test -e fresh.txt && echo sees-fresh || echo no-fresh", read_only=True
        )
        assert reader.state == ExecutionState.completed, reader
        assert reader.exit_code == 0
        assert reader.stdout == "committed\nno-fresh\n"
        assert reader.read_only and reader.snapshot_seq is None
        assert reader.workspace_id == workspace
        assert [s.seq for s in await yard.runner.list_snapshots(workspace)] == before
        try:
            await yard.run("true")
        except WorkspaceBusy as exc:  # the writer is still the background one
            assert writer.execution_id in exc.message
        else:
            raise AssertionError("a second writer ran beside the background writer")
    finally:
        await yard.plane.executions.cancel(writer.execution_id, wait_s=30)
    ended = await yard.plane.executions.status(writer.execution_id)
    assert ended.state == ExecutionState.cancelled and ended.snapshot_seq is not None
    assert await yard.read_file(workspace, ended.snapshot_seq, "data.txt") == b"half-written\n"
    # Now committed: a reader sees the writer's files.
    after = await yard.run("cat data.txt fresh.txt", read_only=True)
    assert after.stdout == "half-written\nnew\n"


async def test_reader_cannot_write_the_workspace(yard: Yard) -> None:
    """A read-only execution's writes to /workspace fail as on a read-only filesystem; /tmp
    takes writes; nothing it tried shows in the workspace afterwards."""
    await yard.run("echo keep > kept.txt")
    result = await yard.run(
        "echo x > /workspace/new.txt; echo rc=$?; rm -f kept.txt; echo rc=$?; "
        "mkdir sub; echo rc=$?; echo tmp > /tmp/t && cat /tmp/t",
        read_only=True,
    )
    assert result.state == ExecutionState.completed
    assert result.stdout == "rc=1\nrc=1\nrc=1\ntmp\n"
    assert "Read-only file system" in result.stderr
    check = await yard.run("ls")
    assert check.stdout == "kept.txt\n"


async def test_reader_budget_logs_cancel_and_notice(yard: Yard) -> None:
    """E3: wait_ms is a budget for a reader too; E6 logs; E7 cancel ends it as cancelled;
    N1: its end posts a notice. No snapshot either way."""
    head = (await yard.run("echo x > a.txt")).snapshot_seq
    slow = await yard.run("echo started; sleep 2; echo done", read_only=True, wait_ms=200)
    assert slow.state == ExecutionState.running and slow.read_only
    view = await yard.plane.executions.wait(slow.execution_id, 30)
    assert view.state == ExecutionState.completed and view.exit_code == 0
    assert view.snapshot_seq is None
    logs = await yard.plane.executions.logs(slow.execution_id)
    assert logs.data == "started\ndone\n" and logs.complete

    long = await yard.run("echo up; sleep 120", read_only=True, background=True)
    await _wait_for_log(yard, long.execution_id, "up")
    cancelled = await yard.plane.executions.cancel(long.execution_id, wait_s=30)
    assert cancelled.state == ExecutionState.cancelled and cancelled.snapshot_seq is None
    notices = await yard.plane.inbox.notices(None)
    assert any(n.subject_id == long.execution_id for n in notices)
    snapshots = await yard.runner.list_snapshots(long.workspace_id)
    assert max(s.seq for s in snapshots) == head


async def test_readers_run_beside_each_other(yard: Yard) -> None:
    """Readers take nothing: two at once both run, while no writer is involved at all."""
    first = await yard.run("echo one; sleep 60", read_only=True, background=True)
    await _wait_for_log(yard, first.execution_id, "one")
    try:
        second = await yard.run("echo two", read_only=True)
        assert second.state == ExecutionState.completed and second.stdout == "two\n"
        writer = await yard.run("echo w > w.txt")  # a reader never holds the writer
        assert writer.state == ExecutionState.completed and writer.snapshot_seq is not None
    finally:
        await yard.plane.executions.cancel(first.execution_id, wait_s=30)

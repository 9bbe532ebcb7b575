"""Limits that keep one workspace from hurting the host (issue 12; R2, E6, E12).

Every test runs twice, on the in-process local runner and on a runner daemon (``yard_factory``
/ ``kind``), with real bubblewrap sandboxes; the small-volume test mounts a real tmpfs."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from tmpfs_fixture import mounted_tmpfs

from conftest import Yard, open_yard
from shellyard.cli.exits import EXIT_RETRY, exit_code_of
from shellyard.config import Settings
from shellyard.contract.executions import (
    ExecutionLogsQuery,
    ExecutionState,
    ExecutionWait,
    RunShellRequest,
)
from shellyard.errors import InvalidInput, LowOnSpace
from shellyard.runner.limits import logcap
from shellyard.runner.protocol import (
    RunnerExecState,
    RunnerExecution,
    SandboxPolicy,
    StartRequest,
)
from shellyard.runner.transport.daemon import limits_options

MB = 1_000_000
MIB = 1 << 20


def runner_root(yard: Yard) -> Path:
    """The runner's folder on disk (the daemon's root, or the local runner's)."""
    if yard.daemon is not None:
        return yard.daemon.root
    return Settings(home=yard.home / "home").local_runner_root


async def runner_record(yard: Yard, execution_id: str) -> RunnerExecution:
    record: RunnerExecution = await yard.runner.status(execution_id)
    return record


async def test_quota_stops_the_command_and_the_next_one_can_delete(yard_factory: Any) -> None:
    """R2: with a 50 MB quota a command writing 1 GB is stopped while it runs; its result
    names the quota and the size reached; what was committed stays; the next command runs
    and deletes the file; a command in another workspace is unaffected."""
    yard: Yard = await yard_factory(SandboxPolicy(workspace_quota_bytes=50 * MB))
    kept = await yard.run("echo kept > kept.txt")
    assert kept.exit_code == 0 and kept.error is None
    other_session = await yard.plane.sessions.create()
    other = await yard.plane.executions.run_shell(
        RunShellRequest(
            command="sleep 1; head -c 20000000 /dev/zero > f; echo fine",
            runner_id=yard.runner_id,
            background=True,
        ),
        other_session.main_agent_id,
    )
    # More than the quota plus the documented margin (a tick and a walk at 2 GB/s: 400 MB
    # here), so a stop within the margin always comes before the write ends.
    result = await yard.run("head -c 1000000000 /dev/zero > big; echo after", wait_ms=30_000)
    view = await yard.ended(result.execution_id)
    assert view.state == ExecutionState.completed
    assert view.exit_code == 137, view  # the sandbox was killed, not the command's own exit
    assert view.error is not None
    assert "workspace quota of 47.7 MiB" in view.error and "reached" in view.error
    assert (await runner_record(yard, result.execution_id)).limit == "quota"
    logs = await yard.plane.executions.logs(result.execution_id, ExecutionLogsQuery())
    assert "after" not in logs.data  # stopped: nothing after the write ran
    # The state it reached is committed (W3), the earlier file with it; the big file was cut
    # short: the command was stopped within the documented margin, far before 1 GB.
    assert view.snapshot_seq is not None
    assert await yard.read_file(view.workspace_id, view.snapshot_seq, "kept.txt") == b"kept\n"
    big = await yard.runner.stat_path(view.workspace_id, view.snapshot_seq, "big")
    assert big is not None and 50 * MB < big.size < 1000 * MB
    info = await yard.runner.info()
    assert info.limits is not None
    assert big.size <= 50 * MB + info.limits.quota_margin_bytes
    after = await yard.run("ls -s --block-size=1 big; rm big; echo removed", wait_ms=30_000)
    assert after.state == ExecutionState.completed and after.exit_code == 0, after
    assert after.error is None and after.stdout.endswith("removed\n")
    assert await yard.runner.stat_path(view.workspace_id, after.snapshot_seq, "big") is None
    again = await yard.run("head -c 10000000 /dev/zero > small; echo ok")
    assert again.exit_code == 0 and again.error is None and again.stdout == "ok\n"
    other_view = await yard.plane.executions.wait(
        other.execution_id, ExecutionWait(timeout_s=60), other_session.main_agent_id
    )
    assert other_view.state == ExecutionState.completed and other_view.exit_code == 0
    assert other_view.error is None


async def test_log_limit_keeps_head_and_tail_and_pages_through(yard_factory: Any) -> None:
    """R2, E6: with a 1 MiB log limit, 6 MB of output keeps its head and its tail; pages of
    execution_logs run head → marker → tail with offsets that follow each other; the last
    line is readable; the stored log is at most the limit plus a block; the exit code is the
    command's, the execution is not failed and its record says the log was cut."""
    yard: Yard = await yard_factory(SandboxPolicy(log_limit_bytes=MIB))
    lines = 100_000  # 61 bytes each: 6.1 MB
    script = f"for i in range({lines}): print(f'line {{i:07d}} ' + 'x' * 47)"
    result = await yard.run(f'python3 -c "{script}"; exit 3', wait_ms=30_000)
    view = await yard.ended(result.execution_id)
    assert view.state == ExecutionState.completed and view.exit_code == 3
    assert view.error is not None and "retained-log limit of 1.0 MiB" in view.error
    record = await runner_record(yard, result.execution_id)
    assert record.limit is None and record.logs_cut["stdout"] > 4 * MB

    pages = []
    offset = 0
    while True:
        page = await yard.plane.executions.logs(
            result.execution_id, ExecutionLogsQuery(offset=offset, limit=MIB)
        )
        assert page.offset == offset
        pages.append(page)
        if page.complete or not page.data:
            break
        offset = page.next_offset
    assert pages[-1].complete and pages[-1].size == lines * 61
    markers = [p for p in pages if "of this log were dropped" in p.data]
    assert len(markers) == 1
    marker = markers[0]
    kept = "".join(p.data for p in pages if p is not marker)
    assert kept.startswith("line 0000000 x")
    assert kept.endswith(f"line {lines - 1:07d} {'x' * 47}\n")
    assert f"{record.logs_cut['stdout']} bytes" in marker.data
    assert marker.next_offset - marker.offset == record.logs_cut["stdout"]
    assert len(kept.encode()) <= MIB + logcap.BLOCK
    tail = await yard.plane.executions.logs(result.execution_id, ExecutionLogsQuery(tail=61))
    assert tail.data == f"line {lines - 1:07d} {'x' * 47}\n"
    stored = runner_root(yard) / "executions" / result.execution_id / "stdout"
    assert stored.stat().st_blocks * 512 <= MIB + logcap.BLOCK
    # E12: the inline output keeps its own head and tail of what is retained.
    assert result.stdout == "" or result.stdout.startswith("line 0000000")


async def test_cpu_and_file_size_limits_are_named_in_the_record(yard_factory: Any) -> None:
    """R2: a CPU-bound loop under a 2 s CPU-time limit ends by SIGXCPU and a file past the
    file-size limit by SIGXFSZ; each record says which limit ended it, not only the code."""
    yard: Yard = await yard_factory(SandboxPolicy(max_cpu_seconds=2, max_file_size_bytes=8 * MIB))
    loop = await yard.run("python3 -c 'while True: pass'", wait_ms=30_000)
    view = await yard.ended(loop.execution_id)
    assert view.exit_code == 152, view
    assert view.error is not None and "SIGXCPU" in view.error
    assert "CPU-time limit of 2 s" in view.error
    assert (await runner_record(yard, loop.execution_id)).limit == "cpu"
    big = await yard.run("head -c 20000000 /dev/zero > big", wait_ms=30_000)
    view = await yard.ended(big.execution_id)
    assert view.exit_code == 153, view
    assert view.error is not None and "SIGXFSZ" in view.error and "8.0 MiB" in view.error
    assert (await runner_record(yard, big.execution_id)).limit == "file_size"
    fine = await yard.run("python3 -c 'sum(range(1000))'; head -c 1000000 /dev/zero > ok")
    assert fine.exit_code == 0 and fine.error is None
    assert (await runner_record(yard, fine.execution_id)).limit is None


async def test_runner_info_shows_the_effective_limits(yard_factory: Any) -> None:
    """R2: the runner's info (runner show, REST and MCP runner views) carries its limits."""
    policy = SandboxPolicy(
        workspace_quota_bytes=3 << 30,
        log_limit_bytes=64 * MIB,
        free_space_reserve_bytes=1 << 30,
        max_cpu_seconds=60,
    )
    yard: Yard = await yard_factory(policy)
    limits = (await yard.runner.info()).limits
    assert limits is not None
    assert limits.workspace_quota_bytes == 3 << 30 and limits.log_limit_bytes == 64 * MIB
    assert limits.free_space_reserve_bytes == 1 << 30 and limits.max_cpu_seconds == 60
    assert limits.free_space_bytes > 0 and limits.quota_margin_bytes > 0
    assert limits.enforcement in ("rlimits", "cgroup v1", "cgroup v2")  # R2 tenants
    assert "tree watch" in limits.quota_mechanism


# ---------------------------------------------------------------- the free-space reserve


@pytest.fixture
def small_volume() -> Iterator[Path]:
    """A 192 MiB tmpfs the test owns: the whole home (database, runner) lives on it."""
    with mounted_tmpfs("192m", "shellyard-small-") as path:
        yield path


@pytest.fixture(params=["local", "direct"])
async def small_yard(request: pytest.FixtureRequest, small_volume: Path) -> AsyncIterator[Yard]:
    home = small_volume / "y"
    home.mkdir(mode=0o711)
    policy = SandboxPolicy(free_space_reserve_bytes=64 * MIB, workspace_quota_bytes=0)
    plane, runner_id, daemon = await open_yard(home, request.param, policy)
    try:
        yield Yard(plane, runner_id, home, daemon)
    finally:
        await plane.aclose()
        if daemon is not None:
            await daemon.stop()


async def test_below_the_reserve_new_work_is_refused_and_the_database_is_intact(
    small_yard: Yard, small_volume: Path
) -> None:
    """R2: when the runner's volume has less free space than its reserve, new executions and
    writer operations are refused with a clear, retryable error (CLI exit 75) and nothing
    hits ENOSPC: the database stays intact; once space is freed work goes on."""
    yard = small_yard
    first = await yard.run("echo before > f.txt; echo ok")
    assert first.exit_code == 0 and first.stdout == "ok\n"
    stat = os.statvfs(small_volume)
    free = stat.f_bavail * stat.f_frsize
    filler = small_volume / "filler"
    with filler.open("wb") as handle:  # another user of the volume eats it up
        chunk = b"\0" * MIB
        for _ in range((free - 64 * MIB) // MIB + 8):
            handle.write(chunk)

    with pytest.raises(LowOnSpace, match=r"below its reserve of 64\.0 MiB; retry later") as caught:
        await yard.run("echo during")
    assert exit_code_of(caught.value) == EXIT_RETRY == 75

    async def upload() -> AsyncIterator[bytes]:
        yield b"data"

    with pytest.raises(LowOnSpace, match="a change to workspace"):
        await yard.runner.write_file(first.workspace_id, "new.txt", upload(), None)
    # Deleting frees space, so it is allowed below the reserve.
    deleted = await yard.runner.delete_path(first.workspace_id, "f.txt", False)
    assert deleted.removed == ["f.txt"]

    database = yard.home / "home" / "shellyard.db"
    with contextlib.closing(sqlite3.connect(database)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    earlier = await yard.plane.executions.status(first.execution_id)
    assert earlier.state == ExecutionState.completed and earlier.exit_code == 0

    filler.unlink()
    await asyncio.sleep(0)
    after = await yard.run("echo after")
    assert after.exit_code == 0 and after.stdout == "after\n"


# ---------------------------------------------------------------- settings


def test_limits_come_from_the_environment_and_the_daemon_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """R2: SHELLYARD_WORKSPACE_QUOTA / _LOG_LIMIT take bytes or a K/M/G/T suffix (0: none),
    _FREE_SPACE_RESERVE a size or a percentage, _CPU_LIMIT seconds; the runner daemon takes
    the same as options, which win over its environment; a bad value is a clear error."""
    monkeypatch.setenv("SHELLYARD_WORKSPACE_QUOTA", "50M")
    monkeypatch.setenv("SHELLYARD_LOG_LIMIT", "0")
    monkeypatch.setenv("SHELLYARD_FREE_SPACE_RESERVE", "10%")
    monkeypatch.setenv("SHELLYARD_CPU_LIMIT", "30")
    policy = Settings.from_env().local_policy
    assert policy.workspace_quota_bytes == 50 * MIB and policy.log_limit_bytes == 0
    assert policy.free_space_reserve_bytes is None and policy.free_space_reserve_percent == 10
    assert policy.max_cpu_seconds == 30
    args = argparse.Namespace(
        workspace_quota="1G", log_limit=None, free_space_reserve="3G", cpu_limit="0"
    )
    daemon_policy = limits_options(SandboxPolicy(), args)
    assert daemon_policy.workspace_quota_bytes == 1 << 30
    assert daemon_policy.log_limit_bytes == 0  # from the environment
    assert daemon_policy.free_space_reserve_bytes == 3 << 30
    assert daemon_policy.max_cpu_seconds is None
    monkeypatch.setenv("SHELLYARD_WORKSPACE_QUOTA", "lots")
    said = re.escape("SHELLYARD_WORKSPACE_QUOTA='lots' is not valid: use a size (10G")
    with pytest.raises(InvalidInput, match=said):
        Settings.from_env()


async def test_a_restarted_daemon_keeps_watching_the_quota_and_the_logs(home: Path) -> None:
    """R2, E11: the runner daemon is killed while a command runs and started again; the new
    daemon re-attaches, stops the command at the quota and cuts its log, and the record says
    both."""
    from runner_daemon_fixture import running_daemon

    policy = SandboxPolicy(workspace_quota_bytes=50 * MB, log_limit_bytes=MIB)
    command = "head -c 3000000 /dev/zero | tr '\\0' x; sleep 6; head -c 400000000 /dev/zero > big"
    async with running_daemon(home / "runner", policy, subprocess=True) as daemon:
        runner = daemon.runner
        await runner.ensure_workspace("ws")
        await runner.start(StartRequest(execution_id="e1", workspace_id="ws", command=command))
        await asyncio.sleep(0.3)
        daemon.kill()
        await daemon.restart()
        record = await runner.wait("e1", 60)
        while record.state == RunnerExecState.running:
            record = await runner.wait("e1", 60)
        assert record.state == RunnerExecState.finished and record.exit_code == 137
        assert record.limit == "quota" and record.error is not None
        assert "workspace quota of 47.7 MiB" in record.error
        assert record.logs_cut["stdout"] > MIB
        assert record.snapshot is not None
        big = await runner.stat_path("ws", record.snapshot.seq, "big")
        assert big is not None and big.size < 400 * MB

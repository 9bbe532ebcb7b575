"""A full disk is an outcome, not a crash; every input that cannot run gets a terminal
record; records stay bounded (R2, E1, E6, T2; docs/limits.md "Full disk, long commands and
bounded records").

Real bubblewrap sandboxes on the in-process local runner and a runner daemon; the full-disk
cases mount a real tmpfs as the home (root needed, skipped with the reason otherwise)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from files_helpers import child_workspace, run
from tmpfs_fixture import mounted_tmpfs

from conftest import Yard, open_yard
from shellyard.cli.exits import EXIT_RETRY, exit_code_of
from shellyard.config import Settings
from shellyard.contract.executions import (
    ExecutionCancelQuery,
    ExecutionLogsQuery,
    ExecutionState,
)
from shellyard.contract.files import TransferWait
from shellyard.contract.maintenance import GcRequest
from shellyard.contract.sessions import TimerCreateRequest
from shellyard.errors import InvalidInput, LowOnSpace, StoreFull
from shellyard.runner.protocol import SandboxPolicy
from shellyard.store.schema import transfer_files, transfers

MIB = 1 << 20


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


@pytest.mark.runner_kinds("local")  # the fault is injected into the in-process runner's spawn
async def test_a_spawn_the_kernel_refuses_ends_failed_and_frees_the_writer(
    yard: Yard,
) -> None:
    """Every input that cannot run gets a terminal record: when the spawn itself fails (here
    the sandbox's program is missing: ENOENT from execve) the execution ends ``failed`` with
    the reason, nothing is left queued, and the workspace takes the next command."""
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


# ---------------------------------------------------------------- T2: bounded transfers


async def _count(yard: Yard, table: sa.Table) -> int:
    store = yard.plane.store
    row = await store.one(sa.select(sa.func.count().label("n")).select_from(table))
    assert row is not None
    return int(row["n"])


async def test_a_transfer_over_its_entry_cap_is_refused_with_the_count_and_gc_deletes_old_ones(
    yard: Yard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T2, bounded records: a transfer naming more entries than ``transfer_max_entries`` is
    refused before any row is written, saying how many it names; finished transfers and their
    entries go under ``record_days`` like execution records (once their notice is read)."""
    monkeypatch.setenv("SHELLYARD_TRANSFER_MAX_ENTRIES", "0")
    said = re.escape(
        "SHELLYARD_TRANSFER_MAX_ENTRIES='0' is not valid: use a whole number, 1 or more"
    )
    with pytest.raises(InvalidInput, match=said):
        Settings.from_env()
    monkeypatch.setenv("SHELLYARD_TRANSFER_MAX_ENTRIES", "50")
    assert Settings.from_env().transfer_max_entries == 50
    assert Settings().transfer_max_entries == 100_000
    plane = yard.plane
    plane.transfers.max_entries = 50
    made = await run(
        plane,
        "mkdir -p many few; for i in $(seq 120); do : > many/f$i; done; "
        "for i in $(seq 30); do : > few/f$i; done",
        yard.runner_id,
    )
    _child, target = await child_workspace(plane, yard.runner_id)
    request = {"source_workspace_id": made.workspace_id, "target_workspace_id": target}
    before = await _count(yard, transfer_files)
    with pytest.raises(InvalidInput, match=r"names 121 entries, more than the 50") as caught:
        await plane.transfers.start({**request, "paths": ["many"]})
    assert caught.value.details["entries"] == 121
    assert await _count(yard, transfer_files) == before  # nothing recorded
    done = await plane.transfers.wait(
        (await plane.transfers.start({**request, "paths": ["few"]})).transfer_id,
        TransferWait(timeout_s=120),
    )
    assert done.state == "completed" and done.files_copied == 31, done  # the folder too
    assert await _count(yard, transfer_files) == before + 31

    # Its notice is unread: it stays, like an unread execution's record.
    kept = await plane.retention.run(GcRequest(snapshots=False, record_days=0))
    assert kept.transfers_deleted == 0
    await plane.store.mark_notice_read("transfer", done.transfer_id)
    report = await plane.retention.run(GcRequest(snapshots=False, record_days=0))
    assert report.transfers_deleted >= 1 and report.transfer_entries_deleted >= 31, report
    assert await _count(yard, transfers) == 0
    assert await _count(yard, transfer_files) == 0


# ---------------------------------------------------------------- R2: a full disk


@pytest.fixture
def small_volume() -> Iterator[Path]:
    """A 256 MiB tmpfs the test mounts: the whole home (database, runner) lives on it."""
    with mounted_tmpfs("256m", "shellyard-full-") as path:
        yield path


@pytest.fixture(params=["local", "direct"])
async def full_yard(request: pytest.FixtureRequest, small_volume: Path) -> AsyncIterator[Yard]:
    home = small_volume / "y"
    home.mkdir(mode=0o711)
    # No quota and no log cap: only the reserve stands between a command and a full volume.
    policy = SandboxPolicy(
        free_space_reserve_bytes=64 * MIB, workspace_quota_bytes=0, log_limit_bytes=0
    )
    plane, runner_id, daemon = await open_yard(home, request.param, policy)
    try:
        yield Yard(plane, runner_id, home, daemon)
    finally:
        await plane.aclose()
        if daemon is not None:
            await daemon.stop()


#: Writes 1 MiB at a time, a little slower than tmpfs can (so the tick of the limits watcher,
#: 0.1 s, comes between two writes well before the volume is full), without end.
FILLERS = {
    "stdout": "while :; do head -c 1048576 /dev/zero; sleep 0.004; done",
    "file": "while :; do head -c 1048576 /dev/zero; sleep 0.004; done > big; echo after",
}


@pytest.mark.parametrize("into", sorted(FILLERS))
async def test_a_command_filling_the_volume_is_stopped_with_limit_disk_and_work_resumes(
    full_yard: Yard, small_volume: Path, into: str, caplog: pytest.LogCaptureFixture
) -> None:
    """R2: a command filling the volume through its stdout or a file it writes is stopped
    while it writes, below the free-space reserve, with ``limit: "disk"`` and a message; the
    database stays intact and writable; another session's run is refused cleanly (503,
    retry later) while the volume is below the reserve; status, cancel and gc answer; once
    the space is freed, work goes on without a restart."""
    yard = full_yard
    first = await yard.run("echo before")
    assert first.state == ExecutionState.completed
    filler = await yard.run(FILLERS[into], background=True)
    view = await yard.ended(filler.execution_id)
    record = await yard.runner.status(filler.execution_id)
    assert record.limit == "disk", (record, view)
    assert view.error is not None and "free-space reserve" in view.error, view
    assert "below its reserve of 64.0 MiB" in view.error
    logs = await yard.plane.executions.logs(filler.execution_id, ExecutionLogsQuery())
    assert "after" not in logs.data  # stopped: nothing after the write ran
    stat = os.statvfs(small_volume)
    assert stat.f_bavail * stat.f_frsize > 16 * MIB  # stopped well before ENOSPC
    if yard.daemon is None:  # the service's log (server.log when served) has the stop
        stops = [r for r in caplog.records if r.levelname == "WARNING" and "disk" in r.message]
        assert any(filler.execution_id in r.message for r in stops), caplog.records

    other_session = await yard.plane.sessions.create()
    other_agent = other_session.main_agent_id
    from shellyard.contract.executions import RunShellRequest

    def other_run(command: str) -> Any:
        return yard.plane.executions.run_shell(
            RunShellRequest(command=command, runner_id=yard.runner_id), other_agent
        )

    with pytest.raises(LowOnSpace, match="retry later"):
        await other_run("echo during")
    again = await yard.plane.executions.cancel(filler.execution_id, ExecutionCancelQuery())
    assert again.state == view.state  # a finished one: its record unchanged (E7)
    store = yard.plane.store
    await store.mark_notice_read("execution", filler.execution_id)
    report = await yard.plane.retention.run(GcRequest(snapshots=False, log_days=0))
    assert not report.errors, report
    if into == "file":
        deleted = await yard.runner.delete_path(view.workspace_id, "big", False)
        assert deleted.removed == ["big"]
    else:
        assert report.logs_pruned >= 1, report
    after = await other_run("echo after")
    assert after.state == ExecutionState.completed and after.stdout == "after\n", after
    mine = await yard.run("echo mine")
    assert mine.state == ExecutionState.completed and mine.stdout == "mine\n"


def _fill(volume: Path, name: str) -> Path:
    """Write a file until the volume is full (ENOSPC): another user of the volume."""
    path = volume / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (MIB, 4096):  # then the last partial MiB
            chunk = b"\0" * size
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, chunk)
    finally:
        os.close(fd)
    return path


async def test_a_full_volume_leaves_the_database_writable_then_answers_507_and_recovers(
    full_yard: Yard, small_volume: Path
) -> None:
    """A full volume is an outcome: the room the home keeps for the database is released so
    its next writes (the record of a session here) still land; once that room is used up
    too, a write is refused with StoreFull (507, retry later) and nothing is half written;
    once space is freed, writes go on and the room is taken again at the next gc."""
    yard = full_yard
    database = yard.home / "home" / "shellyard.db"
    reserve = database.with_name("shellyard.db-reserve")
    assert reserve.stat().st_size == 32 * MIB
    filler = _fill(small_volume, "filler")
    session = await yard.plane.sessions.create()  # lands: the reserve file was released
    assert not reserve.exists()
    more = _fill(small_volume, "filler2")
    with pytest.raises(StoreFull, match="volume is full") as caught:
        for _ in range(10_000):  # the few pages SQLite had left run out
            await yard.plane.sessions.create()
    assert caught.value.http_status == 507
    assert exit_code_of(caught.value) == EXIT_RETRY  # the CLI says: retry later
    with pytest.raises((LowOnSpace, StoreFull)):  # 503 or 507, both "retry later"
        await yard.run("echo during")
    with pytest.raises(StoreFull):  # a reminder cannot be recorded: 507, not a 500
        await yard.plane.timers.create(
            session.main_agent_id, TimerCreateRequest(text="later", after_ms=60_000)
        )
    filler.unlink()
    more.unlink()
    with contextlib.closing(sqlite3.connect(database)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert (await yard.plane.sessions.get(session.session_id)).session_id == session.session_id
    await yard.plane.retention.run(GcRequest(snapshots=False))
    assert reserve.stat().st_size == 32 * MIB
    after = await yard.run("echo after")
    assert after.state == ExecutionState.completed and after.stdout == "after\n"


# ---------------------------------------------------------------- bounded logs


async def test_the_log_budget_cuts_an_unread_executions_logs_to_head_and_tail(
    yard_factory: Any,
) -> None:
    """Bounded records: an execution nobody read yet (its notice unread) keeps its logs, but
    not beyond the runner's log budget: a gc over the budget cuts them to their head and
    tail (1 MiB per stream), marked where the middle was dropped, instead of keeping 20 MB."""
    yard: Yard = await yard_factory(SandboxPolicy(log_limit_bytes=0))
    started = await yard.run(
        "head -c 20000000 /dev/zero | tr '\\0' a; echo; echo END", background=True
    )
    store = yard.plane.store
    for _ in range(1200):
        row = await store.get_execution(started.execution_id)
        if row is not None and ExecutionState(row.state).terminal:
            break
        await asyncio.sleep(0.05)
    kept = await yard.plane.retention.run(GcRequest(snapshots=False))
    assert kept.logs_cut == 0  # within the default budget: left whole
    report = await yard.plane.retention.run(GcRequest(snapshots=False, log_budget_bytes=1))
    assert report.logs_cut == 1 and report.log_bytes_freed > 15 * 1_000_000, report
    size = await yard.runner.log_size(started.execution_id, "stdout")
    assert size == 20_000_000 + 5  # offsets never move
    head = await yard.runner.read_log(started.execution_id, "stdout", 0, 1 << 20)
    assert head.data == b"a" * len(head.data) and 0 < len(head.data) <= 1 << 20
    cut = await yard.runner.read_log(started.execution_id, "stdout", head.next_offset, 200)
    assert b"were dropped here" in cut.data
    tail = await yard.runner.read_log(started.execution_id, "stdout", size - 5, 10)
    assert tail.data == b"\nEND\n"
    # Still the unread record: its notice is there, its logs were not deleted.
    record = await store.get_execution(started.execution_id)
    assert record is not None and record.logs_pruned_at is None


async def test_cancel_on_a_full_volume_ends_the_execution_without_a_restart(
    full_yard: Yard, small_volume: Path
) -> None:
    """E7 on a full volume: the runner's cancel answers and the execution ends ``cancelled``
    although the runner cannot write its cancel mark or its result file (kept in memory,
    written once space is back); the control plane's record follows without a restart."""
    yard = full_yard
    running = await yard.run("sleep 600", background=True)
    fillers = [_fill(small_volume, "filler")]
    await yard.plane.sessions.create()  # its write takes the room kept for the database
    fillers.append(_fill(small_volume, "filler2"))  # and now nothing is left at all
    try:
        await yard.runner.cancel(running.execution_id)
        record = await yard.runner.wait(running.execution_id, 30)
        assert record.state == "finished" and record.cancelled, record
    finally:
        for path in fillers:
            path.unlink()
    if yard.daemon is None:
        result = (
            yard.home / "home" / "runners" / "local" / "executions" / running.execution_id
        ) / "result.json"
        for _ in range(100):
            if result.exists():
                break
            await asyncio.sleep(0.1)
        assert result.exists()  # written once the volume had room again
    view = await yard.ended(running.execution_id)
    assert view.state == ExecutionState.cancelled, view
    after = await yard.run("echo after")
    assert after.state == ExecutionState.completed and after.stdout == "after\n"


def _zeros_tar_gz(size: int) -> bytes:
    """A tar.gz holding one file of ``size`` zero bytes: a few hundred KB per 400 MB."""
    import io
    import tarfile

    class Zeros(io.RawIOBase):
        def __init__(self) -> None:
            self.left = size

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            n = min(len(buffer), self.left)
            buffer[:n] = b"\0" * n
            self.left -= n
            return n

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", compresslevel=1) as tar:
        info = tarfile.TarInfo("zeros.bin")
        info.size = size
        tar.addfile(info, io.BufferedReader(Zeros(), 1 << 20))
    return out.getvalue()


async def test_an_upload_expanding_past_the_reserve_stops_as_it_writes(
    full_yard: Yard, small_volume: Path
) -> None:
    """R2: a small tar.gz that expands to more than the volume has is stopped while it is
    unpacked, once the volume falls below its reserve (503, retry later), not at ENOSPC;
    nothing of it lands in the workspace and its staged bytes are given back."""
    yard = full_yard
    first = await yard.run("echo kept > kept.txt")
    body = _zeros_tar_gz(400 * MIB)
    assert len(body) < 2 * MIB

    async def upload() -> AsyncIterator[bytes]:
        yield body

    with pytest.raises(LowOnSpace, match="unpacking an upload refused"):
        await yard.runner.write_tar(first.workspace_id, "up", upload())
    stat = os.statvfs(small_volume)
    assert stat.f_bavail * stat.f_frsize > 64 * MIB  # the staged bytes went
    assert await yard.runner.stat_path(first.workspace_id, None, "up") is None
    after = await yard.run("cat kept.txt")
    assert after.state == ExecutionState.completed and after.stdout == "kept\n"


async def test_a_writer_faster_than_the_watcher_still_ends_with_limit_disk(
    full_yard: Yard, small_volume: Path
) -> None:
    """R2: a file written at the volume's full speed may meet ENOSPC before the watcher's
    next look; either way the record names the disk (``limit: "disk"``), the workspace takes
    a delete, and work goes on once the file is gone."""
    yard = full_yard
    first = await yard.run("echo kept > kept.txt")
    filler = await yard.run("head -c 1000000000 /dev/zero > big", wait_ms=30_000)
    view = await yard.ended(filler.execution_id)
    record = await yard.runner.status(filler.execution_id)
    assert record.limit == "disk", (record, view)
    assert view.error is not None and "free-space reserve" in view.error, view
    deleted = await yard.runner.delete_path(first.workspace_id, "big", False)
    assert deleted.removed == ["big"]
    after = await yard.run("cat kept.txt")
    assert after.state == ExecutionState.completed and after.stdout == "kept\n"

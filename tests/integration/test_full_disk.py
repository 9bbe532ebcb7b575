"""A full disk is an outcome, not a crash; every input that cannot run gets a terminal
record; records stay bounded (R2, E1, E6, T2; docs/limits.md "Full disk, long commands and
bounded records").

Real bubblewrap sandboxes on the in-process local runner and a runner daemon; the full-disk
cases mount a real tmpfs as the home (root needed, skipped with the reason otherwise)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from files_helpers import child_workspace, run

from conftest import Yard
from shellyard.config import Settings
from shellyard.contract.executions import ExecutionState
from shellyard.contract.maintenance import GcRequest
from shellyard.errors import InvalidInput
from shellyard.store.schema import transfer_files, transfers

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


# ---------------------------------------------------------------- T2: bounded transfers


async def _count(yard: Yard, table: sa.Table) -> int:
    store = yard.plane.store
    assert store is not None
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
    with pytest.raises(InvalidInput, match="SHELLYARD_TRANSFER_MAX_ENTRIES must be"):
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
        (await plane.transfers.start({**request, "paths": ["few"]})).transfer_id, 120
    )
    assert done.state == "completed" and done.files_copied == 31, done  # the folder too
    assert await _count(yard, transfer_files) == before + 31

    # Its notice is unread: it stays, like an unread execution's record.
    kept = await plane.retention.run(GcRequest(snapshots=False, record_days=0))
    assert kept.transfers_deleted == 0
    assert plane.store is not None
    await plane.store.mark_notice_read("transfer", done.transfer_id)
    report = await plane.retention.run(GcRequest(snapshots=False, record_days=0))
    assert report.transfers_deleted >= 1 and report.transfer_entries_deleted >= 31, report
    assert await _count(yard, transfers) == 0
    assert await _count(yard, transfer_files) == 0

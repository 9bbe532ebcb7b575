"""A start whose answer never came, asked about once the runner is back (E9, E10), when the
runner daemon came back on another state folder: its home wiped, or ``--root`` pointed at a
new folder (a host reinstalled, a restore). That runner holds no trace of the execution, as a
runner that never took the start does, but the start may have run on the old state (or still
run where it was): the record must end ``unknown`` saying so, never ``failed`` "never started
… run it again", which may run the command twice. The same state holding no trace keeps
"never started" (tests/integration/test_start_outage.py; the state id is checked here).

Each test is a real plane with a real daemon process (``shellyard.runner.transport.daemon``),
killed -9 while the start is on it (daemon_outage.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from daemon_outage import (
    closed_while_unknown,
    ended,
    held_start,
    killed_on_it,
    outage_yard,
    unread_start,
    until,
)
from leftover_mounts import remove_home
from runner_daemon_fixture import RunnerDaemon

from conftest import open_yard
from shellyard.contract.executions import ExecutionState, ExecutionView, RunShellRequest
from shellyard.control.executions import unstarted
from shellyard.control.plane import ControlPlane
from shellyard.runner import state_id
from shellyard.runner.transport.daemon import TOKEN_FILE_NAME

pytestmark = pytest.mark.timeout(120)


def _point_at_new_root(daemon: RunnerDaemon, root: Path) -> None:
    """The daemon's next ``restart`` serves ``root``, an empty folder but for its key (the
    same key: the plane's runner record is left as it is)."""
    root.mkdir(mode=0o700)
    shutil.copy2(daemon.root / TOKEN_FILE_NAME, root / TOKEN_FILE_NAME)
    daemon.root = root


def _wipe(root: Path) -> None:
    """Everything in the daemon's folder goes but its key (a state folder wiped in place, as
    an operator does it: what the killed daemon left mounted there detached first)."""
    token = (root / TOKEN_FILE_NAME).read_bytes()
    remove_home(root)
    root.mkdir(mode=0o700)
    (root / TOKEN_FILE_NAME).write_bytes(token)
    (root / TOKEN_FILE_NAME).chmod(0o600)


async def _ended_replaced(plane: ControlPlane, execution_id: str) -> ExecutionView:
    """The record once it is final: ``unknown``, with the replaced state's reason."""
    view = await ended(plane, execution_id)
    assert view.state == ExecutionState.unknown, view
    assert view.error == unstarted.STATE_REPLACED, view.error
    return view


async def test_a_start_that_ran_on_a_replaced_state_is_not_never_started(home: Path) -> None:
    """E9/E10: the start reached the daemon and its command ran (the daemon held the answer
    while it did), the daemon was killed -9, and came back on a new ``--root``. It holds no
    trace of the execution (NO_TRACE), but from another state than the start was sent to: the
    record ends ``unknown`` saying the state was replaced, not "never started … run it again";
    the writer is free."""
    plane, daemon, remote = await outage_yard(home)
    try:
        before = (await daemon.runner.info()).state_id
        assert before is not None
        result = await killed_on_it(daemon, await held_start(plane, remote))
        record = await plane.store.get_execution(result.execution_id)
        assert record is not None and record.runner_state == before  # the state it went to
        assert (home / "daemon" / "executions" / result.execution_id).is_dir()  # it ran there
        _point_at_new_root(daemon, home / "daemon-new")
        await daemon.restart()
        after = (await daemon.runner.info()).state_id
        assert after is not None and after != before
        view = await _ended_replaced(plane, result.execution_id)
        assert "never started" not in (view.error or "") and view.was_unknown
        space = await plane.store.get_workspace(view.workspace_id)
        assert space is not None and space.writer_id is None  # the writer was released
    finally:
        await plane.aclose()
        await daemon.stop()


async def test_a_plane_restarted_meanwhile_reads_the_state_from_the_record(home: Path) -> None:
    """E9/E11: as the first test, but the plane is closed while the record is unknown and a
    new plane on the same home comes up after the daemon is back on a new folder: it knows
    only the new state (its heartbeats never saw the old one), the record names the old one
    (the store keeps it), so the answer still reads "replaced", not "never started"."""
    daemon, execution_id = await closed_while_unknown(home)
    _point_at_new_root(daemon, home / "daemon-new")
    await daemon.restart()
    again, _, _ = await open_yard(home, "local")
    try:
        await _ended_replaced(again, execution_id)
    finally:
        await again.aclose()
        await daemon.stop()


async def test_an_unread_start_then_a_wiped_state_is_not_never_started(home: Path) -> None:
    """E9: the daemon stopped (SIGSTOP) so the start waits unread on its socket, killed -9,
    its folder wiped in place, started again. Nothing ran here, but the plane cannot tell
    that from a start the old state ran (the wipe took the trace either way): ``unknown``
    with the replaced state's reason, never "never started"."""
    plane, daemon, _ = await outage_yard(home)
    try:
        submit = await unread_start(plane, daemon, "echo run >> runs.txt")
        result = await killed_on_it(daemon, submit)
        _wipe(daemon.root)
        await daemon.restart()
        await _ended_replaced(plane, result.execution_id)
    finally:
        await plane.aclose()
        await daemon.stop()


async def test_an_unread_start_on_the_same_state_is_still_never_started(home: Path) -> None:
    """E9/E10, the plain case: as above without the wipe. The daemon back on the same folder
    keeps its state id, which the record names: NO_TRACE from it is "never started" (failed),
    and the command never ran."""
    plane, daemon, _ = await outage_yard(home)
    try:
        before = (await daemon.runner.info()).state_id
        submit = await unread_start(plane, daemon, "echo run >> runs.txt")
        result = await killed_on_it(daemon, submit)
        await daemon.restart()
        assert (await daemon.runner.info()).state_id == before
        assert (daemon.root / state_id.STATE_FILE).read_text().strip() == before
        record = await plane.store.get_execution(result.execution_id)
        assert record is not None and record.runner_state == before
        view = await until(plane, result.execution_id, {ExecutionState.failed})
        assert view.error == unstarted.NEVER_STARTED, view.error
        after = await plane.executions.run_shell(
            RunShellRequest(command="cat runs.txt || echo none", runner_id="remote")
        )
        assert after.stdout.strip().endswith("none"), after.stdout  # never run late
    finally:
        await plane.aclose()
        await daemon.stop()

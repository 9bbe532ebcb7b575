"""Attack pass on the sandbox's own mounts (runner/own_mounts.py; R2, docs/security.md "Host
paths"): holding only an agent's powers, learn the home's path or make the runner (root)
misbehave through the overlay each workspace, home and read view now is.

Real bubblewrap sandboxes on the in-process local runner and a runner daemon; root needed
(the overlays are a root runner's), skipped with the reason otherwise."""

from __future__ import annotations

import asyncio
import os

import pytest

from conftest import Yard
from shellyard.contract.executions import ExecutionState

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox's own mounts are a root runner's"),
]

#: Every descriptor link a command can read: its own, its parent's, the sandbox's init's.
FD_LINKS = (
    "for f in /proc/self/fd/* /proc/$$/fd/* /proc/1/fd/* /proc/1/cwd /proc/1/root; do "
    'echo "$f $(readlink "$f")"; done'
)


async def _warm_for(yard: Yard, workspace_id: str) -> None:
    """The in-process runner's next sandbox of ``workspace_id`` is made ahead (warm.py)."""
    for _ in range(500):
        if workspace_id in yard.runner._runs.warm.waiting():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"no warm sandbox was made for {workspace_id}")


def _no_home(text: str, yard: Yard) -> None:
    for root in {str(yard.home), str(yard.home.resolve())}:
        assert root not in text, text


async def test_the_log_descriptors_name_no_host_path(yard: Yard) -> None:
    """A sandbox's stdout and stderr are the runner's log files, inherited as descriptors:
    ``readlink /proc/self/fd/1`` printed ``<home>/runners/local/executions/ex_…/stdout`` (the
    kernel prints an open file's path up to the root of the mount it was opened through, the
    host's here). Opened through a detached copy of the folder's mount, the link reads
    ``/stdout``: the same for a cold sandbox, a warm one, a read-only and a background one."""
    first = await yard.run(FD_LINKS)
    assert first.exit_code == 0, first
    _no_home(first.stdout + first.stderr, yard)
    links = dict(line.split(" ", 1) for line in first.stdout.splitlines())
    assert links["/proc/1/fd/1"] == "/stdout" and links["/proc/1/fd/2"] == "/stderr", links
    if yard.daemon is None:  # the in-process runner: its pool is reachable
        await _warm_for(yard, first.workspace_id)
    warm = await yard.run(FD_LINKS)
    ro = await yard.run(FD_LINKS, read_only=True)
    for done in (warm, ro):
        assert done.exit_code == 0, done
        _no_home(done.stdout + done.stderr, yard)
        assert "/proc/1/fd/1 /stdout" in done.stdout, done.stdout
    bg = await yard.run(FD_LINKS + " >&2", background=True)
    view = await yard.plane.executions.wait(bg.execution_id, 60)
    assert view.state == ExecutionState.completed, view
    logs = await yard.plane.executions.logs(bg.execution_id, stream="stderr")
    _no_home(logs.data, yard)
    assert "/proc/1/fd/2 /stderr" in logs.data, logs.data

"""What a sandbox's making does off the event loop's thread: a warm one's spawn (warm.py) and
an execution's own (supervise.py ``_launch_cold``) in a worker thread, the wait for a
workspace's group being reset (R2), the reaping of a waiter. With 16 agents the loop's thread
was saturated, a quarter of it blocked in vfork until the child exec'd (docs/benchmarks.md
§58), then the cold spawn's share the largest (§62)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shellyard.runner import processes
from shellyard.runner.limits.cgroups import CgroupTree
from shellyard.runner.sandbox.spawn import Started

#: How long a warm sandbox's making waits for its workspace's group being reset (ready_groups.py
#: ``when_ready``): the reset waits up to ``recycle.SETTLE_S`` for the ended sandbox's last
#: processes, then makes a fresh group instead.
GROUP_WAIT_S = 1.0
#: How long an execution's spawn, cancelled in flight, waits for bwrap to report its
#: sandbox's init (``end_execution_spawn``) before its own group is killed instead.
UNDO_WAIT_S = 5.0


async def group_reset(groups: CgroupTree, workspace_id: str) -> bool:
    """R2: the workspace's group on its way (an execution's that just ended, being reset by
    the removal thread: a warm sandbox made at that end) is waited for, at most
    ``GROUP_WAIT_S``, so the spawn takes it rather than make a group of its own while the
    reset one waits unused (docs/benchmarks.md §55, §58). True: one was on its way."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    def done() -> None:  # on the removal thread
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(wake)

    if not groups.ready.when_ready(workspace_id, done):
        return False
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ready, GROUP_WAIT_S)
    return True


async def spawn_in_thread(
    spawn: Callable[[], Started],
    undo: Callable[[Started], object] | None = None,
) -> Started:
    """``spawn`` (a ``PendingSpawn.spawn``, a ``ColdSpawn.run``) in a worker thread.
    Cancelled meanwhile (the loop stops, the start's caller is cancelled), it still waits
    for that thread: the spawn uses descriptors the caller closes once this returns (one
    closed under it could be a number reused, given to the sandbox); what it spawned is
    ended by ``undo`` (default: bwrap's group killed and reaped) in a worker thread too,
    waited for, then the cancellation goes on."""
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(None, spawn)
    cancelled = await _through(future)
    if not cancelled:
        return future.result()
    if not future.cancelled() and future.exception() is None:
        started = future.result()
        await _through(loop.run_in_executor(None, undo or kill_spawned, started))
    raise asyncio.CancelledError


async def _through(future: asyncio.Future[Any]) -> bool:
    """Wait until ``future`` (a worker thread's) is done, cancelled or not; True: this
    task was cancelled meanwhile (the caller raises it once what it waits for is over)."""
    cancelled = False
    while not future.done():
        try:
            await asyncio.wait([future])  # never cancels ``future`` itself
        except asyncio.CancelledError:
            cancelled = True
    return cancelled


def kill_spawned(started: Started) -> None:
    """A warm sandbox's bwrap killed, its group with it, and reaped: its waiter, its pipe's
    writer gone, has run nothing."""
    processes.signal_group(started.popen.pid, signal.SIGKILL)
    reap_popen(started.popen)


def end_execution_spawn(started: Started, status: Path, marker: bytes) -> None:
    """An execution's own (cold) bwrap ended before anyone was told it ran: its pid
    namespace's init killed (every process of the sandbox with it), then bwrap reaped.
    bwrap's own group is not enough: the init leads a session of its own
    (``--new-session``) and outlives its monitor (no ``--die-with-parent`` for executions,
    bwrap.py). Until bwrap has reported the init's pid (``status``, a few ms after its
    setup) that is waited for, at most ``UNDO_WAIT_S``; bwrap exiting first (it failed)
    is the end too."""
    popen = started.popen
    deadline = time.monotonic() + UNDO_WAIT_S
    while popen.poll() is None and time.monotonic() < deadline:
        init_pid = processes.read_bwrap_status(status).get("child-pid")
        if isinstance(init_pid, int):
            _kill_marked(init_pid, marker)
            break
        time.sleep(0.002)
    reap_popen(popen)


def _kill_marked(pid: int, marker: bytes) -> None:
    """SIGKILL ``pid`` if its environment holds ``marker`` (not a pid reused meanwhile)."""
    with contextlib.suppress(OSError):
        if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            processes.signal_process(pid, signal.SIGKILL)


def reap_popen(popen: subprocess.Popen[bytes]) -> bool:
    """The waiter ends on its pipe's end (at once once bwrap has set up); killed if not."""
    try:
        popen.wait(timeout=5)
    except subprocess.TimeoutExpired:
        processes.signal_group(popen.pid, signal.SIGKILL)
        try:
            popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return False
    return True

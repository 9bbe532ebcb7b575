"""Process facts read from /proc, and signals. Pids are reused, so every live check
compares the recorded start time (field 22 of /proc/PID/stat) with the current one."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any


def start_time(pid: int) -> int | None:
    """Start time in clock ticks since boot, or None if the pid is gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name may contain spaces and parentheses; fields resume after the last ')'.
    fields = raw[raw.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def is_same_process(pid: int, recorded_start: int) -> bool:
    return start_time(pid) == recorded_start


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(part) for part in text.split()]


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def signal_process(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def read_bwrap_status(path: Path) -> dict[str, Any]:
    """Merge the JSON documents bwrap wrote to --json-status-fd (one per line)."""
    merged: dict[str, Any] = {}
    try:
        text = path.read_text()
    except OSError:
        return merged
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue  # a half-written last line after a crash
        if isinstance(doc, dict):
            merged.update(doc)
    return merged


def reap_if_child(pid: int) -> int | None:
    """Collect the exit status when ``pid`` is our child, so it leaves no zombie."""
    try:
        reaped, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    if reaped == 0:
        return None
    return os.waitstatus_to_exitcode(status)


async def kill_and_wait(pid: int, marker: bytes, timeout_s: float = 30.0) -> bool:
    """SIGKILL ``pid`` if it is still the process whose environment holds ``marker`` (a pid
    may have been reused), then wait until it has exited. For a pid namespace's init that
    means every process of the namespace is gone: the kernel kills them all and the init's
    exit waits until they are. The kill alone returns at once, while the namespace's
    processes may still be alive for a while on a busy host. False on timeout."""
    try:
        pidfd = os.pidfd_open(pid)
    except (ProcessLookupError, PermissionError):
        return True
    except OSError:  # EMFILE at the descriptor limit, ENOSYS: the same, polled
        return await _kill_and_poll(pid, marker, timeout_s)
    try:
        try:
            environ: bytes | None = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            # Exiting (its memory is gone, so no environment): an init leaving its namespace
            # is still killing and waiting for that namespace's processes, so wait for its
            # exit without a signal (whoever it is, it is on its way out).
            environ = None
        if environ is not None:
            if marker not in environ.split(b"\0"):
                return True  # the pid now names another process
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        loop = asyncio.get_running_loop()
        exited = loop.create_future()

        def on_exit() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(pidfd, on_exit)
        try:
            await asyncio.wait_for(exited, timeout_s)
        except TimeoutError:
            return False
        finally:
            loop.remove_reader(pidfd)
        return True
    finally:
        os.close(pidfd)


async def gone(pid: int, recorded_start: int, every_s: float = 0.05) -> None:
    """Returns once ``pid`` has exited (or is a zombie): the watch of a process when the
    kernel gives no pidfd (EMFILE at the descriptor limit, ENOSYS before Linux 5.3)."""
    while is_same_process(pid, recorded_start):
        await asyncio.sleep(every_s)


async def _kill_and_poll(pid: int, marker: bytes, timeout_s: float) -> bool:
    """``kill_and_wait`` without a pidfd: the start time read before the marker is checked
    tells the process apart from a later one of the same pid."""
    started = start_time(pid)
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        environ = None  # exiting (see kill_and_wait), or gone
    if started is None or (environ is not None and marker not in environ.split(b"\0")):
        return True
    if environ is not None:
        signal_process(pid, signal.SIGKILL)
    try:
        await asyncio.wait_for(gone(pid, started), timeout_s)
    except TimeoutError:
        return False
    return True

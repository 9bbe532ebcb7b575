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


def read_file(path: str | os.PathLike[str]) -> bytes:
    """A small file's bytes by ``os.open``/``os.read``: no buffered file object, whose set-up
    (an fstat, a TCGETS ioctl, an lseek and the wrapper's Python) cost more than the read of a
    /proc file or bwrap's status at every execution's end (docs/benchmarks.md §75). Reads to
    the end, as ``Path.read_bytes`` does (a /proc file may return less than it holds)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, 65536)]
        while chunks[-1]:
            chunks.append(os.read(fd, 65536))
    finally:
        os.close(fd)
    return chunks[0] if len(chunks) == 2 else b"".join(chunks)


def start_time(pid: int) -> int | None:
    """Start time in clock ticks since boot, or None if the pid is gone or a zombie."""
    try:
        raw = read_file(f"/proc/{pid}/stat")
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
        text = read_file(path).decode(errors="replace")
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
            environ: bytes | None = read_file(f"/proc/{pid}/environ")
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
        # A timer of its own on the future, not ``asyncio.wait_for``: the same wait (a
        # cancel of the caller cancels it, the reader and the timer go either way) without
        # wait_for's second future and callbacks at every execution's end
        # (docs/benchmarks.md §75).
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[bool] = loop.create_future()

        def settle(gone: bool) -> None:
            if not exited.done():
                exited.set_result(gone)

        loop.add_reader(pidfd, settle, True)
        timer = loop.call_later(timeout_s, settle, False)
        try:
            return await exited
        finally:
            timer.cancel()
            loop.remove_reader(pidfd)
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
        environ = read_file(f"/proc/{pid}/environ")
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

"""``os.pidfd_open`` and ``signal.pidfd_send_signal`` for a process under valgrind 3.19,
which knows neither system call (ENOSYS): bench/bench_server_instructions.py only.

The stand-in for a pidfd is a pipe's read end that turns readable when the process has
exited, as a pidfd does: a thread per process waits for it, blocked in ``waitid(…,
WNOWAIT)`` for a child of this process (the child stays waitable: ``Popen`` still reaps
it), or, for another process (a sandbox's namespace init), polling ``kill(pid, 0)`` and its
``/proc`` state every millisecond. The thread's instructions are counted with the server's;
both sides of a comparison pay them alike.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

_PIDS: dict[int, int] = {}
_LOCK = threading.Lock()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def _wait(pid: int, write_end: int, child: bool) -> None:
    try:
        if child:
            # reaped meanwhile by Popen: it has exited
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        else:
            while not _gone(pid):
                time.sleep(0.001)
        with contextlib.suppress(OSError):  # the reader closed its end: nobody waits any more
            os.write(write_end, b"x")
    finally:
        os.close(write_end)


def pidfd_open(pid: int, flags: int = 0) -> int:
    del flags
    with contextlib.suppress(PermissionError):  # ESRCH goes to the caller, as pidfd_open's
        os.kill(pid, 0)
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        child = True
    except ChildProcessError:
        child = False
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    with _LOCK:
        _PIDS[read_end] = pid
    threading.Thread(target=_wait, args=(pid, write_end, child), daemon=True).start()
    return read_end


def pidfd_send_signal(pidfd: int, sig: int, *_args: object) -> None:
    with _LOCK:
        pid = _PIDS[pidfd]
    os.kill(pid, sig)


def install() -> None:
    os.pidfd_open = pidfd_open  # type: ignore[assignment]
    signal.pidfd_send_signal = pidfd_send_signal  # type: ignore[assignment]

"""Reading, writing and removing cgroup folders (R2; docs/limits.md "Tenants"): the file-level
helpers of cgroups.py and weight.py. A control file is a few bytes, read and written with plain
``os`` calls; a group is removed once the processes still exiting in it have gone.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import time
from pathlib import Path

from shellyard.paths import StrPath
from shellyard.runner import processes

log = logging.getLogger(__name__)

#: How long ``finish`` waits for a group's last processes to go before it gives up on rmdir.
REMOVE_WAIT_S = 2.0
#: How long a busy group's processes are given to finish exiting before they are killed.
EXITING_WAIT_S = 0.01


def read(path: StrPath) -> str | None:
    # os.open/os.read, not Path.read_text: a control file is a few bytes, and the text
    # wrapper's set-up was half the cost of each read at the end of every execution.
    try:
        return processes.read_file(path).decode()
    except (OSError, UnicodeDecodeError):
        return None


def keyed(text: str | None, key: str) -> int:
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().lstrip("-").isdigit():
            return int(value)
    return 0


def write(path: StrPath, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def children(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.is_dir()]
    except OSError:
        return []


def remove(folder: Path, mechanism: str) -> None:
    """rmdir the group, first ending what is still in it (its pids are this group's only)."""
    if not folder.is_dir():
        return
    started = time.monotonic()
    deadline = started + REMOVE_WAIT_S
    killed = False
    while True:
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                log.warning("could not remove the cgroup %s: %s", folder, exc)
                return
        if not killed and time.monotonic() - started < EXITING_WAIT_S:
            # Most often the sandbox's init, still exiting: bwrap's monitor ends on its
            # report, before it has left its groups (docs/benchmarks.md §34).
            time.sleep(0.001)
            continue
        if not killed:
            killed = True
            if mechanism == "v2" and (folder / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    write(folder / "cgroup.kill", "1")
            else:
                for pid in (read(folder / "cgroup.procs") or "").split():
                    with contextlib.suppress(OSError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.01)

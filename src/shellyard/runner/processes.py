"""Process facts read from /proc, and signals. Pids are reused, so every live check
compares the recorded start time (field 22 of /proc/PID/stat) with the current one."""

from __future__ import annotations

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

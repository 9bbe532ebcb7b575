"""The identity of a runner's state folder (E9, E10; docs/runners.md "A runner whose state was
replaced").

A runner answers ``NO_TRACE`` for an execution id it holds no folder of, which the control
plane reads as "the start never reached it" for a start whose answer never came. That reading
holds only for the state the start was sent to: a folder wiped or swapped (a host
reinstalled, ``--root`` pointed elsewhere, a restore) holds no trace of what the old one ran.
So each state folder gets an id, written once when the folder first lacks one and never
changed after, announced in ``info`` and in every ``NO_TRACE`` answer; the plane keeps the id
a start went to and reads ``NO_TRACE`` from another id as "not known", never "never started".

The file is not in a backup (``backup.ORDER`` copies named subtrees only): a restored runner
folder is a state of its own and gets a new id.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

#: The file in the runner's root that holds its state id.
STATE_FILE = "state_id"


def _valid(text: str) -> bool:
    return 16 <= len(text) <= 64 and all(c in "0123456789abcdef" for c in text)


def load_or_create(root: Path) -> str:
    """The state id of the runner folder ``root``, made (random, 0600) on its first call.

    Written through a temporary file linked into place (``link`` fails on an existing name):
    a runner killed while writing leaves no half-written id, and two starts on one folder end
    with the same id. A file that holds no valid id (damaged) is replaced by a new one: the
    state it named cannot be told from a new one, so it counts as new, the cautious reading.
    """
    path = root / STATE_FILE
    with contextlib.suppress(FileNotFoundError):
        text = path.read_text(encoding="ascii", errors="replace").strip()
        if _valid(text):
            return text
        path.unlink()
    state = secrets.token_hex(16)
    tmp = root / f".{STATE_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(state + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:  # another start on this folder won: its id is the one
            return load_or_create(root)
    finally:
        tmp.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # the link survives a crash once the folder is synced
        dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return state


__all__ = ["STATE_FILE", "load_or_create"]

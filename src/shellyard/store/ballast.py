"""Room kept for the database and server.log on a full volume (docs/limits.md "Full disk,
long commands and bounded records"; docs/operations.md).

A SQLite home keeps ``<database>-reserve``: a file of ``BALLAST_BYTES`` allocated up front
(``posix_fallocate``: real blocks, also on tmpfs). When a write of the database meets a full
volume (SQLITE_FULL), the file is deleted and the transaction tried once more, so the record
of what happened (a stopped execution, a cancel, a retention pass) is still written, and so
is the service's own log. Without the file, or when the retry meets a full volume again, the
answer is ``StoreFull`` (507, retry later) and nothing is half written. The file comes back
(``ensure``) at start and at each retention pass, once the volume has the room again.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

#: What the database and server.log may still write once the volume is full: a few
#: thousand transactions of the records (each a few KiB with its WAL frames).
BALLAST_BYTES = 32 << 20


class Ballast:
    def __init__(self, path: Path, size: int = BALLAST_BYTES) -> None:
        self.path = path
        self.size = size

    def ensure(self) -> bool:
        """Make the file when it is missing and the volume has twice its size free."""
        if self.size <= 0:
            return False
        with contextlib.suppress(OSError):
            if self.path.stat().st_size >= self.size:
                return True
        try:
            st = os.statvfs(self.path.parent)
            if st.f_bavail * st.f_frsize < 2 * self.size:
                return False
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.size)
            finally:
                os.close(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                self.path.unlink()
            log.warning("cannot keep room for the database in %s: %s", self.path, exc)
            return False
        return True

    def release(self) -> bool:
        """Give the room back to the volume; False when there was none to give."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        log.warning(
            "the volume of %s is full: released %d bytes kept for the database and the "
            "service's log; free space (delete files, gc) so work can go on",
            self.path.parent,
            self.size,
            extra={"action": "disk_full"},
        )
        return True

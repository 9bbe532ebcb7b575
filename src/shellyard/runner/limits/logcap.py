"""The retained-log cap (R2, E6; docs/limits.md): head and rolling tail of a live log file.

bwrap writes stdout/stderr straight into files opened with O_APPEND (no pipe, no Python
process in between: the fast durable path of local.py), so the cap cannot filter the bytes
on their way. Instead the watcher punches a hole into the middle of the file
(``fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)``): the blocks go back to the
volume while the writer keeps appending at the end, untouched. Offsets never move: the file's
size stays the number of bytes written, the kept head is ``[0, head)``, the dropped range
``[head, end)`` reads as a marker, and the tail ``[end, size)`` is the latest output.

The dropped range is recorded in ``<stream>.cut`` (JSON) *before* each punch, so a reader
never mistakes a hole (zeros) for output, also after a crash; readers stop a read at
``head`` and answer a read inside the hole with the marker and ``next_offset = end``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from shellyard.runner.limits.settings import format_size

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
#: Holes are cut in whole blocks (the file system frees only whole ones).
BLOCK = 4096

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_fallocate = _libc.fallocate
_fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
_fallocate.restype = ctypes.c_int


@dataclass
class Cut:
    #: Bytes kept from the start of the stream.
    head: int
    #: First byte of the kept tail; ``[head, end)`` was dropped.
    end: int

    @property
    def dropped(self) -> int:
        return self.end - self.head


def cut_path(log: Path) -> Path:
    return log.with_name(log.name + ".cut")


def load_cut(log: Path) -> Cut | None:
    try:
        data = json.loads(cut_path(log).read_text())
        return Cut(head=int(data["head"]), end=int(data["end"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def marker(cut: Cut) -> bytes:
    return (
        f"\n[shellyard: {cut.dropped} bytes ({format_size(cut.dropped)}) of this log were "
        f"dropped here by the runner's retained-log limit; the head and the tail are kept]\n"
    ).encode()


def trim(log: Path, limit: int, size: int, previous: Cut | None) -> Cut | None:
    """Cut ``log`` (now ``size`` bytes long) down to ``limit`` kept bytes when it is over.

    Keeps ``head`` = half the limit (block-aligned) and at least ``limit - head`` bytes of
    tail; the kept data stays within ``limit + BLOCK``. Returns the cut now in force."""
    if limit <= 0 or size <= limit:
        return previous
    head = (limit // 2) // BLOCK * BLOCK
    end = (size - (limit - head)) // BLOCK * BLOCK
    start = head if previous is None else previous.end
    if end <= start:
        return previous
    cut = Cut(head=head, end=end)
    _record(log, cut, limit)  # before the punch: a reader never takes the hole for output
    fd = os.open(log, os.O_WRONLY | os.O_CLOEXEC)
    try:
        if _fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, start, end - start) != 0:
            err = ctypes.get_errno()
            # Nothing was dropped: the record must not hide bytes that are still there.
            _record(log, previous, limit)
            raise OSError(err, f"cannot punch a hole into {log}: {os.strerror(err)}")
    finally:
        os.close(fd)
    return cut


def _record(log: Path, cut: Cut | None, limit: int) -> None:
    if cut is None:
        cut_path(log).unlink(missing_ok=True)
        return
    tmp = cut_path(log).with_suffix(".tmp")
    tmp.write_text(json.dumps({"head": cut.head, "end": cut.end, "limit": limit}))
    os.replace(tmp, cut_path(log))


def read(log: Path, offset: int, limit: int) -> tuple[bytes, int, int, int]:
    """(data, offset, next_offset, size) of a log read, with the dropped range as a marker.

    A read that starts in the head stops at ``head``; one that starts in the dropped range
    returns the marker and ``next_offset = end``; in the tail it reads the file as is."""
    with log.open("rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        start = min(offset, size)
        cut = load_cut(log)
        if cut is not None and cut.head <= start < cut.end:
            return marker(cut), start, cut.end, size
        length = limit
        if cut is not None and start < cut.head:
            length = min(length, cut.head - start)
        handle.seek(start)
        data = handle.read(length)
    # The watcher may have cut more while we read (it records the cut before punching).
    later = load_cut(log)
    if later is not None and later.head <= start < later.end:
        return marker(later), start, later.end, size
    return data, start, start + len(data), size

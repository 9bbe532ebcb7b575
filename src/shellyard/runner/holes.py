"""Files with holes (sparse files) read, stored and copied without filling their holes.

``truncate -s 3G big`` in a workspace, or a build that leaves such a file in its prefix, takes
no block of the volume: the free-space reserve never sees it (R2, docs/limits.md "Sparse
files"). The snapshot store names an object by the sha256 of its whole content, so the holes
are hashed (as zeros, never read from the disk), but they are not written: an object, a
restored file and a read view keep the holes of the file they came from, and their blocks are
the file's data blocks. The data ranges come from ``SEEK_DATA``/``SEEK_HOLE`` (every Linux file
system answers them; one without its own support reports the whole file as data).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from typing import Protocol

#: Bytes read, hashed and written at a time (and the size of the zeros hashed for a hole).
CHUNK = 1 << 20
_ZEROS = bytes(CHUNK)
_ZERO_VIEW = memoryview(_ZEROS)


class Hasher(Protocol):
    def update(self, data: bytes | bytearray | memoryview, /) -> None: ...


def has_holes(st: os.stat_result) -> bool:
    """True when the file takes fewer blocks than its size (it has a hole somewhere)."""
    return st.st_blocks * 512 < st.st_size


def data_ranges(fd: int, start: int = 0) -> Iterator[tuple[int, int]]:
    """``(first, end)`` of each range of data from ``start`` on; what lies between them and
    after the last one is a hole. Moves the descriptor's offset (callers use ``pread``)."""
    pos = start
    while True:
        try:
            first = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                return  # nothing but a hole (or the end) from ``pos`` on
            if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            end = os.fstat(fd).st_size  # no SEEK_DATA here: all of it is data
            if end > pos:
                yield pos, end
            return
        end = os.lseek(fd, first, os.SEEK_HOLE)
        if end <= first:
            return
        yield first, end
        pos = end


def hash_zeros(hasher: Hasher, count: int) -> None:
    """Feed ``count`` zero bytes to ``hasher`` (a hole's content) in bounded memory."""
    while count > 0:
        step = min(count, CHUNK)
        hasher.update(_ZERO_VIEW[:step])
        count -= step


def is_zeros(data: bytes | bytearray | memoryview) -> bool:
    """True when every byte is 0 (a compare that stops at the first other byte)."""
    view = memoryview(data)
    while view:
        step = min(len(view), CHUNK)
        if not _ZEROS.startswith(view[:step]):
            return False
        view = view[step:]
    return True


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def copy_hashing(src: int, dst: int, start: int, hasher: Hasher) -> int:
    """Copy ``src`` from ``start`` to its end into ``dst`` at the same offsets, hashing every
    byte, writing only its data ranges: the holes stay holes in ``dst``. Returns the size
    copied (the file may change meanwhile: what was hashed is what ``dst`` holds)."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    pos = start
    for first, end in data_ranges(src, start):
        hash_zeros(hasher, first - pos)
        pos = first
        while pos < end:
            n = os.preadv(src, [view[: min(CHUNK, end - pos)]], pos)
            if n == 0:  # it shrank under us: it ends here
                os.ftruncate(dst, pos)
                return pos
            hasher.update(view[:n])
            pwrite_all(dst, view[:n], pos)
            pos += n
    size = max(pos, os.fstat(src).st_size)
    hash_zeros(hasher, size - pos)
    os.ftruncate(dst, size)  # a hole at the end is a size, not blocks
    return size


def copy_ranges(src: int, dst: int, size: int | None, chunk: int) -> int:
    """Copy a file with holes from offset 0 into ``dst`` (an empty file), data ranges only
    (``copy_file_range`` each), then set its size: no hole is filled. Returns the size."""
    limit = os.fstat(src).st_size if size is None else size
    for first, end in data_ranges(src, 0):
        pos, end = first, min(end, limit)
        while pos < end:
            n = os.copy_file_range(src, dst, min(chunk, end - pos), pos, pos)
            if n == 0:
                break
            pos += n
        if end >= limit:
            break
    os.ftruncate(dst, limit)
    return limit


__all__ = [
    "CHUNK",
    "copy_hashing",
    "copy_ranges",
    "data_ranges",
    "has_holes",
    "hash_zeros",
    "is_zeros",
    "pwrite_all",
]

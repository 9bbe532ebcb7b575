"""Files a package tool left in a prefix, read or written by the runner (root on a root
runner) without following a link and without reading more than it needs (R2; docs/security.md
"Attack pass (session 43)").

A prefix is the tools' uid's own while a change runs, so a build backend (the agent's code)
may leave a symbolic link or a huge sparse file anywhere in it: ``lib`` as a link to a host
folder, ``lib/R/library/.shellyard-sources.tmp`` as a link to a root-only file, a METADATA of
64 GiB that takes no room. The runner reads the prefix only after its tools have ended, so a
walk from the prefix's own folder (made by the runner) by descriptors, one component at a
time with ``O_NOFOLLOW``, stays inside it; and each read stops at a bound.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

#: The most of a header-like file (METADATA, INSTALLER, DESCRIPTION) the runner reads.
HEADER_BYTES = 1 << 20
#: The most of a record file (pip-sources.json, conda-meta/*.json) the runner reads; a longer
#: one is treated as missing.
RECORD_BYTES = 64 << 20

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_folder(prefix: Path, rel: Path | str) -> int | None:
    """A descriptor of ``prefix/rel``, each component entered without following a link;
    None when a component is missing, not a folder, or a link."""
    try:
        fd = os.open(prefix, _DIR)
    except OSError:
        return None
    for part in Path(rel).parts:
        if part in ("", ".", "..", "/"):
            os.close(fd)
            return None
        try:
            following = os.open(part, _DIR, dir_fd=fd)
        except OSError:
            os.close(fd)
            return None
        os.close(fd)
        fd = following
    return fd


@contextlib.contextmanager
def folder(prefix: Path, rel: Path | str) -> Iterator[int | None]:
    fd = open_folder(prefix, rel)
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def read_at(dir_fd: int, name: str, limit: int = HEADER_BYTES, *, whole: bool = False) -> str:
    """The text of the regular file ``name`` in ``dir_fd`` (its first ``limit`` bytes; with
    ``whole``, OSError when it is longer). OSError for a link, a FIFO, a device, a folder."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    fd = os.open(name, flags, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{name} is not a regular file")
        if whole and st.st_size > limit:
            raise OSError(f"{name} is longer than {limit} bytes")
        chunks: list[bytes] = []
        left = limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(fd)


def write_at(dir_fd: int, name: str, text: str, mode: int = 0o644) -> None:
    """Replace ``name`` in ``dir_fd`` with ``text``: a new temp file (``O_EXCL``, never a
    link a build left) renamed over it inside the same folder."""
    tmp = f".{name}.shellyard-tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dir_fd)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode, dir_fd=dir_fd)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        os.fchmod(handle.fileno(), mode)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)

"""The object store: file contents named by their content id, written once, mode 0o444.

A content id is the sha256 of the content, or for content holding a whole MiB of zeros its
chunk-list id (contentid.py), so a hole is never hashed. Both are 64 hex digits, so the store
records which ids are chunk lists: an empty file ``objects/chunk-lists/<id>``, made before its
object is renamed into place. Every object without one is named by its real sha256 (objects
under 1 MiB always are), which the API may then show as the file's ``sha256``; a marker left
by a crash between an object's removal and its own is harmless (an id is a chunk list or
not, whatever stores it).

Objects are never hard-linked to workspace files: a command could change a linked file's
bytes, and a snapshot's objects must stay immutable. Each is written to a temp file under
``objects/tmp/`` and renamed into place once complete, so a reader never sees half of one.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import re
import stat as stat_mod
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

from shellyard.errors import InvalidInput, NotFound
from shellyard.runner import workspace_paths
from shellyard.runner.protocol import PathEntry
from shellyard.runner.snapshots.budget import HashBudget
from shellyard.runner.snapshots.contentid import (
    CHUNK,
    ContentId,
    has_zero_chunk_hole,
    pread_reread,
)
from shellyard.runner.snapshots.format import O_CLOEXEC, write_all
from shellyard.runner.snapshots.scan import OPEN_FILE, VANISHED

#: Files smaller than this are read with one read(); larger ones are streamed in chunks.
_SMALL_FILE = 1 << 20
#: Read-write: a content id may read back what was copied so far (contentid.ContentId).
OPEN_TMP = os.O_RDWR | os.O_CREAT | os.O_EXCL | O_CLOEXEC
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")

#: (digest, size read, stat before reading, bytes hashed) or None when the file is gone or
#: not a file.
Stored = tuple[bytes, int, os.stat_result, int] | None


def _process_umask() -> int | None:
    """The umask, read without changing it (Linux /proc); None if unknown."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return None


class ObjectStore:
    """``objects/`` of a snapshot store; ``workers`` threads hash and copy big files."""

    def __init__(self, objects: Path, workers: int) -> None:
        self._objects = objects
        self._tmp = objects / "tmp"
        objects.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._tmp.mkdir(mode=0o700, exist_ok=True)
        self._chunk_lists = objects / "chunk-lists"
        self._chunk_lists.mkdir(mode=0o700, exist_ok=True)
        if not (objects / "ff").is_dir():
            for i in range(256):
                (objects / f"{i:02x}").mkdir(mode=0o700, exist_ok=True)
        self._objects_str = f"{objects}/"
        self._tmp_prefix = f"{self._tmp}/{os.getpid()}-{id(self):x}-"
        self._remove_stale_tmp()
        self._tmp_counter = itertools.count()
        umask = _process_umask()
        self._fchmod_objects = umask is None or bool(umask & 0o444)
        self.workers = workers
        self._guard = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def close(self) -> None:
        """Stop the hashing threads (they restart on demand)."""
        with self._guard:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _remove_stale_tmp(self, older_than_s: float = 3600.0) -> None:
        """Temp objects left by a crash (a live writer touches its own within seconds)."""
        cutoff = time.time() - older_than_s
        with contextlib.suppress(OSError), os.scandir(self._tmp) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                        os.unlink(entry.path)

    def mark_chunk_list(self, hexdigest: str) -> None:
        """Record that ``hexdigest`` is a chunk-list id (before its object is in place)."""
        marker = self._chunk_lists / hexdigest
        if not marker.exists():
            marker.touch(mode=0o400)

    def forget_chunk_list(self, hexdigest: str) -> None:
        """Drop the marker of a collected object (after the object: never one without it)."""
        with contextlib.suppress(FileNotFoundError):
            (self._chunk_lists / hexdigest).unlink()

    def sha256_of(self, content_id: str, size: int) -> str | None:
        """The real sha256 of the object ``content_id`` when its id is one, else None
        (a stat for objects of a chunk or more; nothing below that)."""
        if size < CHUNK or not (self._chunk_lists / content_id).exists():
            return content_id
        return None

    def reveal(self, entry: PathEntry) -> PathEntry:
        """``entry`` with its ``sha256`` set from its content id when that is one."""
        if entry.content_id is not None and entry.sha256 is None:
            entry.sha256 = self.sha256_of(entry.content_id, entry.size)
        return entry

    def pool(self) -> ThreadPoolExecutor:
        with self._guard:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self.workers, thread_name_prefix="snapshot-hash"
                )
            return self._pool

    def store_file(self, dfd: int, name: str, budget: HashBudget | None = None) -> Stored:
        """Read one workspace file (never through a symlink) into the store; return
        (digest, size read, stat before reading, bytes hashed), or None if it is no longer
        a file."""
        try:
            fd = os.open(name, OPEN_FILE, dir_fd=dfd)
        except OSError as exc:
            if exc.errno in VANISHED:
                return None
            raise
        try:
            st = os.fstat(fd)
            if not stat_mod.S_ISREG(st.st_mode):
                return None
            if budget is not None:  # before a byte is read
                sparse = workspace_paths.has_holes(st)
                budget.take(workspace_paths.hash_cost(fd, st.st_size) if sparse else st.st_size)
            if st.st_size < _SMALL_FILE:
                data = os.read(fd, st.st_size + 1)
                if len(data) <= st.st_size:
                    # under one chunk: its content id is its sha256 (contentid.py)
                    digest = hashlib.sha256(data).digest()
                    self._put_small(digest, data)
                    return digest, len(data), st, len(data)
                return self._put_stream(fd, data, st)
            return self._put_stream(fd, b"", st)
        finally:
            os.close(fd)

    def object_path(self, hexdigest: str) -> str:
        return f"{self._objects_str}{hexdigest[:2]}/{hexdigest[2:]}"

    def new_tmp(self) -> tuple[str, int]:
        tmp = f"{self._tmp_prefix}{next(self._tmp_counter)}"
        fd = os.open(tmp, OPEN_TMP, 0o444)
        if self._fchmod_objects:
            os.fchmod(fd, 0o444)
        return tmp, fd

    def _put_small(self, digest: bytes, data: bytes) -> None:
        final = self.object_path(digest.hex())
        if os.path.exists(final):
            return
        tmp, fd = self.new_tmp()
        try:
            write_all(fd, data)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        os.rename(tmp, final)

    def _put_stream(
        self, fd: int, head: bytes, st: os.stat_result
    ) -> tuple[bytes, int, os.stat_result, int]:
        """Copy a big file into a temp object while computing its content id, in bounded
        memory. Its holes are neither read, hashed nor written: the object keeps them
        (workspace_paths, "files with holes"), so a sparse file takes the store no more room
        than the workspace (R2), and its commit costs its data, not its size."""
        tmp, out = self.new_tmp()
        try:
            try:
                content = ContentId(reread=pread_reread(out))
                if workspace_paths.has_holes(st) and has_zero_chunk_hole(fd, st.st_size):
                    content.chunked()  # known now: nothing to read back later
                workspace_paths.pwrite_all(out, head, 0)
                content.update(head)
                size = workspace_paths.copy_hashing(fd, out, len(head), content)
            finally:
                os.close(out)
            digest = content.digest()
            if content.is_chunk_list:
                self.mark_chunk_list(digest.hex())
            final = self.object_path(digest.hex())
            if os.path.exists(final):
                os.unlink(tmp)
            else:
                os.rename(tmp, final)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return digest, size, st, content.hashed

    # ------------------------------------------------------------------ manifests

    def open_object(self, sha256: str) -> BinaryIO:
        """Open a stored object (by its content id in hex) for streaming reads; the caller
        closes it."""
        if not isinstance(sha256, str) or not _SHA256_HEX.fullmatch(sha256):
            raise InvalidInput(
                f"{sha256!r} is not an object name; pass a sha256 as 64 lowercase hex digits",
                sha256=str(sha256),
            )
        try:
            return open(self.object_path(sha256), "rb")
        except FileNotFoundError:
            raise NotFound(f"no object {sha256} in the snapshot store", sha256=sha256) from None

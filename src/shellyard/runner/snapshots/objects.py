"""Objects of a runner's snapshot store on the move (T2–T4) and their garbage collection.

**Packs.** A transfer between runners sends the objects the target lacks as one stream per
batch, never one request per file and never a whole file in memory. Version 2 sends each
object's data extents, not its holes::

    b"SYPACK2\\n"
    then per object: "<32sBQ" (content id, status, size)
        status 0: the object follows as extents, each "<QQ" (offset, length) then ``length``
            bytes, offsets rising and within ``size``; what no extent covers is zeros; the
            object ends with the extent (2**64-1, 0)
        status 1: the source has no such object (size 0)
    then the end frame: 32 zero bytes, status 2, size 0

Version 1 (``b"SYPACK1\\n"``, still imported; sent to a runner of protocol 2) has the same
frames but ``size`` bytes after a status 0: every zero of a hole crosses the wire.

The exporter reads each object's data ranges in bounded chunks (a range of zeros it read is
sent as a hole too); the importer writes each into a temp file while computing its content
id (contentid.py) and renames it into place only when that matches, so a corrupt or
truncated stream never puts a wrong object in the store. Per object the importer reports
``ok`` or why not (missing at the source, corrupt, out of room, the stream ended early).

**Garbage collection.** An object is garbage when no retained manifest of any workspace of
the store names it. ``collect_garbage`` marks every digest of every manifest and deletes the
rest, under the store's exclusive lock; commits and transfer batches hold the shared lock from
their first object to their manifest, so an object is never removed between the moment a writer
decides to reuse it and the moment its manifest names it. Objects imported for a batch not
applied yet are protected by a grace period on their mtime (``missing_objects`` and imports
touch the objects they count on), so GC is safe while readers and writers run.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import re
import struct
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from shellyard.runner import workspace_paths
from shellyard.runner.protocol import GcResult, ObjectResult
from shellyard.runner.snapshots.contentid import CHUNK, ContentId, legacy_sha256, pread_reread
from shellyard.runner.snapshots.store import SnapshotStore, locked_at_once

PACK_MAGIC_V1 = b"SYPACK1\n"
PACK_MAGIC = b"SYPACK2\n"
_MAGICS = {PACK_MAGIC_V1: 1, PACK_MAGIC: 2}
#: The pack versions this code reads and writes.
PACK_VERSIONS = (1, 2)
_FRAME = struct.Struct("<32sBQ")
_EXTENT = struct.Struct("<QQ")
_LAST_EXTENT = (1 << 64) - 1
_OK, _MISSING, _END = 0, 1, 2
#: Chunks the exporter yields (and the importer's largest write) are about this big.
PACK_CHUNK = 1 << 20
_SHA = re.compile(r"[0-9a-f]{64}")


def check_sha(value: str) -> str:
    from shellyard.errors import InvalidInput

    if not isinstance(value, str) or not _SHA.fullmatch(value):
        raise InvalidInput(
            f"{value!r} is not an object name; pass a sha256 as 64 lowercase hex digits"
        )
    return value


# ---------------------------------------------------------------------- the store lock


class StoreLock:
    """Shared by writers (commits, transfer batches, restores), exclusive for GC: an
    ``flock`` on ``<store>/gc.lock``, a fresh descriptor per holder so threads of one process
    exclude each other as processes do."""

    def __init__(self, store_root: Path) -> None:
        self.path = store_root / "gc.lock"
        # Made now, not at the first commit: a volume whose inodes a command took before that
        # commit could otherwise make no lock, and no delete could free them (a delete holds it).
        with contextlib.suppress(OSError):
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))

    @contextlib.contextmanager
    def hold(self, exclusive: bool = False) -> Iterator[None]:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def try_hold(self) -> Iterator[bool]:
        """Held shared if that is possible at once (True; no GC runs), else not (False)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            yield locked_at_once(fd, fcntl.LOCK_SH)
        finally:
            os.close(fd)


# ---------------------------------------------------------------------- export


def object_path(store: SnapshotStore, sha256: str) -> str:
    return store.blobs.object_path(sha256)


def missing(store: SnapshotStore, sha256s: list[str]) -> list[str]:
    """The objects of ``sha256s`` this store lacks. Those it has are touched, so a GC in the
    next grace period keeps them for the batch that counts on them."""
    out: list[str] = []
    for sha in dict.fromkeys(sha256s):
        path = object_path(store, check_sha(sha))
        try:
            os.utime(path)
        except FileNotFoundError:
            out.append(sha)
    return out


def pack_chunks(store: SnapshotStore, sha256s: list[str], version: int = 2) -> Iterator[bytes]:
    """The pack of ``sha256s`` in chunks of about ``PACK_CHUNK`` bytes (a sync generator;
    ``aiter_thread`` runs it off the event loop); ``version`` 1 for an importer of before
    version 2 (it sends holes as zeros)."""
    if version not in PACK_VERSIONS:
        raise ValueError(f"no object pack version {version}; this runner writes 1 or 2")
    buf = bytearray(PACK_MAGIC if version == 2 else PACK_MAGIC_V1)
    for sha in sha256s:
        digest = bytes.fromhex(check_sha(sha))
        try:
            fd = os.open(object_path(store, sha), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            buf += _FRAME.pack(digest, _MISSING, 0)
            continue
        try:
            size = os.fstat(fd).st_size
            buf += _FRAME.pack(digest, _OK, size)
            pieces = _extents(fd, size) if version == 2 else _dense(fd, size)
            for offset, data in pieces:
                if version == 2:
                    buf += _EXTENT.pack(offset, len(data))
                buf += data
                if len(buf) >= PACK_CHUNK:
                    yield bytes(buf)
                    buf.clear()
            if version == 2:
                buf += _EXTENT.pack(_LAST_EXTENT, 0)
        finally:
            os.close(fd)
    buf += _FRAME.pack(bytes(32), _END, 0)
    yield bytes(buf)


def _dense(fd: int, size: int) -> Iterator[tuple[int, bytes]]:
    """Every byte of the object, holes read as zeros (pack version 1)."""
    sent = 0
    while sent < size:
        data = os.pread(fd, min(PACK_CHUNK, size - sent), sent)
        if not data:
            # the object shrank under us: the stream cannot keep its promise
            raise OSError(errno.EIO, f"object ended after {sent} of {size} bytes")
        yield sent, data
        sent += len(data)


def _extents(fd: int, size: int) -> Iterator[tuple[int, bytes]]:
    """The object's data in pieces of at most ``PACK_CHUNK``, its holes and pieces of zeros
    left out (pack version 2)."""
    for first, end in workspace_paths.data_ranges(fd, 0):
        pos, end = first, min(end, size)
        while pos < end:
            data = os.pread(fd, min(PACK_CHUNK, end - pos), pos)
            if not data:
                raise OSError(errno.EIO, f"object ended after {pos} of {size} bytes")
            if not workspace_paths.is_zeros(data):
                yield pos, data
            pos += len(data)
        if end >= size:
            return


async def aiter_thread(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """Run a blocking chunk generator on a worker thread, one chunk per hop."""
    done = object()
    try:
        while True:
            chunk = await asyncio.to_thread(next, chunks, done)
            if chunk is done:
                return
            assert isinstance(chunk, bytes)
            yield chunk
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


# ---------------------------------------------------------------------- import


class PackImporter:
    """Parses a pack (version 1 or 2) fed in arbitrary chunks (``feed`` runs on a worker
    thread) and stores each object once its content id is verified."""

    def __init__(self, store: SnapshotStore) -> None:
        self._store = store
        self._buf = bytearray()
        self._version = 0  # 0 until the magic is read
        self._ended = False
        self.results: list[ObjectResult] = []
        # the object being received
        self._digest: bytes | None = None
        self._size = 0
        self._pos = 0  # offset in the object of the next byte to arrive (holes too)
        self._extent_end = -1  # version 2: end of the extent being received; -1: between
        self._content: ContentId | None = None
        self._tmp: str | None = None
        self._fd: int | None = None
        self._error: str | None = None

    def feed(self, chunk: bytes) -> None:
        if self._ended:
            if chunk:
                raise ValueError("data after the end of the object pack")
            return
        self._buf += chunk
        while True:
            if not self._version:
                if len(self._buf) < len(PACK_MAGIC):
                    return
                version = _MAGICS.get(bytes(self._buf[: len(PACK_MAGIC)]))
                if version is None:
                    raise ValueError("this is not an object pack (bad magic)")
                del self._buf[: len(PACK_MAGIC)]
                self._version = version
            if self._digest is None:
                if len(self._buf) < _FRAME.size:
                    return
                digest, status, size = _FRAME.unpack_from(self._buf)
                del self._buf[: _FRAME.size]
                if status == _END:
                    self._ended = True
                    return
                if status == _MISSING:
                    self.results.append(
                        ObjectResult(
                            sha256=digest.hex(),
                            ok=False,
                            error="the source runner has no such object (its store lost it)",
                        )
                    )
                    continue
                if status != _OK:
                    raise ValueError(f"unknown object status {status} in the pack")
                self._begin(digest, size)
                if size == 0 and self._version == 1:
                    self._finish()
                continue
            if self._version == 2 and self._extent_end < 0:
                if len(self._buf) < _EXTENT.size:
                    return
                offset, length = _EXTENT.unpack_from(self._buf)
                del self._buf[: _EXTENT.size]
                if offset == _LAST_EXTENT and length == 0:
                    self._finish()
                    continue
                if offset < self._pos or length == 0 or offset + length > self._size:
                    raise ValueError(
                        f"extent ({offset}, {length}) of object {self._digest.hex()} is out "
                        f"of order or past its size {self._size}"
                    )
                self._hole(offset - self._pos)
                self._extent_end = offset + length
                continue
            end = self._extent_end if self._version == 2 else self._size
            take = min(len(self._buf), end - self._pos)
            if take == 0:
                return
            self._write(memoryview(self._buf)[:take])
            del self._buf[:take]
            if self._pos == end:
                if self._version == 1:
                    self._finish()
                else:
                    self._extent_end = -1

    def _begin(self, digest: bytes, size: int) -> None:
        self._digest, self._size, self._pos = digest, size, 0
        self._extent_end = -1
        self._content = None
        self._error = None
        self._tmp, self._fd = None, None
        if os.path.exists(object_path(self._store, digest.hex())):
            return  # already here: the bytes are skipped, the store's copy is kept
        try:
            self._tmp, self._fd = self._store.blobs.new_tmp()
        except OSError as exc:
            self._fail(exc)
            return
        self._content = ContentId(reread=pread_reread(self._fd))

    def _hole(self, count: int) -> None:
        if self._content is not None and self._error is None:
            self._content.zeros(count)
        self._pos += count

    def _write(self, data: memoryview) -> None:
        if self._fd is not None and self._error is None:
            assert self._content is not None
            try:
                # zeros (a sparse file's holes) are left holes: the object takes the room its
                # source file took, not its apparent size (workspace_paths, "files with
                # holes"; R2); written before hashed, so the content id may read it back
                _write_data(self._fd, data, self._pos)
                self._content.update(data)
            except OSError as exc:
                self._fail(exc)
        self._pos += len(data)

    def _fail(self, exc: OSError) -> None:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            self._error = f"the target runner is out of room ({exc.strerror})"
        else:
            self._error = f"the target runner could not store it: {exc.strerror or exc}"
        self._drop_tmp()

    def _drop_tmp(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)
            self._tmp = None

    def _matches(self) -> bool:
        """The received bytes have the object's name: its content id, or (an object named
        before chunk-list ids, contentid.py) the plain sha256, checked only then."""
        assert self._digest is not None and self._content is not None and self._fd is not None
        self._hole(self._size - self._pos)
        os.ftruncate(self._fd, self._size)  # a hole at its end is a size
        if self._content.digest() == self._digest:
            if self._content.is_chunk_list:
                self._store.blobs.mark_chunk_list(self._digest.hex())
            return True
        return self._content.is_chunked and legacy_sha256(self._fd, self._size) == self._digest

    def _finish(self) -> None:
        assert self._digest is not None
        sha = self._digest.hex()
        existed = self._tmp is None and self._error is None
        if self._error is not None:
            self.results.append(
                ObjectResult(sha256=sha, ok=False, size=self._size, error=self._error)
            )
        elif not existed and not self._matches():
            self._drop_tmp()
            self.results.append(
                ObjectResult(
                    sha256=sha,
                    ok=False,
                    size=self._size,
                    error="its bytes do not match its content id: the source copy is corrupt",
                )
            )
        else:
            final = object_path(self._store, sha)
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
                assert self._tmp is not None
                if os.path.exists(final):
                    os.unlink(self._tmp)
                    existed = True
                else:
                    os.rename(self._tmp, final)
                self._tmp = None
            with contextlib.suppress(FileNotFoundError):
                os.utime(final)  # fresh mtime: a GC's grace period protects it until applied
            self.results.append(ObjectResult(sha256=sha, ok=True, size=self._size, existed=existed))
        self._digest = None
        self._content = None

    def close(self) -> list[ObjectResult]:
        """The results; an object cut off by the end of the stream is reported failed."""
        if self._digest is not None:
            self._drop_tmp()
            self.results.append(
                ObjectResult(
                    sha256=self._digest.hex(),
                    ok=False,
                    size=self._size,
                    error="the stream from the source ended in the middle of this object",
                )
            )
            self._digest = None
        return self.results

    @property
    def ended(self) -> bool:
        return self._ended


#: Runs of zeros at least this long (and aligned to it) in what arrives are left holes.
_HOLE_GRAIN = 64 << 10


def _write_data(fd: int, data: memoryview, offset: int) -> None:
    """Write ``data`` at ``offset`` but for its aligned pieces of zeros (left holes); the
    pieces between them in one write each."""
    start = 0  # of the run of data not written yet
    pos = 0
    while pos < len(data):
        step = min(len(data) - pos, _HOLE_GRAIN - (offset + pos) % _HOLE_GRAIN)
        if workspace_paths.is_zeros(data[pos : pos + step]):
            if start < pos:
                workspace_paths.pwrite_all(fd, data[start:pos], offset + start)
            start = pos + step
        pos += step
    if start < pos:
        workspace_paths.pwrite_all(fd, data[start:pos], offset + start)


# ---------------------------------------------------------------------- garbage collection


def collect_garbage(store: SnapshotStore, lock: StoreLock, grace_s: float) -> GcResult:
    """Delete the objects no retained manifest names and older than ``grace_s``."""
    seen = removed = freed = young = 0
    with lock.hold(exclusive=True):
        marked: set[bytes] = set()
        workspaces = store.root / "workspaces"
        for wdir in workspaces.iterdir() if workspaces.is_dir() else ():
            marked.update(store.retained_digests(wdir.name))
        cutoff = time.time() - grace_s
        objects = store.root / "objects"
        for prefix in sorted(os.listdir(objects)):
            if len(prefix) != 2:
                continue  # objects/tmp
            for entry in os.scandir(objects / prefix):
                seen += 1
                try:
                    digest = bytes.fromhex(prefix + entry.name)
                except ValueError:
                    continue
                if digest in marked:
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if st.st_mtime > cutoff:
                    young += 1
                    continue
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed += 1
                    freed += st.st_size
                if st.st_size >= CHUNK:  # a smaller object is never a chunk list
                    store.blobs.forget_chunk_list(prefix + entry.name)
    return GcResult(
        objects_seen=seen, objects_removed=removed, bytes_removed=freed, objects_young=young
    )


__all__ = [
    "PACK_MAGIC",
    "PACK_MAGIC_V1",
    "PACK_VERSIONS",
    "PackImporter",
    "StoreLock",
    "aiter_thread",
    "collect_garbage",
    "missing",
    "pack_chunks",
]

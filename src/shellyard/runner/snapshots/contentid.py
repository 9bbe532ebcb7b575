"""Content ids: what names an object in the snapshot store, computable without reading holes.

A file's id is the **sha256 of its content**, unless its content holds a whole chunk of
zeros (``CHUNK`` bytes at a multiple of ``CHUNK``, whether a hole or written zeros): then it
is its **chunk-list id**, BLAKE2b-256 (personalised ``PERSON``) of, for each chunk that is not
all zeros, ``<Q`` its index and the sha256 of its bytes, then ``<QQ`` 2**64-1 and the size.

Why: SHA-256 cannot skip a run of zeros, so a workspace's ``truncate -s 64G big`` cost every
commit after it 64 GiB of hashing (minutes of a runner's CPU, no disk used). A chunk-list id
costs the file's data plus 40 bytes per chunk of data: a hole costs nothing. The rule depends
on the content alone (never on where the holes lie), so equal content gets equal ids, sparse
or not, and a file without such a chunk (almost every file, every file under 1 MiB) keeps
the plain sha256 it always had. The outer hash is not SHA-256 so that no file's bytes can be
made to have the sha256 of another file's chunk list (a file whose content is that list would
otherwise share its object).

Objects named by the sha256 of content that holds a zero chunk (stores written before this
rule) stay readable: nothing reads an object by recomputing its name, and the pack importer
accepts either id (``legacy_sha256``).
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable

from shellyard.runner import workspace_paths

CHUNK = workspace_paths.HOLE_CHUNK
PERSON = b"sy-chunks-1"
_INDEX = struct.Struct("<Q")
_TRAILER = struct.Struct("<QQ")
_END = (1 << 64) - 1

#: Reads back ``length`` bytes at ``offset`` of what was fed so far (holes as zeros).
Reread = Callable[[int, int], bytes]


class ContentId:
    """The content id of bytes fed in order: ``update`` for data, ``zeros`` for a hole.

    It starts as a plain sha256. At the first whole chunk of zeros it changes to the chunk
    list; the chunks before it are read back through ``reread`` (the caller's copy of what
    it fed: bounded by the data before that point). A caller that knows the content holds a
    zero chunk (a hole covering one) calls ``chunked()`` first and nothing is read back; if
    no zero chunk came after all (the file changed under the caller), ``digest`` reads all of
    it back for the plain sha256, so the id still follows the rule."""

    __slots__ = (
        "_chunk",
        "_chunk_zero",
        "_list",
        "_plain",
        "_pos",
        "_reread",
        "_saw_zero_chunk",
        "hashed",
    )

    def __init__(self, reread: Reread | None = None) -> None:
        self._plain: hashlib._Hash | None = hashlib.sha256()
        self._list: hashlib.blake2b | None = None
        self._chunk = hashlib.sha256()
        self._chunk_zero = True  # every byte of the current chunk so far is 0
        self._pos = 0
        self._saw_zero_chunk = False
        self._reread = reread
        #: Bytes run through SHA-256 (data, zeros hashed, bytes read back): the cost.
        self.hashed = 0

    @property
    def size(self) -> int:
        return self._pos

    @property
    def is_chunked(self) -> bool:
        return self._list is not None

    @property
    def is_chunk_list(self) -> bool:
        """After ``digest``: the id is a chunk list, not the content's sha256."""
        return self._list is not None and self._saw_zero_chunk

    def chunked(self) -> None:
        """Use the chunk list from here on (the caller knows a zero chunk is coming)."""
        if self._list is not None:
            return
        self._list = hashlib.blake2b(digest_size=32, person=PERSON)
        self._plain = None
        done, self._pos = self._pos, 0
        self._chunk, self._chunk_zero = hashlib.sha256(), True
        # what was fed so far, again, now chunk by chunk
        while self._pos < done:
            step = min(CHUNK - self._pos % CHUNK, done - self._pos)
            if self._reread is None:
                raise RuntimeError("a content id cannot change to chunks without a reread")
            data = self._reread(self._pos, step)
            if len(data) != step:
                raise OSError(f"read back {len(data)} of {step} bytes at {self._pos}")
            self._feed_chunked(memoryview(data))

    def update(self, data: bytes | bytearray | memoryview, /) -> None:
        view = memoryview(data)
        while view:
            step = min(CHUNK - self._pos % CHUNK, len(view))
            piece = view[:step]
            if self._list is not None:
                self._feed_chunked(piece)
            else:
                self._feed_plain(piece, zero=None)
            view = view[step:]

    def zeros(self, count: int) -> None:
        """``count`` zero bytes (a hole): a whole chunk of them costs nothing."""
        while count > 0:
            step = min(CHUNK - self._pos % CHUNK, count)
            if self._list is None and self._pos % CHUNK == 0 and step == CHUNK:
                self.chunked()
            if self._list is not None:
                if self._chunk_zero:
                    self._pos += step  # hashed only if data follows in this chunk
                else:
                    self._hash_zeros(self._chunk, step)
                    self._pos += step
                self._end_chunk()
            else:
                self._feed_plain(workspace_paths.zero_view(step), zero=True)
            count -= step

    def digest(self) -> bytes:
        if self._list is None:
            assert self._plain is not None
            return self._plain.digest()
        if self._pos % CHUNK:
            self._close_chunk()
        if not self._saw_zero_chunk:
            return self._plain_again()
        self._list.update(_TRAILER.pack(_END, self._pos))
        return self._list.digest()

    def _plain_again(self) -> bytes:
        """The plain sha256 of everything fed, read back (a chunk list was begun for a zero
        chunk that never came)."""
        plain = hashlib.sha256()
        pos = 0
        while pos < self._pos:
            if self._reread is None:
                raise RuntimeError("a content id cannot go back to sha256 without a reread")
            step = min(CHUNK, self._pos - pos)
            data = self._reread(pos, step)
            if len(data) != step:
                raise OSError(f"read back {len(data)} of {step} bytes at {pos}")
            plain.update(data)
            self.hashed += step
            pos += step
        return plain.digest()

    # ------------------------------------------------------------------ within a chunk

    def _feed_plain(self, piece: memoryview, zero: bool | None) -> None:
        assert self._plain is not None
        self._plain.update(piece)
        self.hashed += len(piece)
        if self._chunk_zero and not (zero or workspace_paths.is_zeros(piece)):
            self._chunk_zero = False
        self._pos += len(piece)
        if self._pos % CHUNK == 0:
            whole_zero = self._chunk_zero
            self._chunk_zero = True
            if whole_zero:
                # the chunks before this one are read back; this one is zeros: nothing
                self._pos -= CHUNK
                self.chunked()
                self._pos += CHUNK
                self._saw_zero_chunk = True

    def _feed_chunked(self, piece: memoryview) -> None:
        if self._chunk_zero:
            if workspace_paths.is_zeros(piece):
                self._pos += len(piece)
                self._end_chunk()
                return
            # data after zeros in this chunk: the zeros skipped so far are hashed now
            self._hash_zeros(self._chunk, self._pos % CHUNK)
            self._chunk_zero = False
        self._chunk.update(piece)
        self.hashed += len(piece)
        self._pos += len(piece)
        self._end_chunk()

    def _hash_zeros(self, hasher: hashlib._Hash, count: int) -> None:
        workspace_paths.hash_zeros(hasher, count)
        self.hashed += count

    def _end_chunk(self) -> None:
        if self._pos % CHUNK == 0:
            self._close_chunk()

    def _close_chunk(self) -> None:
        assert self._list is not None
        if self._chunk_zero and self._pos % CHUNK == 0:
            self._saw_zero_chunk = True
        if not self._chunk_zero:
            index = (self._pos - 1) // CHUNK
            self._list.update(_INDEX.pack(index) + self._chunk.digest())
            self._chunk = hashlib.sha256()
        self._chunk_zero = True


def pread_reread(fd: int) -> Reread:
    """A reread from a descriptor open for reading (holes read as zeros)."""

    def reread(offset: int, length: int) -> bytes:
        out = bytearray()
        while len(out) < length:
            data = os.pread(fd, length - len(out), offset + len(out))
            if not data:  # past the copy's end: a hole whose size is not set yet
                out += bytes(length - len(out))
                break
            out += data
        return bytes(out)

    return reread


def legacy_sha256(fd: int, size: int) -> bytes:
    """The plain sha256 of an object's ``size`` bytes, holes hashed as zeros: the name an
    object with a zero chunk had before chunk-list ids (costs its apparent size)."""
    hasher = hashlib.sha256()
    pos = 0
    for first, end in workspace_paths.data_ranges(fd, 0):
        end = min(end, size)
        workspace_paths.hash_zeros(hasher, first - pos)
        pos = first
        while pos < end:
            data = os.pread(fd, min(CHUNK, end - pos), pos)
            if not data:
                break
            hasher.update(data)
            pos += len(data)
        if end >= size:
            break
    workspace_paths.hash_zeros(hasher, size - pos)
    return hasher.digest()


def has_zero_chunk_hole(fd: int, size: int) -> bool:
    """True when a hole of the file covers a whole chunk (at a multiple of ``CHUNK``): its
    id is then a chunk list for sure, and nothing needs reading back. Costs two ``lseek``
    per data range up to the first such hole."""
    pos = 0
    for first, end in workspace_paths.data_ranges(fd, 0):
        if _covers_chunk(pos, min(first, size)):
            return True
        pos = end
        if pos >= size:
            return False
    return _covers_chunk(pos, size)


def _covers_chunk(start: int, end: int) -> bool:
    aligned = -(-start // CHUNK) * CHUNK
    return aligned + CHUNK <= end


__all__ = [
    "CHUNK",
    "ContentId",
    "has_zero_chunk_hole",
    "legacy_sha256",
    "pread_reread",
]

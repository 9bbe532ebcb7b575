"""The bytes of a snapshot: manifests, folder trees, folder records, the encodings they share.

Encoding: byte columns per folder (NUL-joined names, packed ints, raw digests), because
``bench/bench_snapshots.py --formats`` timed them ~3x faster than marshal and ~40x faster than
JSON lines for 10,000 entries, and an unchanged folder reuses its bytes with no per-file work.

Format 2 (this one) is a tree of trees, like git's: each folder is one **tree** blob, stored
once under its sha256 (``trees.py``), naming its entries and, for each subfolder, the digest
of the subfolder's tree. A manifest is just a header naming the root tree, so a commit writes
the trees of the folders that changed and of their ancestors, never the whole listing, and an
unchanged folder is reused by its digest. Tree blob::

    "<QQQqqq" n, len(names), len(targets), files, bytes, entries (all three of the subtree)
    kinds   n bytes: b"f" file, b"d" folder, b"l" symlink
    modes   n x uint32 (permission bits)      sizes n x int64 (bytes; length of link text)
    names   NUL-joined UTF-8 (surrogateescape), sorted
    digests n x 32 bytes: a file's content, a folder's tree, zeros for a link
    targets NUL-joined symlink texts ("" unless a symlink)

The same tree always gives the same bytes, so ``root_hash`` (the root tree's digest) is equal
for equal trees. Format 1 (one flat listing of every entry per manifest, ``root_hash`` its
sha256) is still decoded here so ``migrate.py`` can convert stores written by older versions::

    header, then "<QQQ" n, len(paths), len(targets); kinds; modes; sizes; paths (full, grouped
    by folder in sorted path order, names sorted within); digests; targets
"""

from __future__ import annotations

import os
import struct
import sys
import threading
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from shellyard.runner.protocol import PathEntry, SnapshotInfo
from shellyard.runner.snapshots.contentid import CHUNK

MANIFEST_VERSION = 2
#: The flat format of earlier versions (read for the migration only).
MANIFEST_VERSION_FLAT = 1
MANIFEST_MAGIC = b"SYMF"
#: magic, version, created_at, files, bytes, root digest (format 2: of the root tree)
MANIFEST_HEADER = struct.Struct("<4sIdqq32s")
#: format 1 body: n, len(paths blob), len(targets blob)
_BODY_HEADER = struct.Struct("<QQQ")
#: tree: n, len(names blob), len(targets blob), files, bytes, entries of the subtree
TREE_HEADER = struct.Struct("<QQQqqq")
#: one scanned entry: mode, mtime_ns, ctime_ns, size, inode
SCAN = struct.Struct("<IqqqQ")
SCAN_SIZE = SCAN.size

KIND_FILE = ord("f")
KIND_DIR = ord("d")
KIND_LINK = ord("l")
KIND_NAMES: dict[int, Literal["file", "dir", "symlink"]] = {
    KIND_FILE: "file",
    KIND_DIR: "dir",
    KIND_LINK: "symlink",
}
NO_DIGEST = bytes(32)

_LITTLE = sys.byteorder == "little"
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def pack_ints(typecode: str, values: Iterable[int]) -> bytes:
    arr = array(typecode, values)
    if not _LITTLE:
        arr.byteswap()
    return arr.tobytes()


def unpack_ints(typecode: str, data: bytes | memoryview) -> list[int]:
    arr = array(typecode)
    arr.frombytes(data)
    if not _LITTLE:
        arr.byteswap()
    return arr.tolist()


def encode_text(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def decode_text(data: bytes | bytearray | memoryview) -> str:
    return bytes(data).decode("utf-8", "surrogateescape")


def split_names(blob: bytes | memoryview, n: int) -> list[str]:
    if n == 0:
        return []
    parts = decode_text(blob).split("\0")
    if len(parts) != n:
        raise ValueError(f"expected {n} names, found {len(parts)}")
    return parts


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def atomic_write(path: Path, *parts: bytes) -> None:
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | O_CLOEXEC, 0o600)
    try:
        for part in parts:
            write_all(fd, part)
    finally:
        os.close(fd)
    os.replace(tmp, path)


@dataclass(frozen=True, slots=True)
class DirRecord:
    """One folder as last walked: what it looked like (scan) and its manifest section."""

    path: str
    #: Entry names NUL-joined and their packed stats (``SCAN``), in scandir order.
    scan_names: str
    scan_stats: bytes
    #: Latest mtime/ctime of its files and links, and the clock of the walk that scanned
    #: them: the record can be trusted only while max_time < clock (racy-clean rule).
    max_time: int
    clock: int
    subdirs: tuple[str, ...]
    n: int
    #: Files and their bytes in this folder alone.
    files: int
    total: int
    #: The folder's tree columns (module docstring); a subfolder's digest is filled in by
    #: ``seal`` (commit.py), zeros until then.
    names: bytes
    kinds: bytes
    modes: bytes
    sizes: bytes
    digests: bytes
    targets: bytes
    #: The tree's digest and the subtree's totals, once sealed (else zeros).
    digest: bytes = NO_DIGEST
    sub_files: int = 0
    sub_total: int = 0
    sub_entries: int = 0


def encode_tree(r: DirRecord) -> bytes:
    """The tree blob of a sealed record (its digest is this blob's sha256)."""
    header = TREE_HEADER.pack(
        r.n, len(r.names), len(r.targets), r.sub_files, r.sub_total, r.sub_entries
    )
    return b"".join((header, r.kinds, r.modes, r.sizes, r.names, r.digests, r.targets))


EMPTY_TREE = TREE_HEADER.pack(0, 0, 0, 0, 0, 0)


class Tree:
    """A decoded tree blob: one folder's entries (by name, sorted) and its subtree totals."""

    __slots__ = (
        "_index",
        "digests",
        "entries",
        "files",
        "kinds",
        "modes",
        "names",
        "sizes",
        "targets",
        "total",
    )

    def __init__(self, raw: bytes) -> None:
        n, nlen, tlen, self.files, self.total, self.entries = TREE_HEADER.unpack_from(raw)
        view = memoryview(raw)
        off = TREE_HEADER.size
        self.kinds = raw[off : off + n]
        off += n
        self.modes = unpack_ints("I", view[off : off + 4 * n])
        off += 4 * n
        self.sizes = unpack_ints("q", view[off : off + 8 * n])
        off += 8 * n
        self.names = split_names(view[off : off + nlen], n)
        off += nlen
        self.digests = raw[off : off + 32 * n]
        off += 32 * n
        self.targets = split_names(view[off : off + tlen], n)
        if off + tlen != len(raw) or len(self.kinds) != n or len(self.digests) != 32 * n:
            raise ValueError("tree has the wrong length")
        self._index: dict[str, int] | None = None

    def find(self, name: str) -> int | None:
        if self._index is None:
            self._index = {name: i for i, name in enumerate(self.names)}
        return self._index.get(name)

    def digest(self, i: int) -> bytes:
        return self.digests[32 * i : 32 * i + 32]

    def entry(self, i: int, path: str) -> PathEntry:
        """Entry ``i`` as a ``PathEntry`` named ``path`` (no validation: the tree is ours)."""
        kind = self.kinds[i]
        digest = self.digest(i).hex() if kind == KIND_FILE else None
        return PathEntry.model_construct(
            path=path,
            kind=KIND_NAMES[kind],
            size=self.sizes[i],
            mode=self.modes[i],
            # the sha256 is known from the id alone under one chunk (contentid.py); above,
            # the store tells (ObjectStore.reveal)
            sha256=digest if kind == KIND_FILE and self.sizes[i] < CHUNK else None,
            content_id=digest,
            target=self.targets[i] if kind == KIND_LINK else None,
        )


class Manifest:
    """A decoded format 1 manifest (parallel columns, every entry's full path): what the
    migration converts."""

    __slots__ = ("digests", "info", "kinds", "modes", "paths", "sizes", "targets")

    def __init__(
        self,
        info: SnapshotInfo,
        paths: list[str],
        kinds: bytes,
        modes: list[int],
        sizes: list[int],
        digests: bytes,
        targets: list[str],
    ) -> None:
        self.info = info
        self.paths = paths
        self.kinds = kinds
        self.modes = modes
        self.sizes = sizes
        self.digests = digests
        self.targets = targets


def pack_header(created_at: float, files: int, total: int, digest: bytes) -> bytes:
    return MANIFEST_HEADER.pack(MANIFEST_MAGIC, MANIFEST_VERSION, created_at, files, total, digest)


def decode_header(workspace_id: str, seq: int, raw: bytes) -> SnapshotInfo:
    magic, version, created_at, files, total, digest = MANIFEST_HEADER.unpack_from(raw)
    if magic != MANIFEST_MAGIC or version not in (MANIFEST_VERSION, MANIFEST_VERSION_FLAT):
        raise ValueError(f"manifest {seq} of workspace {workspace_id!r} has an unknown format")
    return SnapshotInfo(
        workspace_id=workspace_id,
        seq=seq,
        root_hash=digest.hex(),
        files=files,
        bytes=total,
        created_at=created_at,
        new=False,
    )


def manifest_version(raw: bytes) -> int:
    return int(MANIFEST_HEADER.unpack_from(raw)[1])


def decode_flat_manifest(workspace_id: str, seq: int, raw: bytes) -> Manifest:
    """A format 1 manifest (flat: every entry's full path), for the migration."""
    info = decode_header(workspace_id, seq, raw)
    view = memoryview(raw)
    off = MANIFEST_HEADER.size
    n, plen, tlen = _BODY_HEADER.unpack_from(raw, off)
    off += _BODY_HEADER.size
    kinds = raw[off : off + n]
    off += n
    modes = unpack_ints("I", view[off : off + 4 * n])
    off += 4 * n
    sizes = unpack_ints("q", view[off : off + 8 * n])
    off += 8 * n
    paths = split_names(view[off : off + plen], n)
    off += plen
    digests = raw[off : off + 32 * n]
    off += 32 * n
    targets = split_names(view[off : off + tlen], n)
    if off + tlen != len(raw):
        raise ValueError(f"manifest {seq} of workspace {workspace_id!r} has the wrong length")
    return Manifest(info, paths, kinds, modes, sizes, digests, targets)

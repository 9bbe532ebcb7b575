"""Content-addressed snapshots of workspaces (W2, W3, W5, W6; DESIGN.md "Snapshots").

Layout under the store root::

    objects/<2 hex>/<62 hex>        file contents named by sha256, written once, mode 0o444
    objects/tmp/                    temp files, renamed into place once complete
    workspaces/<id>/manifests/<seq> one manifest per snapshot (header + canonical body)
    workspaces/<id>/HEAD            current seq, replaced atomically (temp + rename)
    workspaces/<id>/statcache       per folder: entry names and stat (mode, mtime_ns, ctime_ns,
                                    size, inode) as last seen, with the manifest entries built
    workspaces/<id>/clock           touched before each walk: the racy-clean clock
    workspaces/<id>/lock            flock'd during a commit (plus a per-workspace thread lock)

Encoding: manifests and the stat cache are columns of bytes (NUL-joined paths, packed
little-endian integers, raw 32-byte digests) kept per folder, because bench_snapshots.py
--formats measured them far cheaper to write and load than JSON lines or marshal'd tuples,
and a folder whose stat bytes are unchanged reuses its manifest section with no per-file work.

Manifest body (``root_hash`` is its sha256)::

    "<QQQ" n, len(paths), len(targets)
    kinds   n bytes: b"f" file, b"d" folder, b"l" symlink
    modes   n x uint32 (permission bits)      sizes n x int64 (bytes; length of link text)
    paths   NUL-joined UTF-8 (surrogateescape) digests n x 32 bytes (zeros unless a file)
    targets NUL-joined symlink texts ("" unless a symlink)

Entries are grouped by folder (folders in sorted path order, "" first), names sorted within
each folder, so the same tree always gives the same bytes and the same ``root_hash``.

A commit walks the tree with ``os.scandir`` on folder descriptors and ``O_NOFOLLOW`` opens,
so a symlink (or a file swapped for one mid-walk) is recorded as a link and never read
through. A folder whose names and stat bytes equal the cache, and whose files were all
changed strictly before the previous walk's clock (git's racy-clean rule, with the clock read
before the walk rather than after, which is stricter), is taken as is. In other folders only
files whose stat differs (or is racy) are read: once, hashing while copying into the store
(never hard-linking). Big files are hashed on a small thread pool; small files are not, as
the GIL and directory-lock hand-offs made two threads slower than one on them (measured).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import itertools
import logging
import os
import re
import stat as stat_mod
import struct
import sys
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

from shellyard.errors import InvalidInput, NotFound
from shellyard.paths import normalize_relative
from shellyard.runner.protocol import MAX_READ_CHUNK, FileChunk, PathEntry, SnapshotInfo

log = logging.getLogger(__name__)

_FORMAT_VERSION = 1
_MANIFEST_MAGIC = b"SYMF"
#: magic, version, created_at, files, bytes, root digest
_MANIFEST_HEADER = struct.Struct("<4sIdqq32s")
#: n, len(paths blob), len(targets blob)
_BODY_HEADER = struct.Struct("<QQQ")
_STATCACHE_MAGIC = b"SYSC"
#: magic, version, clock_ns, number of folder records
_STATCACHE_HEADER = struct.Struct("<4sIqQ")
#: per folder record: len(path), len(scan names), len(scan stats), max_time, len(subdirs),
#: n, files, bytes, len(paths), len(targets)
_RECORD_FIELDS = 10
#: one scanned entry: mode, mtime_ns, ctime_ns, size, inode
_SCAN = struct.Struct("<Iqqqq")
_SCAN_SIZE = _SCAN.size

_KIND_FILE = ord("f")
_KIND_DIR = ord("d")
_KIND_LINK = ord("l")
_KIND_NAMES = {_KIND_FILE: "file", _KIND_DIR: "dir", _KIND_LINK: "symlink"}
_NO_DIGEST = bytes(32)

#: Files smaller than this are read with one read(); larger ones are streamed in chunks.
_SMALL_FILE = 1 << 20
_STREAM_CHUNK = 1 << 20
#: Files at least this big are hashed and copied on the thread pool.
_POOL_MIN_SIZE = 4 << 20
#: Folder descriptors kept open for pool work before the walk waits for it.
_MAX_PENDING_DIRS = 64

#: errno values meaning "this entry vanished or changed type while we looked at it":
#: ELOOP (became a symlink, O_NOFOLLOW), EINVAL (readlink of a non-link), ENXIO (became a
#: socket), ENOENT, ENOTDIR.
_VANISHED = frozenset({errno.ELOOP, errno.EINVAL, errno.ENXIO, errno.ENOENT, errno.ENOTDIR})

_WORKSPACE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_LITTLE = sys.byteorder == "little"

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_OPEN_FILE = os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC
_OPEN_DIR = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
_OPEN_TMP = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC

_Sig = tuple[int, int, int, int]
#: (digest, bytes read, stat before reading) or None when the file is gone / not a file.
_Stored = tuple[bytes, int, os.stat_result] | None


def _pack_ints(typecode: str, values: list[int]) -> bytes:
    arr = array(typecode, values)
    if not _LITTLE:
        arr.byteswap()
    return arr.tobytes()


def _unpack_ints(typecode: str, data: bytes | memoryview) -> list[int]:
    arr = array(typecode)
    arr.frombytes(data)
    if not _LITTLE:
        arr.byteswap()
    return arr.tolist()


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _decode(data: bytes | memoryview) -> str:
    return bytes(data).decode("utf-8", "surrogateescape")


def _split(blob: bytes | memoryview, n: int) -> list[str]:
    if n == 0:
        return []
    parts = _decode(blob).split("\0")
    if len(parts) != n:
        raise ValueError(f"expected {n} names, found {len(parts)}")
    return parts


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _sig(st: os.stat_result) -> _Sig:
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)


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


@dataclass
class CommitStats:
    """What one commit did (for tests, logs and benchmarks)."""

    workspace_id: str
    seq: int = 0
    new: bool = False
    entries: int = 0
    dirs_scanned: int = 0
    #: Folders whose names and stat bytes matched the cache (no per-file work).
    dirs_reused: int = 0
    files_seen: int = 0
    files_hashed: int = 0
    bytes_hashed: int = 0
    #: Files re-read only because they were racily clean.
    racy: int = 0
    #: Entries that vanished or changed type while the commit walked the tree.
    skipped: int = 0
    #: Files the store could not read (permission denied); left out of the snapshot.
    unreadable: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def cache_hits(self) -> int:
        return self.files_seen - self.files_hashed


@dataclass(frozen=True, slots=True)
class _DirRecord:
    """One folder as last walked: what it looked like (scan) and its manifest section."""

    path: str
    #: Entry names NUL-joined and their packed stats (``_SCAN``), in scandir order.
    scan_names: str
    scan_stats: bytes
    #: Latest mtime/ctime of its files and links; racy while >= the cache's clock.
    max_time: int
    subdirs: tuple[str, ...]
    n: int
    files: int
    total: int
    paths: bytes
    kinds: bytes
    modes: bytes
    sizes: bytes
    digests: bytes
    targets: bytes


class _DirBuilder:
    """A folder's manifest section being rebuilt; digests of big files may still be pending."""

    __slots__ = (
        "digests",
        "kinds",
        "max_time",
        "modes",
        "names",
        "path",
        "pending",
        "scan_names",
        "scan_stats",
        "sizes",
        "subdirs",
        "targets",
    )

    def __init__(self, path: str, scan_names: str, scan_stats: bytes) -> None:
        self.path = path
        self.scan_names = scan_names
        self.scan_stats = scan_stats
        self.names: list[str] = []
        self.kinds = bytearray()
        self.modes: list[int] = []
        self.sizes: list[int] = []
        self.digests: list[bytes] = []
        self.targets: list[str] = []
        self.subdirs: list[str] = []
        self.max_time = -(1 << 63)
        self.pending: list[tuple[int, Future[_Stored]]] = []

    def finish(self, dropped: set[int]) -> _DirRecord:
        keep = [i for i in range(len(self.names)) if i not in dropped]
        if dropped:
            # an entry went missing while we read it: make the next walk look again
            scan_stats = b""
            names = [self.names[i] for i in keep]
            kinds = bytes(self.kinds[i] for i in keep)
            modes = [self.modes[i] for i in keep]
            sizes = [self.sizes[i] for i in keep]
            digests = [self.digests[i] for i in keep]
            targets = [self.targets[i] for i in keep]
        else:
            scan_stats = self.scan_stats
            names, kinds, modes = self.names, bytes(self.kinds), self.modes
            sizes, digests, targets = self.sizes, self.digests, self.targets
        prefix = self.path + "/" if self.path else ""
        files = kinds.count(_KIND_FILE)
        total = sum(s for s, k in zip(sizes, kinds, strict=True) if k == _KIND_FILE)
        return _DirRecord(
            path=self.path,
            scan_names=self.scan_names,
            scan_stats=scan_stats,
            max_time=self.max_time,
            subdirs=tuple(self.subdirs),
            n=len(names),
            files=files,
            total=total,
            paths=_encode("\0".join([prefix + name for name in names])),
            kinds=kinds,
            modes=_pack_ints("I", modes),
            sizes=_pack_ints("q", sizes),
            digests=b"".join(digests),
            targets=_encode("\0".join(targets)),
        )


class _Manifest:
    """A decoded manifest: parallel columns plus a lazily built path index."""

    __slots__ = ("_index", "digests", "info", "kinds", "modes", "paths", "sizes", "targets")

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
        self._index: dict[str, int] | None = None

    def index(self) -> dict[str, int]:
        if self._index is None:
            self._index = dict(zip(self.paths, range(len(self.paths)), strict=True))
        return self._index

    def entry(self, i: int) -> PathEntry:
        kind = self.kinds[i]
        return PathEntry(
            path=self.paths[i],
            kind=_KIND_NAMES[kind],
            size=self.sizes[i],
            mode=self.modes[i],
            sha256=self.digests[32 * i : 32 * i + 32].hex() if kind == _KIND_FILE else None,
            target=self.targets[i] if kind == _KIND_LINK else None,
        )


@dataclass
class _WorkspaceState:
    """What a commit needs from disk, kept in memory between commits of a workspace."""

    head_info: SnapshotInfo
    head_sig: _Sig
    dirs: dict[str, _DirRecord]
    clock_ns: int
    cache_sig: _Sig | None


class SnapshotStore:
    """Commits workspace trees into immutable, numbered snapshots and reads them back.

    Synchronous and thread-safe; the runner calls it through ``asyncio.to_thread``. Commits of
    one workspace are serialised (a thread lock plus ``flock``), so snapshot numbers only grow.
    """

    def __init__(
        self,
        root: Path,
        *,
        workers: int | None = None,
        cached_workspaces: int = 32,
        cached_manifests: int = 16,
    ) -> None:
        self.root = Path(root)
        self._objects = self.root / "objects"
        self._tmp = self._objects / "tmp"
        self._workspaces = self.root / "workspaces"
        self._tmp.mkdir(parents=True, exist_ok=True)
        self._workspaces.mkdir(parents=True, exist_ok=True)
        if not (self._objects / "ff").is_dir():
            for i in range(256):
                (self._objects / f"{i:02x}").mkdir(exist_ok=True)
        self._objects_str = f"{self._objects}/"
        self._tmp_prefix = f"{self._tmp}/{os.getpid()}-{id(self):x}-"
        self._tmp_counter = itertools.count()
        umask = _process_umask()
        self._fchmod_objects = umask is None or bool(umask & 0o444)
        self._workers = workers if workers is not None else min(4, os.cpu_count() or 1)
        self._pool: ThreadPoolExecutor | None = None
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._states: OrderedDict[str, _WorkspaceState] = OrderedDict()
        self._cached_workspaces = cached_workspaces
        self._manifests: OrderedDict[tuple[str, int], _Manifest] = OrderedDict()
        self._cached_manifests = cached_manifests
        self._stats: dict[str, CommitStats] = {}
        #: Stats of the most recent commit in this store (any workspace).
        self.last_commit_stats: CommitStats | None = None

    # ------------------------------------------------------------------ public API

    def ensure_workspace(self, workspace_id: str) -> SnapshotInfo:
        """Create the workspace's metadata with the empty snapshot 0 if missing; return head."""
        wdir = self._wdir(workspace_id)
        with self._workspace_lock(workspace_id, wdir):
            return self._load_state(workspace_id, wdir).head_info

    def commit(self, workspace_id: str, tree: Path) -> SnapshotInfo:
        """Snapshot ``tree`` as the workspace's next seq (W3), or return the head with
        ``new=False`` when the tree equals it."""
        started = time.perf_counter()
        wdir = self._wdir(workspace_id)
        stats = CommitStats(workspace_id=workspace_id)
        with self._workspace_lock(workspace_id, wdir):
            state = self._load_state(workspace_id, wdir)
            try:
                root_fd = os.open(tree, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
            except OSError as exc:
                raise NotFound(
                    f"workspace folder {str(tree)!r} cannot be opened ({exc.strerror}); "
                    f"create the workspace before committing it",
                    workspace_id=workspace_id,
                ) from None
            try:
                clock_ns = self._tick(wdir)
                dirs, changed = self._walk(root_fd, state, stats)
            finally:
                os.close(root_fd)
            body, files, total = self._encode_manifest(dirs)
            digest = hashlib.sha256(body).digest()
            if digest.hex() == state.head_info.root_hash:
                info = state.head_info.model_copy(update={"new": False})
            else:
                seq = state.head_info.seq + 1
                info = SnapshotInfo(
                    workspace_id=workspace_id,
                    seq=seq,
                    root_hash=digest.hex(),
                    files=files,
                    bytes=total,
                    created_at=time.time(),
                    new=True,
                )
                header = _MANIFEST_HEADER.pack(
                    _MANIFEST_MAGIC, _FORMAT_VERSION, info.created_at, files, total, digest
                )
                self._atomic_write(wdir / "manifests" / str(seq), header, body)
                self._atomic_write(wdir / "HEAD", f"{seq}\n".encode())
                state.head_info = info.model_copy(update={"new": False})
                state.head_sig = _sig(os.stat(wdir / "HEAD"))
            if changed or len(dirs) != len(state.dirs):
                self._write_statcache(wdir, dirs, clock_ns)
                state.dirs = dirs
                state.clock_ns = clock_ns
                state.cache_sig = _sig(os.stat(wdir / "statcache"))
            stats.seq = info.seq
            stats.new = info.new
            stats.entries = sum(r.n for r in dirs.values())
            stats.elapsed_s = time.perf_counter() - started
            self._stats[workspace_id] = stats
            self.last_commit_stats = stats
            return info

    def head(self, workspace_id: str) -> SnapshotInfo:
        """The workspace's latest committed snapshot."""
        wdir = self._existing_wdir(workspace_id)
        return self._read_info(workspace_id, wdir, self._read_head(wdir, workspace_id))

    def list_snapshots(self, workspace_id: str) -> list[SnapshotInfo]:
        """Every retained snapshot of the workspace, oldest first (W5)."""
        wdir = self._existing_wdir(workspace_id)
        infos: list[SnapshotInfo] = []
        for seq in range(self._read_head(wdir, workspace_id) + 1):
            with contextlib.suppress(NotFound):
                infos.append(self._read_info(workspace_id, wdir, seq))
        return infos

    def commit_stats(self, workspace_id: str) -> CommitStats | None:
        """What the last commit of ``workspace_id`` in this store did."""
        return self._stats.get(workspace_id)

    def manifest(self, workspace_id: str, seq: int | None = None) -> dict[str, PathEntry]:
        """Every entry of a snapshot (files, folders, symlinks) by path; the root is implicit."""
        m = self._manifest(workspace_id, seq)
        return {m.paths[i]: m.entry(i) for i in range(len(m.paths))}

    def iter_entries(self, workspace_id: str, seq: int | None = None) -> Iterator[PathEntry]:
        """The entries of a snapshot in canonical order (by folder, names sorted)."""
        m = self._manifest(workspace_id, seq)
        for i in range(len(m.paths)):
            yield m.entry(i)

    def stat(self, workspace_id: str, seq: int | None, path: str) -> PathEntry | None:
        """The entry at ``path`` in snapshot ``seq`` (None: head), or None when absent.
        ``""`` is the root folder."""
        rel = normalize_relative(path)
        m = self._manifest(workspace_id, seq)
        if rel == "":
            return PathEntry(path="", kind="dir", size=0, mode=0o755)
        i = m.index().get(rel)
        return None if i is None else m.entry(i)

    def read(
        self, workspace_id: str, seq: int | None, path: str, offset: int, limit: int
    ) -> FileChunk:
        """Up to ``limit`` bytes (at most ``MAX_READ_CHUNK``) of a file at ``offset``, from
        snapshot ``seq`` (None: head). Page on with ``next_offset`` until it equals ``size``."""
        if offset < 0 or limit < 0:
            raise InvalidInput(
                f"offset ({offset}) and limit ({limit}) must be zero or more",
                offset=offset,
                limit=limit,
            )
        rel = normalize_relative(path)
        m = self._manifest(workspace_id, seq)
        where = f"snapshot {m.info.seq} of workspace {workspace_id!r}"
        i = m.index().get(rel) if rel else None
        if rel == "" or (i is not None and m.kinds[i] == _KIND_DIR):
            raise InvalidInput(
                f"{rel or '(the root)'!r} is a folder in {where}; read a file inside it, "
                f"or list the folder instead",
                path=rel,
            )
        if i is None:
            raise NotFound(
                f"no file {rel!r} in {where}; check the path (relative to the workspace "
                f"root) or list the snapshot to see what it holds",
                path=rel,
                seq=m.info.seq,
            )
        if m.kinds[i] == _KIND_LINK:
            raise InvalidInput(
                f"{rel!r} is a symbolic link to {m.targets[i]!r} in {where}; links are not "
                f"followed, read the file it points to by its own path",
                path=rel,
            )
        size = m.sizes[i]
        start = min(offset, size)
        want = min(limit, MAX_READ_CHUNK, size - start)
        data = b""
        if want > 0:
            fd = os.open(self._object_path(m.digests[32 * i : 32 * i + 32].hex()), os.O_RDONLY)
            try:
                data = os.pread(fd, want, start)
            finally:
                os.close(fd)
        return FileChunk(data=data, offset=start, next_offset=start + len(data), size=size)

    def open_object(self, sha256: str) -> BinaryIO:
        """Open a stored object (by hex sha256) for streaming reads; the caller closes it."""
        if not isinstance(sha256, str) or not _SHA256_HEX.fullmatch(sha256):
            raise InvalidInput(
                f"{sha256!r} is not an object name; pass a sha256 as 64 lowercase hex digits",
                sha256=str(sha256),
            )
        try:
            return open(self._object_path(sha256), "rb")
        except FileNotFoundError:
            raise NotFound(f"no object {sha256} in the snapshot store", sha256=sha256) from None

    def close(self) -> None:
        """Stop the hashing threads (the store stays usable; they restart on demand)."""
        with self._guard:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    # ------------------------------------------------------------------ workspace metadata

    def _wdir(self, workspace_id: str) -> Path:
        if not isinstance(workspace_id, str) or not _WORKSPACE_ID.fullmatch(workspace_id):
            raise InvalidInput(
                f"workspace id {workspace_id!r} is not valid; use 1-128 letters, digits, "
                f"'.', '_' or '-', starting with a letter or digit",
                workspace_id=str(workspace_id),
            )
        return self._workspaces / workspace_id

    def _existing_wdir(self, workspace_id: str) -> Path:
        wdir = self._wdir(workspace_id)
        if not (wdir / "HEAD").exists():
            raise NotFound(
                f"workspace {workspace_id!r} has no snapshots in this store; create it first",
                workspace_id=workspace_id,
            )
        return wdir

    @contextlib.contextmanager
    def _workspace_lock(self, workspace_id: str, wdir: Path) -> Iterator[None]:
        with self._guard:
            lock = self._locks.setdefault(workspace_id, threading.Lock())
        with lock:
            try:
                fd = os.open(wdir / "lock", os.O_RDWR | os.O_CREAT | _O_CLOEXEC, 0o644)
            except FileNotFoundError:
                (wdir / "manifests").mkdir(parents=True, exist_ok=True)
                fd = os.open(wdir / "lock", os.O_RDWR | os.O_CREAT | _O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def _read_head(self, wdir: Path, workspace_id: str) -> int:
        try:
            return int((wdir / "HEAD").read_bytes())
        except FileNotFoundError:
            raise NotFound(
                f"workspace {workspace_id!r} has no snapshots in this store; create it first",
                workspace_id=workspace_id,
            ) from None

    def _read_info(self, workspace_id: str, wdir: Path, seq: int) -> SnapshotInfo:
        try:
            with open(wdir / "manifests" / str(seq), "rb") as f:
                raw = f.read(_MANIFEST_HEADER.size)
        except FileNotFoundError:
            raise NotFound(
                f"snapshot {seq} of workspace {workspace_id!r} is not retained",
                workspace_id=workspace_id,
                seq=seq,
            ) from None
        return self._decode_header(workspace_id, seq, raw)

    def _decode_header(self, workspace_id: str, seq: int, raw: bytes) -> SnapshotInfo:
        magic, version, created_at, files, total, digest = _MANIFEST_HEADER.unpack_from(raw)
        if magic != _MANIFEST_MAGIC or version != _FORMAT_VERSION:
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

    def _load_state(self, workspace_id: str, wdir: Path) -> _WorkspaceState:
        """The workspace's head and stat cache, creating snapshot 0 if missing. Memoised, and
        checked against the files' stat so commits by another store instance are seen."""
        try:
            head_sig = _sig(os.stat(wdir / "HEAD"))
        except FileNotFoundError:
            self._create_empty(wdir)
            head_sig = _sig(os.stat(wdir / "HEAD"))
        try:
            cache_sig: _Sig | None = _sig(os.stat(wdir / "statcache"))
        except FileNotFoundError:
            cache_sig = None
        with self._guard:
            state = self._states.get(workspace_id)
            if state is not None:
                self._states.move_to_end(workspace_id)
        if state is not None and state.head_sig == head_sig and state.cache_sig == cache_sig:
            return state
        info = self._read_info(workspace_id, wdir, self._read_head(wdir, workspace_id))
        dirs, clock_ns = self._read_statcache(wdir)
        state = _WorkspaceState(info, head_sig, dirs, clock_ns, cache_sig)
        with self._guard:
            self._states[workspace_id] = state
            while len(self._states) > self._cached_workspaces:
                self._states.popitem(last=False)
        return state

    def _create_empty(self, wdir: Path) -> None:
        body = self._encode_manifest({})[0]
        digest = hashlib.sha256(body).digest()
        header = _MANIFEST_HEADER.pack(_MANIFEST_MAGIC, _FORMAT_VERSION, time.time(), 0, 0, digest)
        self._atomic_write(wdir / "manifests" / "0", header, body)
        self._atomic_write(wdir / "HEAD", b"0\n")

    def _atomic_write(self, path: Path, *parts: bytes) -> None:
        tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o644)
        try:
            for part in parts:
                _write_all(fd, part)
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def _tick(self, wdir: Path) -> int:
        """A filesystem timestamp taken now: whatever changes from here on gets an mtime and
        a ctime at or after it."""
        clock = wdir / "clock"
        try:
            os.utime(clock)
        except FileNotFoundError:
            clock.touch()
        return os.stat(clock).st_mtime_ns

    # ------------------------------------------------------------------ stat cache

    def _write_statcache(self, wdir: Path, dirs: dict[str, _DirRecord], clock_ns: int) -> None:
        table: list[int] = []
        blobs: list[bytes] = []
        for r in dirs.values():
            path = _encode(r.path)
            names = _encode(r.scan_names)
            subdirs = _encode("\0".join(r.subdirs))
            table += (
                len(path),
                len(names),
                len(r.scan_stats),
                r.max_time,
                len(subdirs),
                r.n,
                r.files,
                r.total,
                len(r.paths),
                len(r.targets),
            )
            blobs += (path, names, r.scan_stats, subdirs, r.paths, r.kinds, r.modes, r.sizes)
            blobs += (r.digests, r.targets)
        header = _STATCACHE_HEADER.pack(_STATCACHE_MAGIC, _FORMAT_VERSION, clock_ns, len(dirs))
        self._atomic_write(wdir / "statcache", header, _pack_ints("q", table), b"".join(blobs))

    def _read_statcache(self, wdir: Path) -> tuple[dict[str, _DirRecord], int]:
        try:
            raw = (wdir / "statcache").read_bytes()
        except FileNotFoundError:
            return {}, 0
        try:
            magic, version, clock_ns, count = _STATCACHE_HEADER.unpack_from(raw)
            if magic != _STATCACHE_MAGIC or version != _FORMAT_VERSION:
                raise ValueError("unknown stat cache format")
            off = _STATCACHE_HEADER.size
            table = _unpack_ints("q", raw[off : off + 8 * _RECORD_FIELDS * count])
            off += 8 * _RECORD_FIELDS * count
            dirs: dict[str, _DirRecord] = {}

            def take(size: int) -> bytes:
                nonlocal off
                if size < 0 or off + size > len(raw):
                    raise ValueError("stat cache is truncated")
                off += size
                return raw[off - size : off]

            for k in range(count):
                plen, snlen, sslen, max_time, sdlen, n, files, total, pslen, tlen = table[
                    _RECORD_FIELDS * k : _RECORD_FIELDS * (k + 1)
                ]
                path = _decode(take(plen))
                scan_names = _decode(take(snlen))
                scan_stats = take(sslen)
                subdirs = _decode(take(sdlen))
                dirs[path] = _DirRecord(
                    path=path,
                    scan_names=scan_names,
                    scan_stats=scan_stats,
                    max_time=max_time,
                    subdirs=tuple(subdirs.split("\0")) if subdirs else (),
                    n=n,
                    files=files,
                    total=total,
                    paths=take(pslen),
                    kinds=take(n),
                    modes=take(4 * n),
                    sizes=take(8 * n),
                    digests=take(32 * n),
                    targets=take(tlen),
                )
            if off != len(raw):
                raise ValueError("stat cache has trailing bytes")
            return dirs, clock_ns
        except (ValueError, struct.error, UnicodeDecodeError) as exc:
            # The cache only saves work; a bad one means every file is read again.
            log.warning("ignoring unreadable stat cache %s: %s", wdir / "statcache", exc)
            return {}, 0

    # ------------------------------------------------------------------ walking

    def _walk(
        self, root_fd: int, state: _WorkspaceState, stats: CommitStats
    ) -> tuple[dict[str, _DirRecord], bool]:
        """Walk the tree; return its folder records and whether any differs from the cache."""
        old = state.dirs
        clock = state.clock_ns
        pack = _SCAN.pack
        out: dict[str, _DirRecord | _DirBuilder] = {}
        waiting: list[int] = []  # folder fds kept open for pool work
        changed = False
        reused = 0
        stack: list[tuple[int, str]] = [(root_fd, "")]
        try:
            while stack:
                fd, dpath = stack.pop()
                try:
                    entries = list(os.scandir(fd))
                    try:
                        sts = [e.stat(follow_symlinks=False) for e in entries]
                    except OSError:
                        entries, sts = self._stat_each(entries, stats)
                    names = [e.name for e in entries]
                    scan_names = "\0".join(names)
                    scan_stats = b"".join(
                        [
                            pack(s.st_mode, s.st_mtime_ns, s.st_ctime_ns, s.st_size, s.st_ino)
                            for s in sts
                        ]
                    )
                    rec = old.get(dpath)
                    subdirs: tuple[str, ...] | list[str]
                    if (
                        rec is not None
                        and rec.max_time < clock
                        and rec.scan_stats == scan_stats
                        and rec.scan_names == scan_names
                    ):
                        out[dpath] = rec
                        subdirs = rec.subdirs
                        reused += 1
                    else:
                        builder = self._rebuild(
                            fd, dpath, names, sts, scan_names, scan_stats, rec, clock, stats
                        )
                        out[dpath] = builder
                        subdirs = builder.subdirs
                        changed = True
                        if builder.pending:
                            waiting.append(fd)
                    prefix = dpath + "/" if dpath else ""
                    for name in subdirs:
                        try:
                            child = os.open(name, _OPEN_DIR, dir_fd=fd)
                        except OSError as exc:
                            if exc.errno not in _VANISHED:
                                raise
                            # gone or no longer a folder: recorded as an empty folder this
                            # time; the parent is looked at again next time
                            stats.skipped += 1
                            parent = out[dpath]
                            if isinstance(parent, _DirBuilder):
                                parent.scan_stats = b""
                            else:
                                out[dpath] = replace(parent, scan_stats=b"")
                            changed = True
                            continue
                        stack.append((child, prefix + name))
                finally:
                    if fd != root_fd and (not waiting or waiting[-1] != fd):
                        os.close(fd)
                if len(waiting) >= _MAX_PENDING_DIRS:
                    self._settle(out, stats)
                    for wfd in waiting:
                        if wfd != root_fd:
                            os.close(wfd)
                    waiting.clear()
            self._settle(out, stats)
        finally:
            for wfd in waiting:
                if wfd != root_fd:
                    os.close(wfd)
            for sfd, _ in stack:  # left over only when something went wrong
                if sfd != root_fd:
                    os.close(sfd)
        stats.dirs_scanned = len(out)
        stats.dirs_reused = reused
        dirs: dict[str, _DirRecord] = {}
        for dpath in sorted(out):
            r = out[dpath]
            dirs[dpath] = r.finish(set()) if isinstance(r, _DirBuilder) else r
            stats.files_seen += dirs[dpath].files
        return dirs, changed

    def _stat_each(
        self, entries: list[os.DirEntry[str]], stats: CommitStats
    ) -> tuple[list[os.DirEntry[str]], list[os.stat_result]]:
        """Stat entries one by one, leaving out those that vanished meanwhile."""
        kept: list[os.DirEntry[str]] = []
        sts: list[os.stat_result] = []
        for e in entries:
            try:
                sts.append(e.stat(follow_symlinks=False))
            except OSError as exc:
                if exc.errno not in _VANISHED:
                    raise
                stats.skipped += 1
                continue
            kept.append(e)
        return kept, sts

    def _rebuild(
        self,
        fd: int,
        dpath: str,
        names: list[str],
        sts: list[os.stat_result],
        scan_names: str,
        scan_stats: bytes,
        old: _DirRecord | None,
        clock: int,
        stats: CommitStats,
    ) -> _DirBuilder:
        """Build a folder's section entry by entry, reading only files whose stat changed."""
        prev_scan: dict[str, bytes] = {}
        prev_file: dict[str, tuple[bytes, int]] = {}
        if old is not None:
            if old.scan_names:
                prev_scan = {
                    name: old.scan_stats[_SCAN_SIZE * i : _SCAN_SIZE * (i + 1)]
                    for i, name in enumerate(old.scan_names.split("\0"))
                }
            cut = len(_encode(old.path)) + 1 if old.path else 0
            old_sizes = _unpack_ints("q", old.sizes)
            for i, full in enumerate(old.paths.split(b"\0") if old.n else ()):
                if old.kinds[i] == _KIND_FILE:
                    prev_file[_decode(full[cut:])] = (
                        old.digests[32 * i : 32 * i + 32],
                        old_sizes[i],
                    )
        b = _DirBuilder(dpath, scan_names, scan_stats)
        s_isreg, s_isdir, s_islnk = stat_mod.S_ISREG, stat_mod.S_ISDIR, stat_mod.S_ISLNK
        for i in sorted(range(len(names)), key=names.__getitem__):
            name = names[i]
            st = sts[i]
            mode = st.st_mode
            if s_isreg(mode):
                latest = max(st.st_mtime_ns, st.st_ctime_ns)
                if latest > b.max_time:
                    b.max_time = latest
                prev = prev_file.get(name)
                same = (
                    prev is not None
                    and prev_scan.get(name) == scan_stats[_SCAN_SIZE * i : _SCAN_SIZE * (i + 1)]
                )
                if same and latest < clock:
                    assert prev is not None
                    digest, size = prev
                else:
                    if same:
                        stats.racy += 1
                    if st.st_size >= _POOL_MIN_SIZE and self._workers > 1:
                        b.pending.append(
                            (len(b.names), self._get_pool().submit(self._store_file, fd, name))
                        )
                        digest, size = _NO_DIGEST, 0
                    else:
                        try:
                            stored = self._store_file(fd, name)
                        except PermissionError as exc:
                            stats.unreadable.append(f"{b.path}/{name}" if b.path else name)
                            log.warning("snapshot leaves out %s: %s", name, exc)
                            continue
                        if stored is None:
                            stats.skipped += 1
                            continue
                        digest, size = stored[0], stored[1]
                        stats.files_hashed += 1
                        stats.bytes_hashed += size
                b.names.append(name)
                b.kinds.append(_KIND_FILE)
                b.modes.append(mode & 0o7777)
                b.sizes.append(size)
                b.digests.append(digest)
                b.targets.append("")
            elif s_isdir(mode):
                b.names.append(name)
                b.kinds.append(_KIND_DIR)
                b.modes.append(mode & 0o7777)
                b.sizes.append(0)
                b.digests.append(_NO_DIGEST)
                b.targets.append("")
                b.subdirs.append(name)
            elif s_islnk(mode):
                try:
                    target = os.readlink(name, dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in _VANISHED:
                        raise
                    stats.skipped += 1
                    continue
                latest = max(st.st_mtime_ns, st.st_ctime_ns)
                if latest > b.max_time:
                    b.max_time = latest
                b.names.append(name)
                b.kinds.append(_KIND_LINK)
                b.modes.append(0o777)
                b.sizes.append(len(_encode(target)))
                b.digests.append(_NO_DIGEST)
                b.targets.append(target)
            # sockets, fifos and devices are not part of a snapshot
        return b

    def _settle(self, out: dict[str, _DirRecord | _DirBuilder], stats: CommitStats) -> None:
        """Wait for pool work and turn the builders that had some into records."""
        for dpath, b in list(out.items()):
            if not isinstance(b, _DirBuilder) or not b.pending:
                continue
            dropped: set[int] = set()
            for i, future in b.pending:
                try:
                    stored = future.result()
                except PermissionError as exc:
                    full = f"{b.path}/{b.names[i]}" if b.path else b.names[i]
                    stats.unreadable.append(full)
                    log.warning("snapshot leaves out %s: %s", full, exc)
                    dropped.add(i)
                    continue
                if stored is None:
                    stats.skipped += 1
                    dropped.add(i)
                    continue
                b.digests[i] = stored[0]
                b.sizes[i] = stored[1]
                stats.files_hashed += 1
                stats.bytes_hashed += stored[1]
            b.pending = []
            out[dpath] = b.finish(dropped)

    # ------------------------------------------------------------------ objects

    def _get_pool(self) -> ThreadPoolExecutor:
        with self._guard:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self._workers, thread_name_prefix="snapshot-hash"
                )
            return self._pool

    def _store_file(self, dfd: int, name: str) -> _Stored:
        """Read one workspace file (never through a symlink) into the store; return
        (digest, bytes read, stat before reading), or None if it is no longer a file."""
        try:
            fd = os.open(name, _OPEN_FILE, dir_fd=dfd)
        except OSError as exc:
            if exc.errno in _VANISHED:
                return None
            raise
        try:
            st = os.fstat(fd)
            if not stat_mod.S_ISREG(st.st_mode):
                return None
            if st.st_size < _SMALL_FILE:
                data = os.read(fd, st.st_size + 1)
                if len(data) <= st.st_size:
                    digest = hashlib.sha256(data).digest()
                    self._put_small(digest, data)
                    return digest, len(data), st
                return self._put_stream(fd, data, st)
            return self._put_stream(fd, b"", st)
        finally:
            os.close(fd)

    def _object_path(self, hexdigest: str) -> str:
        return f"{self._objects_str}{hexdigest[:2]}/{hexdigest[2:]}"

    def _new_tmp(self) -> tuple[str, int]:
        tmp = f"{self._tmp_prefix}{next(self._tmp_counter)}"
        fd = os.open(tmp, _OPEN_TMP, 0o444)
        if self._fchmod_objects:
            os.fchmod(fd, 0o444)
        return tmp, fd

    def _put_small(self, digest: bytes, data: bytes) -> None:
        final = self._object_path(digest.hex())
        if os.path.exists(final):
            return
        tmp, fd = self._new_tmp()
        try:
            _write_all(fd, data)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        os.rename(tmp, final)

    def _put_stream(
        self, fd: int, head: bytes, st: os.stat_result
    ) -> tuple[bytes, int, os.stat_result]:
        """Copy a big file into a temp object while hashing it, in bounded memory."""
        hasher = hashlib.sha256(head)
        tmp, out = self._new_tmp()
        try:
            try:
                _write_all(out, head)
                size = len(head)
                buf = bytearray(_STREAM_CHUNK)
                view = memoryview(buf)
                while True:
                    n = os.readv(fd, [buf])
                    if n == 0:
                        break
                    chunk = view[:n]
                    hasher.update(chunk)
                    _write_all(out, chunk)
                    size += n
            finally:
                os.close(out)
            digest = hasher.digest()
            final = self._object_path(digest.hex())
            if os.path.exists(final):
                os.unlink(tmp)
            else:
                os.rename(tmp, final)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return digest, size, st

    # ------------------------------------------------------------------ manifests

    def _encode_manifest(self, dirs: dict[str, _DirRecord]) -> tuple[bytes, int, int]:
        """(body, files, bytes) of the tree made of ``dirs`` (already in canonical order)."""
        recs = [r for r in dirs.values() if r.n]
        paths = b"\0".join([r.paths for r in recs])
        targets = b"\0".join([r.targets for r in recs])
        body = b"".join(
            [
                _BODY_HEADER.pack(sum(r.n for r in recs), len(paths), len(targets)),
                *[r.kinds for r in recs],
                *[r.modes for r in recs],
                *[r.sizes for r in recs],
                paths,
                *[r.digests for r in recs],
                targets,
            ]
        )
        return body, sum(r.files for r in recs), sum(r.total for r in recs)

    def _manifest(self, workspace_id: str, seq: int | None) -> _Manifest:
        wdir = self._existing_wdir(workspace_id)
        head = self._read_head(wdir, workspace_id)
        if seq is None:
            seq = head
        elif isinstance(seq, bool) or not isinstance(seq, int) or seq < 0 or seq > head:
            raise NotFound(
                f"snapshot {seq!r} of workspace {workspace_id!r} does not exist; its "
                f"snapshots are numbered 0 to {head}",
                workspace_id=workspace_id,
                seq=str(seq),
            )
        key = (workspace_id, seq)
        with self._guard:
            cached = self._manifests.get(key)
            if cached is not None:
                self._manifests.move_to_end(key)
                return cached
        try:
            raw = (wdir / "manifests" / str(seq)).read_bytes()
        except FileNotFoundError:
            raise NotFound(
                f"snapshot {seq} of workspace {workspace_id!r} is not retained",
                workspace_id=workspace_id,
                seq=seq,
            ) from None
        m = self._decode_manifest(workspace_id, seq, raw)
        with self._guard:
            self._manifests[key] = m
            while len(self._manifests) > self._cached_manifests:
                self._manifests.popitem(last=False)
        return m

    def _decode_manifest(self, workspace_id: str, seq: int, raw: bytes) -> _Manifest:
        info = self._decode_header(workspace_id, seq, raw)
        view = memoryview(raw)
        off = _MANIFEST_HEADER.size
        n, plen, tlen = _BODY_HEADER.unpack_from(raw, off)
        off += _BODY_HEADER.size
        kinds = raw[off : off + n]
        off += n
        modes = _unpack_ints("I", view[off : off + 4 * n])
        off += 4 * n
        sizes = _unpack_ints("q", view[off : off + 8 * n])
        off += 8 * n
        paths = _split(view[off : off + plen], n)
        off += plen
        digests = raw[off : off + 32 * n]
        off += 32 * n
        targets = _split(view[off : off + tlen], n)
        if off + tlen != len(raw):
            raise ValueError(f"manifest {seq} of workspace {workspace_id!r} has the wrong length")
        return _Manifest(info, paths, kinds, modes, sizes, digests, targets)


__all__ = ["CommitStats", "SnapshotStore"]

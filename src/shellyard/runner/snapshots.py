"""Content-addressed snapshots of workspaces (W2, W3, W5, W6; DESIGN.md "Snapshots").

Layout under the store root::

    objects/<2 hex>/<62 hex>        file contents named by sha256, written once, mode 0o444
    objects/tmp/                    temp files, renamed into place when complete
    workspaces/<id>/manifests/<seq> one manifest per snapshot (header + canonical body)
    workspaces/<id>/HEAD            current seq, replaced atomically (temp + rename)
    workspaces/<id>/statcache       path -> (mtime_ns, ctime_ns, size, inode, sha256)
    workspaces/<id>/clock           touched at the start of each walk (racy-clean clock)
    workspaces/<id>/lock            flock'd during a commit (with a per-workspace thread lock)

Encoding: manifests and the stat cache are columns (NUL-joined paths, little-endian int
arrays, raw 32-byte digests) because bench/bench_snapshots.py --formats measured them about
5x faster to encode and decode than JSON lines or marshal'd tuples for 10,000 entries.

Manifest body (``root_hash`` is its sha256)::

    "<QQQ" n, len(paths blob), len(targets blob)
    kinds   n bytes (b"f" file, b"d" directory, b"l" symlink), entries in canonical order:
            depth first, names sorted within each directory
    modes   n x uint32 (permission bits), sizes n x int64 (bytes; link text length)
    paths   NUL-joined UTF-8 (surrogateescape), digests n x 32 bytes (zeros unless a file),
    targets NUL-joined symlink texts ("" unless a symlink)

A commit walks the tree with ``os.scandir`` on directory file descriptors and ``O_NOFOLLOW``
opens, so a symlink (or a file swapped for one mid-walk) is recorded as a link and never
read through. Files whose stat (mtime_ns, ctime_ns, size, inode) matches the stat cache are
not read again, unless racily clean: their mtime or ctime is not strictly older than the
clock file's mtime taken before the previous walk began (git's rule, with the clock read
before the walk instead of after, which is stricter). Changed files are read once, hashed
and copied (never hard-linked) into the store; many changed files are spread over a thread
pool (hashlib and file I/O release the GIL).
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
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from shellyard.errors import InvalidInput, NotFound
from shellyard.paths import normalize_relative
from shellyard.runner.protocol import MAX_READ_CHUNK, FileChunk, PathEntry, SnapshotInfo

log = logging.getLogger(__name__)

_MANIFEST_MAGIC = b"SYMF"
_STATCACHE_MAGIC = b"SYSC"
_FORMAT_VERSION = 1
# magic, version, created_at, files, bytes, root digest
_MANIFEST_HEADER = struct.Struct("<4sIdqq32s")
_BODY_HEADER = struct.Struct("<QQQ")
# magic, version, clock_ns, n, len(paths blob)
_STATCACHE_HEADER = struct.Struct("<4sIqQQ")

_KIND_FILE = ord("f")
_KIND_DIR = ord("d")
_KIND_LINK = ord("l")
_KIND_NAMES = {_KIND_FILE: "file", _KIND_DIR: "dir", _KIND_LINK: "symlink"}
_NO_DIGEST = bytes(32)

#: Files smaller than this are read with one read(); larger ones are streamed in chunks.
_SMALL_FILE = 1 << 20
_STREAM_CHUNK = 1 << 20
#: Fewer changed files than this are hashed in the committing thread.
_PARALLEL_MIN_FILES = 48
#: Directory descriptors kept open for pending hashing work before it is flushed.
_MAX_OPEN_DIRS = 256

#: errno values meaning "this entry vanished or changed type while we looked at it":
#: ELOOP (became a symlink, O_NOFOLLOW), EINVAL (readlink of a non-link), ENXIO (became a
#: socket/fifo), ENOENT, ENOTDIR.
_VANISHED = frozenset({errno.ELOOP, errno.EINVAL, errno.ENXIO, errno.ENOENT, errno.ENOTDIR})

_WORKSPACE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_LITTLE = sys.byteorder == "little"

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_OPEN_FILE = os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC
_OPEN_DIR = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
_OPEN_TMP = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC

# path -> (mtime_ns, ctime_ns, size, inode, sha256 digest)
_CacheEntry = tuple[int, int, int, int, bytes]
_StatCache = dict[str, _CacheEntry]


def _name(entry: os.DirEntry[str]) -> str:
    return entry.name


def _int_array(typecode: str, values: list[int]) -> bytes:
    from array import array

    arr = array(typecode, values)
    if not _LITTLE:
        arr.byteswap()
    return arr.tobytes()


def _int_list(typecode: str, data: bytes | memoryview) -> list[int]:
    from array import array

    arr = array(typecode)
    arr.frombytes(data)
    if not _LITTLE:
        arr.byteswap()
    return arr.tolist()


def _split(blob: bytes | memoryview, n: int) -> list[str]:
    if n == 0:
        return []
    parts = bytes(blob).decode("utf-8", "surrogateescape").split("\0")
    if len(parts) != n:
        raise ValueError(f"expected {n} names, found {len(parts)}")
    return parts


def _join(names: list[str]) -> bytes:
    return "\0".join(names).encode("utf-8", "surrogateescape")


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


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
    """What the last commit of a workspace did (for tests, logs and benchmarks)."""

    workspace_id: str
    seq: int = 0
    new: bool = False
    entries: int = 0
    files_seen: int = 0
    files_hashed: int = 0
    bytes_hashed: int = 0
    cache_hits: int = 0
    racy: int = 0
    #: Files that vanished or changed type while the commit walked the tree.
    skipped: int = 0
    #: Files the store could not read (permission denied); left out of the snapshot.
    unreadable: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0


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

    head_seq: int
    head_info: SnapshotInfo
    head_sig: tuple[int, int, int, int]
    cache: _StatCache
    clock_ns: int
    cache_sig: tuple[int, int, int, int] | None


@dataclass
class _Walk:
    paths: list[str] = field(default_factory=list)
    kinds: bytearray = field(default_factory=bytearray)
    modes: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    digests: list[bytes] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    cache: _StatCache = field(default_factory=dict)
    # (entry index, directory fd, name) of files to read
    todo: list[tuple[int, int, str]] = field(default_factory=list)
    dirty: bool = False
    dropped: set[int] = field(default_factory=set)


def _sig(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)


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
        self._objects_str = str(self._objects) + "/"
        self._tmp_prefix = f"{self._tmp}/{os.getpid()}-{id(self):x}-"
        self._tmp_counter = itertools.count()
        umask = _process_umask()
        self._fchmod_objects = umask is None or bool(umask & 0o444)
        self._workers = workers if workers is not None else min(4, 2 * (os.cpu_count() or 1))
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
        """Snapshot ``tree`` as the workspace's next seq, or return the head (``new=False``)
        when the tree equals it (W3)."""
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
                    f"the workspace must exist before it is committed",
                    workspace_id=workspace_id,
                ) from None
            try:
                clock_ns = self._tick(wdir)
                walk = self._walk(root_fd, state, stats)
            finally:
                os.close(root_fd)
            body, files, total = self._encode_manifest(walk)
            digest = hashlib.sha256(body).digest()
            if digest.hex() == state.head_info.root_hash:
                info = state.head_info.model_copy(update={"new": False})
            else:
                seq = state.head_seq + 1
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
                self._atomic_write(wdir / "manifests" / str(seq), header + body)
                self._atomic_write(wdir / "HEAD", f"{seq}\n".encode())
                state.head_seq = seq
                state.head_info = info.model_copy(update={"new": False})
                state.head_sig = _sig(os.stat(wdir / "HEAD"))
            if walk.dirty or len(walk.cache) != len(state.cache):
                self._write_statcache(wdir, walk.cache, clock_ns)
                state.cache = walk.cache
                state.clock_ns = clock_ns
                state.cache_sig = _sig(os.stat(wdir / "statcache"))
            stats.seq = info.seq
            stats.new = info.new
            stats.entries = len(walk.paths)
            stats.elapsed_s = time.perf_counter() - started
            self._stats[workspace_id] = stats
            self.last_commit_stats = stats
            return info

    def head(self, workspace_id: str) -> SnapshotInfo:
        """The workspace's latest committed snapshot."""
        wdir = self._existing_wdir(workspace_id)
        seq = self._read_head(wdir, workspace_id)
        return self._read_info(workspace_id, wdir, seq)

    def list_snapshots(self, workspace_id: str) -> list[SnapshotInfo]:
        """Every retained snapshot of the workspace, oldest first (W5)."""
        wdir = self._existing_wdir(workspace_id)
        head = self._read_head(wdir, workspace_id)
        infos: list[SnapshotInfo] = []
        for seq in range(head + 1):
            try:
                infos.append(self._read_info(workspace_id, wdir, seq))
            except NotFound:
                continue
        return infos

    def commit_stats(self, workspace_id: str) -> CommitStats | None:
        """What the last commit of ``workspace_id`` in this store did."""
        return self._stats.get(workspace_id)

    def manifest(self, workspace_id: str, seq: int | None = None) -> dict[str, PathEntry]:
        """Every entry of a snapshot (files, directories, symlinks), by path; no root entry."""
        m = self._manifest(workspace_id, seq)
        return {m.paths[i]: m.entry(i) for i in range(len(m.paths))}

    def iter_entries(self, workspace_id: str, seq: int | None = None) -> Iterator[PathEntry]:
        """The entries of a snapshot in canonical order (depth first, names sorted)."""
        m = self._manifest(workspace_id, seq)
        for i in range(len(m.paths)):
            yield m.entry(i)

    def stat(self, workspace_id: str, seq: int | None, path: str) -> PathEntry | None:
        """The entry at ``path`` in snapshot ``seq`` (None: head); None when absent."""
        rel = normalize_relative(path)
        m = self._manifest(workspace_id, seq)
        if rel == "":
            return PathEntry(path="", kind="dir", size=0, mode=0o755)
        i = m.index().get(rel)
        return None if i is None else m.entry(i)

    def read(
        self, workspace_id: str, seq: int | None, path: str, offset: int, limit: int
    ) -> FileChunk:
        """Read up to ``limit`` bytes (at most ``MAX_READ_CHUNK``) of a file at ``offset``."""
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
                f"no file {rel!r} in {where}; check the path (relative to the workspace root) "
                f"or list the snapshot to see what it holds",
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
        limit = min(limit, MAX_READ_CHUNK)
        start = min(offset, size)
        want = min(limit, size - start)
        data = b""
        if want > 0:
            fd = os.open(self._object_path(m.digests[32 * i : 32 * i + 32].hex()), os.O_RDONLY)
            try:
                data = os.pread(fd, want, start)
            finally:
                os.close(fd)
        return FileChunk(data=data, offset=start, next_offset=start + len(data), size=size)

    def open_object(self, sha256: str) -> BinaryIO:
        """Open a stored object (by hex sha256) for streaming reads."""
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise InvalidInput(
                f"{sha256!r} is not a sha256 object name; pass 64 lowercase hex digits",
                sha256=sha256,
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
                f"snapshot {seq} of workspace {workspace_id!r} does not exist",
                workspace_id=workspace_id,
                seq=seq,
            ) from None
        return self._decode_header(workspace_id, seq, raw)

    def _decode_header(self, workspace_id: str, seq: int, raw: bytes) -> SnapshotInfo:
        magic, version, created_at, files, total, digest = _MANIFEST_HEADER.unpack_from(raw)
        if magic != _MANIFEST_MAGIC or version != _FORMAT_VERSION:
            raise ValueError(f"manifest {seq} of {workspace_id!r} has an unknown format")
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
        """The workspace's head and stat cache (memoised; checked against the files'
        stat so another store instance's commits are seen). Creates seq 0 if missing."""
        try:
            head_sig = _sig(os.stat(wdir / "HEAD"))
        except FileNotFoundError:
            self._create_empty(workspace_id, wdir)
            head_sig = _sig(os.stat(wdir / "HEAD"))
        try:
            cache_sig: tuple[int, int, int, int] | None = _sig(os.stat(wdir / "statcache"))
        except FileNotFoundError:
            cache_sig = None
        with self._guard:
            state = self._states.get(workspace_id)
            if state is not None:
                self._states.move_to_end(workspace_id)
        if state is not None and state.head_sig == head_sig and state.cache_sig == cache_sig:
            return state
        seq = self._read_head(wdir, workspace_id)
        info = self._read_info(workspace_id, wdir, seq)
        cache, clock_ns = self._read_statcache(wdir)
        state = _WorkspaceState(seq, info, head_sig, cache, clock_ns, cache_sig)
        with self._guard:
            self._states[workspace_id] = state
            self._states.move_to_end(workspace_id)
            while len(self._states) > self._cached_workspaces:
                self._states.popitem(last=False)
        return state

    def _create_empty(self, workspace_id: str, wdir: Path) -> None:
        body = self._encode_manifest(_Walk())[0]
        digest = hashlib.sha256(body).digest()
        header = _MANIFEST_HEADER.pack(_MANIFEST_MAGIC, _FORMAT_VERSION, time.time(), 0, 0, digest)
        self._atomic_write(wdir / "manifests" / "0", header + body)
        self._atomic_write(wdir / "HEAD", b"0\n")

    def _atomic_write(self, path: Path, data: bytes) -> None:
        tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o644)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def _tick(self, wdir: Path) -> int:
        """A filesystem timestamp taken now: files changed from here on have mtime/ctime
        at or after it."""
        clock = wdir / "clock"
        try:
            os.utime(clock)
        except FileNotFoundError:
            clock.touch()
        return os.stat(clock).st_mtime_ns

    # ------------------------------------------------------------------ stat cache

    def _write_statcache(self, wdir: Path, cache: _StatCache, clock_ns: int) -> None:
        paths = list(cache)
        values = list(cache.values())
        names = _join(paths)
        parts = [
            _STATCACHE_HEADER.pack(
                _STATCACHE_MAGIC, _FORMAT_VERSION, clock_ns, len(paths), len(names)
            ),
            names,
            _int_array("q", [v[0] for v in values]),
            _int_array("q", [v[1] for v in values]),
            _int_array("q", [v[2] for v in values]),
            _int_array("Q", [v[3] for v in values]),
            b"".join([v[4] for v in values]),
        ]
        self._atomic_write(wdir / "statcache", b"".join(parts))

    def _read_statcache(self, wdir: Path) -> tuple[_StatCache, int]:
        try:
            raw = (wdir / "statcache").read_bytes()
        except FileNotFoundError:
            return {}, 0
        try:
            magic, version, clock_ns, n, plen = _STATCACHE_HEADER.unpack_from(raw)
            if magic != _STATCACHE_MAGIC or version != _FORMAT_VERSION:
                raise ValueError("unknown stat cache format")
            view = memoryview(raw)
            off = _STATCACHE_HEADER.size
            paths = _split(view[off : off + plen], n)
            off += plen
            cols = []
            for code in ("q", "q", "q", "Q"):
                cols.append(_int_list(code, view[off : off + 8 * n]))
                off += 8 * n
            digests = [raw[j : j + 32] for j in range(off, off + 32 * n, 32)]
            if off + 32 * n != len(raw):
                raise ValueError("stat cache has the wrong length")
            return dict(zip(paths, zip(*cols, digests, strict=True), strict=True)), clock_ns
        except (ValueError, struct.error) as exc:
            # The cache only saves work; a bad one means every file is read again.
            log.warning("ignoring unreadable stat cache %s: %s", wdir / "statcache", exc)
            return {}, 0

    # ------------------------------------------------------------------ walking and hashing

    def _walk(self, root_fd: int, state: _WorkspaceState, stats: CommitStats) -> _Walk:
        walk = _Walk()
        paths = walk.paths
        kinds = walk.kinds
        modes = walk.modes
        sizes = walk.sizes
        digests = walk.digests
        targets = walk.targets
        new_cache = walk.cache
        todo = walk.todo
        old_get = state.cache.get
        clock_ns = state.clock_ns
        s_isreg = stat_mod.S_ISREG
        open_fds: list[int] = []
        hits = 0
        racy = 0
        files = 0
        try:
            stack: list[tuple[int, str, Iterator[os.DirEntry[str]]]] = [
                (root_fd, "", iter(sorted(os.scandir(root_fd), key=_name)))
            ]
            while stack:
                dfd, prefix, entries = stack[-1]
                for entry in entries:
                    name = entry.name
                    path = prefix + name
                    try:
                        if entry.is_file(follow_symlinks=False):
                            st = entry.stat(follow_symlinks=False)
                            if not s_isreg(st.st_mode):
                                continue
                            files += 1
                            c = old_get(path)
                            if (
                                c is not None
                                and c[0] == st.st_mtime_ns
                                and c[1] == st.st_ctime_ns
                                and c[2] == st.st_size
                                and c[3] == st.st_ino
                            ):
                                if c[0] < clock_ns and c[1] < clock_ns:
                                    hits += 1
                                    new_cache[path] = c
                                    digests.append(c[4])
                                    sizes.append(c[2])
                                else:
                                    racy += 1
                                    todo.append((len(paths), dfd, name))
                                    digests.append(_NO_DIGEST)
                                    sizes.append(0)
                            else:
                                todo.append((len(paths), dfd, name))
                                digests.append(_NO_DIGEST)
                                sizes.append(0)
                            paths.append(path)
                            kinds.append(_KIND_FILE)
                            modes.append(st.st_mode & 0o7777)
                            targets.append("")
                        elif entry.is_dir(follow_symlinks=False):
                            cfd = os.open(name, _OPEN_DIR, dir_fd=dfd)
                            open_fds.append(cfd)
                            st = os.fstat(cfd)
                            children = sorted(os.scandir(cfd), key=_name)
                            paths.append(path)
                            kinds.append(_KIND_DIR)
                            modes.append(st.st_mode & 0o7777)
                            sizes.append(0)
                            digests.append(_NO_DIGEST)
                            targets.append("")
                            stack.append((cfd, path + "/", iter(children)))
                            break
                        elif entry.is_symlink():
                            target = os.readlink(name, dir_fd=dfd)
                            paths.append(path)
                            kinds.append(_KIND_LINK)
                            modes.append(0o777)
                            sizes.append(len(target.encode("utf-8", "surrogateescape")))
                            digests.append(_NO_DIGEST)
                            targets.append(target)
                        # sockets, fifos, devices: not part of a snapshot
                    except (FileNotFoundError, NotADirectoryError):
                        stats.skipped += 1  # vanished or changed type mid-walk
                    except OSError as exc:
                        if exc.errno in _VANISHED:
                            stats.skipped += 1
                        else:
                            raise
                else:
                    stack.pop()
                    if dfd == root_fd:
                        continue
                    if not todo:
                        open_fds.remove(dfd)
                        os.close(dfd)
                    elif len(open_fds) >= _MAX_OPEN_DIRS:
                        # bound open directory descriptors: hash what is pending, then close
                        # every descriptor no longer on the stack
                        self._hash_pending(walk, stats)
                        keep = {fd for fd, _, _ in stack}
                        for fd in open_fds:
                            if fd not in keep:
                                os.close(fd)
                        open_fds = [fd for fd in open_fds if fd in keep]
            self._hash_pending(walk, stats)
        finally:
            for fd in open_fds:
                os.close(fd)
        stats.files_seen = files
        stats.cache_hits = hits
        stats.racy = racy
        if walk.dropped:
            self._drop(walk)
        if stats.files_hashed or walk.dropped:
            walk.dirty = True
        return walk

    def _drop(self, walk: _Walk) -> None:
        keep = [i for i in range(len(walk.paths)) if i not in walk.dropped]
        walk.paths = [walk.paths[i] for i in keep]
        walk.kinds = bytearray(walk.kinds[i] for i in keep)
        walk.modes = [walk.modes[i] for i in keep]
        walk.sizes = [walk.sizes[i] for i in keep]
        walk.digests = [walk.digests[i] for i in keep]
        walk.targets = [walk.targets[i] for i in keep]
        walk.dropped = set()

    def _hash_pending(self, walk: _Walk, stats: CommitStats) -> None:
        todo = walk.todo
        if not todo:
            return
        walk.todo = []
        results: list[tuple[bytes, int, os.stat_result] | BaseException | None] = [None] * len(todo)
        items = iter(range(len(todo)))

        def work() -> None:
            store = self._store_file
            for k in items:  # a shared iterator: threads take the next file as they free up
                _, dfd, name = todo[k]
                try:
                    results[k] = store(dfd, name)
                except BaseException as exc:
                    results[k] = exc

        if len(todo) >= _PARALLEL_MIN_FILES and self._workers > 1:
            pool = self._get_pool()
            futures = [pool.submit(work) for _ in range(self._workers)]
            for future in futures:
                future.result()
        else:
            work()
        for (i, _dfd, _name), result in zip(todo, results, strict=True):
            path = walk.paths[i]
            if result is None:
                walk.dropped.add(i)
                stats.skipped += 1
            elif isinstance(result, PermissionError):
                walk.dropped.add(i)
                stats.unreadable.append(path)
                log.warning("snapshot leaves out %s: %s", path, result)
            elif isinstance(result, (FileNotFoundError, NotADirectoryError)):
                walk.dropped.add(i)
                stats.skipped += 1
            elif isinstance(result, BaseException):
                raise result
            else:
                digest, size, st = result
                walk.digests[i] = digest
                walk.sizes[i] = size
                walk.modes[i] = st.st_mode & 0o7777
                walk.cache[path] = (st.st_mtime_ns, st.st_ctime_ns, size, st.st_ino, digest)
                stats.files_hashed += 1
                stats.bytes_hashed += size

    def _get_pool(self) -> ThreadPoolExecutor:
        with self._guard:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self._workers, thread_name_prefix="snapshot-hash"
                )
            return self._pool

    def _store_file(self, dfd: int, name: str) -> tuple[bytes, int, os.stat_result] | None:
        """Read one workspace file (never through a symlink), store it as an object and
        return (digest, size, stat before reading); None if it is no longer a regular file."""
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

    def _encode_manifest(self, walk: _Walk) -> tuple[bytes, int, int]:
        """(body, files, bytes) for the walked tree."""
        paths = _join(walk.paths)
        targets = _join(walk.targets)
        kinds = bytes(walk.kinds)
        sizes = walk.sizes
        files = kinds.count(_KIND_FILE)
        total = sum(s for s, k in zip(sizes, kinds, strict=True) if k == _KIND_FILE)
        body = b"".join(
            (
                _BODY_HEADER.pack(len(walk.paths), len(paths), len(targets)),
                kinds,
                _int_array("I", walk.modes),
                _int_array("q", sizes),
                paths,
                b"".join(walk.digests),
                targets,
            )
        )
        return body, files, total

    def _manifest(self, workspace_id: str, seq: int | None) -> _Manifest:
        wdir = self._existing_wdir(workspace_id)
        head = self._read_head(wdir, workspace_id)
        if seq is None:
            seq = head
        elif not isinstance(seq, int) or seq < 0 or seq > head:
            raise NotFound(
                f"snapshot {seq} of workspace {workspace_id!r} does not exist; "
                f"snapshots run from 0 to {head}",
                workspace_id=workspace_id,
                seq=seq,
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
                f"snapshot {seq} of workspace {workspace_id!r} is no longer retained",
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
        modes = _int_list("I", view[off : off + 4 * n])
        off += 4 * n
        sizes = _int_list("q", view[off : off + 8 * n])
        off += 8 * n
        paths = _split(view[off : off + plen], n)
        off += plen
        digests = raw[off : off + 32 * n]
        off += 32 * n
        targets = _split(view[off : off + tlen], n) if n else []
        if off + tlen != len(raw):
            raise ValueError(f"manifest {seq} of {workspace_id!r} has the wrong length")
        return _Manifest(info, paths, kinds, modes, sizes, digests, targets)


__all__ = ["CommitStats", "SnapshotStore"]

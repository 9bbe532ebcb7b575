"""Content-addressed snapshots of workspaces (W2, W3, W5, W6; DESIGN.md "Snapshots").

Layout under the store root::

    objects/<2 hex>/<62 hex>        file contents named by sha256, written once, mode 0o444
    objects/tmp/                    temp files, renamed into place once complete
    workspaces/<id>/manifests/<seq> one manifest per snapshot (header + canonical body)
    workspaces/<id>/HEAD            current seq, replaced atomically (temp + rename)
    workspaces/<id>/statcache       stat cache: one record per folder (below)
    workspaces/<id>/statcache.log   records changed since statcache was last rewritten
    workspaces/<id>/clock           touched before each walk: the racy-clean clock
    workspaces/<id>/lock            flock'd during a commit (plus a per-workspace thread lock)

Encoding: byte columns per folder (NUL-joined names, packed ints, raw digests), because
``bench/bench_snapshots.py --formats`` timed them ~3x faster than marshal and ~40x faster than
JSON lines for 10,000 entries, and an unchanged folder reuses its bytes with no per-file work.

Manifest body (``root_hash`` is its sha256)::

    "<QQQ" n, len(paths), len(targets)
    kinds   n bytes: b"f" file, b"d" folder, b"l" symlink
    modes   n x uint32 (permission bits)      sizes n x int64 (bytes; length of link text)
    paths   NUL-joined UTF-8 (surrogateescape) digests n x 32 bytes (zeros unless a file)
    targets NUL-joined symlink texts ("" unless a symlink)

Entries are grouped by folder (folders in sorted path order, "" first), names sorted within
each folder, so the same tree always gives the same bytes and the same ``root_hash``.

The stat cache keeps, per folder, its entry names and each entry's (mode, mtime_ns,
ctime_ns, size, inode) as scanned, the latest mtime/ctime of its files and links, the
racy-clean clock of the walk that scanned it, and its manifest section. A commit scans every
folder (``os.scandir`` on folder descriptors, ``lstat`` of each entry) and:

* reuses a folder's section as is when its names and stat bytes are unchanged and all its
  files and links changed strictly before that walk's clock (git's racy-clean rule; the clock
  is the mtime of a file touched just before the walk began, which is stricter than git's
  index-write time; it assumes the store and the workspaces share a filesystem clock and
  timestamp granularity, as they do under one runner folder);
* otherwise rebuilds the section, re-reading only files whose stat differs or is racy: each
  read once (``O_NOFOLLOW`` relative to the folder descriptor, so a symlink, or a file swapped
  for one mid-walk, is never read through), hashed while it is copied into the store (never
  hard-linked). Files of 4 MiB and more are hashed on a thread pool; small ones in line,
  because GIL and directory-lock hand-offs made two threads slower than one (measured).

Large trees (3,000 entries and more) are scanned by two processes at once: a long-lived
helper process lists folders from the first (in cached order) and streams each one back,
while the committing thread scans from the last, until they meet; so on a busy host the
commit just does more of the work itself, and never waits for the helper for more than one
folder (threads cannot overlap per-entry lstat calls: the GIL). The helper only lists and
lstats folders it reaches from the workspace descriptor it is sent, one component at a time
without following links; the committing thread checks each folder's identity (device,
inode) before using a prescan, and scans by itself whenever the helper is not up or fails.
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
import select
import signal
import socket
import stat as stat_mod
import struct
import subprocess
import sys
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from shellyard.errors import InvalidInput, NotFound
from shellyard.paths import normalize_relative
from shellyard.runner.protocol import MAX_READ_CHUNK, FileChunk, PathEntry, SnapshotInfo

log = logging.getLogger(__name__)

_MANIFEST_VERSION = 1
_STATCACHE_VERSION = 2
_MANIFEST_MAGIC = b"SYMF"
#: magic, version, created_at, files, bytes, root digest
_MANIFEST_HEADER = struct.Struct("<4sIdqq32s")
#: n, len(paths blob), len(targets blob)
_BODY_HEADER = struct.Struct("<QQQ")
_STATCACHE_MAGIC = b"SYSC"
#: magic, version, number of folder records
_STATCACHE_HEADER = struct.Struct("<4sIQ")
_LOG_MAGIC = b"SYSL"
#: magic, payload length, sha256 of the payload; the payload is "<QQQ" (removed folders,
#: len(their NUL-joined paths), records), those paths, then records as in the base file
_LOG_FRAME = struct.Struct("<4sQ32s")
#: per folder record: len(path), len(scan names), len(scan stats), max_time, clock,
#: len(subdirs), n, files, total, len(paths), len(targets)
_RECORD_FIELDS = 11
#: one scanned entry: mode, mtime_ns, ctime_ns, size, inode
_SCAN = struct.Struct("<IqqqQ")
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
#: The scan helper is used for trees with at least this many cached entries.
_HELPER_MIN_ENTRIES = 3000
#: How long a commit waits for the helper to stop (one folder's scan) before giving up on it.
_HELPER_TIMEOUT_S = 10.0
#: The log is folded into the stat cache once it grows past this share of it.
_LOG_MAX_SHARE = 0.25

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
#: Commit hints: relative path → (sha256 digest, (mtime_ns, ctime_ns, size, inode)).
Hints = dict[str, tuple[bytes, tuple[int, int, int, int]]]
#: (digest, bytes read, stat before reading) or None when the file is gone / not a file.
_Stored = tuple[bytes, int, os.stat_result] | None
#: A folder as scanned: (device, inode, names NUL-joined, packed stats).
_Scan = tuple[int, int, str, bytes]


# ---------------------------------------------------------------------- small helpers


def _pack_ints(typecode: str, values: Iterable[int]) -> bytes:
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


def _decode(data: bytes | bytearray | memoryview) -> str:
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


def _sig(path: Path) -> _Sig | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
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


# ---------------------------------------------------------------------- scanning


def _scan_fd(fd: int) -> tuple[str, bytes, int]:
    """List a folder and lstat its entries: (names NUL-joined, packed stats, entries that
    vanished meanwhile). Order is scandir's (stable while the folder is unchanged)."""
    entries = list(os.scandir(fd))
    skipped = 0
    try:
        sts = [e.stat(follow_symlinks=False) for e in entries]
    except OSError:
        kept: list[os.DirEntry[str]] = []
        sts = []
        for e in entries:
            try:
                sts.append(e.stat(follow_symlinks=False))
            except OSError as exc:
                if exc.errno not in _VANISHED:
                    raise
                skipped += 1
                continue
            kept.append(e)
        entries = kept
    pack = _SCAN.pack
    return (
        "\0".join([e.name for e in entries]),
        b"".join([pack(s.st_mode, s.st_mtime_ns, s.st_ctime_ns, s.st_size, s.st_ino) for s in sts]),
        skipped,
    )


class _DirOpener:
    """Reaches folders by relative path under a root descriptor, one component at a time
    with ``O_NOFOLLOW`` (so nothing outside the tree is ever listed), caching ancestors."""

    def __init__(self, root_fd: int) -> None:
        self._fds: dict[str, int] = {"": root_fd}

    def _reach(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is None:
            parent, _, name = path.rpartition("/")
            fd = os.open(name, _OPEN_DIR, dir_fd=self._reach(parent))
            self._fds[path] = fd
        return fd

    def scan(self, path: str) -> _Scan | None:
        """(device, inode, names, stats) of the folder at ``path``; None if unreachable."""
        if len(self._fds) > 256:  # bound open descriptors; ancestors are reopened on demand
            self.close()
        try:
            fd = self._reach(path)
            st = os.fstat(fd)
            names, stats, _ = _scan_fd(fd)
        except OSError:
            return None  # left for the committing thread to look at
        return (st.st_dev, st.st_ino, names, stats)

    def close(self) -> None:
        for path in [path for path in self._fds if path]:
            os.close(self._fds.pop(path))


# The scan helper protocol, over a Unix socket pair. The store sends a request, "<Q" length
# + NUL-joined folder paths, with the workspace root descriptor attached (SCM_RIGHTS). The
# helper scans the folders in order and streams one frame per folder; the store scans the
# same list from the other end and, when the two meet, sends one stop byte. The helper
# consumes exactly one stop byte per request (between folders, or after the last one) and
# answers with an end frame.
#: frame: kind (1 scanned, 2 not reachable, 0 end), index, device, inode, len(names),
#: len(stats); then the names and the stats.
_FRAME = struct.Struct("<BQQQQQ")
_STOP = b"X"


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    parts: list[bytes] = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise EOFError("scan helper connection closed")
        parts.append(chunk)
        size -= len(chunk)
    return b"".join(parts)


def _scan_helper_main(sock_fd: int) -> None:
    """The scan helper process: answers folder scans until its socket closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C is for the runner
    sock = socket.socket(fileno=sock_fd)
    try:
        sock.sendall(b"R")
        while True:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 1)
            if not data:
                return
            try:
                _answer(sock, data, fds)
            finally:
                for fd in fds:
                    os.close(fd)
    except (OSError, EOFError):
        return  # the store went away


def _answer(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    if len(data) < 8:
        data += _recv_exact(sock, 8 - len(data))
    (length,) = struct.unpack_from("<Q", data)
    payload = data[8:] + _recv_exact(sock, length - (len(data) - 8))
    paths = _decode(payload).split("\0") if payload else []
    opener = _DirOpener(fds[0]) if fds else None
    stopped = False
    try:
        for index, path in enumerate(paths):
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                if sock.recv(1) != _STOP:
                    raise EOFError("unexpected message")
                stopped = True
                break
            scan = opener.scan(path) if opener is not None else None
            if scan is None:
                sock.sendall(_FRAME.pack(2, index, 0, 0, 0, 0))
                continue
            dev, ino, names, stats = scan
            encoded = _encode(names)
            header = _FRAME.pack(1, index, dev, ino, len(encoded), len(stats))
            sock.sendall(b"".join((header, encoded, stats)))
    finally:
        if opener is not None:
            opener.close()
    if not stopped and _recv_exact(sock, 1) != _STOP:
        raise EOFError("unexpected message")
    sock.sendall(_FRAME.pack(0, 0, 0, 0, 0, 0))


class _ScanHelper:
    """The store's side of the scan helper process (see the module docstring). It is
    started in the background after a commit of a big tree, so starting it never slows a
    commit down, and a commit never waits for it for more than one folder's scan."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._ready = False
        self._starting = False
        self._failures = 0
        self._buffer = bytearray()

    def start_soon(self) -> None:
        """Start the helper on a background thread unless it is up (or given up on)."""
        if self._sock is None and not self._starting and self._failures < 3:
            self._starting = True
            threading.Thread(target=self._start, name="snapshot-scan-start", daemon=True).start()

    def _start(self) -> None:
        with self._lock:
            self._starting = False
            if self._sock is not None:
                return
            parent, child = socket.socketpair()
            code = (
                "import sys; sys.path.insert(0, sys.argv[2]); "
                "from shellyard.runner.snapshots import _scan_helper_main; "
                "_scan_helper_main(int(sys.argv[1]))"
            )
            try:
                self._proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        code,
                        str(child.fileno()),
                        str(Path(__file__).resolve().parents[2]),
                    ],
                    pass_fds=[child.fileno()],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                )
            except OSError as exc:
                parent.close()
                self._failures += 1
                log.warning("snapshot scan helper did not start: %s", exc)
                return
            finally:
                child.close()
            self._sock = parent
            self._ready = False

    def begin(self, root_fd: int, paths: list[str]) -> bool:
        """Send a scan request; False if the helper cannot take it now (not started yet,
        busy with another commit, or given up on). On True, call ``finish`` afterwards."""
        if self._failures >= 3 or not self._lock.acquire(blocking=False):
            return False
        try:
            if self._sock is None:
                return self._release(False)
            if not self._ready:
                readable, _, _ = select.select([self._sock], [], [], 0)
                if not readable:
                    return self._release(False)
                if self._sock.recv(1) != b"R":
                    self._fail("scan helper did not start properly")
                    return self._release(False)
                self._ready = True
            payload = _encode("\0".join(paths))
            message = struct.pack("<Q", len(payload)) + payload
            sent = socket.send_fds(self._sock, [message], [root_fd])
            if sent < len(message):
                self._sock.sendall(message[sent:])
            self._buffer.clear()
            self._sock.setblocking(False)
            return True  # the lock stays held until finish()
        except OSError as exc:
            self._fail(f"scan helper request failed: {exc}")
            return self._release(False)

    def poll(self) -> list[tuple[int, _Scan | None]]:
        """The folder frames that have arrived, without waiting; (index, scan or None)."""
        sock = self._sock
        if sock is None:
            return []
        try:
            while True:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    raise EOFError("scan helper connection closed")
                self._buffer += chunk
        except BlockingIOError:
            pass
        except (OSError, EOFError) as exc:
            self._fail(f"scan helper answer failed: {exc}")
            return []
        return self._frames()[0]

    def _frames(self) -> tuple[list[tuple[int, _Scan | None]], bool]:
        """Complete frames in the buffer (consumed), and whether the end frame was seen."""
        out: list[tuple[int, _Scan | None]] = []
        buf = self._buffer
        off = 0
        ended = False
        while len(buf) - off >= _FRAME.size:
            kind, index, dev, ino, nlen, slen = _FRAME.unpack_from(buf, off)
            size = _FRAME.size + nlen + slen
            if len(buf) - off < size:
                break
            start = off + _FRAME.size
            if kind == 1:
                names = _decode(buf[start : start + nlen])
                out.append((index, (dev, ino, names, bytes(buf[start + nlen : off + size]))))
            elif kind == 2:
                out.append((index, None))
            off += size
            if kind == 0:
                ended = True
                break
        del buf[:off]
        return out, ended

    def finish(self) -> list[tuple[int, _Scan | None]]:
        """Stop the request and collect its last frames (waiting at most for the folder the
        helper is scanning); releases the helper for the next commit."""
        try:
            sock = self._sock
            if sock is None:
                return []
            sock.setblocking(True)
            sock.settimeout(_HELPER_TIMEOUT_S)
            sock.sendall(_STOP)
            out: list[tuple[int, _Scan | None]] = []
            while True:
                frames, ended = self._frames()
                out += frames
                if ended:
                    break
                chunk = sock.recv(1 << 20)
                if not chunk:
                    raise EOFError("scan helper connection closed")
                self._buffer += chunk
            sock.settimeout(None)
            return out
        except (OSError, EOFError, ValueError, struct.error) as exc:
            self._fail(f"scan helper answer failed: {exc}")
            return []
        finally:
            self._buffer.clear()
            self._lock.release()

    def _release(self, value: bool) -> bool:
        self._lock.release()
        return value

    def _fail(self, message: str) -> None:
        log.warning("%s; scanning in the committing thread instead", message)
        self._failures += 1
        self._stop()

    def _stop(self) -> None:
        sock, self._sock = self._sock, None
        proc, self._proc = self._proc, None
        self._ready = False
        if sock is not None:
            sock.close()  # the helper exits when it sees the socket close...
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()  # ...or now, if it is still starting up
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        with self._lock:
            self._stop()


# ---------------------------------------------------------------------- records


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
    #: Folders scanned ahead from both ends on big trees, and those by the helper process.
    dirs_prescanned: int = 0
    dirs_from_helper: int = 0
    files_seen: int = 0
    files_hashed: int = 0
    bytes_hashed: int = 0
    #: Files re-read only because they were racily clean.
    racy: int = 0
    #: Files taken from the caller's hints (written from store objects), not read.
    files_known: int = 0
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
    #: Latest mtime/ctime of its files and links, and the clock of the walk that scanned
    #: them: the record can be trusted only while max_time < clock (racy-clean rule).
    max_time: int
    clock: int
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


def _encode_records(records: Iterable[_DirRecord]) -> tuple[int, bytes]:
    table: list[int] = []
    blobs: list[bytes] = []
    count = 0
    for r in records:
        count += 1
        path = _encode(r.path)
        names = _encode(r.scan_names)
        subdirs = _encode("\0".join(r.subdirs))
        table += (
            len(path),
            len(names),
            len(r.scan_stats),
            r.max_time,
            r.clock,
            len(subdirs),
            r.n,
            r.files,
            r.total,
            len(r.paths),
            len(r.targets),
        )
        blobs += (path, names, r.scan_stats, subdirs, r.paths, r.kinds, r.modes, r.sizes)
        blobs += (r.digests, r.targets)
    return count, _pack_ints("q", table) + b"".join(blobs)


def _decode_records(raw: bytes, off: int, count: int, end: int) -> Iterator[_DirRecord]:
    table = _unpack_ints("q", raw[off : off + 8 * _RECORD_FIELDS * count])
    if len(table) != _RECORD_FIELDS * count:
        raise ValueError("stat cache is truncated")
    off += 8 * _RECORD_FIELDS * count

    def take(size: int) -> bytes:
        nonlocal off
        if size < 0 or off + size > end:
            raise ValueError("stat cache is truncated")
        off += size
        return raw[off - size : off]

    for k in range(count):
        plen, snlen, sslen, max_time, clock, sdlen, n, files, total, pslen, tlen = table[
            _RECORD_FIELDS * k : _RECORD_FIELDS * (k + 1)
        ]
        path = _decode(take(plen))
        scan_names = _decode(take(snlen))
        scan_stats = take(sslen)
        subdirs = _decode(take(sdlen))
        yield _DirRecord(
            path=path,
            scan_names=scan_names,
            scan_stats=scan_stats,
            max_time=max_time,
            clock=clock,
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
    if off != end:
        raise ValueError("stat cache has trailing bytes")


class _DirBuilder:
    """A folder's manifest section being rebuilt; digests of big files may still be pending."""

    __slots__ = (
        "clock",
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

    def __init__(self, path: str, scan_names: str, scan_stats: bytes, clock: int) -> None:
        self.path = path
        self.scan_names = scan_names
        self.scan_stats = scan_stats
        self.clock = clock
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
        """The record, leaving out entries whose reading failed (gone or unreadable)."""
        names, kinds, modes = self.names, bytes(self.kinds), self.modes
        sizes, digests, targets = self.sizes, self.digests, self.targets
        if dropped:
            keep = [i for i in range(len(names)) if i not in dropped]
            names = [names[i] for i in keep]
            kinds = bytes(kinds[i] for i in keep)
            modes = [modes[i] for i in keep]
            sizes = [sizes[i] for i in keep]
            digests = [digests[i] for i in keep]
            targets = [targets[i] for i in keep]
        prefix = self.path + "/" if self.path else ""
        return _DirRecord(
            path=self.path,
            scan_names=self.scan_names,
            scan_stats=self.scan_stats,
            max_time=self.max_time,
            clock=self.clock,
            subdirs=tuple(self.subdirs),
            n=len(names),
            files=kinds.count(_KIND_FILE),
            total=sum(s for s, k in zip(sizes, kinds, strict=True) if k == _KIND_FILE),
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
    head_sig: _Sig | None
    dirs: dict[str, _DirRecord]
    cache_sig: tuple[_Sig | None, _Sig | None]
    #: Size of the statcache base file and of its log (to decide when to fold the log).
    base_size: int = 0
    log_size: int = 0


# ---------------------------------------------------------------------- the store


class SnapshotStore:
    """Commits workspace trees into immutable, numbered snapshots and reads them back.

    Synchronous and thread-safe; the runner calls it through ``asyncio.to_thread``. Commits of
    one workspace are serialised (a thread lock plus ``flock``), so snapshot numbers only grow.
    ``workers``: threads hashing big files; ``scan_helper``: scan big trees in two processes.
    """

    def __init__(
        self,
        root: Path,
        *,
        workers: int | None = None,
        scan_helper: bool | None = None,
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
        self._remove_stale_tmp()
        self._tmp_counter = itertools.count()
        umask = _process_umask()
        self._fchmod_objects = umask is None or bool(umask & 0o444)
        cpus = os.cpu_count() or 1
        self._workers = workers if workers is not None else min(4, cpus)
        if scan_helper is None:
            scan_helper = cpus > 1
        self._helper = _ScanHelper() if scan_helper else None
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

    def commit(self, workspace_id: str, tree: Path, hints: Hints | None = None) -> SnapshotInfo:
        """Snapshot ``tree`` as the workspace's next seq (W3), or return the head with
        ``new=False`` when the tree equals it.

        ``hints`` (path → digest and the file's stat as (mtime_ns, ctime_ns, size, inode))
        names files the caller has just written from objects already in this store: a file
        whose stat still matches is taken with that digest instead of being read again (a
        transfer or a restore that copied it out of the store knows its content)."""
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
                clock = self._tick(wdir)
                dirs = self._walk(root_fd, state.dirs, clock, stats, hints)
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
                    _MANIFEST_MAGIC, _MANIFEST_VERSION, info.created_at, files, total, digest
                )
                self._atomic_write(wdir / "manifests" / str(seq), header, body)
                self._atomic_write(wdir / "HEAD", f"{seq}\n".encode())
                state.head_info = info.model_copy(update={"new": False})
                state.head_sig = _sig(wdir / "HEAD")
            try:
                self._save_statcache(wdir, state, dirs)
            except OSError as exc:  # only costs re-reading files next time
                log.warning("could not save the stat cache of %s: %s", workspace_id, exc)
            stats.seq = info.seq
            stats.new = info.new
            stats.entries = sum(r.n for r in dirs.values())
            if self._helper is not None and stats.entries >= _HELPER_MIN_ENTRIES:
                self._helper.start_soon()  # for the next commits of this big tree
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
        """Stop the hashing threads and the scan helper (both restart on demand)."""
        with self._guard:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        if self._helper is not None:
            self._helper.close()

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
        if magic != _MANIFEST_MAGIC or version != _MANIFEST_VERSION:
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
        head_sig = _sig(wdir / "HEAD")
        if head_sig is None:
            self._create_empty(wdir)
            head_sig = _sig(wdir / "HEAD")
        cache_sig = (_sig(wdir / "statcache"), _sig(wdir / "statcache.log"))
        with self._guard:
            state = self._states.get(workspace_id)
            if state is not None:
                self._states.move_to_end(workspace_id)
        if state is not None and state.head_sig == head_sig and state.cache_sig == cache_sig:
            return state
        info = self._read_info(workspace_id, wdir, self._read_head(wdir, workspace_id))
        state = _WorkspaceState(info, head_sig, {}, cache_sig)
        self._read_statcache(wdir, state)
        with self._guard:
            self._states[workspace_id] = state
            while len(self._states) > self._cached_workspaces:
                self._states.popitem(last=False)
        return state

    def _create_empty(self, wdir: Path) -> None:
        """Snapshot 0, the empty tree; or, if manifests exist without a HEAD (it was lost),
        a HEAD at the latest of them, so numbers never go back."""
        (wdir / "manifests").mkdir(parents=True, exist_ok=True)
        seqs = [int(n) for n in os.listdir(wdir / "manifests") if n.isdigit()]
        if seqs:
            self._atomic_write(wdir / "HEAD", f"{max(seqs)}\n".encode())
            return
        body = self._encode_manifest({})[0]
        digest = hashlib.sha256(body).digest()
        header = _MANIFEST_HEADER.pack(
            _MANIFEST_MAGIC, _MANIFEST_VERSION, time.time(), 0, 0, digest
        )
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

    def _save_statcache(
        self, wdir: Path, state: _WorkspaceState, dirs: dict[str, _DirRecord]
    ) -> None:
        """Record the folders whose record changed: appended to the log, or the whole cache
        rewritten when the log has grown past a share of it."""
        old = state.dirs
        changed = [r for path, r in dirs.items() if old.get(path) is not r]
        removed = [path for path in old if path not in dirs]
        if not changed and not removed:
            return
        count, records = _encode_records(changed)
        gone = _encode("\0".join(removed))
        payload = struct.pack("<QQQ", len(removed), len(gone), count) + gone + records
        frame_size = _LOG_FRAME.size + len(payload)
        if state.base_size and state.log_size + frame_size <= _LOG_MAX_SHARE * state.base_size:
            frame = _LOG_FRAME.pack(_LOG_MAGIC, len(payload), hashlib.sha256(payload).digest())
            fd = os.open(
                wdir / "statcache.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT | _O_CLOEXEC, 0o644
            )
            try:
                _write_all(fd, frame + payload)
            finally:
                os.close(fd)
            state.log_size += frame_size
        else:
            count, records = _encode_records(dirs.values())
            header = _STATCACHE_HEADER.pack(_STATCACHE_MAGIC, _STATCACHE_VERSION, count)
            self._atomic_write(wdir / "statcache", header, records)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(wdir / "statcache.log")
            state.base_size = len(header) + len(records)
            state.log_size = 0
        state.dirs = dirs
        state.cache_sig = (_sig(wdir / "statcache"), _sig(wdir / "statcache.log"))

    def _read_statcache(self, wdir: Path, state: _WorkspaceState) -> None:
        """Load the stat cache and replay its log into ``state`` (a bad cache means every
        file is read again, never a wrong snapshot)."""
        try:
            raw = (wdir / "statcache").read_bytes()
        except FileNotFoundError:
            return
        dirs: dict[str, _DirRecord] = {}
        try:
            magic, version, count = _STATCACHE_HEADER.unpack_from(raw)
            if magic != _STATCACHE_MAGIC or version != _STATCACHE_VERSION:
                raise ValueError("unknown stat cache format")
            for r in _decode_records(raw, _STATCACHE_HEADER.size, count, len(raw)):
                dirs[r.path] = r
        except (ValueError, struct.error, UnicodeDecodeError) as exc:
            log.warning("ignoring unreadable stat cache %s: %s", wdir / "statcache", exc)
            return
        state.dirs = dirs
        state.base_size = len(raw)
        try:
            logged = (wdir / "statcache.log").read_bytes()
        except FileNotFoundError:
            return
        off = 0
        while off + _LOG_FRAME.size <= len(logged):
            magic, length, digest = _LOG_FRAME.unpack_from(logged, off)
            start = off + _LOG_FRAME.size
            payload = logged[start : start + length]
            if (
                magic != _LOG_MAGIC
                or len(payload) != length
                or hashlib.sha256(payload).digest() != digest
            ):
                break  # a torn last append: what follows is ignored
            try:
                nremoved, glen, count = struct.unpack_from("<QQQ", payload)
                gone = _split(payload[24 : 24 + glen], nremoved)
                records = list(_decode_records(payload, 24 + glen, count, len(payload)))
            except (ValueError, struct.error, UnicodeDecodeError):
                break
            for path in gone:
                dirs.pop(path, None)
            for r in records:
                dirs[r.path] = r
            off = start + length
        if off < len(logged):  # drop a torn tail so later appends stay readable
            os.truncate(wdir / "statcache.log", off)
        state.log_size = off

    # ------------------------------------------------------------------ walking

    def _prescan(
        self, root_fd: int, old: dict[str, _DirRecord], stats: CommitStats
    ) -> dict[str, _Scan]:
        """Scan the folders known from the cache from both ends at once: the helper process
        from the first, this thread from the last, until they meet. Empty when the tree is
        small or the helper is not available."""
        helper = self._helper
        if helper is None or sum(r.n for r in old.values()) < _HELPER_MIN_ENTRIES:
            return {}
        paths = list(old)
        if not helper.begin(root_fd, paths):
            return {}
        out: dict[str, _Scan] = {}
        opener = _DirOpener(root_fd)
        theirs = -1  # the helper has answered for paths[0..theirs]
        mine = len(paths) - 1  # this thread scans paths[mine] next
        try:
            while mine > theirs:
                for index, scan in helper.poll():
                    theirs = index
                    if scan is not None:
                        out[paths[index]] = scan
                        stats.dirs_from_helper += 1
                if mine <= theirs:
                    break
                scan = opener.scan(paths[mine])
                if scan is not None:
                    out[paths[mine]] = scan
                mine -= 1
        finally:
            opener.close()
            for index, scan in helper.finish():
                if scan is not None and paths[index] not in out:
                    out[paths[index]] = scan
                    stats.dirs_from_helper += 1
        return out

    def _walk(
        self,
        root_fd: int,
        old: dict[str, _DirRecord],
        clock: int,
        stats: CommitStats,
        hints: Hints | None = None,
    ) -> dict[str, _DirRecord]:
        """Walk the tree; return its folder records in canonical (sorted path) order."""
        prescans = self._prescan(root_fd, old, stats)
        out: dict[str, _DirRecord | _DirBuilder] = {}
        waiting: list[int] = []  # folder fds kept open for pool work
        reused = 0
        stack: list[tuple[int, str]] = [(root_fd, "")]
        try:
            while stack:
                fd, dpath = stack.pop()
                try:
                    pre = prescans.get(dpath)
                    if pre is not None:
                        st = os.fstat(fd)
                        if (st.st_dev, st.st_ino) != (pre[0], pre[1]):
                            pre = None  # the prescan saw another folder there: look again
                        else:
                            stats.dirs_prescanned += 1
                    if pre is None:
                        scan_names, scan_stats, skipped = _scan_fd(fd)
                        stats.skipped += skipped
                    else:
                        scan_names, scan_stats = pre[2], pre[3]
                    rec = old.get(dpath)
                    subdirs: tuple[str, ...] | list[str]
                    if (
                        rec is not None
                        and rec.max_time < rec.clock
                        and rec.scan_stats == scan_stats
                        and rec.scan_names == scan_names
                    ):
                        out[dpath] = rec
                        subdirs = rec.subdirs
                        reused += 1
                    else:
                        builder = self._rebuild(
                            fd, dpath, scan_names, scan_stats, rec, clock, stats, hints
                        )
                        out[dpath] = builder
                        subdirs = builder.subdirs
                        if builder.pending:
                            waiting.append(fd)
                    prefix = dpath + "/" if dpath else ""
                    for name in subdirs:
                        # a folder that cannot be entered is recorded empty this time: gone
                        # or no longer a folder (its parent's scan will differ next time),
                        # or not readable by the store
                        try:
                            child = os.open(name, _OPEN_DIR, dir_fd=fd)
                        except PermissionError:
                            stats.unreadable.append(prefix + name)
                            continue
                        except OSError as exc:
                            if exc.errno not in _VANISHED:
                                raise
                            stats.skipped += 1
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
            # on an error, let pool work still running finish before its folders close
            for r in out.values():
                if isinstance(r, _DirBuilder):
                    for _, future in r.pending:
                        future.exception()
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
        return dirs

    def _rebuild(
        self,
        fd: int,
        dpath: str,
        scan_names: str,
        scan_stats: bytes,
        old: _DirRecord | None,
        clock: int,
        stats: CommitStats,
        hints: Hints | None = None,
    ) -> _DirBuilder:
        """Build a folder's section entry by entry, reading only files whose stat changed
        or is racily clean (and not named by a matching hint)."""
        prev_scan: dict[str, bytes] = {}
        prev_file: dict[str, tuple[bytes, int]] = {}
        old_clock = 0
        if old is not None:
            old_clock = old.clock
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
        names = scan_names.split("\0") if scan_names else []
        sts = list(_SCAN.iter_unpack(scan_stats))
        b = _DirBuilder(dpath, scan_names, scan_stats, clock)
        s_isreg, s_isdir, s_islnk = stat_mod.S_ISREG, stat_mod.S_ISDIR, stat_mod.S_ISLNK
        for i in sorted(range(len(names)), key=names.__getitem__):
            name = names[i]
            mode, mtime, ctime, st_size, ino = sts[i]
            if s_isreg(mode):
                latest = max(mtime, ctime)
                if latest > b.max_time:
                    b.max_time = latest
                prev = prev_file.get(name)
                same = (
                    prev is not None
                    and prev_scan.get(name) == scan_stats[_SCAN_SIZE * i : _SCAN_SIZE * (i + 1)]
                )
                hint = hints.get(f"{dpath}/{name}" if dpath else name) if hints else None
                if prev is not None and same and latest < old_clock:
                    digest, size = prev
                elif hint is not None and hint[1] == (mtime, ctime, st_size, ino):
                    digest, size = hint[0], st_size
                    stats.files_known += 1
                else:
                    if same:
                        stats.racy += 1
                    if st_size >= _POOL_MIN_SIZE and self._workers > 1:
                        future = self._get_pool().submit(self._store_file, fd, name)
                        b.pending.append((len(b.names), future))
                        digest, size = _NO_DIGEST, 0
                    else:
                        try:
                            stored = self._store_file(fd, name)
                        except PermissionError as exc:
                            where = f"{dpath}/{name}" if dpath else name
                            stats.unreadable.append(where)
                            log.warning("snapshot leaves out %s: %s", where, exc)
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
                latest = max(mtime, ctime)
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
                full = f"{b.path}/{b.names[i]}" if b.path else b.names[i]
                try:
                    stored = future.result()
                except PermissionError as exc:
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

    def _remove_stale_tmp(self, older_than_s: float = 3600.0) -> None:
        """Temp objects left by a crash (a live writer touches its own within seconds)."""
        cutoff = time.time() - older_than_s
        with contextlib.suppress(OSError), os.scandir(self._tmp) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                        os.unlink(entry.path)

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


__all__ = ["CommitStats", "Hints", "SnapshotStore"]

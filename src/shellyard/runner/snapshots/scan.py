"""Listing folders for a commit: one folder at a time on descriptors, and the scan helper.

Large trees (3,000 entries and more) walked in full without change hints (changes.py; a
prescan would happen before the walk sets its watches up) are scanned by two processes at
once: a long-lived helper process lists folders from the first (in cached order) and streams
each one back, while the committing thread scans from the last, until they meet; so on a busy
host the commit just does more of the work itself, and never waits for the helper for more
than one folder (threads cannot overlap per-entry lstat calls: the GIL). The helper only
lists and lstats folders it reaches from the workspace descriptor it is sent, one component
at a time without following links; the committing thread checks each folder's identity
(device, inode) before using a prescan, and scans by itself whenever the helper is not up or
fails.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import signal
import socket
import stat as stat_mod
import struct
import subprocess
import sys
import threading
from pathlib import Path

from shellyard.runner.snapshots.format import O_CLOEXEC, SCAN, decode_text, encode_text
from shellyard.runner.workspace_paths import PARTIAL, is_partial

log = logging.getLogger(__name__)

#: How long a commit waits for the helper to stop (one folder's scan) before giving up on it.
_HELPER_TIMEOUT_S = 10.0
#: The folder holding the top-level package (``shellyard``): the helper's import path.
_PACKAGE_PARENT = Path(__file__).resolve().parents[len(__name__.split(".")) - 1]

#: errno values meaning "this entry vanished or changed type while we looked at it":
#: ELOOP (became a symlink, O_NOFOLLOW), EINVAL (readlink of a non-link), ENXIO (became a
#: socket), ENOENT, ENOTDIR.
VANISHED = frozenset({errno.ELOOP, errno.EINVAL, errno.ENXIO, errno.ENOENT, errno.ENOTDIR})

O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
OPEN_FILE = os.O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC
OPEN_DIR = os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC

#: A folder as scanned: (device, inode, names NUL-joined, packed stats).
Scan = tuple[int, int, str, bytes]


def scan_fd(fd: int, links: bool = False) -> tuple[str, bytes, int, bool]:
    """List a folder and lstat its entries: (names NUL-joined, packed stats, entries that
    vanished meanwhile, and with ``links`` whether a file in it has more than one name).
    Order is scandir's (stable while the folder is unchanged)."""
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
                if exc.errno not in VANISHED:
                    raise
                skipped += 1
                continue
            kept.append(e)
        entries = kept
    names = "\0".join([e.name for e in entries])
    if PARTIAL in names:  # one substring search: the commit's hot path stays a join
        # a runner's temp file a crash left beside its target is never committed (R2,
        # workspace_paths.PARTIAL); the next start removes it (edits/placing.py)
        kept_sts = [(e, s) for e, s in zip(entries, sts, strict=True) if not is_partial(e.name)]
        entries, sts = [e for e, _ in kept_sts], [s for _, s in kept_sts]
        names = "\0".join([e.name for e in entries])
    pack = SCAN.pack
    return (
        names,
        b"".join([pack(s.st_mode, s.st_mtime_ns, s.st_ctime_ns, s.st_size, s.st_ino) for s in sts]),
        skipped,
        links and any(s.st_nlink > 1 and stat_mod.S_ISREG(s.st_mode) for s in sts),
    )


class DirOpener:
    """Reaches folders by relative path under a root descriptor, one component at a time
    with ``O_NOFOLLOW`` (so nothing outside the tree is ever listed), caching ancestors."""

    def __init__(self, root_fd: int) -> None:
        self._fds: dict[str, int] = {"": root_fd}

    def _reach(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is None:
            parent, _, name = path.rpartition("/")
            fd = os.open(name, OPEN_DIR, dir_fd=self._reach(parent))
            self._fds[path] = fd
        return fd

    def open(self, path: str) -> int | None:
        """A new descriptor of the folder at ``path`` (the caller closes it); None if it
        cannot be reached (gone, not a folder, or a link on the way)."""
        if len(self._fds) > 256:  # bound open descriptors; ancestors are reopened on demand
            self.close()
        try:
            return os.dup(self._reach(path))
        except OSError:
            return None

    def scan(self, path: str) -> Scan | None:
        """(device, inode, names, stats) of the folder at ``path``; None if unreachable."""
        if len(self._fds) > 256:  # bound open descriptors; ancestors are reopened on demand
            self.close()
        try:
            fd = self._reach(path)
            st = os.fstat(fd)
            names, stats, _, _ = scan_fd(fd)
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


def scan_helper_main(sock_fd: int) -> None:
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
    paths = decode_text(payload).split("\0") if payload else []
    opener = DirOpener(fds[0]) if fds else None
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
            encoded = encode_text(names)
            header = _FRAME.pack(1, index, dev, ino, len(encoded), len(stats))
            sock.sendall(b"".join((header, encoded, stats)))
    finally:
        if opener is not None:
            opener.close()
    if not stopped and _recv_exact(sock, 1) != _STOP:
        raise EOFError("unexpected message")
    sock.sendall(_FRAME.pack(0, 0, 0, 0, 0, 0))


class ScanHelper:
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
            # started by this module's own name and the folder its top package is in, so the
            # helper runs this very code wherever the module lives
            code = (
                "import sys; sys.path.insert(0, sys.argv[2]); "
                f"from {__name__} import scan_helper_main; "
                "scan_helper_main(int(sys.argv[1]))"
            )
            try:
                self._proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        code,
                        str(child.fileno()),
                        str(_PACKAGE_PARENT),
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
            payload = encode_text("\0".join(paths))
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

    def poll(self) -> list[tuple[int, Scan | None]]:
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

    def _frames(self) -> tuple[list[tuple[int, Scan | None]], bool]:
        """Complete frames in the buffer (consumed), and whether the end frame was seen."""
        out: list[tuple[int, Scan | None]] = []
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
                names = decode_text(buf[start : start + nlen])
                out.append((index, (dev, ino, names, bytes(buf[start + nlen : off + size]))))
            elif kind == 2:
                out.append((index, None))
            off += size
            if kind == 0:
                ended = True
                break
        del buf[:off]
        return out, ended

    def finish(self) -> list[tuple[int, Scan | None]]:
        """Stop the request and collect its last frames (waiting at most for the folder the
        helper is scanning); releases the helper for the next commit."""
        try:
            sock = self._sock
            if sock is None:
                return []
            sock.setblocking(True)
            sock.settimeout(_HELPER_TIMEOUT_S)
            sock.sendall(_STOP)
            out: list[tuple[int, Scan | None]] = []
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

"""Change hints: which folders of a workspace changed since its last commit (inotify).

A commit that knows which folders changed scans only those (and walks new or moved folders
in full) instead of every folder of the tree; everything else keeps its record. Why inotify
and not fanotify or an overlay, with the figures: docs/files-and-transfers.md, "Change
hints".

The hint is only a hint. Its source is a watch on every folder of the workspace, added by
the walk just before the folder is scanned, so whatever changes after a scan produces an
event. A workspace's changes are trusted only when the tracker has watched it without a gap
since its previous commit: the first commit of a process (a restart of the runner, a kill -9,
changes made while nobody watched), a queue overflow, a watch that could not be added, an
unmount, a commit that failed half-way — each makes the next commit a full walk, and that
walk sets up the watches again. The store adds its own rules on top (stat cache reloaded
from disk, racily clean folders, hard-linked files: see ``store.py`` and ``commit.py``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import logging
import os
import struct
import sys
import termios
import threading
import weakref
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

_IN_MODIFY = 0x2
_IN_ATTRIB = 0x4
_IN_CLOSE_WRITE = 0x8
_IN_MOVED_FROM = 0x40
_IN_MOVED_TO = 0x80
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_UNMOUNT = 0x2000
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000
_IN_ONLYDIR = 0x1000000
_IN_ISDIR = 0x40000000
#: What changes a folder's record: its entries' content, stat, names; and the folder itself
#: moving or going away (then its parent's record changes too).
_WATCH_MASK = (
    _IN_MODIFY
    | _IN_ATTRIB
    | _IN_CLOSE_WRITE
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
    | _IN_ONLYDIR
)
#: Events naming a child folder that was created, moved or removed: its whole subtree (at
#: that path) is walked again, since the records below the path may describe another folder.
_SUBTREE_EVENTS = _IN_CREATE | _IN_MOVED_FROM | _IN_MOVED_TO | _IN_DELETE
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len(name)
_READ_SIZE = 1 << 16
#: ``unchanged`` reads the queued events itself up to this many bytes (~100 events, tens of
#: µs); more are left to ``begin`` on a worker thread.
QUICK_READ_BYTES = 4096


@dataclass
class Changes:
    """What changed in a workspace since its last commit, as folder paths under its root."""

    #: Folders whose entries changed: scanned again.
    dirs: set[str] = field(default_factory=set)
    #: Folders created, moved or removed: everything at and below the path is walked again.
    subtrees: set[str] = field(default_factory=set)


@dataclass
class Tracking:
    """One commit's use of the tracker: the changes it may rely on (None: walk everything),
    and what its walk learns for the next commit."""

    workspace_id: str
    tracker: ChangeTracker
    changes: Changes | None
    #: Folders whose records were built in the same timestamp tick as their walk (racily
    #: clean): the next commit scans them again whatever the hints say.
    racy: set[str] = field(default_factory=set)
    #: Folders holding a file with more than one name: a change through another name makes no
    #: event here, so while any is known the next commits walk the whole tree.
    linked: set[str] = field(default_factory=set)

    def watch(self, fd: int, path: str) -> None:
        """Watch the folder open as ``fd`` (at ``path``): call before scanning it."""
        self.tracker.watch(self.workspace_id, fd, path)


@dataclass
class _Watched:
    tree: str
    changes: Changes
    #: Something may have been missed since the last ``begin`` (overflow, a failed watch).
    lost: bool = False
    #: Between ``begin`` and ``finish``: a commit that never finished trusts nothing.
    pending: bool = True


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    except (OSError, AttributeError):
        return None
    return libc


def _parent(path: str) -> str:
    return path.rpartition("/")[0]


class ChangeTracker:
    """inotify watches on the workspaces of one snapshot store, and the changes they saw.
    Thread-safe; the inotify instance is made on first use and closed by ``close``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd = -1
        self._unavailable = False
        self._libc: ctypes.CDLL | None = None
        #: watch descriptor → (workspace id, folder path)
        self._wds: dict[int, tuple[str, str]] = {}
        self._spaces: dict[str, _Watched] = {}

    def begin(self, workspace_id: str, tree: str) -> Tracking | None:
        """Start a commit of ``workspace_id``: the changes since its last commit if they are
        known without a gap (else ``changes`` is None: walk everything); from now on its
        changes are collected for the next commit. None when inotify is not available."""
        with self._lock:
            if not self._open():
                return None
            self._drain()
            old = self._spaces.get(workspace_id)
            known = old is not None and old.tree == tree and not old.lost and not old.pending
            self._spaces[workspace_id] = _Watched(tree, Changes())
            return Tracking(workspace_id, self, old.changes if known and old else None)

    def unchanged(self, workspace_id: str, tree: str) -> bool:
        """Whether ``begin`` would give ``workspace_id`` empty changes now: watched without a
        gap since its last commit (of the same ``tree``), no folder changed. Told without
        waiting (the event loop calls it, store.py ``commit_if_unchanged``): False when the
        lock is held elsewhere or more than ``QUICK_READ_BYTES`` of events are queued. Its
        state stays as it is: with nothing changed, ``begin`` then ``finish`` would leave it
        the same."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._fd < 0:
                return False
            queued = bytearray(4)
            fcntl.ioctl(self._fd, termios.FIONREAD, queued)
            size = int.from_bytes(queued, sys.byteorder)
            if size > QUICK_READ_BYTES:
                return False
            if size:
                self._drain()
            old = self._spaces.get(workspace_id)
            return (
                old is not None
                and old.tree == tree
                and not (old.lost or old.pending or old.changes.dirs or old.changes.subtrees)
            )
        finally:
            self._lock.release()

    def finish(self, tracking: Tracking) -> None:
        """The commit that began with ``tracking`` is complete: its walk watched every folder
        it scanned, so the changes collected since ``begin`` can be trusted."""
        with self._lock:
            watched = self._spaces.get(tracking.workspace_id)
            if watched is not None:
                watched.pending = False

    def watch(self, workspace_id: str, fd: int, path: str) -> None:
        with self._lock:
            watched = self._spaces.get(workspace_id)
            if watched is None or watched.lost or self._libc is None:
                return
            wd = self._libc.inotify_add_watch(self._fd, f"/proc/self/fd/{fd}".encode(), _WATCH_MASK)
            if wd < 0:
                code = ctypes.get_errno()
                if code == errno.ENOSPC:
                    log.warning(
                        "no inotify watch left (fs.inotify.max_user_watches); workspace %s "
                        "is committed by full walks",
                        workspace_id,
                    )
                watched.lost = True
                return
            self._wds[wd] = (workspace_id, path)

    def lose(self, workspace_id: str) -> None:
        """Something may have changed unseen (the tree is now reached through a new mount,
        runner/own_mounts.py): its next commit walks it whole."""
        with self._lock:
            watched = self._spaces.get(workspace_id)
            if watched is not None:
                watched.lost = True

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, -1
            self._wds.clear()
            self._spaces.clear()
            if fd >= 0:
                self._finalizer()  # closes it, once

    # ------------------------------------------------------------------ events

    def _open(self) -> bool:
        if self._fd >= 0:
            return True
        if self._unavailable:
            return False
        self._libc = _libc()
        fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC) if self._libc else -1
        if fd < 0:
            self._unavailable = True
            log.info(
                "inotify is not available (%s); every commit walks the whole tree",
                os.strerror(ctypes.get_errno()) if self._libc else "no libc",
            )
            return False
        self._fd = fd
        # a store dropped without close() must not keep an inotify instance (128 per user)
        self._finalizer = weakref.finalize(self, os.close, fd)
        return True

    def _drain(self) -> None:
        """Read every queued event and note it against its workspace."""
        while True:
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                return
            off = 0
            while off + _EVENT.size <= len(data):
                wd, mask, _cookie, size = _EVENT.unpack_from(data, off)
                off += _EVENT.size
                name = os.fsdecode(data[off : off + size].rstrip(b"\0"))
                off += size
                self._note(wd, mask, name)

    def _note(self, wd: int, mask: int, name: str) -> None:
        if mask & _IN_Q_OVERFLOW:
            for space in self._spaces.values():
                space.lost = True
            return
        where = self._wds.get(wd)
        if where is None:
            return  # a watch already dropped, or made for a workspace no longer tracked
        workspace_id, path = where
        watched = self._spaces.get(workspace_id)
        if mask & _IN_IGNORED:
            del self._wds[wd]  # the folder is gone: its parent has seen it go
            if watched is not None and path:
                watched.changes.dirs.add(_parent(path))
            return
        if watched is None:
            return
        if mask & _IN_UNMOUNT:
            watched.lost = True
            return
        changes = watched.changes
        if not name:  # an event of the watched folder itself: its parent lists it
            changes.dirs.add(path)
            if path:
                changes.dirs.add(_parent(path))
            if mask & (_IN_MOVE_SELF | _IN_DELETE_SELF):
                changes.subtrees.add(path)
            return
        changes.dirs.add(path)
        if mask & _IN_ISDIR and mask & _SUBTREE_EVENTS:
            changes.subtrees.add(f"{path}/{name}" if path else name)


__all__ = ["ChangeTracker", "Changes", "Tracking"]

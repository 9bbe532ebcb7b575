"""A file system of its own for each environment prefix a sandbox binds (V4, R2;
docs/security.md "Host paths").

A sandbox sees an environment's prefix at ``/env`` (a base's at ``/base/python``,
``/base/r``; environments/seen.py), but a bind of the prefix prints, in
``/proc/self/mountinfo`` field 4, the prefix's folder inside its file system:
``<home>/runners/local/environments/env_…/prefix`` or the bases folder. Only a mount whose
own root is the prefix hides it. A root runner (``own_mounts.py`` enabled) therefore binds,
instead of the prefix, a read-only overlay of it (lower layers the prefix and an empty
folder, named by descriptors: the line reads ``/ /env ro,… - overlay overlay
ro,lowerdir=/proc/self/fd/N:/proc/self/fd/M``), mounted in the host's namespace at
``at/<digest>`` here.

One overlay per prefix *as it is*: its digest names the prefix's path and its identity
(``_identity``: its inode and the change times of it and its folder, which every change
touches: the journal beside it is written and removed). overlayfs leaves a lower layer
changed under a mounted overlay undefined (stale names, measured for workspaces in
docs/security.md), so a prefix changed since gets a new overlay at a new mount point and
the old one is left to the sandboxes already bound to it, never unmounted under a bwrap
still setting up. V5 keeps a change and the executions of its environment apart, so no
sandbox reads through an overlay whose prefix changes.

Held while needed: bwrap binds the overlay while it sets the sandbox up, so a hold is taken
before the spawn (``hold``) and kept by the spawned process (a pidfd) until it exits; the
sandbox's own copy of the mount lives on in its namespace whatever the host does. Every
host mount is copied into each new sandbox (docs/benchmarks.md §22), so a reaper thread
unmounts an overlay nothing has held for ``LINGER_S``; a restart adopts what a killed
runner left as idle, so it goes a linger later (a sandbox spawned just before the kill may
still be binding it).

Not root, ``SHELLYARD_OWN_MOUNTS=off``, or a refused mount: the prefix is bound itself and
its mountinfo line names its host folder (docs/security.md "Known limits").
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import select
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shellyard.runner.own_mounts import LINGER_S, mount_overlay, unmount_all
from shellyard.runner.reaper import Reaper, every

log = logging.getLogger(__name__)

#: (host folder, where the sandbox shows it) pairs, as ``bwrap_argv``'s read-only binds
Binds = Sequence[tuple[Path, Path]]


@dataclass
class _Overlay:
    """One prefix's overlay: what holds it, under its own lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    #: holds taken for a spawn not made yet
    pending: int = 0
    #: pidfds of spawned sandboxes (each closes when its process has exited and been seen)
    holders: list[int] = field(default_factory=list)
    #: (pid, start time) of spawned sandboxes the kernel gave no pidfd for (EMFILE, ENOSYS):
    #: checked against /proc by ``reap``, never dropped unseen (the prefix stays mounted);
    #: :data:`UNREAD` while /proc could not be read either (the same full descriptor table)
    polled: list[tuple[int, int]] = field(default_factory=list)
    mounted: bool = False
    #: monotonic time nothing has held it since; None: held
    idle_since: float | None = None

    def attach(self, pid: int) -> None:
        """A spawned sandbox holds it until its process exits (seen by ``reap``)."""
        started: int | None = None
        try:
            pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # gone already: its setup is over
            pidfd = None
        except OSError:  # no pidfd (EMFILE at the descriptor limit, ENOSYS): held by its pid
            pidfd, started = None, _start(pid)
        with self.lock:
            self.pending -= 1
            if pidfd is not None:
                self.holders.append(pidfd)
            elif started is not None:
                self.polled.append((pid, started))
            elif not self.held():
                self.idle_since = time.monotonic()

    def held(self) -> bool:
        """Whether a spawn on its way or a sandbox holds it (the caller holds ``lock``)."""
        return bool(self.pending or self.holders or self.polled)

    def release(self) -> None:
        """A hold whose spawn never happened."""
        with self.lock:
            self.pending -= 1
            if not self.held():
                self.idle_since = time.monotonic()


class PrefixMounts:
    """The overlays of one runner's prefixes, under ``directory`` (``empty``: their second
    lower layer; ``at``: their mount points, 0711 so the sandbox uid reaches them)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._empty = directory / "empty"
        self._at = directory / "at"
        self.enabled = False
        self.linger_s = LINGER_S
        self._table = threading.Lock()
        self._overlays: dict[Path, _Overlay] = {}
        self._reaper: Reaper | None = None

    def startup(self, enabled: bool) -> None:
        """``enabled``: this runner mounts overlays of its own (``OwnMounts.startup``).
        What a killed runner left mounted here is adopted as idle: a sandbox it spawned just
        before the kill may still be setting up and bind one, so each goes a linger later
        (or at the first ``reap``), unless a new hold of the same prefix takes it."""
        if not enabled:
            return
        self.directory.mkdir(mode=0o711, exist_ok=True)
        self._empty.mkdir(mode=0o700, exist_ok=True)
        self._at.mkdir(mode=0o711, exist_ok=True)
        now = time.monotonic()
        for entry in os.scandir(self._at):
            point = Path(entry.path)
            if os.path.ismount(point):
                self._overlays[point] = _Overlay(mounted=True, idle_since=now)
            else:
                self._remove(point)
        self.enabled = True
        if self.linger_s > 0 and self._reaper is None:
            self._reaper = every("prefixes", self.reap, lambda: max(0.2, self.linger_s / 2))

    def hold(self, binds: Binds) -> tuple[list[tuple[Path, Path]], Hold]:
        """``binds`` with each host folder replaced by its overlay's mount point, mounted now
        if needed, and the hold that keeps them until the spawned process exits (``Hold``).
        A mount the kernel refuses leaves that folder bound itself (logged)."""
        shown: list[tuple[Path, Path]] = []
        hold = Hold()
        try:
            for host, seen in binds:
                taken = self._hold_one(host) if self.enabled else None
                if taken is None:
                    shown.append((host, seen))
                else:
                    hold.overlays.append(taken[1])
                    shown.append((taken[0], seen))
        except BaseException:
            hold.close()
            raise
        return shown, hold

    def _hold_one(self, host: Path) -> tuple[Path, _Overlay] | None:
        try:
            identity = _identity(host)
        except OSError:
            return None  # bwrap says what is missing, as before
        digest = hashlib.sha256(f"{host}\0{identity}".encode()).hexdigest()[:24]
        point = self._at / digest
        while True:
            overlay = self._overlay(point)
            with overlay.lock:
                if self._overlays.get(point) is not overlay:
                    continue  # the reaper dropped it meanwhile: the table's entry decides
                if not overlay.mounted:
                    try:
                        point.mkdir(mode=0o700, exist_ok=True)
                        mount_overlay(point, self._empty, lower=host)
                    except OSError as exc:
                        log.warning("%s is bound itself (mountinfo shows its path): %s", host, exc)
                        return None
                    overlay.mounted = True
                overlay.pending += 1
                overlay.idle_since = None
                return point, overlay

    def holds(self) -> dict[Path, int]:
        """Mount point → pending holds plus live holders (for the tests)."""
        with self._table:
            items = list(self._overlays.items())
        return {
            point: o.pending + len(o.holders) + len(o.polled) for point, o in items if o.mounted
        }

    def _overlay(self, point: Path) -> _Overlay:
        with self._table:
            overlay = self._overlays.get(point)
            if overlay is None:
                overlay = self._overlays[point] = _Overlay()
            return overlay

    def reap(self, linger_s: float | None = None) -> int:
        """Unmount the overlays whose holders have all exited ``linger_s`` ago (default
        ``self.linger_s``); how many."""
        linger = self.linger_s if linger_s is None else linger_s
        with self._table:
            items = list(self._overlays.items())
        done = 0
        for point, overlay in items:
            with overlay.lock:
                for pidfd in _exited(overlay.holders):
                    overlay.holders.remove(pidfd)
                    os.close(pidfd)
                overlay.polled = _still_running(overlay.polled)
                if overlay.held() or not overlay.mounted:
                    continue
                now = time.monotonic()
                if overlay.idle_since is None:
                    overlay.idle_since = now
                if now - overlay.idle_since < linger:
                    continue
                self._remove(point)
                overlay.mounted = False
                with self._table:
                    del self._overlays[point]  # a hold waiting on its lock takes a new entry
                done += 1
        return done

    def close(self) -> None:
        """The reaper thread ends (runner/reaper.py) and every overlay is unmounted from the
        host, those it was still to reap included (detached: the sandboxes bound to one keep
        their bind, E11); one left by a kill -9 is adopted by the next start and reaped a
        linger later. A spawn after this binds the prefix itself: nothing would unmount an
        overlay mounted now."""
        self.enabled = False
        if self._reaper is not None:
            self._reaper.stop()
            self._reaper = None
        with self._table:
            items = list(self._overlays.items())
            self._overlays.clear()
        for point, overlay in items:
            with overlay.lock:
                for pidfd in overlay.holders:
                    os.close(pidfd)
                overlay.holders.clear()
                overlay.polled.clear()
                if overlay.mounted:
                    self._remove(point)
                    overlay.mounted = False

    @staticmethod
    def _remove(point: Path) -> None:
        unmount_all(point)
        with contextlib.suppress(OSError):  # never a walk: rmdir of the bare mount point
            point.rmdir()


class Hold:
    """The overlays one spawn binds: ``attach`` the spawned pid (they stay until it exits),
    ``close`` after the spawn (releases them if it never happened)."""

    def __init__(self) -> None:
        self.overlays: list[_Overlay] = []
        self._done = False

    def attach(self, pid: int) -> None:
        if not self._done:
            self._done = True
            for overlay in self.overlays:
                overlay.attach(pid)

    def close(self) -> None:
        if not self._done:
            self._done = True
            for overlay in self.overlays:
                overlay.release()


def _exited(pidfds: list[int]) -> list[int]:
    """The pidfds whose process has exited (readable), without waiting; poll, not select:
    a runner's descriptors pass 1024."""
    if not pidfds:
        return []
    poller = select.poll()
    for pidfd in pidfds:
        poller.register(pidfd, select.POLLIN)
    return [fd for fd, _events in poller.poll(0)]


def _identity(prefix: Path) -> str:
    """What changes when a change touches ``prefix``: its inode (a failed create makes a new
    one) and the change times of it and of its folder (a change writes its journal there
    first and removes it last, store.py; a base's revision folder is never written after)."""
    own = os.stat(prefix)
    folder = os.stat(prefix.parent)
    return f"{own.st_dev}:{own.st_ino}:{own.st_ctime_ns}:{folder.st_ctime_ns}"


#: A holder's start time not read yet: /proc refused it for another reason than "no such
#: process" (EMFILE: the full descriptor table that refused its pidfd refuses the read too).
UNREAD = -1


def _start(pid: int) -> int | None:
    """``pid``'s start time in clock ticks since boot; None only when it is gone (or a
    zombie: exited); :data:`UNREAD` when /proc could not be read. processes.start_time says
    None for any error, and an EMFILE read as "gone" unmounted a running sandbox's prefix
    (docs/security.md "Attack pass (session 50)")."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return UNREAD
    # The command name may contain spaces and parentheses; fields resume after the last ')'.
    fields = raw[raw.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def _still_running(polled: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The holders kept by pid that still run: one whose start time differs ran at that pid
    before (reused); one whose start could not be read stays (and takes the start read once
    /proc answers: an unmount under a running sandbox is worse than a mount kept a while)."""
    kept = []
    for pid, started in polled:
        now = _start(pid)
        if now is None or (started != UNREAD and now not in (started, UNREAD)):
            continue
        kept.append((pid, started if now == UNREAD else now))
    return kept

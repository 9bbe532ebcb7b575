"""The runner's clean mount namespace: a copy of the host's with nothing mounted below the
runner's folder, from which a busy runner's spawns start (launch.c ``--clean-namespace``,
``--clean-fd``; docs/benchmarks.md §80).

Every bwrap copies the mount table it starts in and formats it again at each of its binds,
so a busy runner's own mounts (two overlays and a network namespace per busy workspace) made
every spawn dearer. The launcher used to copy the host's whole table and unmount the other
workspaces' mounts one by one (~50 detached unmounts an execution with 16 busy workspaces,
each waiting on an RCU grace period). From this namespace it instead copies only what its
own binds need (``OPEN_TREE_CLONE``), enters it, takes a copy of its own and attaches them.

A slave of the host's, as the old way's namespace is: nothing done in it or in a copy
reaches the host, and what the host unmounts later goes from it and from every sandbox's
launcher namespace (a private copy held a revoked volume for the sandbox's life, attack pass
session 56). Where the mount the runner's folder lies on is shared (a systemd host's), the
runner's later overlays would arrive in it too and each spawn would unmount them again (the
old way's cost and more): none is made there (``start``). Where it is private (a
container's), nothing of the runner's arrives, and the host's other mounts are followed:
every ``REFRESH_S`` a thread compares the host's mounts outside the runner's folder with
those it was made from and makes a new one when they differ, so a mount an operator adds or
replaces reaches new sandboxes within that time (until then they see the host as it was, as
one started a moment earlier does; ``follow``).

Each spawn gets a descriptor of its own (``descriptor``, a ``dup`` it closes with its other
descriptors): a refresh closes the runner's, never one a spawn is about to pass on. The
launcher closes its copy once entered; nothing of the command inherits it (R2).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import re
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from shellyard.runner.reaper import Reaper, every

log = logging.getLogger(__name__)

#: How often the host's mounts outside the runner's folder are compared, in seconds (a read
#: of /proc/self/mountinfo, well under a millisecond).
REFRESH_S = 2.0
#: How long the launcher may take to make one, in seconds.
MAKE_TIMEOUT_S = 10.0
#: How many folders a runner must have mounted (two per busy workspace) for a spawn to
#: start from the clean namespace: fewer cost a spawn less than a namespace of its own does
#: (docs/benchmarks.md §73, §80); below it the launcher decides by its own count.
BUSY_MOUNTS = 6


def _escaped(path: str) -> str:
    """``path`` as /proc/self/mountinfo prints a mount point (octal escapes)."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in path)


def _unescaped(text: str) -> str:
    """A mountinfo field's octal escapes undone."""
    return re.sub(r"\\([0-3][0-7]{2})", lambda m: chr(int(m.group(1), 8)), text)


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_AT_FDCWD = -100
_AT_SYMLINK_NOFOLLOW, _AT_NO_AUTOMOUNT = 0x100, 0x800
#: statx's mount id that is never reused (Linux 6.8); the plain one is handed out again
_STATX_MNT_ID_UNIQUE = 0x4000
_STATX_SIZE, _STX_MNT_ID_AT = 256, 0x90


def unique_mount_id(point: str) -> int | None:
    """The never-reused id of the mount at ``point`` (its topmost); None: the kernel gives
    none, or the point cannot be looked at."""
    buffer = ctypes.create_string_buffer(_STATX_SIZE)
    flags = _AT_SYMLINK_NOFOLLOW | _AT_NO_AUTOMOUNT
    if _libc.statx(_AT_FDCWD, os.fsencode(point), flags, _STATX_MNT_ID_UNIQUE, buffer) != 0:
        return None
    mask = int.from_bytes(buffer.raw[0:4], "little")
    if not mask & _STATX_MNT_ID_UNIQUE:
        return None
    return int.from_bytes(buffer.raw[_STX_MNT_ID_AT : _STX_MNT_ID_AT + 8], "little")


def shared_below(root: str) -> bool:
    """Whether the mount ``root`` lies on propagates its new mounts to other namespaces (its
    line's optional fields hold ``shared:N``): a slave of it would receive every overlay the
    runner mounts below ``root``."""
    best, shared = "", False
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as table:
        for line in table:
            left = line.partition(" - ")[0].split(" ")
            point = _unescaped(left[4]) if len(left) > 4 else ""
            inside = point == "/" or root == point or root.startswith(point + "/")
            if inside and len(point) >= len(best):  # the last of stacked ones is on top
                best, shared = point, any(f.startswith("shared:") for f in left[6:])
    return shared


def host_signature(root: str) -> tuple[tuple[str, int | None], ...]:
    """The mounts outside ``root`` (and ``root``'s own), in the table's order: each whole
    line (flags, options, source: a remount changes it) with the never-reused id of the
    mount at its point (the line's own id is handed out again: a file system unmounted and
    another mounted at the same point printed the same line, attack pass session 56)."""
    below = _escaped(root) + "/"
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as table:
        for line in table:
            fields = line.split(" ", 5)
            if len(fields) > 4 and not fields[4].startswith(below):
                found.append((line, unique_mount_id(_unescaped(fields[4]))))
    return tuple(found)


class CleanNamespace:
    """One runner's clean namespace, made by ``launcher`` for the folder ``root`` (a real
    path, as the table names it) and the host paths ``host_keeps`` (outside ``root``: the
    bind sources of the runner's host view): the host's mounts none of them needs are left
    out of it once, when it is made, not at each spawn (launch.c ``make_clean``)."""

    def __init__(self, launcher: Path, root: str, host_keeps: Sequence[str] = ()) -> None:
        self.launcher = launcher
        self.root = root
        self.host_keeps = frozenset(host_keeps)
        self._argv = [str(launcher), "--clean-namespace", root]
        for keep in host_keeps:
            self._argv += ["--keep", keep]
        self._lock = threading.Lock()
        #: the current namespace's descriptor and the host's mounts it was made from
        self._fd: int | None = None
        self._made_from: tuple[tuple[str, int | None], ...] = ()
        #: whether the host's unbound mounts were left out of it (launch.c ``make_clean``)
        self.pruned = False
        self._follower: Reaper | None = None

    def start(self) -> bool:
        """Made; False: the kernel or the launcher refused, or the kernel names no mount by
        a never-reused id, without which a replaced host mount would go unseen (the launcher
        then detaches the old way). ``follow`` keeps it up to date."""
        if unique_mount_id("/") is None:
            log.info("no never-reused mount ids (Linux < 6.8): no clean mount namespace")
            return False
        if shared_below(self.root):
            log.info("the runner's folder lies on a shared mount: no clean mount namespace")
            return False
        return self._renew()

    def follow(self) -> None:
        """A thread that calls ``refresh`` every ``REFRESH_S`` until ``close``."""
        if self._follower is None:
            self._follower = every("clean-namespace", self.refresh, lambda: REFRESH_S)

    def covers(self, keeps: Sequence[str]) -> bool:
        """Whether a spawn binding from ``keeps`` may start here: the host's unbound mounts
        were left out (``pruned``: otherwise every host mount would be held alive in the
        sandbox's launcher namespace, a private copy, after the host let it go), and every
        keep outside the folder is one this namespace was made for (another may lie on a
        mount left out)."""
        below = self.root + "/"
        return self.pruned and all(k in self.host_keeps or k.startswith(below) for k in keeps)

    def descriptor(self) -> int | None:
        """A descriptor of the current namespace for one spawn, which owns it (pass_fds,
        then closed); None: none."""
        with self._lock:
            return None if self._fd is None else os.dup(self._fd)

    def refresh(self) -> bool:
        """A new namespace if the host's mounts outside the folder changed; whether made."""
        if host_signature(self.root) == self._made_from:
            return False
        return self._renew()

    def _renew(self) -> bool:
        made_from = host_signature(self.root)  # before the copy: a change after is seen next
        made = self._make()
        if made is None:
            return False
        fd, pruned = made
        with self._lock:
            old, self._fd, self._made_from = self._fd, fd, made_from
            self.pruned = pruned
        if old is not None:
            os.close(old)
        return True

    def _make(self) -> tuple[int, bool] | None:
        """A descriptor of a new one, and whether the host's unbound mounts were left out."""
        try:
            maker = subprocess.Popen(
                self._argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd="/",
            )
        except OSError as exc:
            log.warning("no clean mount namespace (%s): spawns detach the old way", exc)
            return None
        assert maker.stdin is not None and maker.stdout is not None
        try:
            said = maker.stdout.readline()
            if said not in (b"ready pruned\n", b"ready whole\n"):
                return None
            # The maker is this process's child and not reaped yet: its pid names it.
            fd = os.open(f"/proc/{maker.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            return fd, said == b"ready pruned\n"
        except OSError as exc:
            log.warning("no clean mount namespace (%s): spawns detach the old way", exc)
            return None
        finally:  # its stdin's end lets it go (communicate closes it)
            try:
                _out, err = maker.communicate(timeout=MAKE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                maker.kill()
                _out, err = maker.communicate()
            if maker.returncode != 0:
                log.warning(
                    "no clean mount namespace (%s): spawns detach the old way",
                    err.decode(errors="replace").strip() or f"exit {maker.returncode}",
                )

    def close(self) -> None:
        if self._follower is not None:
            self._follower.stop()
            self._follower = None
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def for_runner(launcher: Path, root: Path, view_keeps: Sequence[str]) -> CleanNamespace | None:
    """A runner's clean namespace, made and followed, for its folder ``root`` and the bind
    sources ``view_keeps`` of its host view (those outside the folder are the host keeps);
    None where none can be made (``start``)."""
    real = os.path.realpath(root)
    host = [k for k in view_keeps if k != real and not k.startswith(real + "/")]
    clean = CleanNamespace(launcher, real, host)
    if not clean.start():
        return None
    clean.follow()
    return clean

"""The runner's clean mount namespace: a private copy of the host's with nothing mounted below
the runner's folder, from which a busy runner's spawns start (launch.c ``--clean-namespace``,
``--clean-fd``; docs/benchmarks.md §80).

Every bwrap copies the mount table it starts in and formats it again at each of its binds,
so a busy runner's own mounts (two overlays and a network namespace per busy workspace) made
every spawn dearer. The launcher used to copy the host's whole table and unmount the other
workspaces' mounts one by one (~50 detached unmounts an execution with 16 busy workspaces,
each waiting on an RCU grace period). From this namespace it instead copies only what its
own binds need (``OPEN_TREE_CLONE``), enters it, takes a copy of its own and attaches them.

Private, so none of the runner's later overlays arrive in it (a slave of a shared host
would receive them all) and nothing done in a copy reaches the host. The host's other mounts
are followed instead: every ``REFRESH_S`` a thread compares the host's mounts outside the
runner's folder (their ids and points) with those this namespace was made from and makes a
new one when they differ, so a mount an operator adds or removes reaches the sandboxes within
that time (until then they see the host as it was, as one started a moment earlier does);
its owner runs that thread (local.py).

Each spawn gets a descriptor of its own (``descriptor``, a ``dup`` it closes with its other
descriptors): a refresh closes the runner's, never one a spawn is about to pass on. The
launcher closes its copy once entered; nothing of the command inherits it (R2).
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from pathlib import Path

log = logging.getLogger(__name__)

#: How often the host's mounts outside the runner's folder are compared, in seconds (a read
#: of /proc/self/mountinfo, well under a millisecond).
REFRESH_S = 2.0
#: How long the launcher may take to make one, in seconds.
MAKE_TIMEOUT_S = 10.0


def _escaped(path: str) -> str:
    """``path`` as /proc/self/mountinfo prints a mount point (octal escapes)."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in path)


def host_signature(root: str) -> tuple[tuple[str, str], ...]:
    """The ids and points of the mounts outside ``root`` (and ``root``'s own), in the table's
    order: what a clean namespace copied of the host."""
    below = _escaped(root) + "/"
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as table:
        for line in table:
            fields = line.split(" ", 5)
            if len(fields) > 4 and not fields[4].startswith(below):
                found.append((fields[0], fields[4]))
    return tuple(found)


class CleanNamespace:
    """One runner's clean namespace, made by ``launcher`` for the folder ``root`` (a real
    path, as the table names it)."""

    def __init__(self, launcher: Path, root: str) -> None:
        self.launcher = launcher
        self.root = root
        self._lock = threading.Lock()
        #: the current namespace's descriptor and the host's mounts it was made from
        self._fd: int | None = None
        self._made_from: tuple[tuple[str, str], ...] = ()

    def start(self) -> bool:
        """Made; False: the kernel or the launcher refused (the launcher then detaches the
        old way). Its owner calls ``refresh`` every ``REFRESH_S`` (local.py)."""
        return self._renew()

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
        fd = self._make()
        if fd is None:
            return False
        with self._lock:
            old, self._fd, self._made_from = self._fd, fd, made_from
        if old is not None:
            os.close(old)
        return True

    def _make(self) -> int | None:
        try:
            maker = subprocess.Popen(
                [str(self.launcher), "--clean-namespace", self.root],
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
            if maker.stdout.readline() != b"ready\n":
                return None
            # The maker is this process's child and not reaped yet: its pid names it.
            return os.open(f"/proc/{maker.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
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
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

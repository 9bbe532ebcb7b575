"""A file system of its own for each workspace, home and read view (R2; docs/security.md
"Host paths").

A bind mount shows, in ``/proc/self/mountinfo`` field 4, the path of its folder inside the
file system it comes from: a sandbox bound to ``<home>/runners/local/workspaces/ws_…`` reads
the home's path there. Only a mount whose own root is that folder hides it. A root runner
therefore mounts an overlay over each such folder, in the host's mount namespace, with the
folder itself as its upper layer (an empty folder below it); the sandbox binds the overlay,
whose line reads ``/ /workspace … - overlay overlay rw,lowerdir=/proc/self/fd/N,…``: the
layers are named by descriptors, so no path of the host is printed.

One overlay per folder, shared by the runner and every sandbox: overlayfs leaves what happens
to a layer changed beside it undefined (a name created under an overlay that had looked it up
stays missing through it; measured, docs/security.md), so after the mount every access, the
runner's edits and commits included, goes through the overlay at the folder's own path — the
rest of the runner sees the same paths as before. A read view is mounted read-only the same
way; it is unmounted before it is renamed or removed (a mount point cannot be).

Not root, or where the kernel refuses (an upper layer on overlayfs, as inside a container):
the folders stay plain binds, and mountinfo shows their paths (docs/security.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)

_MS_RDONLY = 0x1
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MNT_DETACH = 0x2
_O_FOLDER = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.syscall.restype = ctypes.c_long
#: open_tree(2): one number on every architecture but alpha (the unified table, Linux 5.2)
_SYS_OPEN_TREE = 428
_OPEN_TREE_CLONE = 0x1
_AT_EMPTY_PATH = 0x1000


class OwnMounts:
    """Overlays of one runner: ``empty`` (the lower layer) and ``work`` (overlayfs' work
    folders, one per mounted folder) under ``directory``, on the same file system as the
    folders they mount (overlayfs wants the work folder beside the upper one)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._empty = directory / "empty"
        self._work = directory / "work"
        self.enabled = False

    def startup(self) -> bool:
        """Probe once (root, and the kernel mounts an overlay here); False: plain binds."""
        if os.geteuid() != 0:
            return False
        for folder in (self.directory, self._empty, self._work):
            folder.mkdir(mode=0o700, exist_ok=True)
        probe = self.directory / "probe"
        probe.mkdir(mode=0o700, exist_ok=True)
        try:
            self.enabled = True
            self.mount(probe)
            self.unmount(probe)
        except OSError as exc:
            self.enabled = False
            log.warning(
                "no overlay of its own per workspace (%s): sandboxes see the home's path in "
                "their mountinfo (docs/security.md \"Host paths\")",
                exc,
            )
        probe.rmdir()
        return self.enabled

    def mount(self, folder: Path, *, read_only: bool = False) -> None:
        """``folder`` seen through an overlay of its own from now on (no-op if it is, or if
        this runner has none)."""
        if not self.enabled or os.path.ismount(folder):
            return
        fds: list[int] = []
        try:
            target = os.open(folder, _O_FOLDER)
            fds.append(target)
            empty = os.open(self._empty, _O_FOLDER)
            fds.append(empty)
            if read_only:
                options = f"lowerdir=/proc/self/fd/{target}:/proc/self/fd/{empty}"
            else:
                work_dir = self._work / _work_name(folder)
                work_dir.mkdir(mode=0o700, exist_ok=True)
                work = os.open(work_dir, _O_FOLDER)
                fds.append(work)
                options = (
                    f"lowerdir=/proc/self/fd/{empty},upperdir=/proc/self/fd/{target},"
                    f"workdir=/proc/self/fd/{work},uuid=null"
                )
            flags = _MS_NOSUID | _MS_NODEV | (_MS_RDONLY if read_only else 0)
            # the target by its descriptor too: the folder mounted is the one opened
            if _libc.mount(
                b"overlay", f"/proc/self/fd/{target}".encode(), b"overlay", flags,
                options.encode(),
            ) != 0:
                code = ctypes.get_errno()
                raise OSError(code, f"cannot mount an overlay on {folder}: {os.strerror(code)}")
        finally:
            for fd in fds:
                os.close(fd)

    def unmount(self, folder: Path) -> None:
        """``folder`` back to a plain folder (before it is renamed or removed). Detached: a
        sandbox still running keeps its bind of the overlay until it ends."""
        if not self.enabled:
            return
        while os.path.ismount(folder):  # mounted twice (two runners' starts racing): all
            if _libc.umount2(str(folder).encode(), _MNT_DETACH) != 0:
                code = ctypes.get_errno()
                if code in (errno.EINVAL, errno.ENOENT):
                    return
                raise OSError(code, f"cannot unmount {folder}: {os.strerror(code)}")
        work_dir = self._work / _work_name(folder)
        if work_dir.is_dir():
            _remove_work(work_dir)

    def mount_all(self, parent: Path) -> int:
        """Mount every folder in ``parent`` (a runner's start: mounts do not outlive a boot)."""
        count = 0
        if self.enabled and parent.is_dir():
            for entry in os.scandir(parent):
                if entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."):
                    self.mount(Path(entry.path))
                    count += 1
        return count

    def start_all(self, parents: Sequence[Path]) -> None:
        """A runner's start: probe, then mount every folder of ``parents``."""
        if self.startup():
            for parent in parents:
                self.mount_all(parent)

    def stop_all(self, parents: Sequence[Path], in_use: set[str]) -> None:
        """A runner's stop: every folder of ``parents`` a plain folder again but those named
        in ``in_use`` (a sandbox running on keeps its overlay, which the next start finds
        mounted; a second overlay over the same folder would not see what it writes)."""
        for parent in parents:
            for folder in parent.iterdir() if parent.is_dir() else ():
                if folder.name not in in_use:
                    self.unmount(folder)

    def unmount_all(self, parent: Path) -> None:
        if self.enabled and parent.is_dir():
            for entry in os.scandir(parent):
                if entry.is_dir(follow_symlinks=False):
                    self.unmount(Path(entry.path))


def open_unnamed(directory: Path, names: Sequence[str], flags: int, mode: int) -> list[int]:
    """``names`` in ``directory`` opened through a detached copy of its mount (open_tree with
    OPEN_TREE_CLONE), for descriptors a sandbox inherits (its stdout and stderr logs): the
    kernel prints a file's path, in ``/proc/<pid>/fd/N``, up to the root of the mount it was
    opened through, so the sandbox reads ``/stdout`` there and not
    ``<home>/runners/local/executions/ex_…/stdout`` (R2, docs/security.md "Host paths").
    The copy lives as long as a descriptor does; nothing is attached anywhere. Where the
    kernel refuses (not root), the files are opened by path."""
    tree = -1
    folder = os.open(directory, _O_FOLDER)
    try:
        tree = _libc.syscall(
            ctypes.c_long(_SYS_OPEN_TREE), ctypes.c_int(folder), ctypes.c_char_p(b""),
            ctypes.c_uint(_OPEN_TREE_CLONE | os.O_CLOEXEC | _AT_EMPTY_PATH),
        )
        base = folder if tree < 0 else tree
        opened: list[int] = []
        try:
            for name in names:
                opened.append(os.open(name, flags, mode, dir_fd=base))
        except BaseException:
            for fd in opened:
                os.close(fd)
            raise
        return opened
    finally:
        os.close(folder)
        if tree >= 0:
            os.close(tree)


def _work_name(folder: Path) -> str:
    return f"{folder.parent.name}.{folder.name}"


def _remove_work(work_dir: Path) -> None:
    """overlayfs' work folder holds only its own empty ``work``/``index`` folders (made mode
    0000 by the kernel): removed without following anything."""
    for entry in os.scandir(work_dir):
        if entry.is_dir(follow_symlinks=False):
            try:
                os.rmdir(entry.path)
            except OSError:
                log.debug("kept %s", entry.path, exc_info=True)
    try:
        work_dir.rmdir()
    except OSError:
        log.debug("kept %s", work_dir, exc_info=True)

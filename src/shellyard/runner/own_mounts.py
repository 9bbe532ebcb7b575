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
stays missing through it; measured, docs/security.md), so while it is mounted every access,
the runner's edits and commits included, goes through the overlay at the folder's own path —
the rest of the runner sees the same paths as before. A read view is mounted read-only the
same way; it is unmounted before it is renamed or removed (a mount point cannot be).

Mounted while held: every mount of the host is copied into each new sandbox, so overlays of
idle workspaces would slow every spawn (docs/benchmarks.md §22). A workspace's folders are
held (``hold``/``let_go``, counted per folder) by each sandbox that binds them, running or
warm, and by each runner operation on them; the first hold mounts (or adopts the overlay a
killed runner left), the last release unmounts ``linger_s`` later. Both transitions happen
under the folder's lock with nothing holding it, so no descriptor or cwd opened through one
side is used across a transition.

Not root, or where the kernel refuses (an upper layer on overlayfs, as inside a container):
the folders stay plain binds, and mountinfo shows their paths (docs/security.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from shellyard import settings_env
from shellyard.runner.reaper import Reaper, every

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


#: How long a folder nothing holds stays mounted, in seconds. Unmounting costs 8-20 ms
#: (measured: a detached unmount waits out an RCU grace period), mounting ~0.3 ms; so the
#: unmount is left to a background thread, and a workspace used again within this time
#: (an edit after its warm sandbox went) reuses its overlay.
LINGER_S = 5.0


@dataclass
class _Folder:
    """One folder's holds, under its own lock (a mount of one never waits on another)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    holds: int = 0
    #: when the last hold went (monotonic); None: held, or not mounted by a hold
    idle_since: float | None = None


class OwnMounts:
    """Overlays of one runner: ``empty`` (the lower layer) and ``work`` (overlayfs' work
    folders, one per mounted folder) under ``directory``, on the same file system as the
    folders they mount (overlayfs wants the work folder beside the upper one)."""

    def __init__(self, directory: Path, parents: tuple[Path, ...] = ()) -> None:
        self.directory = directory
        #: the folders whose every folder is mounted (a runner's workspaces and homes)
        self.parents = parents
        self._empty = directory / "empty"
        self._work = directory / "work"
        self.enabled = False
        #: A lock per folder: ``ismount`` then ``mount`` is a check-then-act, and two threads
        #: making a new home at once stacked two overlays, the second one blind to what went
        #: through the first (docs/security.md). Entries are never removed (one per folder
        #: ever used): a second lock for the same folder would reopen the race.
        self._table = threading.Lock()
        self._folders: dict[Path, _Folder] = {}
        #: name → its folders with their states, looked up once per name: every execution
        #: holds and lets go of its workspace two or three times, and joining each parent and
        #: looking each state up under ``_table`` at each was the largest part of the loop
        #: thread's path joins (docs/benchmarks.md §72). Kept as long as ``_folders`` (a path
        #: is only a name: nothing on disk is cached, so a removed or renamed folder is seen).
        self._named: dict[str, tuple[tuple[Path, _Folder], ...]] = {}
        self.linger_s = LINGER_S
        #: the folders mounted now (under ``_table``): how busy the host's table is for the
        #: launcher's choice of namespace (bwrap.py ``Detach.busy``)
        self._mounted: set[Path] = set()
        #: called with a folder just mounted (a new overlay: what was watched through the
        #: last one is not seen through it; the snapshot store's change hints)
        self.mounted: Callable[[Path], None] | None = None
        self._reaper: Reaper | None = None

    def startup(self) -> bool:
        """Probe once (root, ``SHELLYARD_OWN_MOUNTS`` not ``off``: on by default, and the
        kernel mounts an overlay here); False: plain binds. Folders are mounted while held
        (``hold``), so idle workspaces add no mount to a sandbox's start (docs/benchmarks.md
        §27: 1.02x off's with 250 idle workspaces, where mounting all of them cost 2.9x)."""
        if not allowed():
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
                'their mountinfo (docs/security.md "Host paths")',
                exc,
            )
        probe.rmdir()
        if self.enabled and self.linger_s > 0 and self._reaper is None:
            # every half linger: an idle overlay goes between one and 1.5 lingers after
            self._reaper = every("own-mounts", self.reap, lambda: max(0.2, self.linger_s / 2))
        return self.enabled

    # ------------------------------------------------------------------ holds

    def folders_of(self, name: str) -> list[Path]:
        """The folders a hold on ``name`` covers: its tree and home (one per parent)."""
        return [parent / name for parent in self.parents]

    def hold(self, name: str) -> None:
        """A sandbox (running or warm) or a runner operation uses the folders of workspace
        ``name`` until ``let_go``: mounted now if nothing held them (an overlay a killed
        runner left is adopted). A folder not made yet is counted, not mounted."""
        if not self.enabled:
            return
        done = 0  # folders held so far
        try:
            for folder, state in self._of(name):
                with state.lock:
                    made = state.holds == 0 and folder.is_dir() and self._try_mount(folder)
                    if made and self.mounted is not None:
                        self.mounted(folder)
                    state.holds += 1
                    state.idle_since = None
                done += 1
        except BaseException:
            for folder, state in self._of(name)[:done]:
                self._let_go(folder, state)
            raise

    def _try_mount(self, folder: Path) -> bool:
        """A refused mount (the host's ``fs.mount-max``, a busy work folder) does not refuse
        the command: the folder stays plain for this held period, seen by every side the
        same way (only its path shows in the sandbox's mountinfo); the next period tries
        again."""
        try:
            return self._mount(folder, False)
        except OSError as exc:
            log.warning("%s stays a plain folder while in use: %s", folder, exc)
            return False

    def let_go(self, name: str) -> None:
        """One hold of ``hold(name)`` ends; the last one unmounts, ``linger_s`` later."""
        if self.enabled:
            for folder, state in self._of(name):
                self._let_go(folder, state)

    @contextmanager
    def held(self, name: str) -> Iterator[None]:
        self.hold(name)
        try:
            yield
        finally:
            self.let_go(name)

    def holds(self, name: str) -> list[int]:
        """How many hold each folder of ``name`` (for the tests and the status page)."""
        return [state.holds for _folder, state in self._of(name)]

    def _of(self, name: str) -> tuple[tuple[Path, _Folder], ...]:
        found = self._named.get(name)
        if found is None:  # two threads here at once find the same states (``_state``)
            found = self._named[name] = tuple((f, self._state(f)) for f in self.folders_of(name))
        return found

    def _state(self, folder: Path) -> _Folder:
        with self._table:
            state = self._folders.get(folder)
            if state is None:
                state = self._folders[folder] = _Folder()
            return state

    def _let_go(self, folder: Path, state: _Folder) -> None:
        with state.lock:
            if state.holds <= 0:
                log.error("a hold on %s was let go twice", folder)
                return
            state.holds -= 1
            if state.holds:
                return
            if self.linger_s <= 0:
                self._unmount(folder)
            else:
                state.idle_since = time.monotonic()

    def reap(self) -> int:
        """Unmount the folders nothing has held for ``linger_s``; how many."""
        now = time.monotonic()
        with self._table:
            idle = [(f, s) for f, s in self._folders.items() if s.idle_since is not None]
        done = 0
        for folder, state in idle:
            with state.lock:
                since = state.idle_since
                if state.holds == 0 and since is not None and now - since >= self.linger_s:
                    state.idle_since = None
                    self._unmount(folder)
                    done += 1
        return done

    def unmount_unheld(self) -> None:
        """Unmount every folder of the parents nothing holds: at start, after the sandboxes
        still running were adopted (what a killed runner left mounted for them stays; the
        rest goes), and at stop (a sandbox that runs on keeps its overlay, E11)."""
        for entry in self._entries():
            state = self._state(Path(entry.path))
            with state.lock:
                if state.holds == 0:
                    state.idle_since = None
                    self._unmount(Path(entry.path))

    def close(self) -> None:
        """The reaper thread ends (runner/reaper.py). An overlay it was still to unmount
        (idle, within its linger) is not unmounted here: ``unmount_unheld`` takes it, which
        the runner's stop calls right after and its next start calls too (a kill -9 skips
        the stop), so none is lost; ``close`` alone stays cheap and never unmounts under a
        hold taken meanwhile."""
        if self._reaper is not None:
            self._reaper.stop()
            self._reaper = None

    def mount(self, folder: Path, *, read_only: bool = False) -> None:
        """``folder`` seen through an overlay of its own from now on (no-op if it is, or if
        this runner has none)."""
        with self._state(folder).lock:
            self._mount(folder, read_only)

    def _mount(self, folder: Path, read_only: bool) -> bool:
        """Whether it mounted one (False: mounted already, or no overlays here)."""
        if not self.enabled or os.path.ismount(folder):
            return False
        if read_only:
            mount_overlay(folder, self._empty, lower=folder)
        else:
            work_dir = self._work / _work_name(folder)
            work_dir.mkdir(mode=0o700, exist_ok=True)
            mount_overlay(folder, self._empty, work=work_dir)
        with self._table:
            self._mounted.add(folder)
        return True

    def mounted_count(self) -> int:
        """How many folders this runner has mounted now."""
        return len(self._mounted)

    def tmpfs(self, folder: Path) -> Path:
        """``folder``, made, with a small file system of its own when this runner mounts (the
        egress socket's: a bind of a file shows its path within its file system, so the
        socket lives at a root)."""
        folder.mkdir(mode=0o711, exist_ok=True)
        if os.geteuid() != 0 or os.path.ismount(folder):  # one mount: whatever OWN_MOUNTS says
            return folder
        options = b"mode=0711,size=64k,nr_inodes=16"
        if (
            _libc.mount(
                b"tmpfs", str(folder).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV | 0x8, options
            )
            != 0
        ):  # 0x8: MS_NOEXEC
            code = ctypes.get_errno()
            log.warning("no tmpfs for the egress socket (%s)", os.strerror(code))
        return folder

    def unmount(self, folder: Path) -> None:
        """``folder`` back to a plain folder (before it is renamed or removed). Detached: a
        sandbox still running keeps its bind of the overlay until it ends. Whatever
        ``enabled`` says: the egress socket's tmpfs is every root runner's."""
        with self._state(folder).lock:
            self._unmount(folder)

    def _unmount(self, folder: Path) -> None:
        unmount_all(folder)  # mounted twice (two runners' starts racing): all
        with self._table:
            self._mounted.discard(folder)
        work_dir = self._work / _work_name(folder)
        if work_dir.is_dir():
            _remove_work(work_dir)

    def _entries(self) -> list[os.DirEntry[str]]:
        found: list[os.DirEntry[str]] = []
        for parent in self.parents if self.enabled else ():
            if parent.is_dir():
                found += [e for e in os.scandir(parent) if e.is_dir(follow_symlinks=False)]
        return found


def mount_overlay(
    target: Path,
    empty: Path,
    *,
    lower: Path | None = None,
    work: Path | None = None,
    upper: Path | None = None,
    volatile: bool = False,
) -> None:
    """An overlay mounted on ``target`` whose layers are named by descriptors
    (``/proc/self/fd/N``), so its mountinfo line prints ``/`` as root and no path: read-only
    over ``lower`` (``empty`` below it: overlayfs wants two lower layers without an upper
    one), or, with ``work``, writable with ``upper`` (default ``target`` itself) as its upper
    layer (``empty`` below, ``work`` overlayfs' work folder beside it). ``volatile``: no
    sync of the upper file system at unmount nor on a tool's fsync, as a plain bind; and
    ``index=off`` whatever the kernel's default, which with the index on refuses (EBUSY) an
    upper layer a detached overlay still holds while its last processes exit."""
    fds: list[int] = []
    try:
        layers = (lower,) if work is None else (upper or target, work)
        for folder in (target, empty, *layers):
            if folder is None:
                raise ValueError("a read-only overlay needs its lower layer")
            fds.append(os.open(folder, _O_FOLDER))
        at, empty_fd, more = fds[0], fds[1], fds[2:]
        if work is None:
            options = f"lowerdir=/proc/self/fd/{more[0]}:/proc/self/fd/{empty_fd}"
        else:
            options = (
                f"lowerdir=/proc/self/fd/{empty_fd},upperdir=/proc/self/fd/{more[0]},"
                f"workdir=/proc/self/fd/{more[1]},uuid=null"
            ) + (",volatile,index=off" if volatile else "")
        flags = _MS_NOSUID | _MS_NODEV | (_MS_RDONLY if work is None else 0)
        # the target by its descriptor too: the folder mounted is the one opened
        path = f"/proc/self/fd/{at}".encode()
        if _libc.mount(b"overlay", path, b"overlay", flags, options.encode()) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"cannot mount an overlay on {target}: {os.strerror(code)}")
    finally:
        for fd in fds:
            os.close(fd)


def allowed() -> bool:
    """Whether this process may mount overlays of its own: root, and the operator has not
    turned them off (``SHELLYARD_OWN_MOUNTS=off``)."""
    return os.geteuid() == 0 and settings_env.get("SHELLYARD_OWN_MOUNTS") != "off"


def unmount_all(folder: Path) -> None:
    """Every mount on ``folder`` detached (a sandbox that binds one keeps its bind until it
    ends); none left is no error."""
    while os.path.ismount(folder):
        if _libc.umount2(str(folder).encode(), _MNT_DETACH) != 0:
            code = ctypes.get_errno()
            if code in (errno.EINVAL, errno.ENOENT):
                return
            raise OSError(code, f"cannot unmount {folder}: {os.strerror(code)}")


def open_unnamed(directory: Path, names: Sequence[str], flags: int, mode: int) -> list[int]:
    """``names`` in ``directory`` opened through a detached copy of its mount (open_tree with
    OPEN_TREE_CLONE), for descriptors a sandbox inherits (its stdout and stderr logs): the
    kernel prints a file's path, in ``/proc/<pid>/fd/N``, up to the root of the mount it was
    opened through, so the sandbox reads ``/stdout`` there and not
    ``<home>/runners/local/executions/ex_…/stdout`` (R2, docs/security.md "Host paths").
    The copy lives as long as a descriptor does; nothing is attached anywhere. Where the
    kernel refuses (not root), the files are opened by path."""
    tree = detached_copy(directory)
    base = os.open(directory, _O_FOLDER) if tree is None else tree
    try:
        return open_names(base, names, flags, mode)
    finally:
        os.close(base)


def open_names(folder: int, names: Sequence[str], flags: int, mode: int) -> list[int]:
    """``names`` opened in the folder ``folder`` is a descriptor of; none left open if one
    fails."""
    opened: list[int] = []
    try:
        for name in names:
            opened.append(os.open(name, flags, mode, dir_fd=folder))
    except BaseException:
        for fd in opened:
            os.close(fd)
        raise
    return opened


def detached_copy(directory: Path) -> int | None:
    """A descriptor of a detached copy of the mount ``directory`` is on, rooted at
    ``directory`` (open_tree with OPEN_TREE_CLONE, not recursive: no mount below it comes
    along); None where the kernel refuses (not root). A file opened through it prints its
    path from ``directory`` down (R2, docs/security.md "Host paths"); folders made there later
    are seen through it (the same file system). Kept open by its caller (sandbox/log_root.py)."""
    folder = os.open(directory, _O_FOLDER)
    try:
        tree = _libc.syscall(
            ctypes.c_long(_SYS_OPEN_TREE),
            ctypes.c_int(folder),
            ctypes.c_char_p(b""),
            ctypes.c_uint(_OPEN_TREE_CLONE | os.O_CLOEXEC | _AT_EMPTY_PATH),
        )
    finally:
        os.close(folder)
    return None if tree < 0 else int(tree)


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

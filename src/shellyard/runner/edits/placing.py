"""Placing new content in a workspace's live tree, and the commit that ends each edit.

New content is written to a temp file first — in the runner's staging folder when it shares
the workspace's filesystem, else beside the target — then renamed into place, so a reader of
the live tree (the next command) never sees half a file and a failure leaves nothing
half-written behind.

Files copied out of the snapshot store (restore, transfer batches) are passed to the commit as
hints (their digest and stat), so the commit does not read them again: a transfer costs one
copy of the bytes, like ``cp``. They are copied, never hard-linked: the store's objects must
stay immutable whatever a command later does to the workspace's files (docs/contract.md).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat as stat_mod
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from shellyard.errors import NotFound, OutOfRoom, ShellyardError
from shellyard.runner import workspace_paths
from shellyard.runner.protocol import EditResult, PathEntry, SnapshotInfo
from shellyard.runner.snapshots.budget import HashBudget
from shellyard.runner.snapshots.commit import Hints
from shellyard.runner.snapshots.objects import StoreLock
from shellyard.runner.snapshots.store import SnapshotStore
from shellyard.runner.workspace_paths import Owner

log = logging.getLogger(__name__)

#: The staging folder's folder of marks, one per workspace a writer operation is changing.
WRITING = "writing"


@dataclass
class Done:
    """What one edit wrote and removed, and the hints its commit can trust."""

    written: list[PathEntry] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    hints: Hints = field(default_factory=dict)


class Placer:
    """Staging, placing and committing: what every writer operation of a runner shares.
    Synchronous (the runner calls it on a worker thread); the caller guarantees one writer
    per workspace."""

    def __init__(
        self,
        store: SnapshotStore,
        lock: StoreLock,
        staging: Path,
        owner: Owner,
        tree_of: Callable[[str], Path],
        owner_of: Callable[[str], Owner] | None = None,
    ) -> None:
        self.store = store
        self.lock = lock
        self._staging = staging
        self._owner = owner
        self._tree_of = tree_of
        #: R2 tenants: each workspace's own uid (tenants.py); None: ``owner`` for all.
        self._owner_of = owner_of
        self._current = threading.local()
        #: Raises when the runner's volume is below its reserve (limits/reserve.py
        #: require_room), called while an upload is unpacked; None: not checked.
        self.room: Callable[[], None] | None = None
        #: R2: holds a workspace's folders for an access outside a writer operation (the
        #: start-up sweep), so it goes through their overlay (runner/own_mounts.py)
        self.hold: Callable[[str], contextlib.AbstractContextManager[None]] | None = None

    def tree_of(self, workspace_id: str) -> Path:
        """The workspace's tree; also makes its owner the one this thread's operation gives
        new files (every operation opens its tree first)."""
        tree = self._tree_of(workspace_id)
        self._current.owner = self._owner_of(workspace_id) if self._owner_of else self._owner
        return tree

    @property
    def owner(self) -> Owner:
        return getattr(self._current, "owner", self._owner)

    def startup(self) -> None:
        """Make the staging folder, emptying what a crash left in it, and remove the temp
        files a crash left in the workspaces it was writing (``writing``)."""
        marks = self._staging / WRITING
        for name in sorted(os.listdir(marks)) if marks.is_dir() else ():
            tree = self._tree_of(name)
            if tree.is_dir():
                with self.hold(name) if self.hold else contextlib.nullcontext():
                    swept = self.sweep(name)
                log.info("removed %d temp files a crash left in %s", swept, tree)
        if self._staging.exists():  # through descriptors: a staged link is never followed
            with workspace_paths.open_root(self._staging.parent) as parent:
                workspace_paths.remove_at(parent, self._staging.name)
        self._staging.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self._staging / WRITING).mkdir(mode=0o700)
        self._staging_fd = os.open(self._staging, workspace_paths.O_DIR)
        self._staging_dev = os.fstat(self._staging_fd).st_dev

    @contextlib.contextmanager
    def writing(self, workspace_id: str) -> Iterator[None]:
        """One writer operation on the workspace: its mark in ``staging/writing`` while it
        runs, so that after a crash the next start sweeps that tree (and no other) for the
        temp files it may have left beside their targets (``workspace_paths.PARTIAL``)."""
        mark = self._staging / WRITING / workspace_id
        try:
            os.close(os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # A full volume (no inode for the mark) must not refuse the delete that frees it
            # (docs/limits.md "Full disk"): a temp file left by a crash now is still never
            # committed (snapshots/scan.py), only not swept at the next start.
            log.warning("no room for the writing mark of %s: %s", workspace_id, exc.strerror)
        try:
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(mark)

    def sweep(self, workspace_id: str) -> int:
        """Remove the runner's temp files (``workspace_paths.is_partial``) from the tree,
        walking by descriptors, never following a link (os.fwalk); a folder of that name
        (a command's) stays. The number removed."""
        removed = 0
        tree = self._tree_of(workspace_id)
        for _path, folders, files, dir_fd in os.fwalk(tree, follow_symlinks=False):
            for name in [*files, *folders]:
                if workspace_paths.is_partial(name):
                    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                        os.unlink(name, dir_fd=dir_fd)
                        removed += 1
        return removed

    def close(self) -> None:
        fd, self._staging_fd = getattr(self, "_staging_fd", -1), -1
        if fd >= 0:
            os.close(fd)

    # ------------------------------------------------------------------ commit

    def commit_edit(self, workspace_id: str, done: Done) -> EditResult:
        if done.hints:
            self._wait_tick(max(max(sig[0], sig[1]) for _digest, sig in done.hints.values()))
        snapshot = self.store.commit(workspace_id, self.tree_of(workspace_id), done.hints)
        return EditResult(snapshot=snapshot, written=done.written, removed=done.removed)

    def _wait_tick(self, latest_ns: int) -> None:
        """Let the filesystem clock pass the files just written before the commit takes its
        racy-clean clock: otherwise a file written in the same timestamp tick (4 ms with a
        coarse clock) counts as racily clean, and the next commit reads it again — a 250 MB
        file of one transfer batch re-hashed by the next batch's commit (measured)."""
        probe = self._staging / ".tick"
        for _ in range(200):
            try:
                os.utime(probe)
            except FileNotFoundError:
                probe.touch()
            if os.stat(probe).st_mtime_ns > latest_ns:
                return
            time.sleep(0.001)

    def commit(self, workspace_id: str, budget: HashBudget | None = None) -> SnapshotInfo:
        with self.lock.hold():
            return self.store.commit(workspace_id, self.tree_of(workspace_id), budget=budget)

    def commit_if_unchanged(self, workspace_id: str) -> SnapshotInfo | None:
        """``commit``'s answer if it is known at once, without waiting (the event loop
        calls it): the head of a workspace nothing changed in; None: call ``commit``."""
        with self.lock.try_hold() as held:
            if not held:
                return None
            return self.store.commit_if_unchanged(workspace_id, self._tree_of(workspace_id))

    # ------------------------------------------------------------------ staging

    def temp_for(self, parent_fd: int) -> tuple[int, str]:
        """(folder descriptor, name) for a new temp file that can be renamed into
        ``parent_fd``: the staging folder when on the same filesystem, else the parent."""
        if os.fstat(parent_fd).st_dev == self._staging_dev:
            return os.dup(self._staging_fd), workspace_paths.temp_name()
        return os.dup(parent_fd), workspace_paths.temp_name()

    def place(self, temp_dir: int, temp: str, parent_fd: int, name: str) -> os.stat_result:
        """Rename a finished temp entry to ``name``; its stat after the rename."""
        os.rename(temp, name, src_dir_fd=temp_dir, dst_dir_fd=parent_fd)
        return os.stat(name, dir_fd=parent_fd, follow_symlinks=False)

    def _new_file(
        self,
        parent_fd: int,
        name: str,
        mode: int,
        fill: Callable[[int], None],
    ) -> os.stat_result:
        """Create ``name`` below ``parent_fd`` with content written by ``fill(fd)``, through
        a temp file renamed into place. Out of room raises ``OutOfRoom``; the temp is gone."""
        temp_dir, temp = self.temp_for(parent_fd)
        try:
            fd = os.open(temp, workspace_paths.O_NEW, 0o600, dir_fd=temp_dir)
            try:
                try:
                    fill(fd)
                except OSError as exc:
                    if workspace_paths.out_of_room(exc):
                        raise OutOfRoom(
                            f"the workspace's filesystem is out of room ({exc.strerror}); "
                            f"free space or write less"
                        ) from None
                    raise
                os.fchmod(fd, mode & workspace_paths.PERMISSION_BITS)
                if self.owner is not None:
                    os.fchown(fd, *self.owner)
            finally:
                os.close(fd)
            return self.place(temp_dir, temp, parent_fd, name)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=temp_dir)
            raise
        finally:
            os.close(temp_dir)

    def _new_link(self, parent_fd: int, name: str, target: str) -> None:
        temp = workspace_paths.temp_name()
        os.symlink(target, temp, dir_fd=parent_fd)
        try:
            workspace_paths.chown_at(parent_fd, temp, self.owner)
            os.rename(temp, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=parent_fd)
            raise

    def _new_dir(self, parent_fd: int, name: str, mode: int) -> None:
        os.mkdir(name, mode & workspace_paths.PERMISSION_BITS, dir_fd=parent_fd)
        os.chmod(
            name, mode & workspace_paths.PERMISSION_BITS, dir_fd=parent_fd, follow_symlinks=False
        )
        workspace_paths.chown_at(parent_fd, name, self.owner)

    def _from_object(self, sha256: str, size: int | None = None) -> Callable[[int], None]:
        def fill(fd: int) -> None:
            try:
                src = os.open(self.store.blobs.object_path(sha256), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise NotFound(
                    f"object {sha256} is not in this runner's snapshot store", sha256=sha256
                ) from None
            try:
                workspace_paths.copy_fd(src, fd, size)
            finally:
                os.close(src)

        return fill

    # ------------------------------------------------------------------ single file

    def copy_over(self, src_dir: int, src: str, parent_fd: int, name: str) -> os.stat_result:
        st = os.stat(src, dir_fd=src_dir, follow_symlinks=False)
        if stat_mod.S_ISLNK(st.st_mode):
            self._new_link(parent_fd, name, os.readlink(src, dir_fd=src_dir))
            return os.stat(name, dir_fd=parent_fd, follow_symlinks=False)

        def fill(fd: int) -> None:
            s = os.open(src, workspace_paths.O_FILE, dir_fd=src_dir)
            try:
                workspace_paths.copy_fd(s, fd)
            finally:
                os.close(s)

        return self._new_file(parent_fd, name, st.st_mode, fill)


def kind_name(st: os.stat_result) -> str:
    if stat_mod.S_ISDIR(st.st_mode):
        return "folder"
    if stat_mod.S_ISLNK(st.st_mode):
        return "symbolic link"
    if stat_mod.S_ISREG(st.st_mode):
        return "file"
    return "special file"


def reason_of(exc: BaseException) -> str:
    if isinstance(exc, ShellyardError):
        return exc.message
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}"
    return str(exc)

"""Writer operations on a workspace's live tree (W1, W3, W6, T2, T3): write a file, unpack a
tar upload, delete, move, restore a snapshot, apply a transfer batch. Each ends with a commit,
so its result is a snapshot; the control plane holds the workspace's writer around it.

Every path goes through ``fsops`` (no symbolic link is ever followed). New content is written
to a temp file first — in the runner's staging folder when it shares the workspace's
filesystem, else beside the target — then renamed into place, so a reader of the live tree
(the next command) never sees half a file and a failure leaves nothing half-written behind.

Files copied out of the snapshot store (restore, transfer batches) are passed to the commit as
hints (their digest and stat), so the commit does not read them again: a transfer costs one
copy of the bytes, like ``cp``. They are copied, never hard-linked: the store's objects must
stay immutable whatever a command later does to the workspace's files (DESIGN "Snapshots").
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import queue
import shutil
import stat as stat_mod
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, cast

from shellyard.errors import InvalidInput, NotFound, OutOfRoom, PathRefused, ShellyardError
from shellyard.paths import normalize_relative
from shellyard.runner import fsops, history
from shellyard.runner.fsops import Folders, Owner
from shellyard.runner.objects import StoreLock
from shellyard.runner.protocol import (
    ApplyEntry,
    ApplyOutcome,
    EditResult,
    PathEntry,
    SnapshotInfo,
)
from shellyard.runner.snapshots import Hints, SnapshotStore, _Manifest

_KIND_FILE, _KIND_DIR, _KIND_LINK = ord("f"), ord("d"), ord("l")


@dataclass
class _Done:
    written: list[PathEntry] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    hints: Hints = field(default_factory=dict)


class Editor:
    """The writer operations of one runner. Synchronous (the runner calls it on a worker
    thread); the caller guarantees one writer per workspace."""

    def __init__(
        self,
        store: SnapshotStore,
        lock: StoreLock,
        staging: Path,
        owner: Owner,
        tree_of: Callable[[str], Path],
    ) -> None:
        self._store = store
        self._lock = lock
        self._staging = staging
        self._owner = owner
        self._tree_of = tree_of

    def startup(self) -> None:
        """Make the staging folder, emptying what a crash left in it."""
        if self._staging.exists():
            shutil.rmtree(self._staging, ignore_errors=True)
        self._staging.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._staging_fd = os.open(self._staging, fsops.O_DIR)
        self._staging_dev = os.fstat(self._staging_fd).st_dev

    def close(self) -> None:
        fd, self._staging_fd = getattr(self, "_staging_fd", -1), -1
        if fd >= 0:
            os.close(fd)

    # ------------------------------------------------------------------ commit

    def _commit(self, workspace_id: str, done: _Done) -> EditResult:
        if done.hints:
            self._wait_tick(max(max(sig[0], sig[1]) for _digest, sig in done.hints.values()))
        snapshot = self._store.commit(workspace_id, self._tree_of(workspace_id), done.hints)
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

    def commit(self, workspace_id: str) -> SnapshotInfo:
        with self._lock.hold():
            return self._store.commit(workspace_id, self._tree_of(workspace_id))

    # ------------------------------------------------------------------ staging

    def _temp_for(self, parent_fd: int) -> tuple[int, str]:
        """(folder descriptor, name) for a new temp file that can be renamed into
        ``parent_fd``: the staging folder when on the same filesystem, else the parent."""
        if os.fstat(parent_fd).st_dev == self._staging_dev:
            return os.dup(self._staging_fd), fsops.temp_name()
        return os.dup(parent_fd), fsops.temp_name()

    def _place(self, temp_dir: int, temp: str, parent_fd: int, name: str) -> os.stat_result:
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
        temp_dir, temp = self._temp_for(parent_fd)
        try:
            fd = os.open(temp, fsops.O_NEW, 0o600, dir_fd=temp_dir)
            try:
                try:
                    fill(fd)
                except OSError as exc:
                    if fsops.out_of_room(exc):
                        raise OutOfRoom(
                            f"the workspace's filesystem is out of room ({exc.strerror}); "
                            f"free space or write less"
                        ) from None
                    raise
                os.fchmod(fd, mode & fsops.PERMISSION_BITS)
                if self._owner is not None:
                    os.fchown(fd, *self._owner)
            finally:
                os.close(fd)
            return self._place(temp_dir, temp, parent_fd, name)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=temp_dir)
            raise
        finally:
            os.close(temp_dir)

    def _new_link(self, parent_fd: int, name: str, target: str) -> None:
        temp = fsops.temp_name()
        os.symlink(target, temp, dir_fd=parent_fd)
        try:
            fsops.chown_at(parent_fd, temp, self._owner)
            os.rename(temp, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=parent_fd)
            raise

    def _new_dir(self, parent_fd: int, name: str, mode: int) -> None:
        os.mkdir(name, mode & fsops.PERMISSION_BITS, dir_fd=parent_fd)
        os.chmod(name, mode & fsops.PERMISSION_BITS, dir_fd=parent_fd, follow_symlinks=False)
        fsops.chown_at(parent_fd, name, self._owner)

    def _from_object(self, sha256: str, size: int | None = None) -> Callable[[int], None]:
        def fill(fd: int) -> None:
            try:
                src = os.open(self._store._object_path(sha256), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise NotFound(
                    f"object {sha256} is not in this runner's snapshot store", sha256=sha256
                ) from None
            try:
                fsops.copy_fd(src, fd, size)
            finally:
                os.close(src)

        return fill

    # ------------------------------------------------------------------ single file

    def begin_write(self, workspace_id: str, path: str, mode: int | None) -> FileUpload:
        return FileUpload(self, workspace_id, path, mode)

    # ------------------------------------------------------------------ delete, move

    def delete(self, workspace_id: str, path: str, recursive: bool) -> EditResult:
        rel = normalize_relative(path)
        if not rel:
            raise InvalidInput(
                "deleting the workspace root is not allowed; delete the files and folders inside it"
            )
        with (
            self._lock.hold(),
            fsops.open_root(self._tree_of(workspace_id)) as root,
            fsops.resolve(root, rel) as where,
        ):
            st = fsops.lstat_at(where.dir_fd, where.name)
            if st is None:
                raise NotFound(f"no {rel!r} in the workspace to delete", path=rel)
            if stat_mod.S_ISDIR(st.st_mode) and not recursive:
                with contextlib.suppress(OSError):
                    os.rmdir(where.name, dir_fd=where.dir_fd)
                    return self._commit(workspace_id, _Done(removed=[rel]))
                raise InvalidInput(
                    f"{rel!r} is a folder that is not empty; pass recursive=true to delete it "
                    f"with everything inside",
                    path=rel,
                )
            fsops.remove_at(where.dir_fd, where.name)
            return self._commit(workspace_id, _Done(removed=[rel]))

    def move(self, workspace_id: str, source: str, destination: str, overwrite: bool) -> EditResult:
        src, dst = normalize_relative(source), normalize_relative(destination)
        if not src or not dst:
            raise InvalidInput("the workspace root cannot be moved or replaced; name a path in it")
        if dst == src or dst.startswith(src + "/"):
            raise InvalidInput(
                f"cannot move {src!r} to {dst!r}: a folder cannot move into itself",
                path=src,
            )
        head = history.head_manifest(self._store, workspace_id)
        with self._lock.hold(), fsops.open_root(self._tree_of(workspace_id)) as root:
            with fsops.resolve(root, src) as a:
                st = fsops.lstat_at(a.dir_fd, a.name)
                if st is None:
                    raise NotFound(f"no {src!r} in the workspace to move", path=src)
                with fsops.resolve(root, dst, create_parents=True, owner=self._owner) as b:
                    existing = fsops.lstat_at(b.dir_fd, b.name)
                    if existing is not None:
                        if not overwrite:
                            raise InvalidInput(
                                f"{dst!r} already exists; pass overwrite=true to replace it",
                                path=dst,
                            )
                        fsops.remove_at(b.dir_fd, b.name)
                    os.rename(a.name, b.name, src_dir_fd=a.dir_fd, dst_dir_fd=b.dir_fd)
                    done = _Done(removed=[src])
                    self._hint_moved(head, src, dst, b.dir_fd, b.name, done)
            return self._commit(workspace_id, done)

    def _hint_moved(
        self, head: _Manifest, src: str, dst: str, dir_fd: int, name: str, done: _Done
    ) -> None:
        """Hints for the files a move carried: their content is the head's at the old path."""
        m = head
        assert isinstance(m, _Manifest)
        index = m.index()

        def visit(fd: int, entry: str, old: str, new: str) -> None:
            st = fsops.lstat_at(fd, entry)
            if st is None:
                return
            if stat_mod.S_ISREG(st.st_mode):
                i = index.get(old)
                if i is not None and m.kinds[i] == _KIND_FILE and m.sizes[i] == st.st_size:
                    done.hints[new] = (m.digests[32 * i : 32 * i + 32], fsops.sig_of(st))
                    done.written.append(m.entry(i).model_copy(update={"path": new}))
            elif stat_mod.S_ISDIR(st.st_mode):
                sub = os.open(entry, fsops.O_DIR, dir_fd=fd)
                try:
                    for child in os.listdir(sub):
                        visit(sub, child, f"{old}/{child}", f"{new}/{child}")
                finally:
                    os.close(sub)

        visit(dir_fd, name, src, dst)

    # ------------------------------------------------------------------ restore

    def restore(self, workspace_id: str, seq: int, path: str) -> EditResult:
        """Make the workspace (or the folder or file ``path``) what it was in snapshot
        ``seq``, then commit: a new snapshot; nothing of history is deleted (W5)."""
        rel = normalize_relative(path)
        with self._lock.hold():
            old = history.manifest(self._store, workspace_id, seq)
            head = history.head_manifest(self._store, workspace_id)
            if rel:
                history.check_links(old, rel)
                if rel not in old.index() and rel not in head.index():
                    raise NotFound(
                        f"{rel!r} is neither in snapshot {seq} nor in the head; nothing to restore",
                        path=rel,
                    )
            prefix = rel + "/" if rel else ""

            def under(p: str) -> bool:
                return not rel or p == rel or p.startswith(prefix)

            want = {p: i for p, i in old.index().items() if under(p)}
            have = {p: i for p, i in head.index().items() if under(p)}
            done = _Done()
            with (
                fsops.open_root(self._tree_of(workspace_id)) as root,
                Folders(root, create=True, owner=self._owner) as folders,
            ):
                # what goes away: absent from the old snapshot, or of another kind there
                doomed = sorted(
                    p
                    for p, i in have.items()
                    if p not in want or old.kinds[want[p]] != head.kinds[i]
                )
                gone: list[str] = []
                for p in doomed:
                    if any(p.startswith(g + "/") for g in gone[-1:]):
                        continue
                    where = folders.resolve(p)
                    folders.forget(p)
                    fsops.remove_at(where.dir_fd, where.name)
                    gone.append(p)
                    done.removed.append(p)
                for p in sorted(want):
                    i = want[p]
                    j = have.get(p)
                    same = (
                        j is not None
                        and head.kinds[j] == old.kinds[i]
                        and head.digests[32 * j : 32 * j + 32] == old.digests[32 * i : 32 * i + 32]
                        and head.modes[j] == old.modes[i]
                        and head.targets[j] == old.targets[i]
                        and p not in gone
                    )
                    if same:
                        continue
                    self._materialize(folders, old, i, done)
            return self._commit(workspace_id, done)

    def _materialize(self, folders: Folders, m: _Manifest, i: int, done: _Done) -> None:
        """Write entry ``i`` of manifest ``m`` into the live tree (over what is there)."""
        entry = m.entry(i)
        where = folders.resolve(entry.path)
        existing = fsops.lstat_at(where.dir_fd, where.name)
        if entry.kind == "dir":
            if existing is not None and stat_mod.S_ISDIR(existing.st_mode):
                os.chmod(where.name, entry.mode, dir_fd=where.dir_fd, follow_symlinks=False)
                return
            if existing is not None:
                fsops.remove_at(where.dir_fd, where.name)
            self._new_dir(where.dir_fd, where.name, entry.mode)
            return
        if existing is not None and stat_mod.S_ISDIR(existing.st_mode):
            folders.forget(entry.path)
            fsops.remove_at(where.dir_fd, where.name)
        if entry.kind == "symlink":
            self._new_link(where.dir_fd, where.name, entry.target or "")
            return
        assert entry.sha256 is not None
        st = self._new_file(
            where.dir_fd, where.name, entry.mode, self._from_object(entry.sha256, entry.size)
        )
        done.hints[entry.path] = (bytes.fromhex(entry.sha256), fsops.sig_of(st))
        done.written.append(entry)

    # ------------------------------------------------------------------ transfer batches

    def apply(
        self, workspace_id: str, entries: list[ApplyEntry]
    ) -> tuple[list[ApplyOutcome], EditResult]:
        """Write a transfer batch into the live tree and commit it (T3): per entry
        ``copied``, ``unchanged`` (already so in the head), ``skipped`` (a symbolic link that
        would point outside the workspace) or ``failed`` with the reason. A failure of one
        entry never stops the others; the commit publishes every entry that was written."""
        outcomes: list[ApplyOutcome] = []
        done = _Done()
        with self._lock.hold():
            head = history.head_manifest(self._store, workspace_id)
            index = head.index()
            with (
                fsops.open_root(self._tree_of(workspace_id)) as root,
                Folders(root, create=True, owner=self._owner) as folders,
            ):
                for entry in sorted(entries, key=lambda e: e.path):
                    try:
                        outcome, reason = self._apply_one(folders, head, index, entry, done)
                    except (ShellyardError, OSError) as exc:
                        outcome, reason = "failed", _reason(exc)
                    outcomes.append(ApplyOutcome(path=entry.path, outcome=outcome, reason=reason))
            result = self._commit(workspace_id, done)
        return outcomes, result

    def _apply_one(
        self,
        folders: Folders,
        head: _Manifest,
        index: dict[str, int],
        entry: ApplyEntry,
        done: _Done,
    ) -> tuple[str, str | None]:
        rel = normalize_relative(entry.path)
        if not rel:
            return ("unchanged", None) if entry.kind == "dir" else ("failed", "empty path")
        mode = entry.mode & fsops.PERMISSION_BITS
        i = index.get(rel)
        if entry.kind == "symlink":
            target = entry.target or ""
            if fsops.escapes(rel, target):
                return "skipped", f"symbolic link to {target!r} would point outside the workspace"
            if i is not None and head.kinds[i] == _KIND_LINK and head.targets[i] == target:
                return "unchanged", None
        elif entry.kind == "file":
            if entry.sha256 is None:
                return "failed", "no content named for the file"
            digest = bytes.fromhex(entry.sha256)
            if (
                i is not None
                and head.kinds[i] == _KIND_FILE
                and head.digests[32 * i : 32 * i + 32] == digest
                and head.modes[i] & fsops.PERMISSION_BITS == mode
            ):
                return "unchanged", None
        where = folders.resolve(rel)
        existing = fsops.lstat_at(where.dir_fd, where.name)
        if entry.kind == "dir":
            if existing is None:
                self._new_dir(where.dir_fd, where.name, mode)
                return "copied", None
            if stat_mod.S_ISDIR(existing.st_mode):
                return "unchanged", None
            return "failed", f"a {_kind(existing)} is in the way at {rel!r}"
        if existing is not None and not stat_mod.S_ISREG(existing.st_mode):
            return "failed", f"a {_kind(existing)} is in the way at {rel!r}"
        if entry.kind == "symlink":
            self._new_link(where.dir_fd, where.name, entry.target or "")
            return "copied", None
        assert entry.sha256 is not None
        st = self._new_file(
            where.dir_fd, where.name, mode, self._from_object(entry.sha256, entry.size)
        )
        done.hints[rel] = (bytes.fromhex(entry.sha256), fsops.sig_of(st))
        return "copied", None

    # ------------------------------------------------------------------ tar uploads

    def unpack(self, workspace_id: str, path: str, chunks: queue.Queue[bytes | None]) -> EditResult:
        """Unpack a tar stream (fed through ``chunks``; None ends it) below ``path``.

        Two phases, so a bad archive changes nothing: everything is unpacked into a private
        staging tree first (members named absolute or with ``..``, symbolic links pointing
        outside, hard links and devices refuse the whole upload), then moved into place.
        """
        dest = normalize_relative(path)
        stage = self._staging / fsops.temp_name(".tar")
        stage.mkdir(mode=0o700)
        reader = _QueueReader(chunks)
        try:
            try:
                members = self._unpack_to(stage, dest, reader)
            except tarfile.TarError as exc:
                raise InvalidInput(
                    f"the upload is not a readable tar archive ({exc}); send a tar stream "
                    "(for example `tar -c -C FOLDER .`) as the body; nothing was unpacked"
                ) from None
            with self._lock.hold(), fsops.open_root(self._tree_of(workspace_id)) as root:
                done = _Done()
                with (
                    fsops.open_root(stage) as stage_fd,
                    Folders(stage_fd) as staged,
                    Folders(root, create=True, owner=self._owner) as folders,
                ):
                    self._check_conflicts(root, dest, members)
                    for name, kind, mode in members:
                        full = f"{dest}/{name}" if dest else name
                        where = folders.resolve(full)
                        existing = fsops.lstat_at(where.dir_fd, where.name)
                        if kind == "dir":
                            if existing is None:
                                self._new_dir(where.dir_fd, where.name, mode)
                            continue
                        src = staged.resolve(name)
                        if existing is not None:
                            fsops.remove_at(where.dir_fd, where.name)
                        try:
                            st = self._place(src.dir_fd, src.name, where.dir_fd, where.name)
                        except OSError as exc:
                            if exc.errno != errno.EXDEV:
                                raise
                            st = self._copy_over(src.dir_fd, src.name, where.dir_fd, where.name)
                        if kind == "file":
                            done.written.append(
                                PathEntry(path=full, kind="file", size=st.st_size, mode=mode)
                            )
                return self._commit(workspace_id, done)
        finally:
            reader.drain()
            shutil.rmtree(stage, ignore_errors=True)

    def _copy_over(self, src_dir: int, src: str, parent_fd: int, name: str) -> os.stat_result:
        st = os.stat(src, dir_fd=src_dir, follow_symlinks=False)
        if stat_mod.S_ISLNK(st.st_mode):
            self._new_link(parent_fd, name, os.readlink(src, dir_fd=src_dir))
            return os.stat(name, dir_fd=parent_fd, follow_symlinks=False)

        def fill(fd: int) -> None:
            s = os.open(src, fsops.O_FILE, dir_fd=src_dir)
            try:
                fsops.copy_fd(s, fd)
            finally:
                os.close(s)

        return self._new_file(parent_fd, name, st.st_mode, fill)

    def _check_conflicts(self, root: int, dest: str, members: list[tuple[str, str, int]]) -> None:
        """Refuse the upload before anything moves when a member cannot take its place: a
        folder where a file goes or the reverse, a symbolic link in the way, or a path
        through a file or a link."""
        with Folders(root) as folders:
            for name, kind, _mode in members:
                full = f"{dest}/{name}" if dest else name
                try:
                    where = folders.resolve(full)
                except NotFound:
                    continue  # its folders will be made
                existing = fsops.lstat_at(where.dir_fd, where.name)
                if existing is None:
                    continue
                is_dir = stat_mod.S_ISDIR(existing.st_mode)
                if (kind == "dir") != is_dir or stat_mod.S_ISLNK(existing.st_mode):
                    raise InvalidInput(
                        f"the upload has a {'folder' if kind == 'dir' else kind} at {full!r} "
                        f"where the workspace has a {_kind(existing)}; delete it first or "
                        f"upload elsewhere; nothing was changed",
                        path=full,
                    )

    def _unpack_to(
        self, stage: Path, dest: str, reader: _QueueReader
    ) -> list[tuple[str, str, int]]:
        members: list[tuple[str, str, int]] = []
        with (
            tarfile.open(fileobj=cast(IO[bytes], reader), mode="r|*") as tar,
            fsops.open_root(stage) as stage_fd,
            Folders(stage_fd, create=True) as folders,
        ):
            for member in tar:
                name = normalize_relative(member.name)
                full = f"{dest}/{name}" if dest else name
                if not name:
                    continue
                mode = member.mode & fsops.PERMISSION_BITS
                where = folders.resolve(name)
                if member.isdir():
                    if fsops.lstat_at(where.dir_fd, where.name) is None:
                        os.mkdir(where.name, 0o700, dir_fd=where.dir_fd)
                    members.append((name, "dir", mode or fsops.DIR_MODE))
                elif member.isreg():
                    source = tar.extractfile(member)
                    assert source is not None
                    fsops.remove_at(where.dir_fd, where.name)
                    fd = os.open(where.name, fsops.O_NEW, 0o600, dir_fd=where.dir_fd)
                    try:
                        _copy_stream(source, fd)
                        os.fchmod(fd, mode)
                        if self._owner is not None:
                            os.fchown(fd, *self._owner)
                    finally:
                        os.close(fd)
                    members.append((name, "file", mode))
                elif member.issym():
                    if fsops.escapes(full, member.linkname):
                        raise PathRefused(
                            f"the archive's symbolic link {member.name!r} points to "
                            f"{member.linkname!r}, outside the workspace; nothing was unpacked",
                            path=member.name,
                        )
                    fsops.remove_at(where.dir_fd, where.name)
                    os.symlink(member.linkname, where.name, dir_fd=where.dir_fd)
                    fsops.chown_at(where.dir_fd, where.name, self._owner)
                    members.append((name, "symlink", 0o777))
                else:
                    raise InvalidInput(
                        f"the archive's member {member.name!r} is a "
                        f"{'hard link' if member.islnk() else 'device or fifo'}; only files, "
                        f"folders and symbolic links can be uploaded; nothing was unpacked",
                        path=member.name,
                    )
        # a member listed twice keeps its last kind; parents come before their children
        last: dict[str, tuple[str, str, int]] = {}
        for member_info in members:
            last[member_info[0]] = member_info
        return [last[name] for name in sorted(last)]


class FileUpload:
    """One streamed file write: ``write`` chunks, then ``finish`` (renames it into place and
    commits) or ``abort``. Runs on worker threads; the bytes are hashed as they come."""

    def __init__(self, editor: Editor, workspace_id: str, path: str, mode: int | None) -> None:
        self._editor = editor
        self._workspace_id = workspace_id
        self.rel = normalize_relative(path)
        if not self.rel:
            raise InvalidInput("path names the workspace root; give a file path such as 'a.txt'")
        self._stack = contextlib.ExitStack()
        try:
            self._root = self._stack.enter_context(fsops.open_root(editor._tree_of(workspace_id)))
            # folders on the way are made only when the upload is complete (finish), so a
            # failed upload leaves nothing behind; the temp goes where the rename will work
            try:
                where = self._stack.enter_context(fsops.resolve(self._root, self.rel))
            except NotFound:
                near, existing = self._root, None
            else:
                near, existing = where.dir_fd, fsops.lstat_at(where.dir_fd, where.name)
            if existing is not None and not stat_mod.S_ISREG(existing.st_mode):
                raise InvalidInput(
                    f"{self.rel!r} is a {_kind(existing)}; delete it first or write elsewhere",
                    path=self.rel,
                )
            if mode is None:
                mode = existing.st_mode if existing is not None else fsops.FILE_MODE
            self.mode = mode & fsops.PERMISSION_BITS
            self._temp_dir, self._temp = editor._temp_for(near)
            self._stack.callback(os.close, self._temp_dir)
            self._fd = os.open(self._temp, fsops.O_NEW, 0o600, dir_fd=self._temp_dir)
        except BaseException:
            self._stack.close()
            raise
        self._hasher = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            if fsops.out_of_room(exc):
                raise OutOfRoom(
                    f"the workspace's filesystem is out of room ({exc.strerror}) after "
                    f"{self.size} bytes of {self.rel!r}; nothing was changed; free space or "
                    f"upload less"
                ) from None
            raise
        self._hasher.update(chunk)
        self.size += len(chunk)

    def finish(self) -> EditResult:
        try:
            os.fchmod(self._fd, self.mode)
            if self._editor._owner is not None:
                os.fchown(self._fd, *self._editor._owner)
            os.close(self._fd)
            self._fd = -1
            with (
                self._editor._lock.hold(),
                fsops.resolve(
                    self._root, self.rel, create_parents=True, owner=self._editor._owner
                ) as where,
            ):
                try:
                    self._editor._place(self._temp_dir, self._temp, where.dir_fd, where.name)
                except OSError as exc:
                    if exc.errno != errno.EXDEV:  # the folder is another mount: copy it over
                        raise
                    self._editor._copy_over(self._temp_dir, self._temp, where.dir_fd, where.name)
                    os.unlink(self._temp, dir_fd=self._temp_dir)
                entry = PathEntry(
                    path=self.rel,
                    kind="file",
                    size=self.size,
                    mode=self.mode,
                    sha256=self._hasher.hexdigest(),
                )
                return self._editor._commit(self._workspace_id, _Done(written=[entry]))
        except BaseException:
            self.abort()
            raise
        finally:
            self._stack.close()

    def abort(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        with contextlib.suppress(OSError):
            os.unlink(self._temp, dir_fd=self._temp_dir)
        self._stack.close()


class _QueueReader:
    """A blocking file-like reader over chunks an event loop puts into a queue."""

    def __init__(self, chunks: queue.Queue[bytes | None]) -> None:
        self._chunks = chunks
        self._buf = bytearray()
        self._eof = False

    def read(self, n: int = -1) -> bytes:
        while not self._eof and (n < 0 or len(self._buf) < n):
            chunk = self._chunks.get()
            if chunk is None:
                self._eof = True
            else:
                self._buf += chunk
        if n < 0:
            n = len(self._buf)
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def drain(self) -> None:
        """Consume what is left so the feeding side never blocks on a full queue."""
        while not self._eof:
            if self._chunks.get() is None:
                self._eof = True

    def readable(self) -> bool:
        return True


def _copy_stream(source: IO[bytes], fd: int) -> None:
    while True:
        data = source.read(1 << 20)
        if not data:
            return
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view) :]
        except OSError as exc:
            if fsops.out_of_room(exc):
                raise OutOfRoom(
                    f"the runner is out of room ({exc.strerror}) while unpacking the upload; "
                    f"nothing was changed"
                ) from None
            raise


def _kind(st: os.stat_result) -> str:
    if stat_mod.S_ISDIR(st.st_mode):
        return "folder"
    if stat_mod.S_ISLNK(st.st_mode):
        return "symbolic link"
    if stat_mod.S_ISREG(st.st_mode):
        return "file"
    return "special file"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ShellyardError):
        return exc.message
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}"
    return str(exc)


__all__ = ["Editor", "FileUpload"]

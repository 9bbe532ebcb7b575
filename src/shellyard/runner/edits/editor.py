"""Writer operations on a workspace's live tree (W1, W3, W6, T2, T3): write a file, unpack a
tar upload, delete, move, restore a snapshot, apply a transfer batch. Each ends with a commit,
so its result is a snapshot; the control plane holds the workspace's writer around it.

Every path goes through ``runner/workspace_paths.py`` (no symbolic link is ever followed); new
content is placed as ``placing`` describes."""

from __future__ import annotations

import contextlib
import errno
import os
import queue
import stat as stat_mod
import tarfile

from shellyard.errors import InvalidInput, NotFound, ShellyardError
from shellyard.paths import normalize_relative
from shellyard.runner import workspace_paths
from shellyard.runner.edits.placing import Done, Placer, kind_name, reason_of
from shellyard.runner.edits.tar import QueueReader, check_conflicts, unpack_to
from shellyard.runner.edits.tarscan import TarLimits
from shellyard.runner.edits.upload import FileUpload
from shellyard.runner.protocol import ApplyEntry, ApplyOutcome, EditResult, PathEntry
from shellyard.runner.snapshots import history
from shellyard.runner.snapshots.format import KIND_FILE, KIND_LINK
from shellyard.runner.snapshots.trees import SnapshotView
from shellyard.runner.workspace_paths import Folders


class Editor(Placer):
    """The writer operations of one runner. Synchronous (the runner calls it on a worker
    thread); the caller guarantees one writer per workspace."""

    def begin_write(
        self, workspace_id: str, path: str, mode: int | None, room_left: int | None = None
    ) -> FileUpload:
        """``room_left``: bytes the workspace may still grow under its quota (None: no
        quota); the upload is refused once past it (plus the size of the file it replaces)."""
        return FileUpload(self, workspace_id, path, mode, room_left)

    # ------------------------------------------------------------------ delete, move

    def delete(self, workspace_id: str, path: str, recursive: bool) -> EditResult:
        rel = normalize_relative(path)
        if not rel:
            raise InvalidInput(
                "deleting the workspace root is not allowed; delete the files and folders inside it"
            )
        with (
            self.lock.hold(),
            workspace_paths.open_root(self.tree_of(workspace_id)) as root,
            workspace_paths.resolve(root, rel) as where,
        ):
            st = workspace_paths.lstat_at(where.dir_fd, where.name)
            if st is None:
                raise NotFound(f"no {rel!r} in the workspace to delete", path=rel)
            if stat_mod.S_ISDIR(st.st_mode) and not recursive:
                with contextlib.suppress(OSError):
                    os.rmdir(where.name, dir_fd=where.dir_fd)
                    return self.commit_edit(workspace_id, Done(removed=[rel]))
                raise InvalidInput(
                    f"{rel!r} is a folder that is not empty; pass recursive=true to delete it "
                    f"with everything inside",
                    path=rel,
                )
            workspace_paths.remove_at(where.dir_fd, where.name)
            return self.commit_edit(workspace_id, Done(removed=[rel]))

    def move(self, workspace_id: str, source: str, destination: str, overwrite: bool) -> EditResult:
        src = normalize_relative(source)
        dst = workspace_paths.refuse_partial(normalize_relative(destination))
        if not src or not dst:
            raise InvalidInput("the workspace root cannot be moved or replaced; name a path in it")
        if dst == src or dst.startswith(src + "/"):
            raise InvalidInput(
                f"cannot move {src!r} to {dst!r}: a folder cannot move into itself",
                path=src,
            )
        head = self.store.view(workspace_id)
        with self.lock.hold(), workspace_paths.open_root(self.tree_of(workspace_id)) as root:
            with workspace_paths.resolve(root, src) as a:
                st = workspace_paths.lstat_at(a.dir_fd, a.name)
                if st is None:
                    raise NotFound(f"no {src!r} in the workspace to move", path=src)
                with workspace_paths.resolve(root, dst, create_parents=True, owner=self.owner) as b:
                    existing = workspace_paths.lstat_at(b.dir_fd, b.name)
                    if existing is not None:
                        if not overwrite:
                            raise InvalidInput(
                                f"{dst!r} already exists; pass overwrite=true to replace it",
                                path=dst,
                            )
                        workspace_paths.remove_at(b.dir_fd, b.name)
                    os.rename(a.name, b.name, src_dir_fd=a.dir_fd, dst_dir_fd=b.dir_fd)
                    done = Done(removed=[src])
                    self._hint_moved(head, src, dst, b.dir_fd, b.name, done)
            return self.commit_edit(workspace_id, done)

    def _hint_moved(
        self, head: SnapshotView, src: str, dst: str, dir_fd: int, name: str, done: Done
    ) -> None:
        """Hints for the files a move carried: their content is the head's at the old path
        (looked up folder by folder in the head's trees, not in a listing of all of it)."""

        def visit(fd: int, entry: str, old: str, new: str) -> None:
            st = workspace_paths.lstat_at(fd, entry)
            if st is None:
                return
            if stat_mod.S_ISREG(st.st_mode):
                found = head.find(old)
                if found is None:
                    return
                tree, i = found
                if tree.kinds[i] == KIND_FILE and tree.sizes[i] == st.st_size:
                    done.hints[new] = (tree.digest(i), workspace_paths.sig_of(st))
                    moved = PathEntry.model_validate(tree.entry(i, new).model_dump())
                    done.written.append(self.store.blobs.reveal(moved))
            elif stat_mod.S_ISDIR(st.st_mode):
                sub = os.open(entry, workspace_paths.O_DIR, dir_fd=fd)
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
        with self.lock.hold():
            old = history.manifest(self.store, workspace_id, seq)
            head = self.store.view(workspace_id)
            if rel:
                history.check_links(old, rel)
                if old.find(rel) is None and head.find(rel) is None:
                    raise NotFound(
                        f"{rel!r} is neither in snapshot {seq} nor in the head; nothing to restore",
                        path=rel,
                    )
            done = Done()
            gone: set[str] = set()

            def below_gone(p: str) -> bool:
                while "/" in p:
                    p = p.rpartition("/")[0]
                    if p in gone:
                        return True
                return False

            with (
                workspace_paths.open_root(self.tree_of(workspace_id)) as root,
                Folders(root, create=True, owner=self.owner) as folders,
            ):
                # head and old entry by entry in path order (a folder before what is in it),
                # never entering a folder whose tree is the same in both
                for p, now, then in history.pairs(head, old, rel):
                    if below_gone(p):
                        if then is not None:
                            self._materialize(folders, then[0].entry(then[1], p), done)
                        continue
                    if now is not None and (
                        then is None or now[0].kinds[now[1]] != then[0].kinds[then[1]]
                    ):
                        # absent from the old snapshot, or of another kind there: it goes
                        where = folders.resolve(p)
                        folders.forget(p)
                        workspace_paths.remove_at(where.dir_fd, where.name)
                        gone.add(p)
                        done.removed.append(p)
                    if then is None or (
                        now is not None and p not in gone and history.same(now, then)
                    ):
                        continue
                    self._materialize(folders, then[0].entry(then[1], p), done)
            return self.commit_edit(workspace_id, done)

    def _materialize(self, folders: Folders, entry: PathEntry, done: Done) -> None:
        """Write ``entry`` (of an older snapshot) into the live tree (over what is there)."""
        where = folders.resolve(entry.path)
        existing = workspace_paths.lstat_at(where.dir_fd, where.name)
        if entry.kind == "dir":
            if existing is not None and stat_mod.S_ISDIR(existing.st_mode):
                os.chmod(where.name, entry.mode, dir_fd=where.dir_fd, follow_symlinks=False)
                return
            if existing is not None:
                workspace_paths.remove_at(where.dir_fd, where.name)
            self._new_dir(where.dir_fd, where.name, entry.mode)
            return
        if existing is not None and stat_mod.S_ISDIR(existing.st_mode):
            folders.forget(entry.path)
            workspace_paths.remove_at(where.dir_fd, where.name)
        if entry.kind == "symlink":
            self._new_link(where.dir_fd, where.name, entry.target or "")
            return
        assert entry.content_id is not None
        st = self._new_file(
            where.dir_fd, where.name, entry.mode, self._from_object(entry.content_id, entry.size)
        )
        done.hints[entry.path] = (bytes.fromhex(entry.content_id), workspace_paths.sig_of(st))
        done.written.append(self.store.blobs.reveal(entry))

    # ------------------------------------------------------------------ transfer batches

    def apply(
        self, workspace_id: str, entries: list[ApplyEntry]
    ) -> tuple[list[ApplyOutcome], EditResult]:
        """Write a transfer batch into the live tree and commit it (T3): per entry
        ``copied``, ``unchanged`` (already so in the head), ``skipped`` (a symbolic link that
        would point outside the workspace) or ``failed`` with the reason. A failure of one
        entry never stops the others; the commit publishes every entry that was written."""
        outcomes: list[ApplyOutcome] = []
        done = Done()
        with self.lock.hold():
            head = self.store.view(workspace_id)
            with (
                workspace_paths.open_root(self.tree_of(workspace_id)) as root,
                Folders(root, create=True, owner=self.owner) as folders,
            ):
                for entry in sorted(entries, key=lambda e: e.path):
                    try:
                        outcome, reason = self._apply_one(folders, head, entry, done)
                    except (ShellyardError, OSError) as exc:
                        outcome, reason = "failed", reason_of(exc)
                    outcomes.append(ApplyOutcome(path=entry.path, outcome=outcome, reason=reason))
            result = self.commit_edit(workspace_id, done)
        return outcomes, result

    def _apply_one(
        self,
        folders: Folders,
        head: SnapshotView,
        entry: ApplyEntry,
        done: Done,
    ) -> tuple[str, str | None]:
        rel = workspace_paths.refuse_partial(normalize_relative(entry.path))
        if not rel:
            return ("unchanged", None) if entry.kind == "dir" else ("failed", "empty path")
        mode = entry.mode & workspace_paths.PERMISSION_BITS
        found = head.find(rel)
        if entry.kind == "symlink":
            target = entry.target or ""
            if workspace_paths.escapes(rel, target):
                return "skipped", f"symbolic link to {target!r} would point outside the workspace"
            if (
                found is not None
                and found[0].kinds[found[1]] == KIND_LINK
                and found[0].targets[found[1]] == target
            ):
                return "unchanged", None
        elif entry.kind == "file":
            if entry.sha256 is None:
                return "failed", "no content named for the file"
            digest = bytes.fromhex(entry.sha256)
            if (
                found is not None
                and found[0].kinds[found[1]] == KIND_FILE
                and found[0].digest(found[1]) == digest
                and found[0].modes[found[1]] & workspace_paths.PERMISSION_BITS == mode
            ):
                return "unchanged", None
        where = folders.resolve(rel)
        existing = workspace_paths.lstat_at(where.dir_fd, where.name)
        if entry.kind == "dir":
            if existing is None:
                self._new_dir(where.dir_fd, where.name, mode)
                return "copied", None
            if stat_mod.S_ISDIR(existing.st_mode):
                return "unchanged", None
            return "failed", f"a {kind_name(existing)} is in the way at {rel!r}"
        if existing is not None and not stat_mod.S_ISREG(existing.st_mode):
            return "failed", f"a {kind_name(existing)} is in the way at {rel!r}"
        if entry.kind == "symlink":
            self._new_link(where.dir_fd, where.name, entry.target or "")
            return "copied", None
        assert entry.sha256 is not None
        st = self._new_file(
            where.dir_fd, where.name, mode, self._from_object(entry.sha256, entry.size)
        )
        done.hints[rel] = (bytes.fromhex(entry.sha256), workspace_paths.sig_of(st))
        return "copied", None

    # ------------------------------------------------------------------ tar uploads

    def unpack(
        self,
        workspace_id: str,
        path: str,
        chunks: queue.Queue[bytes | None],
        limits: TarLimits | None = None,
    ) -> EditResult:
        """Unpack a tar stream (fed through ``chunks``; None ends it) below ``path``.

        Two phases, so a bad archive changes nothing: everything is unpacked into a private
        staging tree first (members named absolute or with ``..``, symbolic links pointing
        outside, hard links and devices refuse the whole upload), then moved into place.
        """
        dest = workspace_paths.refuse_partial(normalize_relative(path))
        self.tree_of(workspace_id)  # R2 tenants: the workspace's owner for this thread
        stage = self._staging / workspace_paths.temp_name(".tar")
        stage.mkdir(mode=0o700)
        reader = QueueReader(chunks)
        try:
            try:
                members = unpack_to(stage, dest, reader, self.owner, limits, self.room)
            except tarfile.TarError as exc:
                raise InvalidInput(
                    f"the upload is not a readable tar archive ({exc}); send a tar stream "
                    "(for example `tar -c -C FOLDER .`) as the body; nothing was unpacked"
                ) from None
            with self.lock.hold(), workspace_paths.open_root(self.tree_of(workspace_id)) as root:
                done = Done()
                with (
                    workspace_paths.open_root(stage) as stage_fd,
                    Folders(stage_fd) as staged,
                    Folders(root, create=True, owner=self.owner) as folders,
                ):
                    check_conflicts(root, dest, members)
                    for name, kind, mode in members:
                        full = f"{dest}/{name}" if dest else name
                        where = folders.resolve(full)
                        existing = workspace_paths.lstat_at(where.dir_fd, where.name)
                        if kind == "dir":
                            if existing is None:
                                self._new_dir(where.dir_fd, where.name, mode)
                            continue
                        src = staged.resolve(name)
                        if existing is not None:
                            workspace_paths.remove_at(where.dir_fd, where.name)
                        try:
                            st = self.place(src.dir_fd, src.name, where.dir_fd, where.name)
                        except OSError as exc:
                            if exc.errno != errno.EXDEV:
                                raise
                            st = self.copy_over(src.dir_fd, src.name, where.dir_fd, where.name)
                        if kind == "file":
                            done.written.append(
                                PathEntry(path=full, kind="file", size=st.st_size, mode=mode)
                            )
                return self.commit_edit(workspace_id, done)
        finally:
            reader.drain()
            # the staged members (links among them) removed through descriptors, never followed
            with contextlib.suppress(OSError), workspace_paths.open_root(stage.parent) as parent:
                workspace_paths.remove_at(parent, stage.name)


__all__ = ["Editor", "FileUpload"]

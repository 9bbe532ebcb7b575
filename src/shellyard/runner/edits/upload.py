"""One streamed file write into a workspace (T2): chunks into a temp file, renamed into
place and committed when complete, so a failed upload leaves nothing behind."""

from __future__ import annotations

import contextlib
import errno
import os
import stat as stat_mod

from shellyard.errors import InvalidInput, NotFound, OutOfRoom, TooLarge
from shellyard.paths import normalize_relative
from shellyard.runner import workspace_paths
from shellyard.runner.edits.placing import Done, Placer, kind_name
from shellyard.runner.edits.tar import ROOM_CHECK_BYTES
from shellyard.runner.protocol import EditResult, PathEntry
from shellyard.runner.snapshots.contentid import ContentId, pread_reread


class FileUpload:
    """One streamed file write: ``write`` chunks, then ``finish`` (renames it into place and
    commits) or ``abort``. Runs on worker threads; the bytes are hashed as they come (the
    content id that names them in the snapshot store)."""

    def __init__(
        self,
        editor: Placer,
        workspace_id: str,
        path: str,
        mode: int | None,
        room_left: int | None = None,
    ) -> None:
        self._editor = editor
        self._workspace_id = workspace_id
        self.rel = workspace_paths.refuse_partial(normalize_relative(path))
        if not self.rel:
            raise InvalidInput("path names the workspace root; give a file path such as 'a.txt'")
        self._stack = contextlib.ExitStack()
        try:
            self._root = self._stack.enter_context(
                workspace_paths.open_root(editor.tree_of(workspace_id))
            )
            self._owner = editor.owner  # finish may run on another thread
            # folders on the way are made only when the upload is complete (finish), so a
            # failed upload leaves nothing behind; the temp goes where the rename will work
            try:
                where = self._stack.enter_context(workspace_paths.resolve(self._root, self.rel))
            except NotFound:
                near, existing = self._root, None
            else:
                near, existing = where.dir_fd, workspace_paths.lstat_at(where.dir_fd, where.name)
            if existing is not None and not stat_mod.S_ISREG(existing.st_mode):
                raise InvalidInput(
                    f"{self.rel!r} is a {kind_name(existing)}; delete it first or write elsewhere",
                    path=self.rel,
                )
            # limits (R2, docs/limits.md "Uploads and the quota"): the bytes it may hold are
            # the room left under the quota plus those of the file it replaces
            self.max_bytes = (
                None
                if room_left is None
                else max(0, room_left) + (existing.st_size if existing is not None else 0)
            )
            if mode is None:
                mode = existing.st_mode if existing is not None else workspace_paths.FILE_MODE
            self.mode = mode & workspace_paths.PERMISSION_BITS
            self._temp_dir, self._temp = editor.temp_for(near)
            self._stack.callback(os.close, self._temp_dir)
            self._fd = os.open(self._temp, workspace_paths.O_NEW, 0o600, dir_fd=self._temp_dir)
            # the content id may read back what arrived (a zero MiB after data: contentid.py)
            reader = os.open(self._temp, workspace_paths.O_FILE, dir_fd=self._temp_dir)
            self._stack.callback(os.close, reader)
        except BaseException:
            self._stack.close()
            raise
        self._content = ContentId(reread=pread_reread(reader))
        self.size = 0
        self._unchecked = 0  # bytes written since the reserve was last checked

    def write(self, chunk: bytes) -> None:
        if self.max_bytes is not None and self.size + len(chunk) > self.max_bytes:
            raise TooLarge(
                f"the upload of {self.rel!r} passed {self.max_bytes} bytes, the room left "
                f"under the workspace quota; nothing was changed; upload less or free room "
                f"(delete files)",
                path=self.rel,
                limit=self.max_bytes,
            )
        self._unchecked += len(chunk)
        if self._editor.room is not None and self._unchecked >= ROOM_CHECK_BYTES:
            self._unchecked = 0
            self._editor.room()  # LowOnSpace below the volume's reserve (docs/limits.md)
        view = memoryview(chunk)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            if workspace_paths.out_of_room(exc):
                raise OutOfRoom(
                    f"the workspace's filesystem is out of room ({exc.strerror}) after "
                    f"{self.size} bytes of {self.rel!r}; nothing was changed; free space or "
                    f"upload less"
                ) from None
            raise
        self._content.update(chunk)
        self.size += len(chunk)

    def finish(self) -> EditResult:
        try:
            os.fchmod(self._fd, self.mode)
            if self._owner is not None:
                os.fchown(self._fd, *self._owner)
            os.close(self._fd)
            self._fd = -1
            with (
                self._editor.lock.hold(),
                workspace_paths.resolve(
                    self._root, self.rel, create_parents=True, owner=self._owner
                ) as where,
            ):
                try:
                    self._editor.place(self._temp_dir, self._temp, where.dir_fd, where.name)
                except OSError as exc:
                    if exc.errno != errno.EXDEV:  # the folder is another mount: copy it over
                        raise
                    self._editor.copy_over(self._temp_dir, self._temp, where.dir_fd, where.name)
                    os.unlink(self._temp, dir_fd=self._temp_dir)
                content_id = self._content.digest().hex()
                entry = PathEntry(
                    path=self.rel,
                    kind="file",
                    size=self.size,
                    mode=self.mode,
                    sha256=None if self._content.is_chunk_list else content_id,
                    content_id=content_id,
                )
                return self._editor.commit_edit(self._workspace_id, Done(written=[entry]))
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

"""Tar uploads: reading a tar stream into a private staging tree, refusing what cannot be
unpacked safely (absolute or ``..`` members, links pointing outside, hard links, devices)."""

from __future__ import annotations

import os
import queue
import stat as stat_mod
import tarfile
from pathlib import Path
from typing import IO, cast

from shellyard.errors import InvalidInput, NotFound, OutOfRoom, PathRefused
from shellyard.paths import normalize_relative
from shellyard.runner import workspace_paths
from shellyard.runner.edits.placing import kind_name
from shellyard.runner.workspace_paths import Folders, Owner

#: A member to place: (path below the destination, "dir" | "file" | "symlink", mode).
Member = tuple[str, str, int]


def check_conflicts(root: int, dest: str, members: list[tuple[str, str, int]]) -> None:
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
            existing = workspace_paths.lstat_at(where.dir_fd, where.name)
            if existing is None:
                continue
            is_dir = stat_mod.S_ISDIR(existing.st_mode)
            if (kind == "dir") != is_dir or stat_mod.S_ISLNK(existing.st_mode):
                raise InvalidInput(
                    f"the upload has a {'folder' if kind == 'dir' else kind} at {full!r} "
                    f"where the workspace has a {kind_name(existing)}; delete it first or "
                    f"upload elsewhere; nothing was changed",
                    path=full,
                )


def unpack_to(
    stage: Path, dest: str, reader: QueueReader, owner: Owner
) -> list[tuple[str, str, int]]:
    members: list[tuple[str, str, int]] = []
    with (
        tarfile.open(fileobj=cast(IO[bytes], reader), mode="r|*") as tar,
        workspace_paths.open_root(stage) as stage_fd,
        Folders(stage_fd, create=True) as folders,
    ):
        for member in tar:
            name = normalize_relative(member.name)
            full = f"{dest}/{name}" if dest else name
            if not name:
                continue
            mode = member.mode & workspace_paths.PERMISSION_BITS
            where = folders.resolve(name)
            if member.isdir():
                if workspace_paths.lstat_at(where.dir_fd, where.name) is None:
                    os.mkdir(where.name, 0o700, dir_fd=where.dir_fd)
                members.append((name, "dir", mode or workspace_paths.DIR_MODE))
            elif member.isreg():
                source = tar.extractfile(member)
                assert source is not None
                workspace_paths.remove_at(where.dir_fd, where.name)
                fd = os.open(where.name, workspace_paths.O_NEW, 0o600, dir_fd=where.dir_fd)
                try:
                    _copy_stream(source, fd)
                    os.fchmod(fd, mode)
                    if owner is not None:
                        os.fchown(fd, *owner)
                finally:
                    os.close(fd)
                members.append((name, "file", mode))
            elif member.issym():
                if workspace_paths.escapes(full, member.linkname):
                    raise PathRefused(
                        f"the archive's symbolic link {member.name!r} points to "
                        f"{member.linkname!r}, outside the workspace; nothing was unpacked",
                        path=member.name,
                    )
                workspace_paths.remove_at(where.dir_fd, where.name)
                os.symlink(member.linkname, where.name, dir_fd=where.dir_fd)
                workspace_paths.chown_at(where.dir_fd, where.name, owner)
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


class QueueReader:
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
            if workspace_paths.out_of_room(exc):
                raise OutOfRoom(
                    f"the runner is out of room ({exc.strerror}) while unpacking the upload; "
                    f"nothing was changed"
                ) from None
            raise

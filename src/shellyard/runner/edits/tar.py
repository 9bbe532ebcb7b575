"""Tar uploads: reading a tar stream into a private staging tree, refusing what cannot be
unpacked safely (absolute or ``..`` members, links pointing outside, hard links, devices)."""

from __future__ import annotations

import os
import queue
import stat as stat_mod
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, cast

from shellyard.errors import InvalidInput, NotFound, OutOfRoom, PathRefused
from shellyard.paths import normalize_relative
from shellyard.runner import workspace_paths
from shellyard.runner.edits.placing import kind_name
from shellyard.runner.edits.tarscan import BoundedTar, TarLimits
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


#: How often (bytes written) an unpack looks at the runner's free-space reserve: a 389 KB
#: tar.gz can expand to fill a volume between two chunks of its upload.
ROOM_CHECK_BYTES = 8 << 20
#: The same in members: an archive of empty files fills the inode table, not the bytes.
ROOM_CHECK_MEMBERS = 1000


def unpack_to(
    stage: Path,
    dest: str,
    reader: QueueReader,
    owner: Owner,
    limits: TarLimits | None = None,
    room: Callable[[], None] | None = None,
) -> list[tuple[str, str, int]]:
    """``room`` raises (LowOnSpace) when the volume fell below its reserve: called every
    ``ROOM_CHECK_BYTES`` written and every ``ROOM_CHECK_MEMBERS`` members, so the expansion
    stops as it writes, not at ENOSPC."""
    written = [0]
    members: list[tuple[str, str, int]] = []
    # tarfile reads only what the bounded scan let through (tarscan.py, CVE-2024-6232)
    scanned = BoundedTar(reader, limits or TarLimits())
    with (
        tarfile.open(fileobj=cast(IO[bytes], scanned), mode="r|") as tar,
        workspace_paths.open_root(stage) as stage_fd,
        Folders(stage_fd, create=True) as folders,
    ):
        for count, member in enumerate(tar, 1):
            vars(tar)["members"].clear()  # read once as a stream: keep no list of them all
            if room is not None and count % ROOM_CHECK_MEMBERS == 0:
                room()  # empty members take inodes, not bytes (reserve.inode_reserve)
            name = workspace_paths.refuse_partial(normalize_relative(member.name))
            full = f"{dest}/{name}" if dest else name
            if not name:
                continue
            mode = member.mode & workspace_paths.PERMISSION_BITS
            where = folders.resolve(name)
            if member.isdir():
                staged = workspace_paths.lstat_at(where.dir_fd, where.name)
                if staged is not None and not stat_mod.S_ISDIR(staged.st_mode):
                    # a later member wins, as with tar -x
                    workspace_paths.remove_at(where.dir_fd, where.name)
                    staged = None
                if staged is None:
                    os.mkdir(where.name, 0o700, dir_fd=where.dir_fd)
                members.append((name, "dir", mode or workspace_paths.DIR_MODE))
            elif member.isreg():
                source = tar.extractfile(member)
                assert source is not None
                workspace_paths.remove_at(where.dir_fd, where.name)
                fd = os.open(where.name, workspace_paths.O_NEW, 0o600, dir_fd=where.dir_fd)
                try:
                    _copy_stream(source, fd, room, written)
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
    return staged_members(members)


def staged_members(members: list[Member]) -> list[Member]:
    """What the staging tree holds, parents before their children: a member listed twice
    keeps its last kind, and members below one that a later member made a file or a link
    went with the folder (as with ``tar -x``). The list is the staged tree's, so moving it
    into place can meet no link or file of its own making (docs/files-and-transfers.md)."""
    last: dict[str, Member] = {}
    for member_info in members:
        last[member_info[0]] = member_info
    kept: list[Member] = []
    for name in sorted(last):
        parent = name.rpartition("/")[0]
        while parent and (parent not in last or last[parent][1] == "dir"):
            parent = parent.rpartition("/")[0]
        if not parent:
            kept.append(last[name])
    return kept


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


def _copy_stream(
    source: IO[bytes], fd: int, room: Callable[[], None] | None, written: list[int]
) -> None:
    while True:
        data = source.read(1 << 20)
        if not data:
            return
        written[0] += len(data)
        if room is not None and written[0] >= ROOM_CHECK_BYTES:
            written[0] = 0
            room()
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

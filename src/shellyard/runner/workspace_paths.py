"""Workspace paths on the live tree (W6): the one resolver every runner file operation uses.

``resolve`` takes a caller's path, normalises its text (``paths.normalize_relative`` refuses
absolute paths, ``..`` that leaves the root, NUL bytes and over-long names) and then walks it
from a descriptor of the workspace root one component at a time with ``O_NOFOLLOW``. A symbolic
link is therefore never followed — whether it points outside, inside, through a chain of other
links, or was swapped in between a check and the use: the kernel refuses to open it as a folder
at the moment of use, and the caller gets ``PathRefused`` naming the link. Every later step
(create, rename, unlink, open) is relative to the parent folder's descriptor, never a path
string, so nothing outside the workspace can be reached by a race either.

Also here: small fd-relative helpers (stat, remove a tree, copy bytes between descriptors)
shared by the writer operations and the transfer code.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat as stat_mod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from shellyard.contract.snapshots import CONTENT_CHUNK
from shellyard.errors import InvalidInput, NotFound, OutOfRoom, PathRefused
from shellyard.paths import normalize_relative

O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

#: Folders made on a caller's behalf, and files when no mode is given.
DIR_MODE = 0o755
FILE_MODE = 0o644
#: Permission bits a written file or folder may carry (no setuid, setgid or sticky).
PERMISSION_BITS = 0o777
COPY_CHUNK = 8 << 20
#: Files up to this size are copied with one read and one write.
SMALL_COPY = 1 << 20

#: (uid, gid) that new entries are given (the sandbox's), or None to keep the runner's.
Owner = tuple[int, int] | None
#: A file's identity for the commit's hints: (mtime_ns, ctime_ns, size, inode).
Sig = tuple[int, int, int, int]


@dataclass
class Resolved:
    """A workspace path resolved to its parent folder's descriptor (owned by the caller
    through ``resolve``'s context) and its last component (``""`` for the root itself)."""

    dir_fd: int
    name: str
    rel: str


@contextlib.contextmanager
def open_root(tree: Path) -> Iterator[int]:
    """A descriptor on a workspace's root folder (the tree itself is never a link)."""
    try:
        fd = os.open(tree, O_DIR)
    except FileNotFoundError:
        raise NotFound(f"workspace folder {tree.name} does not exist on this runner") from None
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def resolve(
    root_fd: int, path: str, *, create_parents: bool = False, owner: Owner = None
) -> Iterator[Resolved]:
    """Resolve ``path`` below the workspace root without following any symbolic link.

    Yields the parent folder's descriptor and the last name. ``create_parents`` makes missing
    folders on the way (mode 0755, given to ``owner``). Raises ``PathRefused`` for a path that
    is absolute, climbs out, or crosses a symbolic link; ``InvalidInput`` when a component is a
    file; ``NotFound`` when a folder on the way is missing and may not be created.
    """
    with Folders(root_fd, create=create_parents, owner=owner) as folders:
        yield folders.resolve(path)


class Folders:
    """``resolve`` for many paths of one operation: folders already reached stay open (up
    to a bound), so a batch of 10,000 files does not walk from the root 10,000 times. Each
    folder is still entered with ``O_NOFOLLOW`` from its parent's descriptor."""

    MAX_OPEN = 256

    def __init__(self, root_fd: int, *, create: bool = False, owner: Owner = None) -> None:
        self._root = root_fd
        self._create = create
        self._owner = owner
        self._fds: dict[str, int] = {}

    def __enter__(self) -> Folders:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def resolve(self, path: str) -> Resolved:
        """The parent's descriptor (owned by this object: do not close it) and last name."""
        rel = normalize_relative(path)
        parent, _, name = rel.rpartition("/")
        return Resolved(self.folder(parent, rel), name, rel)

    def folder(self, rel: str, for_path: str | None = None) -> int:
        """A descriptor of the folder ``rel`` (normalised, ``""`` the root)."""
        if not rel:
            return self._root
        fd = self._fds.get(rel)
        if fd is not None:
            return fd
        if len(self._fds) >= self.MAX_OPEN:
            self.close()
        parent, _, name = rel.rpartition("/")
        parent_fd = self.folder(parent, for_path)
        fd = _enter(os.dup(parent_fd), name, rel, for_path or rel, self._create, self._owner)
        self._fds[rel] = fd
        return fd

    def forget(self, rel: str) -> None:
        """Drop cached folders at or below ``rel`` (it was removed or moved)."""
        for key in [k for k in self._fds if k == rel or k.startswith(rel + "/")]:
            os.close(self._fds.pop(key))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _enter(fd: int, part: str, prefix: str, rel: str, create: bool, owner: Owner) -> int:
    """Open folder ``part`` below ``fd`` (closing ``fd``), refusing links."""
    try:
        try:
            return _open_dir(fd, part, prefix, rel)
        except FileNotFoundError:
            if not create:
                raise NotFound(
                    f"no folder {prefix!r} in the workspace, so {rel!r} cannot exist; check "
                    f"the path (relative to the workspace root)",
                    path=rel,
                ) from None
        with contextlib.suppress(FileExistsError):
            os.mkdir(part, DIR_MODE, dir_fd=fd)
            chown_at(fd, part, owner)
        return _open_dir(fd, part, prefix, rel)
    finally:
        os.close(fd)


def _open_dir(fd: int, part: str, prefix: str, rel: str) -> int:
    try:
        return os.open(part, O_DIR, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise refusal(fd, part, prefix, rel) from None
        raise


def refusal(dir_fd: int, name: str, prefix: str, rel: str) -> InvalidInput:
    """The error for a component that is not a real folder: a link (refused) or a file."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        st = None
    if st is not None and stat_mod.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            target = "?"
        return link_refused(rel, prefix, target)
    return InvalidInput(
        f"{prefix!r} is a file, not a folder, so {rel!r} cannot be inside it; "
        f"give a path whose folders exist or can be made",
        path=rel,
    )


def link_refused(rel: str, link: str, target: str) -> PathRefused:
    where = "outside the workspace" if escapes(link, target) else "elsewhere"
    return PathRefused(
        f"path {rel!r} crosses the symbolic link {link!r} (→ {target!r}, {where}); links "
        f"are never followed: give the real path of the file or folder",
        path=rel,
    )


def escapes(link_path: str, target: str) -> bool:
    """Whether a symbolic link at ``link_path`` whose text is ``target`` points outside the
    workspace (absolute, or climbing above the root from where it sits)."""
    if target.startswith("/") or not target:
        return True
    depth = len(link_path.split("/")) - 1  # folders above the link inside the workspace
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def sig_of(st: os.stat_result) -> Sig:
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)


def chown_at(dir_fd: int, name: str, owner: Owner) -> None:
    if owner is not None:
        os.chown(name, owner[0], owner[1], dir_fd=dir_fd, follow_symlinks=False)


#: What every temp name starts with. One made beside its target (the staging folder on
#: another device, as under a workspace's overlay) and left by a crash is never committed
#: (``is_partial``, snapshots/scan.py) and is swept at the next start (edits/placing.py).
PARTIAL = ".shellyard-partial-"


def temp_name(hint: str = "") -> str:
    return f"{PARTIAL}{secrets.token_hex(6)}{hint}"


def is_partial(name: str) -> bool:
    """Whether ``name`` is one ``temp_name()`` gives (no hint): the prefix and 12 lowercase
    hex digits, nothing else, so a command's own ``.shellyard-partial-notes`` stays a file."""
    tail = name[len(PARTIAL) :]
    return (
        name.startswith(PARTIAL)
        and len(tail) == 12
        and all(ch in "0123456789abcdef" for ch in tail)
    )


def refuse_partial(rel: str) -> str:
    """``rel`` (normalised) unless a component is a name ``temp_name()`` gives: a file of
    that name is never committed and is swept after a crash (``is_partial``), so a door that
    wrote one would answer success and lose it. Refused with ``PathRefused`` instead (R2,
    docs/security.md "Attack pass (session 41)"); a command's own such file is documented
    (docs/limits.md)."""
    for part in rel.split("/"):
        if is_partial(part):
            raise PathRefused(
                f"path {rel!r} uses the name {part!r}, which shellyard keeps for its own "
                f"temp files ({PARTIAL!r} and 12 hex digits are never committed); "
                f"pick another name",
                path=rel,
            )
    return rel


def remove_at(dir_fd: int, name: str) -> int:
    """Remove ``name`` below ``dir_fd`` (a whole folder tree too), never following a link.
    Returns the number of entries removed."""
    st = lstat_at(dir_fd, name)
    if st is None:
        return 0
    if not stat_mod.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return 1
    removed = 0
    fd = os.open(name, O_DIR, dir_fd=dir_fd)
    try:
        for child in os.listdir(fd):
            removed += remove_at(fd, child)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)
    return removed + 1


# ---------------------------------------------------------------- files with holes
#
# Files with holes (sparse files) read, stored and copied without filling their holes.
#
# ``truncate -s 3G big`` in a workspace, or a build that leaves such a file in its prefix, takes
# no block of the volume: the free-space reserve never sees it (R2, docs/limits.md "Sparse
# files"). The snapshot store names an object by a content id that skips whole MiBs of zeros
# (snapshots/contentid.py), so a hole is neither read, hashed nor written: an object, a restored
# file and a read view keep the holes of the file they came from, and their blocks are the
# file's data blocks. The data ranges come from ``SEEK_DATA``/``SEEK_HOLE`` (every Linux file
# system answers them; one without its own support reports the whole file as data).

#: Bytes read, hashed and written at a time (and the most zeros hashed at once).
HOLE_CHUNK = CONTENT_CHUNK
_ZEROS = bytes(HOLE_CHUNK)
_ZERO_VIEW = memoryview(_ZEROS)


class Hasher(Protocol):
    def update(self, data: bytes | bytearray | memoryview, /) -> None: ...


class HoleHasher(Hasher, Protocol):
    """A hasher told where the holes are (``snapshots.contentid.ContentId``): it may skip them."""

    def zeros(self, count: int, /) -> None: ...


def zero_view(count: int) -> memoryview:
    """``count`` (at most ``HOLE_CHUNK``) zero bytes, without allocating them."""
    return _ZERO_VIEW[:count]


def has_holes(st: os.stat_result) -> bool:
    """True when the file takes fewer blocks than its size (it has a hole somewhere)."""
    return st.st_blocks * 512 < st.st_size


def hash_cost(fd: int, size: int) -> int:
    """Bytes the content id (snapshots/contentid.py) of a ``size``-byte file runs through
    SHA-256, known from its holes alone (no data read): its size less every whole chunk at a
    multiple of ``HOLE_CHUNK`` that a hole covers; with no such hole the plain sha256 costs
    the size. A chunk holding any data counts whole (its zeros are hashed with it). The
    quota charges it (limits/quota.py), a commit's budget too (snapshots/budget.py).

    One ``SEEK_DATA`` per chunk holding data and per run of free chunks, from chunk starts
    only: a file of many small data ranges costs its MiB, not its ranges (a byte every
    8 KiB would otherwise be 256 seeks a MiB on every walk of the quota)."""
    free = 0
    pos = 0  # a chunk's start: is it a hole to its end (or to the file's)?
    while pos < size:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                data = size  # nothing but a hole from ``pos`` on
            elif exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
                return size  # no SEEK_DATA here: all of it is data
            else:
                raise
        if data >= size:
            free += size - pos  # holes to the end; a last part-chunk too (below)
            break
        free += (data // HOLE_CHUNK - pos // HOLE_CHUNK) * HOLE_CHUNK
        pos = (data // HOLE_CHUNK + 1) * HOLE_CHUNK
    if free < HOLE_CHUNK:
        return size  # no whole chunk free: the plain sha256 reads it all
    return size - free


def data_ranges(fd: int, start: int = 0) -> Iterator[tuple[int, int]]:
    """``(first, end)`` of each range of data from ``start`` on; what lies between them and
    after the last one is a hole. Moves the descriptor's offset (callers use ``pread``)."""
    pos = start
    while True:
        try:
            first = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                return  # nothing but a hole (or the end) from ``pos`` on
            if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            end = os.fstat(fd).st_size  # no SEEK_DATA here: all of it is data
            if end > pos:
                yield pos, end
            return
        end = os.lseek(fd, first, os.SEEK_HOLE)
        if end <= first:
            return
        yield first, end
        pos = end


def hash_zeros(hasher: Hasher, count: int) -> None:
    """Feed ``count`` zero bytes to ``hasher`` (a hole's content) in bounded memory."""
    while count > 0:
        step = min(count, HOLE_CHUNK)
        hasher.update(_ZERO_VIEW[:step])
        count -= step


def is_zeros(data: bytes | bytearray | memoryview) -> bool:
    """True when every byte is 0 (a compare that stops at the first other byte)."""
    view = memoryview(data)
    while view:
        step = min(len(view), HOLE_CHUNK)
        if not _ZEROS.startswith(view[:step]):
            return False
        view = view[step:]
    return True


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def copy_hashing(src: int, dst: int, start: int, hasher: HoleHasher) -> int:
    """Copy ``src`` from ``start`` to its end into ``dst`` at the same offsets, hashing every
    data byte and telling ``hasher`` of each hole (``zeros``), writing only the data ranges:
    the holes stay holes in ``dst``. Each piece is written before it is hashed, so ``dst``
    holds everything hashed so far (a content id may read it back). Returns the size copied
    (the file may change meanwhile: what was hashed is what ``dst`` holds)."""
    buf = bytearray(HOLE_CHUNK)
    view = memoryview(buf)
    pos = start
    for first, end in data_ranges(src, start):
        hasher.zeros(first - pos)
        pos = first
        while pos < end:
            n = os.preadv(src, [view[: min(HOLE_CHUNK, end - pos)]], pos)
            if n == 0:  # it shrank under us: it ends here
                os.ftruncate(dst, pos)
                return pos
            pwrite_all(dst, view[:n], pos)
            hasher.update(view[:n])
            pos += n
    size = max(pos, os.fstat(src).st_size)
    hasher.zeros(size - pos)
    os.ftruncate(dst, size)  # a hole at the end is a size, not blocks
    return size


def copy_ranges(src: int, dst: int, size: int | None, chunk: int) -> int:
    """Copy a file with holes from offset 0 into ``dst`` (an empty file), data ranges only
    (``copy_file_range`` each), then set its size: no hole is filled. Returns the size."""
    limit = os.fstat(src).st_size if size is None else size
    for first, end in data_ranges(src, 0):
        pos, end = first, min(end, limit)
        while pos < end:
            n = os.copy_file_range(src, dst, min(chunk, end - pos), pos, pos)
            if n == 0:
                break
            pos += n
        if end >= limit:
            break
    os.ftruncate(dst, limit)
    return limit


def copy_fd(src: int, dst: int, size: int | None = None) -> int:
    """Copy ``src`` (from its offset 0) into ``dst`` in the kernel where it can
    (``copy_file_range``: a reflink on filesystems that share blocks), else by reads and
    writes in bounded chunks. Returns the bytes copied; raises ``OutOfRoom`` on ENOSPC or
    EDQUOT."""
    copied = 0
    try:
        if size is not None and size <= SMALL_COPY:
            # one read and one write: cheaper than copy_file_range for small files (measured)
            data = os.pread(src, size + 1, 0)
            if len(data) == size:
                view = memoryview(data)
                while view:
                    view = view[os.write(dst, view) :]
                return size
        try:
            if has_holes(os.fstat(src)):
                # its holes stay holes: a restored `truncate -s 3G` takes no 3 GiB (R2)
                return copy_ranges(src, dst, size, COPY_CHUNK)
            while size is None or copied < size:
                n = os.copy_file_range(src, dst, COPY_CHUNK, copied, copied)
                if n == 0:
                    break
                copied += n
            return copied
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
        # copy_file_range refused these descriptors: the plain way, from where it stopped
        while True:
            chunk = os.pread(src, COPY_CHUNK, copied)
            if not chunk:
                break
            if not is_zeros(chunk):  # zeros are left a hole, as copy_ranges does
                pwrite_all(dst, chunk, copied)
            copied += len(chunk)
        os.ftruncate(dst, copied)
        return copied
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OutOfRoom(
                f"the workspace's filesystem is out of room ({exc.strerror}) after "
                f"{copied} bytes; free space or copy less",
            ) from None
        raise


def out_of_room(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "PERMISSION_BITS",
    "Folders",
    "Hasher",
    "HoleHasher",
    "Owner",
    "Resolved",
    "Sig",
    "copy_fd",
    "copy_hashing",
    "copy_ranges",
    "data_ranges",
    "escapes",
    "has_holes",
    "hash_zeros",
    "is_partial",
    "is_zeros",
    "link_refused",
    "lstat_at",
    "open_root",
    "pwrite_all",
    "refuse_partial",
    "remove_at",
    "resolve",
    "sig_of",
    "temp_name",
    "zero_view",
]

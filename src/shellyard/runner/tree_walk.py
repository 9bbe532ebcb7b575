"""Walking a tree that someone else may be changing, by descriptors only (backups, restores).

A root process copying an agent's tree must never be led out of it: a folder checked with
``lstat`` and then listed by its path can have been swapped for a link to a host folder in
between. Here each folder is entered with ``O_DIRECTORY|O_NOFOLLOW`` from its parent's
descriptor and must still be the inode that was listed (device, inode), so a link swapped in
at any moment is refused by the kernel at the moment of use, and a folder swapped for another
one is left out like one that vanished. Callers open the files by ``dir_fd`` with
``O_NOFOLLOW`` (``workspace_paths.O_FILE``) for the same reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from enum import Enum

from shellyard.runner.workspace_paths import O_DIR

#: errno values of an entry that vanished or changed kind between listing and use: ELOOP
#: (now a link, O_NOFOLLOW), ENOTDIR (now a file), ENOENT (gone), ENXIO (now a socket).
CHANGED = frozenset({errno.ELOOP, errno.ENOTDIR, errno.ENOENT, errno.ENXIO})


class Step(Enum):
    #: an entry that is not a folder (file, link, anything else): the caller opens it itself
    LEAF = "leaf"
    #: a folder, listed and about to be entered (the caller may make its copy's folder)
    ENTER = "enter"
    #: a folder that could not be entered as listed (now a link, gone, another folder)
    GONE = "gone"
    #: a folder whose entries have all been walked; ``fd`` is its descriptor
    DONE = "done"


_Listing = Generator[tuple[str, os.stat_result], None, None]


@dataclass(frozen=True)
class Walked:
    step: Step
    #: descriptor of the folder holding the entry (valid until the walk resumes)
    parent_fd: int
    name: str
    #: path below the walk's root, "/"-separated
    rel: str
    #: the entry as listed (``lstat``); for DONE the folder's own ``fstat``
    st: os.stat_result
    #: DONE only: the folder's descriptor (valid until the walk resumes)
    fd: int = -1


def walk_at(dir_fd: int, skipped: frozenset[str] = frozenset()) -> Iterator[Walked]:
    """Every entry below the folder ``dir_fd`` (not closed here), never following a link;
    entries named in ``skipped`` (at any depth) and entries that vanish meanwhile are left
    out. A folder yields ENTER, then its entries, then DONE (or GONE instead when it is no
    longer the folder that was listed). Walked with a stack of its own, not by recursion: an
    agent's tree 1,500 folders deep is copied, not a RecursionError (two descriptors a
    level: the folder's and its listing's)."""
    #: (folder's descriptor, its listing, its ENTER, or None for the root), innermost last
    stack: list[tuple[int, _Listing, Walked | None]] = [(dir_fd, _listing(dir_fd, skipped), None)]
    try:
        while stack:
            fd, listing, folder = stack[-1]
            item = next(listing, None)
            if item is None:
                stack.pop()
                listing.close()  # its scandir's descriptor, now
                if folder is not None:
                    try:
                        done = Walked(
                            Step.DONE, folder.parent_fd, folder.name, folder.rel, os.fstat(fd), fd
                        )
                        yield done
                    finally:
                        os.close(fd)
                continue
            name, st = item
            path = f"{folder.rel}/{name}" if folder is not None else name
            if not stat.S_ISDIR(st.st_mode):
                yield Walked(Step.LEAF, fd, name, path, st)
                continue
            entered = Walked(Step.ENTER, fd, name, path, st)
            yield entered
            sub = enter_at(fd, name, st)
            if sub is None:
                yield Walked(Step.GONE, fd, name, path, st)
                continue
            stack.append((sub, _listing(sub, skipped), entered))
    finally:
        for fd, listing, folder in stack:
            listing.close()  # its scandir's descriptor, now
            if folder is not None:
                os.close(fd)


def enter_at(dir_fd: int, name: str, listed: os.stat_result) -> int | None:
    """A descriptor of the folder ``name`` below ``dir_fd`` if it is still the inode listed
    as ``listed``; None when it is a link now, gone, or another inode."""
    try:
        fd = os.open(name, O_DIR, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in CHANGED:
            return None
        raise
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino) != (listed.st_dev, listed.st_ino):
        os.close(fd)
        return None
    return fd


def _listing(dir_fd: int, skipped: frozenset[str]) -> _Listing:
    """Streamed (a folder of a million names is never held at once), each entry ``lstat``-ed
    when reached."""
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            if entry.name in skipped:
                continue
            try:
                yield entry.name, entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue


def copy_meta(src_fd: int, dst_fd: int, st: os.stat_result) -> None:
    """Give ``dst_fd`` the mode, times, extended attributes and owner of ``src_fd`` (as
    ``shutil.copystat`` and ``chown`` would, by descriptors: nothing named is followed).
    The owner last, as ``copy2`` then ``chown`` did: a changed owner drops setuid bits."""
    os.fchmod(dst_fd, stat.S_IMODE(st.st_mode))
    _copy_xattrs(src_fd, dst_fd)
    os.utime(dst_fd, ns=(st.st_atime_ns, st.st_mtime_ns))
    with contextlib.suppress(PermissionError):
        os.fchown(dst_fd, st.st_uid, st.st_gid)


def _copy_xattrs(src_fd: int, dst_fd: int) -> None:
    try:
        names = os.listxattr(src_fd)
    except OSError as exc:
        if exc.errno in _NO_XATTRS:
            return
        raise
    for name in names:
        try:
            os.setxattr(dst_fd, name, os.getxattr(src_fd, name))
        except OSError as exc:  # shutil._copyxattr's tolerance: what the target cannot hold
            if exc.errno not in (*_NO_XATTRS, errno.EPERM, errno.ENODATA, errno.EINVAL):
                raise


_NO_XATTRS = (errno.ENOTSUP, errno.ENODATA, errno.EINVAL)


__all__ = ["CHANGED", "Step", "Walked", "copy_meta", "enter_at", "walk_at"]

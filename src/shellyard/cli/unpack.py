"""Unpacking a workspace folder's tar on the operator's machine (``shellyard files get``).

The tree is the agent's: its names and links are whatever a command made. tarfile's ``data``
filter checks each member with ``os.path.realpath``, which stops resolving links once a path
passes PATH_MAX and reads the rest lexically; the kernel does not (CVE-2025-4517's shape,
fixed in Python 3.11.13; this project runs on older 3.11 too). A link 16 folders of 247-byte
names deep then passed the filter while leading out of the target, and a second download into
the same target wrote a file through it (docs/security.md "Attack pass (session 45)"). So,
whatever the Python:

- nothing is ever written through a link: each member's folders are walked from the target
  with ``O_NOFOLLOW``, and a link where the member goes is removed first (the member replaces
  it);
- links are made last (after every file and folder of the archive), and, once all are made,
  each is kept only if the kernel, opening it, lands inside the target (or, when it leads
  nowhere, its text read from where it sits stays inside); the others are removed and named.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
import tarfile
from collections.abc import Iterable
from pathlib import Path

from shellyard.errors import InvalidInput


class UnsafeMember(InvalidInput):
    """A member that would be written through a link or outside the target."""


def unpack(members: Iterable[tarfile.TarInfo], tar: tarfile.TarFile, target: Path) -> list[str]:
    """Extract ``members`` of ``tar`` (a stream, read once) into ``target``; returns the
    names of the links left out (a hard link, or a link that leads out of it)."""
    root = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        links: list[tarfile.TarInfo] = []
        refused: list[str] = []
        for member in members:
            if member.islnk():  # a workspace's export has none: os.link would follow a link
                refused.append(member.name)
                continue
            if member.issym():
                links.append(member)
                continue
            _clear_the_way(root, member.name)
            tar.extract(member, target, filter="data")
        made: list[str] = []
        for link in links:
            _clear_the_way(root, link.name)
            try:
                tar.extract(link, target, filter="data")
            except tarfile.FilterError:
                refused.append(link.name)
            else:
                made.append(link.name)
        # judged once all are made: a link checked while another it goes through was
        # missing (read by its text) may lead out once that one exists; removing one may
        # change another, so again until none goes
        while out := [name for name in made if not _stays_inside(root, name)]:
            for name in out:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=root)
                made.remove(name)
            refused += out
        return refused
    finally:
        os.close(root)


def _clear_the_way(root: int, name: str) -> None:
    """Refuse ``name`` when a folder on its way is a link (or not a folder); remove a link
    (never a folder or file) where it goes, so that extracting it cannot write through one."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise UnsafeMember(f"{name!r} is not a plain name below the target")
    fd = os.dup(root)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                return  # made by tarfile from here on: nothing below it can be a link
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafeMember(
                        f"{name!r} goes through {part!r}, which is not a folder in the target "
                        f"(a link left by an earlier download?): remove it and download again"
                    ) from None
                raise
            os.close(fd)
            fd = nxt
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISLNK(os.lstat(parts[-1], dir_fd=fd).st_mode):
                os.unlink(parts[-1], dir_fd=fd)
    finally:
        os.close(fd)


def _stays_inside(root: int, name: str) -> bool:
    """Whether the link ``name`` (relative to ``root``) leads to ``root`` or below it, as the
    kernel resolves it: the longest part of its target that exists is opened (links on the
    way followed by the kernel) and the path the kernel gives it (``/proc/self/fd``) must lie
    in the target; what follows, missing and so no link, is read by its text from there."""
    text = os.readlink(name, dir_fd=root)
    if text.startswith("/"):
        return False
    folder = posixpath.dirname(name)
    parts = text.split("/")
    top = os.readlink(f"/proc/self/fd/{root}")
    for cut in range(len(parts), -1, -1):
        head = posixpath.join(folder, *parts[:cut]) if cut else folder
        try:
            fd = os.open(head or ".", os.O_PATH | os.O_CLOEXEC, dir_fd=root)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:
            return False  # a loop, a name too long: not kept
        try:
            end = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return False  # a path past PATH_MAX: not kept
        finally:
            os.close(fd)
        if end != top and not end.startswith(top.rstrip("/") + "/"):
            return False
        rest = posixpath.normpath("/".join(parts[cut:]) or ".")
        return rest != ".." and not rest.startswith("../")
    return False


def no_link(path: str, flags: int) -> int:
    """An ``open`` opener that follows no link where the file goes (one a download of the
    agent's tree left): ``files get`` of a file, ``artifact get``."""
    return os.open(path, flags | os.O_NOFOLLOW, 0o666)

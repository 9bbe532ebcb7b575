"""The home's files are the service user's alone (docs/security.md "The home's files").

The home is 0700 and what it holds is 0700 (folders) or 0600 (files). The one other uid that
must pass through it is the sandbox uid (as root), and it gets a POSIX ACL entry
``user:<uid>:--x`` on exactly the folders on the way to what bwrap binds
(sandbox/folder_access.py),
never a world bit. Below those folders, what the sandbox reads keeps the modes it needs (an
environment prefix, a read view, the workspace itself); no other local user reaches them,
because every path to them crosses a folder that is 0700.

A home made by an older release had world-readable files (the database 0644, the snapshot
store 0755): ``tighten_once`` takes the group and other bits away from everything the
service owns there, once (a marker file records it), sparing only what the sandbox must read.
This module is light (no server imports): the CLI's home.py and the runner use it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger(__name__)

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
#: Group and other bits: what ``tighten`` takes away.
_SHARED_BITS = 0o077
#: The marker of a folder already tightened; its number grows when the rules do.
MARKER = ".modes-v1"


def _shared(path: Path, mode: int) -> int:
    """The bits of ``mode`` to take away. On a folder with an ACL the group bits are its mask,
    which bounds the sandbox uid's ``--x`` entry (sandbox/folder_access.py): only the other
    bits go there."""
    if stat.S_ISDIR(mode):
        try:
            os.getxattr(path, "system.posix_acl_access", follow_symlinks=False)
        except OSError:
            pass
        else:
            return stat.S_IMODE(mode) & 0o007
    return stat.S_IMODE(mode) & _SHARED_BITS


def private_dir(path: Path) -> None:
    """``path`` made and private to this user, whatever the umask: 0700, or 07x0 where its
    ACL grants the sandbox uid search (sandbox/folder_access.py). Parents it makes are 0700
    too (``mkdir -p`` would give them the umask's mode); parents that exist are left as they
    are."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=PRIVATE_DIR)
    mode = path.stat().st_mode
    if _shared(path, mode):
        path.chmod(stat.S_IMODE(mode) & ~_shared(path, mode))


def private_files(paths: Iterable[Path]) -> None:
    """Each of ``paths`` that exists set to 0600 (the database and its -wal and -shm, logs)."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            mode = path.lstat().st_mode
            if stat.S_ISREG(mode) and mode & _SHARED_BITS:
                path.chmod(stat.S_IMODE(mode) & ~_SHARED_BITS)


def create_private(path: Path) -> None:
    """Create ``path`` empty with mode 0600 if it does not exist (before SQLite opens it:
    SQLite gives its -wal and -shm files the database file's mode)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))


def tighten(root: Path, spare: Callable[[Path], str | None]) -> int:
    """Take the group and other bits away from ``root`` and everything below it that this
    process owns; returns how many entries changed. ``spare(path)`` says what to leave:
    ``"tree"`` (the path and what it holds, untouched), ``"files"`` (its folders tightened,
    its files kept: a store whose objects read views link to), None (tighten it)."""
    changed = 0
    uid = os.geteuid()
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        keep_files = spare(here) == "files"
        for name in list(dirs):
            if spare(here / name) == "tree":
                dirs.remove(name)
        entries = [here] + ([] if keep_files else [here / name for name in files])
        for path in entries:
            try:
                info = path.lstat()
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(info.st_mode) or info.st_uid != uid:
                continue
            shared = _shared(path, info.st_mode)
            if shared:
                path.chmod(stat.S_IMODE(info.st_mode) & ~shared)
                changed += 1
    return changed


def tighten_once(root: Path, spare: Callable[[Path], str | None]) -> None:
    """``tighten`` a folder an older release may have made, the first time it is opened by
    this one (docs/operations.md "Upgrades"): the marker file says it was done."""
    marker = root / MARKER
    if marker.exists():
        return
    changed = tighten(root, spare)
    if changed:
        log.warning(
            "took group and other permissions away from %d entries of %s (made by an older "
            "release; docs/operations.md)",
            changed,
            root,
        )
    create_private(marker)


def runner_spare(root: Path) -> Callable[[Path], str | None]:
    """What ``tighten`` leaves as it is in a runner's folder: what the sandbox reads through
    its modes (workspaces and their homes are the agent's own files and modes (each root is
    closed to 0700 at its next use), environments their manager's,
    read views and the sandbox folder are read by the sandbox uid), and the snapshot objects
    read views link to (0444: the folders above them are 0700)."""

    def spare(path: Path) -> str | None:
        parts = path.relative_to(root).parts
        if len(parts) == 1 and parts[0] in (
            "workspaces",
            "homes",
            "environments",
            "views",
            "sandbox",
        ):
            return "tree"
        return "files" if parts[:2] == ("snapshots", "objects") else None

    return spare


def secure_home(home: Path) -> None:
    """The home made (0700) or narrowed to its user; a home of an older release tightened
    once: the home, its files (the database, tokens, log) and ``runners/``. Its other folders
    are not walked: a runner's folder is tightened by its runner (``runner_spare``), the base
    environments are public by design, and anything else is not shellyard's."""
    private_dir(home)
    home = home.absolute()
    runners = home / "runners"

    def spare(path: Path) -> str | None:
        if (path.parent == home and path != runners) or path.parent == runners:
            return "tree"
        return None

    tighten_once(home, spare)


__all__ = [
    "MARKER",
    "PRIVATE_DIR",
    "PRIVATE_FILE",
    "create_private",
    "private_dir",
    "private_files",
    "runner_spare",
    "secure_home",
    "tighten",
    "tighten_once",
]

"""Letting the sandbox uid reach the runner's folders through a private home (root only).

As root, bwrap is started as the unprivileged sandbox uid, and that uid must be able to
traverse every folder on the way to a workspace or an environment prefix to bind it (bwrap
resolves the path itself; a directory fd opened by root does not help, see docs/decisions.md).
A home chosen by the user is often private: ``mktemp -d`` and pytest's ``tmp_path`` make 0700
folders, ``/root`` is 0700. Instead of asking for ``chmod o+x`` (which opens the folder to every
local user), the runner adds one POSIX ACL entry, ``user:<sandbox uid>:--x``, to each folder on
the path that does not already let the sandbox uid search it: that uid, and nobody else, may
pass through, and still may not list or read anything there. The sandbox itself never sees
these folders (the home is covered by a tmpfs inside it), so the entry serves only bwrap's
set-up. Existing ACL entries are kept; the entry is added once and found again on restart.
"""

from __future__ import annotations

import logging
import os
import stat
import struct
from pathlib import Path

from shellyard.errors import SandboxUnavailable

log = logging.getLogger(__name__)

_XATTR = "system.posix_acl_access"
_VERSION = 2
# Tags of the Linux ACL xattr format (linux/posix_acl_xattr.h).
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_UNDEFINED_ID = 0xFFFFFFFF
_SEARCH = 0o1
#: A uid no folder belongs to and no entry names: ``can_search(path, _ANY_MEMBER, gid)`` asks
#: whether every uid of primary group ``gid`` may pass.
_ANY_MEMBER = -1
_ENTRY = struct.Struct("<HHI")


def _entries(path: Path) -> list[tuple[int, int, int]] | None:
    """The folder's access ACL as (tag, perm, id), or None when it has none beyond its mode."""
    try:
        blob = os.getxattr(path, _XATTR)
    except OSError:
        return None
    body = blob[4:]
    return [_ENTRY.unpack_from(body, i) for i in range(0, len(body), _ENTRY.size)]


def can_search(path: Path, uid: int, gid: int) -> bool:
    """Whether ``uid`` (primary group ``gid``, no other groups) may traverse ``path``."""
    info = path.stat()
    mode = info.st_mode
    entries = _entries(path)
    if info.st_uid == uid:
        return bool(mode & stat.S_IXUSR)
    if entries:
        mask = next((p for t, p, _ in entries if t == _MASK), 0o7)
        named = next((p for t, p, i in entries if t == _USER and i == uid), None)
        if named is not None:
            return bool(named & mask & _SEARCH)
        # The group entries that apply (the owning group's and a named one of ``gid``): any
        # of them granting search is enough.
        groups = [
            p
            for t, p, i in entries
            if (t == _GROUP and i == gid) or (t == _GROUP_OBJ and info.st_gid == gid)
        ]
        if groups:
            return any(p & mask & _SEARCH for p in groups)
    if info.st_gid == gid:
        return bool(mode & stat.S_IXGRP)
    return bool(mode & stat.S_IXOTH)


def grant_search(path: Path, uid: int, gid: int | None = None) -> None:
    """Add ``user:<uid>:--x`` (and ``group:<gid>:--x`` when given) to the folder's access ACL,
    keeping every other entry."""
    mode = path.stat().st_mode
    entries = _entries(path) or [
        (_USER_OBJ, (mode >> 6) & 0o7, _UNDEFINED_ID),
        (_GROUP_OBJ, (mode >> 3) & 0o7, _UNDEFINED_ID),
        (_OTHER, mode & 0o7, _UNDEFINED_ID),
    ]
    named_ids = [(_USER, uid)] + ([(_GROUP, gid)] if gid is not None else [])
    kept = [(t, p, i) for t, p, i in entries if (t, i) not in named_ids and t != _MASK]
    for tag, ident in named_ids:
        named = next((p for t, p, i in entries if t == tag and i == ident), 0)
        kept.append((tag, named | _SEARCH, ident))
    # The mask bounds the named entries and the owning group. Without an ACL the group bits
    # were the owning group's; keep that bound and add search only.
    mask = next((p for t, p, _ in entries if t == _MASK), None)
    if mask is None:
        mask = next((p for t, p, _ in entries if t == _GROUP_OBJ), 0)
    mask |= _SEARCH
    kept.append((_MASK, mask, _UNDEFINED_ID))
    kept.sort(key=lambda e: (e[0], e[2]))
    blob = struct.pack("<I", _VERSION) + b"".join(_ENTRY.pack(*e) for e in kept)
    os.setxattr(path, _XATTR, blob)


def grant_folder(folder: Path, uid: int, gid: int | None = None) -> bool:
    """``user:<uid>:--x`` on ``folder`` alone (not its ancestors) unless ``uid`` (primary
    group ``gid``, default ``uid``) may already search it; True when an entry was added. For
    a folder below one already reached: an environment's, the egress socket's (docs/security.md
    "The home's files"). Each uid gets its own entry: one per sandbox uid."""
    group = uid if gid is None else gid
    if can_search(folder, uid, group) and (gid is None or can_search(folder, _ANY_MEMBER, group)):
        return False
    grant_search(folder, uid, gid)
    return True


def make_reachable(directory: Path, uid: int, gid: int) -> list[Path]:
    """Let the sandbox uid traverse ``directory`` and each of its ancestors; returns the
    folders that got an ACL entry. Raises SandboxUnavailable, naming the folder and the fix,
    when a folder cannot take one (a file system without ACLs, a read-only mount)."""
    granted: list[Path] = []
    for folder in reversed([directory, *directory.parents]):
        if can_search(folder, uid, gid) and can_search(folder, _ANY_MEMBER, gid):
            continue
        try:
            # The group entry serves every uid whose primary group is ``gid``: the sandbox
            # group that the uids of all workspaces share (docs/security.md).
            grant_search(folder, uid, gid)
        except OSError as exc:
            mode = folder.stat().st_mode & 0o777
            raise SandboxUnavailable(
                f"the sandbox user (uid {uid}) cannot reach {directory}: {folder} is not "
                f"searchable by it (mode {oct(mode)}) and an ACL entry could not be added "
                f"({exc.strerror}). Choose a SHELLYARD_HOME outside it (as root the default is "
                f"/var/lib/shellyard), or run 'setfacl -m u:{uid}:x {folder}' or "
                f"'chmod o+x {folder}'"
            ) from None
        granted.append(folder)
        log.warning("let the sandbox uid %d traverse %s (ACL entry u:%d:--x)", uid, folder, uid)
    return granted


def grant_sandbox_uid(roots: tuple[Path, ...], sandbox_dir: Path, uid: int, gid: int) -> None:
    """Search (``--x``, an ACL entry of that uid alone) on the folders bwrap passes as the
    sandbox uid to bind what it binds (``roots``: workspaces, homes, read views, environment
    prefixes; the egress socket in ``sandbox_dir``). The relays of a root runner, the sandbox
    uid once set up, reach the socket through its folder (ports.py)."""
    for directory in roots:
        make_reachable(directory, uid, gid)
    grant_folder(sandbox_dir, uid, gid)

"""``environment_create --from python-base`` (docs/environments.md): a named environment that starts
with a base's packages without installing them.

The new prefix is the base revision's tree, except what names the base's own path: the venv's
``bin/`` scripts (shebangs, ``activate``), which are rewritten (a venv is not relocatable, and
nothing else in a uv venv holds its path — checked by grepping a built base). The other files
are shared one of two ways, ``SHELLYARD_BASE_SHARING`` (``sharing``):

- **copies** (6,842 files, 344 MB for python-base) by ``copy_file_range`` — a reflink, no
  bytes written, where the filesystem shares blocks (btrfs, XFS); a kernel-side copy elsewhere
  (this machine's ext4: ~9x the time and the disk of links) — mode's executable bit and mtime
  kept (a ``.pyc`` checks its source's mtime). No inode is the base's, so no link count does
  what a hard link's does: count every session's environments made from that base, a side
  channel on other sessions' activity (docs/security.md, "Environments share no inode").
- **hard links** (a few hundred ms, no bytes): the base must then be safe from the derived
  environment's changes. Every change rewrites by unlink or temp + rename (uv, the rollback of
  ``Editor.restore``), never in place; the base's files are 0444 and, on a root runner, owned
  by another uid (``bases.BASE_OWNER``), so a package tool running as root with every
  capability dropped can neither write nor chmod them. Where that does not hold (a non-root
  runner: the tools run as the base's owner and could chmod it; or the base on another
  filesystem) the files are copied instead (``can_link``).

``auto`` picks copies when workspaces have uids of their own (tenants to keep apart) and links
when one uid serves them all. The revision's ``base`` record says which was done.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Literal

from shellyard.runner.environments import bases
from shellyard.runner.environments.managers.base import ManagerContext, ManagerError
from shellyard.runner.environments.managers.pip import record_origin
from shellyard.runner.protocol import PackageRecord, SandboxPolicy
from shellyard.runner.sandbox import tenants
from shellyard.runner.workspace_paths import O_FILE, O_NEW, copy_fd

#: Files of bin/ larger than this are binaries (uv): shared, never scanned for the path.
SCRIPT_MAX_BYTES = 1 << 20
#: Threads copying files: the copy is the kernel's (the GIL is released), and a few in flight
#: overlap one file's open/close with another's bytes (measured in docs/benchmarks.md).
COPY_WORKERS = 4
#: Copies queued at most per worker: the walk waits rather than listing a whole tree ahead.
QUEUED_PER_WORKER = 64
#: Files copied between two checks of the free-space reserve (a ``statvfs`` each).
ROOM_EVERY = 32
#: What the ``base`` record's source ends with, after how the files were shared.
SHARED_AS = {True: "hard links", False: "copies"}

Sharing = Literal["copies", "links"]


def sharing(policy: SandboxPolicy) -> Sharing:
    """``policy.base_sharing``, ``auto`` resolved: copies when the runner gives workspaces
    uids of their own (root, ``SHELLYARD_UID_RANGE`` not ``off``: tenants whose activity a
    shared link count would tell each other), links when one uid serves every workspace."""
    if policy.base_sharing != "auto":
        return policy.base_sharing
    tenant_uids = os.geteuid() == 0 and tenants.range_of(policy) is not None
    return "copies" if tenant_uids else "links"


def resolve(name: str) -> bases.BaseRevision:
    """The base revision a create starts from, or a clear error."""
    if name not in bases.KNOWN:
        raise ManagerError(
            "not_found", f"unknown base environment {name!r}; the bases are "
            f"{', '.join(bases.KNOWN)}",
        )  # fmt: skip
    base = bases.current(name)
    if base is None or not base.prefix.is_dir():
        raise ManagerError(
            "not_found",
            f"{name} is not prepared on this runner; run `shellyard env prepare` once on the "
            f"runner's host, then create the environment again",
        )
    return base


async def create(
    ctx: ManagerContext,
    name: str,
    room: Callable[[], None] | None = None,
    how: Sharing = "copies",
) -> list[PackageRecord]:
    """Fill the empty ``ctx.prefix`` from base ``name`` by ``how``; returns revision 1's base
    records. ``room`` raises when the volume is below its free-space reserve (called as it
    fills)."""
    import asyncio

    base = resolve(name)
    linking = how == "links" and can_link(base.prefix, ctx.prefix)
    verb = "hard-linking" if linking else "copying"
    ctx.progress(f"{verb} {name} revision {base.revision} into the environment")
    # V4: bin/'s scripts name where the sandboxes show the new prefix (/env, seen.py)
    shown = Path(ctx.inside(str(ctx.prefix)))
    await asyncio.to_thread(
        clone, base.prefix, ctx.prefix, shown, base.seen, room=room, linking=linking
    )
    record_origin(ctx.prefix, f"{name} revision {base.revision}")
    records = [
        PackageRecord(
            manager="base",
            name=name,
            version=str(base.revision),
            source=f"{base.prefix} ({SHARED_AS[linking]})",
        )
    ]
    for package in ("python", "pip", "uv"):
        if package in base.packages:
            records.append(
                PackageRecord(
                    manager="base", name=package, version=base.packages[package], source=name
                )
            )
    return records


def can_link(base: Path, prefix: Path) -> bool:
    """Hard links are safe and possible: same filesystem, and the base's files belong to a
    uid other than the one the package tools run as (they could chmod their own files)."""
    try:
        top = os.stat(base / "pyvenv.cfg")
        return top.st_dev == os.stat(prefix).st_dev and top.st_uid != os.geteuid()
    except OSError:
        return False


def clone(
    base: Path,
    prefix: Path,
    shown: Path | None = None,
    named: Path | None = None,
    workers: int = COPY_WORKERS,
    room: Callable[[], None] | None = None,
    linking: bool = False,
) -> None:
    """``base``'s tree into the existing empty folder ``prefix``: folders made (0755, so the
    environment's own changes can add and remove), symbolic links re-made (those into the
    base pointed at the new prefix), files copied (``copy_file``) or, ``linking``, hard-linked
    (``link_file``; on the walk's thread: a link is one cheap call), bin/ scripts rewritten to
    name ``shown``, where the sandboxes see the new prefix (default: its host path), instead
    of ``named``, the path the base's files name (V4: its neutral path; default ``base``).
    Walks with ``scandir`` (the entry kinds come with the listing); the copies run on
    ``workers`` threads, at most ``QUEUED_PER_WORKER`` each queued (bounded memory).
    ``room`` is called first and every ``ROOM_EVERY`` files: a copy of hundreds of MB must
    stop at the volume's free-space reserve, as a package tool does (docs/limits.md)."""
    old = os.fsencode(named if named is not None else base)
    new = os.fsencode(shown if shown is not None else prefix)
    pending = [(os.fspath(base), os.fspath(prefix), False)]
    queued: deque[Future[None]] = deque()
    submitted = 0
    if room is not None:  # a volume already below its reserve takes nothing
        room()
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        try:
            while pending:
                source_dir, target_dir, in_bin = pending.pop()
                with os.scandir(source_dir) as entries:
                    for entry in entries:
                        target = os.path.join(target_dir, entry.name)
                        if entry.is_symlink():
                            _relink(entry.path, target, os.fsdecode(old), os.fsdecode(new))
                        elif entry.is_dir(follow_symlinks=False):
                            os.mkdir(target, 0o755)
                            top_bin = source_dir == os.fspath(base) and entry.name == "bin"
                            pending.append((entry.path, target, top_bin))
                        elif entry.is_file(follow_symlinks=False):
                            script = (old, new) if in_bin else None
                            if linking and not in_bin:
                                os.link(entry.path, target)
                            else:
                                share = link_file if linking else copy_file
                                queued.append(pool.submit(share, entry.path, target, script))
                            submitted += 1
                            if room is not None and submitted % ROOM_EVERY == 0:
                                room()
                            while len(queued) > workers * QUEUED_PER_WORKER:
                                queued.popleft().result()
            while queued:
                queued.popleft().result()
        finally:
            for future in queued:  # a failure: the rest is not worth copying
                future.cancel()


def _relink(source: str, target: str, old: str, new: str) -> None:
    link = os.readlink(source)
    if link == old or link.startswith(old + "/"):
        link = new + link[len(old) :]
    os.symlink(link, target)


def _open_quietly(source: str) -> int:
    """Open a base's file without updating its access time where the owner's rights allow
    (root, or the base's owner): the base is every session's, and an access time moved by a
    create would tell any command reading ``stat`` that some session made an environment."""
    try:
        return os.open(source, O_FILE | os.O_NOATIME)
    except PermissionError:  # O_NOATIME on a file not ours: EPERM
        return os.open(source, O_FILE)


def copy_file(source: str, target: str, script: tuple[bytes, bytes] | None = None) -> None:
    """Copy ``source`` to the new file ``target``: an inode of its own (never a hard link),
    mode 0755 or 0644 after its owner's executable bit, its mtime kept. ``script``
    (old, new): a small file naming ``old`` is written with ``new`` in its place instead."""
    fd = _open_quietly(source)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ManagerError("failed", f"{source} of the base is no longer a regular file")
        mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
        data = None
        if script is not None and st.st_size <= SCRIPT_MAX_BYTES:
            data = os.pread(fd, SCRIPT_MAX_BYTES + 1, 0)
            data = data.replace(*script) if script[0] in data else None
        out = os.open(target, O_NEW, mode)
        try:
            if data is None:
                copy_fd(fd, out, st.st_size)
                # a .pyc records its source's mtime: a newer one would be recompiled (and,
                # the prefix read-only, on every import)
                os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
            else:
                view = memoryview(data)
                while view:
                    view = view[os.write(out, view) :]
            os.fchmod(out, mode)  # the runner's umask must not narrow it
        finally:
            os.close(out)
    finally:
        os.close(fd)


def link_file(source: str, target: str, script: tuple[bytes, bytes] | None = None) -> None:
    """Hard-link ``source`` at ``target``, unless it is a small file naming ``script``'s old
    path: that one is written with the new path (``copy_file``)."""
    names = False
    if script is not None:
        fd = _open_quietly(source)
        try:
            st = os.fstat(fd)
            if st.st_size <= SCRIPT_MAX_BYTES:
                names = script[0] in os.pread(fd, st.st_size + 1, 0)
        finally:
            os.close(fd)
    if names:
        copy_file(source, target, script)
    else:
        os.link(source, target, follow_symlinks=False)


def unshare(prefix: Path, owners: frozenset[int]) -> int:
    """Give every file of ``prefix`` that is a hard link of a base's file (owned by one of
    ``owners``, more than one link) a copy of its own, put in its place by a rename: what an
    older release's ``--from`` left. Run while nothing changes the prefix (its lock held).
    Returns how many files were copied."""
    copied = 0
    for folder, _dirs, names, dir_fd in os.fwalk(prefix, follow_symlinks=False):
        for name in names:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink < 2 or st.st_uid not in owners:
                continue
            path = os.path.join(folder, name)
            temp = os.path.join(folder, f".{name}.unshare")
            with contextlib.suppress(FileNotFoundError):  # a crash's leftover
                os.unlink(temp)
            copy_file(path, temp)
            os.rename(temp, path)
            copied += 1
    return copied

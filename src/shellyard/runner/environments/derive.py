"""``environment_create --from python-base`` (docs/environments.md): a named environment that starts
with a base's packages without installing them.

The new prefix is the base revision's tree with every file **copied** (6,842 files, 344 MB for
python-base) by ``copy_file_range`` — a reflink, no bytes written, where the filesystem shares
blocks (btrfs, XFS); a kernel-side copy elsewhere (this machine's ext4) — with its mode's
executable bit and its mtime kept (a ``.pyc`` checks its source's mtime), except what names the
base's own path: the venv's ``bin/`` scripts (shebangs, ``activate``), which are rewritten (a
venv is not relocatable, and nothing else in a uv venv holds its path — checked by grepping a
built base).

Copies, not hard links (what this did before): a hard link shares the inode, and its
``st_nlink``, which any command of any session reads in the base or in an environment made from
it, counted every session's environments made from that base — a side channel on other
sessions' activity (docs/security.md, "Environments share no inode with a base"). The measured
cost, and why not an overlay, are in docs/environments.md ("Starting from a base").
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from shellyard.runner.environments import bases
from shellyard.runner.environments.managers.base import ManagerContext, ManagerError
from shellyard.runner.environments.managers.pip import record_origin
from shellyard.runner.protocol import PackageRecord
from shellyard.runner.workspace_paths import O_FILE, O_NEW, copy_fd

#: Files of bin/ larger than this are binaries (uv): copied, never scanned for the path.
SCRIPT_MAX_BYTES = 1 << 20
#: Threads copying files: the copy is the kernel's (the GIL is released), and a few in flight
#: overlap one file's open/close with another's bytes (measured in docs/benchmarks.md).
COPY_WORKERS = 4
#: Copies queued at most per worker: the walk waits rather than listing a whole tree ahead.
QUEUED_PER_WORKER = 64
#: Files copied between two checks of the free-space reserve (a ``statvfs`` each).
ROOM_EVERY = 32


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
    ctx: ManagerContext, name: str, room: Callable[[], None] | None = None
) -> list[PackageRecord]:
    """Fill the empty ``ctx.prefix`` from base ``name``; returns revision 1's base records.
    ``room`` raises when the volume is below its free-space reserve (called as it fills)."""
    import asyncio

    base = resolve(name)
    ctx.progress(f"copying {name} revision {base.revision} into the environment")
    # V4: bin/'s scripts name where the sandboxes show the new prefix (/env, seen.py)
    shown = Path(ctx.inside(str(ctx.prefix)))
    await asyncio.to_thread(clone, base.prefix, ctx.prefix, shown, base.seen, room=room)
    record_origin(ctx.prefix, f"{name} revision {base.revision}")
    records = [
        PackageRecord(
            manager="base", name=name, version=str(base.revision), source=f"{base.prefix} (copies)"
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


def clone(
    base: Path,
    prefix: Path,
    shown: Path | None = None,
    named: Path | None = None,
    workers: int = COPY_WORKERS,
    room: Callable[[], None] | None = None,
) -> None:
    """``base``'s tree into the existing empty folder ``prefix``: folders made (0755, so the
    environment's own changes can add and remove), symbolic links re-made (those into the
    base pointed at the new prefix), files copied (``copy_file``), bin/ scripts rewritten to
    name ``shown``, where the sandboxes see the new prefix (default: its host path), instead
    of ``named``, the path the base's files name (V4: its neutral path; default ``base``).
    Walks with ``scandir`` (the entry kinds come with the listing); the copies run on
    ``workers`` threads, at most ``QUEUED_PER_WORKER`` each queued (bounded memory).
    ``room`` is called every ``ROOM_EVERY`` files: a copy of hundreds of MB must stop at the
    volume's free-space reserve, as a package tool does (docs/limits.md)."""
    old = os.fsencode(named if named is not None else base)
    new = os.fsencode(shown if shown is not None else prefix)
    pending = [(os.fspath(base), os.fspath(prefix), False)]
    queued: deque[Future[None]] = deque()
    submitted = 0
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
                            queued.append(pool.submit(copy_file, entry.path, target, script))
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

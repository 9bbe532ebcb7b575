"""``environment_create --from python-base`` (docs/environments.md): a named environment that starts
with a base's packages without copying their bytes.

The new prefix is the base revision's tree with every file **hard-linked** (7,500 files, 344
MB for python-base: a few hundred ms instead of an install), except what names the base's own
path: the venv's ``bin/`` scripts (shebangs, ``activate``), which are copied with the path
rewritten (a venv is not relocatable, and nothing else in a uv venv holds its path — checked
by grepping a built base). Why hard links and not the alternatives is measured in
docs/environments.md ("Starting from a base"): ext4 here has no reflinks (``cp
--reflink=always`` fails: Operation not supported), and an overlay would need a mount per
environment, kept across restarts, for every execution and tool sandbox.

A hard link shares the inode, so the base must be safe from the derived environment's
changes. What protects it: every change rewrites by unlink or temp + rename (uv, the rollback
of ``Editor.restore``), never in place; the base's files are 0444 and, on a root runner, owned
by another uid (``bases.BASE_OWNER``), so a package tool running as root with every capability
dropped can neither write nor chmod them. Where that does not hold (a non-root runner: the
tools run as the base's owner and could chmod it; or the base on another filesystem) the
files are copied instead, and the revision says which (``link`` record).
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from shellyard.runner.environments import bases
from shellyard.runner.environments.managers.base import ManagerContext, ManagerError
from shellyard.runner.environments.managers.pip import record_origin
from shellyard.runner.protocol import PackageRecord

#: Entries made between two checks of the free-space reserve (``clone``'s ``room``): well
#: under the inode reserve's least (1,024), and a few MB of copies at most.
ROOM_EVERY = 256
#: Files of bin/ larger than this are binaries (uv): linked, never scanned for the path.
SCRIPT_MAX_BYTES = 1 << 20


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


async def create(ctx: ManagerContext, name: str) -> list[PackageRecord]:
    """Fill the empty ``ctx.prefix`` from base ``name``; returns revision 1's base records."""
    import asyncio

    base = resolve(name)
    linking = can_link(base.prefix, ctx.prefix)
    how = "hard-linking" if linking else "copying"
    ctx.progress(f"{how} {name} revision {base.revision} into the environment")
    # V4: bin/'s scripts name where the sandboxes show the new prefix (/env, seen.py)
    shown = Path(ctx.inside(str(ctx.prefix)))
    # the clone is the runner's own writing, not a tool's: held to the free-space reserve
    # as it goes (a base's 7,500 files, as links or copies)
    room = functools.partial(ctx.room, f"making an environment from {name}")
    await asyncio.to_thread(clone, base.prefix, ctx.prefix, linking, shown, base.seen, room)
    record_origin(ctx.prefix, f"{name} revision {base.revision}")
    records = [
        PackageRecord(
            manager="base",
            name=name,
            version=str(base.revision),
            source=f"{base.prefix} ({'hard links' if linking else 'copies'})",
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
    linking: bool,
    shown: Path | None = None,
    named: Path | None = None,
    room: Callable[[], None] | None = None,
) -> None:
    """``base``'s tree into the existing empty folder ``prefix``: folders made (0755, so the
    environment's own changes can add and remove), symbolic links re-made (those into the
    base pointed at the new prefix), files linked or copied, bin/ scripts rewritten to name
    ``shown``, where the sandboxes see the new prefix (default: its host path), instead of
    ``named``, the path the base's files name (V4: its neutral path; default ``base``). Walks with
    ``scandir`` (the entry kinds come with the listing: no stat per file). ``room`` raises when
    the volume is below the free-space reserve: called first and every ``ROOM_EVERY`` entries
    (the inode reserve, at least 1,024, is smaller than one base's files)."""
    old = os.fsencode(named if named is not None else base)
    new = os.fsencode(shown if shown is not None else prefix)
    pending = [(os.fspath(base), os.fspath(prefix), False)]
    made = 0
    while pending:
        source_dir, target_dir, in_bin = pending.pop()
        with os.scandir(source_dir) as entries:
            for entry in entries:
                if room is not None and made % ROOM_EVERY == 0:
                    room()
                made += 1
                target = os.path.join(target_dir, entry.name)
                if entry.is_symlink():
                    _relink(entry.path, Path(target), os.fsdecode(old), os.fsdecode(new))
                elif entry.is_dir(follow_symlinks=False):
                    os.mkdir(target, 0o755)
                    top_bin = source_dir == os.fspath(base) and entry.name == "bin"
                    pending.append((entry.path, target, top_bin))
                elif entry.is_file(follow_symlinks=False):
                    if in_bin or not linking:
                        _file(entry.path, Path(target), entry.stat(), in_bin, linking, old, new)
                    else:
                        os.link(entry.path, target)


def _relink(source: str, target: Path, old: str, new: str) -> None:
    link = os.readlink(source)
    if link == old or link.startswith(old + "/"):
        link = new + link[len(old) :]
    os.symlink(link, target)


def _file(
    source: str,
    target: Path,
    st: os.stat_result,
    script: bool,
    linking: bool,
    old: bytes,
    new: bytes,
) -> None:
    mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
    if script and st.st_size <= SCRIPT_MAX_BYTES:
        with open(source, "rb") as handle:
            data = handle.read()
        if old in data:
            target.write_bytes(data.replace(old, new))
            target.chmod(mode)
            return
    if linking:
        os.link(source, target)
    else:
        shutil.copyfile(source, target)
        target.chmod(mode)

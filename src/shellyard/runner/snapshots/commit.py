"""One commit's walk of a workspace tree (W3): which folders to reuse, which files to read.

A commit scans every folder (``os.scandir`` on folder descriptors, ``lstat`` of each entry)
and:

* reuses a folder's section as is when its names and stat bytes are unchanged and all its
  files and links changed strictly before that walk's clock (git's racy-clean rule; the clock
  is the mtime of a file touched just before the walk began, which is stricter than git's
  index-write time; it assumes the store and the workspaces share a filesystem clock and
  timestamp granularity, as they do under one runner folder);
* otherwise rebuilds the section, re-reading only files whose stat differs or is racy: each
  read once (``O_NOFOLLOW`` relative to the folder descriptor, so a symlink, or a file swapped
  for one mid-walk, is never read through), hashed while it is copied into the store (never
  hard-linked). Files of 4 MiB and more are hashed on a thread pool; small ones in line,
  because GIL and directory-lock hand-offs made two threads slower than one (measured).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat as stat_mod
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

from shellyard.runner.snapshots.blobs import ObjectStore, Stored
from shellyard.runner.snapshots.budget import HashBudget
from shellyard.runner.snapshots.changes import Changes, Tracking
from shellyard.runner.snapshots.format import (
    KIND_DIR,
    KIND_FILE,
    KIND_LINK,
    NO_DIGEST,
    SCAN,
    SCAN_SIZE,
    DirRecord,
    decode_text,
    encode_text,
    encode_tree,
    pack_ints,
    unpack_ints,
)
from shellyard.runner.snapshots.scan import OPEN_DIR, VANISHED, DirOpener, Scan, ScanHelper, scan_fd
from shellyard.runner.snapshots.trees import EMPTY_DIGEST

log = logging.getLogger(__name__)

#: Files at least this big are hashed and copied on the thread pool.
_POOL_MIN_SIZE = 4 << 20
#: Folder descriptors kept open for pool work before the walk waits for it.
_MAX_PENDING_DIRS = 64
#: The scan helper is used for trees with at least this many cached entries.
HELPER_MIN_ENTRIES = 3000

#: Commit hints: relative path → (sha256 digest, (mtime_ns, ctime_ns, size, inode)).
Hints = dict[str, tuple[bytes, tuple[int, int, int, int]]]


@dataclass
class CommitStats:
    """What one commit did (for tests, logs and benchmarks)."""

    workspace_id: str
    seq: int = 0
    new: bool = False
    entries: int = 0
    dirs_scanned: int = 0
    #: Folders whose names and stat bytes matched the cache (no per-file work).
    dirs_reused: int = 0
    #: Folders scanned ahead from both ends on big trees, and those by the helper process.
    dirs_prescanned: int = 0
    dirs_from_helper: int = 0
    files_seen: int = 0
    files_hashed: int = 0
    #: Bytes run through a hash to name the files read (a hole costs none: contentid.py).
    bytes_hashed: int = 0
    #: What the files read may cost at most (a command's commit: budget.py); None: no bound.
    budget: HashBudget | None = None
    #: Files re-read only because they were racily clean.
    racy: int = 0
    #: Files taken from the caller's hints (written from store objects), not read.
    files_known: int = 0
    #: Entries that vanished or changed type while the commit walked the tree.
    skipped: int = 0
    #: Files the store could not read (permission denied); left out of the snapshot.
    unreadable: list[str] = field(default_factory=list)
    #: Whether the commit scanned only the folders its change hints named (changes.py).
    change_hints: bool = False
    #: Folder trees written (the folders that changed and their ancestors), and bytes
    #: written to the stat cache (a log frame of the records that changed, or now and
    #: then the whole cache folded).
    trees_written: int = 0
    cache_bytes: int = 0
    elapsed_s: float = 0.0

    @property
    def cache_hits(self) -> int:
        return self.files_seen - self.files_hashed


class _DirBuilder:
    """A folder's manifest section being rebuilt; digests of big files may still be pending."""

    __slots__ = (
        "clock",
        "digests",
        "kinds",
        "max_time",
        "modes",
        "names",
        "path",
        "pending",
        "scan_names",
        "scan_stats",
        "sizes",
        "subdirs",
        "targets",
    )

    def __init__(self, path: str, scan_names: str, scan_stats: bytes, clock: int) -> None:
        self.path = path
        self.scan_names = scan_names
        self.scan_stats = scan_stats
        self.clock = clock
        self.names: list[str] = []
        self.kinds = bytearray()
        self.modes: list[int] = []
        self.sizes: list[int] = []
        self.digests: list[bytes] = []
        self.targets: list[str] = []
        self.subdirs: list[str] = []
        self.max_time = -(1 << 63)
        self.pending: list[tuple[int, Future[Stored]]] = []

    def finish(self, dropped: set[int]) -> DirRecord:
        """The record, leaving out entries whose reading failed (gone or unreadable)."""
        names, kinds, modes = self.names, bytes(self.kinds), self.modes
        sizes, digests, targets = self.sizes, self.digests, self.targets
        if dropped:
            keep = [i for i in range(len(names)) if i not in dropped]
            names = [names[i] for i in keep]
            kinds = bytes(kinds[i] for i in keep)
            modes = [modes[i] for i in keep]
            sizes = [sizes[i] for i in keep]
            digests = [digests[i] for i in keep]
            targets = [targets[i] for i in keep]
        return DirRecord(
            path=self.path,
            scan_names=self.scan_names,
            scan_stats=self.scan_stats,
            max_time=self.max_time,
            clock=self.clock,
            subdirs=tuple(self.subdirs),
            n=len(names),
            files=kinds.count(KIND_FILE),
            total=sum(s for s, k in zip(sizes, kinds, strict=True) if k == KIND_FILE),
            names=encode_text("\0".join(names)),
            kinds=kinds,
            modes=pack_ints("I", modes),
            sizes=pack_ints("q", sizes),
            digests=b"".join(digests),
            targets=encode_text("\0".join(targets)),
        )


@dataclass
class Walked:
    """What a walk found, as a change to the records it started from: the records made or
    sealed anew (by path), the paths whose records are gone, and the new root record."""

    changed: dict[str, DirRecord]
    removed: set[str]
    root: DirRecord
    #: Tree blobs of the records sealed anew, by digest (to store).
    blobs: dict[bytes, bytes]


def _parent(path: str) -> str:
    return path.rpartition("/")[0]


def seal(
    paths: Iterable[str],
    changed: dict[str, DirRecord],
    old: dict[str, DirRecord],
    removed: set[str],
    full: bool = False,
) -> dict[bytes, bytes]:
    """Give the folders ``paths`` and their ancestors their tree digests and subtree totals,
    deepest first, from the records of the new tree (``changed`` over ``old`` less
    ``removed``); records that come out different go into ``changed``. The new blobs.

    A record kept from ``old`` (already sealed) has only the entries of its subfolders that
    were sealed again updated, so a wide ancestor (a root of 200 folders) costs its changed
    children, not all of them; ``full`` recomputes every record from all its children (a full
    walk: records loaded from disk may predate their children's)."""

    def lookup(path: str) -> DirRecord | None:
        rec = changed.get(path)
        if rec is None and path not in removed:
            rec = old.get(path)
        return rec

    todo: set[str] = set()
    kids: dict[str, set[str]] = {}
    for path in paths:
        while path not in todo:
            todo.add(path)
            if not path:
                break
            parent, _, name = path.rpartition("/")
            kids.setdefault(parent, set()).add(name)
            path = parent
    blobs: dict[bytes, bytes] = {}
    for path in sorted(todo, key=lambda p: p.count("/") + 1 if p else 0, reverse=True):
        rec = lookup(path)
        if rec is None:
            continue  # gone: its parent no longer lists it
        prefix = path + "/" if path else ""
        column = bytearray(rec.digests)
        if full or rec.digest == NO_DIGEST:
            files, total, entries = rec.files, rec.total, rec.n
            dirs = [i for i, kind in enumerate(rec.kinds) if kind == KIND_DIR]
            update = list(zip(dirs, rec.subdirs, strict=True))
        else:  # sealed before: its totals and other subfolders' digests stand
            files, total, entries = rec.sub_files, rec.sub_total, rec.sub_entries
            # each changed child's index found in the names blob (a C-level search), not by
            # going through every entry
            hay = b"\0" + rec.names + b"\0"
            update = []
            for name in kids.get(path, ()):
                at = hay.find(b"\0" + encode_text(name) + b"\0")
                i = hay.count(b"\0", 0, at) if at >= 0 else -1
                if i >= 0 and rec.kinds[i] == KIND_DIR:
                    update.append((i, name))
            for _, name in update:
                before = old.get(prefix + name)
                if before is not None:
                    files -= before.sub_files
                    total -= before.sub_total
                    entries -= before.sub_entries
        for i, name in update:
            child = lookup(prefix + name)
            if child is None:  # it could not be entered: recorded empty (see _visit)
                column[32 * i : 32 * i + 32] = EMPTY_DIGEST
                continue
            column[32 * i : 32 * i + 32] = child.digest
            files += child.sub_files
            total += child.sub_total
            entries += child.sub_entries
        digests = bytes(column)
        if (digests, files, total, entries) == (
            rec.digests,
            rec.sub_files,
            rec.sub_total,
            rec.sub_entries,
        ) and rec.digest != NO_DIGEST:
            continue
        rec = replace(rec, digests=digests, sub_files=files, sub_total=total, sub_entries=entries)
        blob = encode_tree(rec)
        digest = hashlib.sha256(blob).digest()
        rec = replace(rec, digest=digest)
        blobs[digest] = blob
        changed[path] = rec
    return blobs


class TreeWalker:
    """Walks workspace trees for commits: scans folders (with the scan helper on big trees),
    reuses what the stat cache vouches for, and stores the files that changed."""

    def __init__(self, blobs: ObjectStore, helper: ScanHelper | None) -> None:
        self._blobs = blobs
        self._helper = helper

    def _prescan(
        self, root_fd: int, old: dict[str, DirRecord], stats: CommitStats
    ) -> dict[str, Scan]:
        """Scan the folders known from the cache from both ends at once: the helper process
        from the first, this thread from the last, until they meet. Empty when the tree is
        small or the helper is not available."""
        helper = self._helper
        if helper is None or sum(r.n for r in old.values()) < HELPER_MIN_ENTRIES:
            return {}
        paths = list(old)
        if not helper.begin(root_fd, paths):
            return {}
        out: dict[str, Scan] = {}
        opener = DirOpener(root_fd)
        theirs = -1  # the helper has answered for paths[0..theirs]
        mine = len(paths) - 1  # this thread scans paths[mine] next
        try:
            while mine > theirs:
                for index, scan in helper.poll():
                    theirs = index
                    if scan is not None:
                        out[paths[index]] = scan
                        stats.dirs_from_helper += 1
                if mine <= theirs:
                    break
                scan = opener.scan(paths[mine])
                if scan is not None:
                    out[paths[mine]] = scan
                mine -= 1
        finally:
            opener.close()
            for index, scan in helper.finish():
                if scan is not None and paths[index] not in out:
                    out[paths[index]] = scan
                    stats.dirs_from_helper += 1
        return out

    def walk(
        self,
        root_fd: int,
        old: dict[str, DirRecord],
        clock: int,
        stats: CommitStats,
        hints: Hints | None = None,
        track: Tracking | None = None,
    ) -> Walked:
        """Walk the tree; what it found as a change to the records ``old`` (not modified).

        With ``track`` every folder is watched before it is scanned, and when its
        ``changes`` are known only the folders they name are scanned (and the folders new
        or moved since, in full); every other record is kept as it is, and only the
        changed folders and their ancestors are sealed again."""
        if track is not None and track.changes is not None:
            return self._walk_changes(root_fd, old, clock, stats, hints, track, track.changes)
        # a prescan happens before the watches, so it could miss a change made in between
        prescans = self._prescan(root_fd, old, stats) if track is None else {}
        if track is not None:
            track.linked = set()  # every folder is scanned: learnt again
        out = self._visit([(root_fd, "")], root_fd, old, clock, stats, hints, track, prescans, None)
        changed = {p: r for p, r in out.items() if old.get(p) is not r}
        removed = {p for p in old if p not in out}
        # every folder is sealed again: records loaded from disk may predate their children
        blobs = seal(out, changed, old, removed, full=True)
        if track is not None:
            track.racy = {p for p, r in out.items() if r.max_time >= r.clock}
        root = changed.get("") or old[""]
        stats.files_seen = root.sub_files
        return Walked(changed, removed, root, blobs)

    def _walk_changes(
        self,
        root_fd: int,
        old: dict[str, DirRecord],
        clock: int,
        stats: CommitStats,
        hints: Hints | None,
        track: Tracking,
        changes: Changes,
    ) -> Walked:
        """Scan only the changed folders (and the racily clean ones of the last commit);
        walk the subtrees created or moved in full; keep every other record."""
        stats.change_hints = True
        forced = changes.subtrees
        dirty = changes.dirs | track.racy

        def covered(path: str, roots: set[str]) -> bool:
            while True:
                if path in roots:
                    return True
                if not path:
                    return False
                path = _parent(path)

        def descend(path: str) -> bool:
            return path not in old or path in dirty or covered(path, forced)

        # a changed folder whose parent is scanned too is reached from it; the others are
        # opened by path, one component at a time without following links
        starts: list[tuple[int, str]] = []
        opener = DirOpener(root_fd)
        try:
            for path in sorted(dirty | forced):
                if path:
                    parent = _parent(path)
                    if parent in dirty or covered(parent, forced):
                        continue
                fd = opener.open(path)
                if fd is not None:
                    starts.append((fd, path))
        finally:
            opener.close()
        out = self._visit(starts, root_fd, old, clock, stats, hints, track, {}, descend)
        # records at or below a folder that is gone or was walked anew go, unless the walk
        # made them again: found through the old records' subfolders, not a scan of them all
        roots = set(forced)
        for dpath, rec in out.items():
            before = old.get(dpath)
            if before is not None and before.subdirs != rec.subdirs:
                prefix = dpath + "/" if dpath else ""
                roots.update(prefix + name for name in set(before.subdirs) - set(rec.subdirs))
        removed: set[str] = set()
        stack = [p for p in roots if p in old]
        while stack:
            path = stack.pop()
            before = old.get(path)
            if before is None or path in removed:
                continue
            if path not in out:
                removed.add(path)
            prefix = path + "/" if path else ""
            stack += [prefix + name for name in before.subdirs]
        changed = {p: r for p, r in out.items() if old.get(p) is not r}
        blobs = seal([*out, *(_parent(p) for p in roots if p)], changed, old, removed)
        root = changed.get("") or old[""]
        stats.files_seen = root.sub_files
        track.racy = {p for p, r in out.items() if r.max_time >= r.clock}
        track.linked = {p for p in track.linked if p not in removed}
        return Walked(changed, removed, root, blobs)

    def _visit(
        self,
        stack: list[tuple[int, str]],
        root_fd: int,
        old: dict[str, DirRecord],
        clock: int,
        stats: CommitStats,
        hints: Hints | None,
        track: Tracking | None,
        prescans: dict[str, Scan],
        descend: Callable[[str], bool] | None,
    ) -> dict[str, DirRecord]:
        """Scan the folders on ``stack`` (descriptors this call closes, except ``root_fd``)
        and their subfolders (those ``descend`` accepts, or all); their records by path."""
        out: dict[str, DirRecord | _DirBuilder] = {}
        waiting: list[int] = []  # folder fds kept open for pool work
        reused = 0
        try:
            while stack:
                fd, dpath = stack.pop()
                try:
                    pre = prescans.get(dpath)
                    if pre is not None:
                        st = os.fstat(fd)
                        if (st.st_dev, st.st_ino) != (pre[0], pre[1]):
                            pre = None  # the prescan saw another folder there: look again
                        else:
                            stats.dirs_prescanned += 1
                    if pre is None:
                        if track is not None:
                            track.watch(fd, dpath)  # before the scan: no change slips between
                        scan_names, scan_stats, skipped, linked = scan_fd(fd, track is not None)
                        stats.skipped += skipped
                        if linked and track is not None:
                            track.linked.add(dpath)
                        elif track is not None:
                            track.linked.discard(dpath)
                    else:
                        scan_names, scan_stats = pre[2], pre[3]
                    rec = old.get(dpath)
                    subdirs: tuple[str, ...] | list[str]
                    if (
                        rec is not None
                        and rec.max_time < rec.clock
                        and rec.scan_stats == scan_stats
                        and rec.scan_names == scan_names
                    ):
                        out[dpath] = rec
                        subdirs = rec.subdirs
                        reused += 1
                    else:
                        builder = self._rebuild(
                            fd, dpath, scan_names, scan_stats, rec, clock, stats, hints
                        )
                        out[dpath] = builder
                        subdirs = builder.subdirs
                        if builder.pending:
                            waiting.append(fd)
                    prefix = dpath + "/" if dpath else ""
                    for name in subdirs:
                        if descend is not None and not descend(prefix + name):
                            continue  # unchanged: its record (and those below) stay
                        # a folder that cannot be entered is recorded empty this time: gone
                        # or no longer a folder (its parent's scan will differ next time),
                        # or not readable by the store
                        try:
                            child = os.open(name, OPEN_DIR, dir_fd=fd)
                        except PermissionError:
                            stats.unreadable.append(prefix + name)
                            continue
                        except OSError as exc:
                            if exc.errno not in VANISHED:
                                raise
                            stats.skipped += 1
                            continue
                        stack.append((child, prefix + name))
                finally:
                    if fd != root_fd and (not waiting or waiting[-1] != fd):
                        os.close(fd)
                if len(waiting) >= _MAX_PENDING_DIRS:
                    self._settle(out, stats)
                    for wfd in waiting:
                        if wfd != root_fd:
                            os.close(wfd)
                    waiting.clear()
            self._settle(out, stats)
        finally:
            # on an error, let pool work still running finish before its folders close
            for r in out.values():
                if isinstance(r, _DirBuilder):
                    for _, future in r.pending:
                        future.exception()
            for wfd in waiting:
                if wfd != root_fd:
                    os.close(wfd)
            for sfd, _ in stack:  # left over only when something went wrong
                if sfd != root_fd:
                    os.close(sfd)
        stats.dirs_scanned += len(out)
        stats.dirs_reused += reused
        return {p: r.finish(set()) if isinstance(r, _DirBuilder) else r for p, r in out.items()}

    def _rebuild(
        self,
        fd: int,
        dpath: str,
        scan_names: str,
        scan_stats: bytes,
        old: DirRecord | None,
        clock: int,
        stats: CommitStats,
        hints: Hints | None = None,
    ) -> _DirBuilder:
        """Build a folder's section entry by entry, reading only files whose stat changed
        or is racily clean (and not named by a matching hint)."""
        prev_scan: dict[str, bytes] = {}
        prev_file: dict[str, tuple[bytes, int]] = {}
        old_clock = 0
        if old is not None:
            old_clock = old.clock
            if old.scan_names:
                prev_scan = {
                    name: old.scan_stats[SCAN_SIZE * i : SCAN_SIZE * (i + 1)]
                    for i, name in enumerate(old.scan_names.split("\0"))
                }
            old_sizes = unpack_ints("q", old.sizes)
            for i, raw in enumerate(old.names.split(b"\0") if old.n else ()):
                if old.kinds[i] == KIND_FILE:
                    prev_file[decode_text(raw)] = (
                        old.digests[32 * i : 32 * i + 32],
                        old_sizes[i],
                    )
        names = scan_names.split("\0") if scan_names else []
        sts = list(SCAN.iter_unpack(scan_stats))
        b = _DirBuilder(dpath, scan_names, scan_stats, clock)
        s_isreg, s_isdir, s_islnk = stat_mod.S_ISREG, stat_mod.S_ISDIR, stat_mod.S_ISLNK
        for i in sorted(range(len(names)), key=names.__getitem__):
            name = names[i]
            mode, mtime, ctime, st_size, ino = sts[i]
            if s_isreg(mode):
                latest = max(mtime, ctime)
                if latest > b.max_time:
                    b.max_time = latest
                prev = prev_file.get(name)
                same = (
                    prev is not None
                    and prev_scan.get(name) == scan_stats[SCAN_SIZE * i : SCAN_SIZE * (i + 1)]
                )
                hint = hints.get(f"{dpath}/{name}" if dpath else name) if hints else None
                if prev is not None and same and latest < old_clock:
                    digest, size = prev
                elif hint is not None and hint[1] == (mtime, ctime, st_size, ino):
                    digest, size = hint[0], st_size
                    stats.files_known += 1
                else:
                    if same:
                        stats.racy += 1
                    if st_size >= _POOL_MIN_SIZE and self._blobs.workers > 1:
                        future = self._blobs.pool().submit(
                            self._blobs.store_file, fd, name, stats.budget
                        )
                        b.pending.append((len(b.names), future))
                        digest, size = NO_DIGEST, 0
                    else:
                        try:
                            stored = self._blobs.store_file(fd, name, stats.budget)
                        except PermissionError as exc:
                            where = f"{dpath}/{name}" if dpath else name
                            stats.unreadable.append(where)
                            log.warning("snapshot leaves out %s: %s", where, exc)
                            continue
                        if stored is None:
                            stats.skipped += 1
                            continue
                        digest, size = stored[0], stored[1]
                        stats.files_hashed += 1
                        stats.bytes_hashed += stored[3]
                b.names.append(name)
                b.kinds.append(KIND_FILE)
                b.modes.append(mode & 0o7777)
                b.sizes.append(size)
                b.digests.append(digest)
                b.targets.append("")
            elif s_isdir(mode):
                b.names.append(name)
                b.kinds.append(KIND_DIR)
                b.modes.append(mode & 0o7777)
                b.sizes.append(0)
                b.digests.append(NO_DIGEST)
                b.targets.append("")
                b.subdirs.append(name)
            elif s_islnk(mode):
                try:
                    target = os.readlink(name, dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in VANISHED:
                        raise
                    stats.skipped += 1
                    continue
                latest = max(mtime, ctime)
                if latest > b.max_time:
                    b.max_time = latest
                b.names.append(name)
                b.kinds.append(KIND_LINK)
                b.modes.append(0o777)
                b.sizes.append(len(encode_text(target)))
                b.digests.append(NO_DIGEST)
                b.targets.append(target)
            # sockets, fifos and devices are not part of a snapshot
        return b

    def _settle(self, out: dict[str, DirRecord | _DirBuilder], stats: CommitStats) -> None:
        """Wait for pool work and turn the builders that had some into records."""
        for dpath, b in list(out.items()):
            if not isinstance(b, _DirBuilder) or not b.pending:
                continue
            dropped: set[int] = set()
            for i, future in b.pending:
                full = f"{b.path}/{b.names[i]}" if b.path else b.names[i]
                try:
                    stored = future.result()
                except PermissionError as exc:
                    stats.unreadable.append(full)
                    log.warning("snapshot leaves out %s: %s", full, exc)
                    dropped.add(i)
                    continue
                if stored is None:
                    stats.skipped += 1
                    dropped.add(i)
                    continue
                b.digests[i] = stored[0]
                b.sizes[i] = stored[1]
                stats.files_hashed += 1
                stats.bytes_hashed += stored[3]
            b.pending = []
            out[dpath] = b.finish(dropped)

    # ------------------------------------------------------------------ objects

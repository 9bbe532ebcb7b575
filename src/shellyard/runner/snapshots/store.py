"""Content-addressed snapshots of workspaces (W2, W3, W5, W6; docs/contract.md).

Layout under the store root::

    objects/<2 hex>/<62 hex>        file contents named by content id (contentid.py), 0o444
    objects/tmp/                    temp files, renamed into place once complete
    workspaces/<id>/manifests/<seq> one manifest per snapshot: a header naming its root tree
    workspaces/<id>/trees/          the folder trees of its snapshots, by digest (trees.py)
    workspaces/<id>/HEAD            current seq, replaced atomically (temp + rename)
    workspaces/<id>/statcache       stat cache: one record per folder (statcache.py)
    workspaces/<id>/statcache.log   records changed since statcache was last rewritten
    workspaces/<id>/clock           touched before each walk: the racy-clean clock
    workspaces/<id>/lock            flock'd during a commit (plus a per-workspace thread lock)

The jobs live beside this module: ``format`` (the bytes of manifests and folder records),
``statcache`` (the stat cache on disk), ``scan`` (listing folders, the scan helper process),
``commit`` (the walk that decides what to read), ``blobs`` (the object store), ``trees``
(folder trees, and snapshots read through them), ``migrate`` (format 1 stores converted).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from shellyard import filemodes
from shellyard.errors import InvalidInput, NotFound
from shellyard.paths import normalize_relative
from shellyard.runner.kept import Kept
from shellyard.runner.protocol import MAX_READ_CHUNK, FileChunk, PathEntry, SnapshotInfo
from shellyard.runner.snapshots.blobs import ObjectStore
from shellyard.runner.snapshots.budget import HashBudget, HashBudgetExceeded
from shellyard.runner.snapshots.changes import ChangeTracker, Tracking
from shellyard.runner.snapshots.commit import HELPER_MIN_ENTRIES, CommitStats, Hints, TreeWalker
from shellyard.runner.snapshots.format import (
    EMPTY_TREE,
    KIND_DIR,
    KIND_LINK,
    MANIFEST_HEADER,
    O_CLOEXEC,
    atomic_write,
    decode_header,
    encode_tree,
    pack_header,
)
from shellyard.runner.snapshots.migrate import flat_manifests, migrate_workspace
from shellyard.runner.snapshots.scan import O_DIRECTORY, ScanHelper
from shellyard.runner.snapshots.statcache import (
    WorkspaceState,
    apply_delta,
    file_sig,
    load_statcache,
    save_statcache,
)
from shellyard.runner.snapshots.trees import (
    EMPTY_DIGEST,
    SnapshotView,
    TreeCache,
    manifest_roots,
    reachable,
    tree_path,
    write_tree,
)

log = logging.getLogger(__name__)

_WORKSPACE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def locked_at_once(fd: int, operation: int) -> bool:
    """``flock(fd, operation)`` if it is granted without waiting (True), else nothing held."""
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class SnapshotStore:
    """Commits workspace trees into immutable, numbered snapshots and reads them back.

    Synchronous and thread-safe; the runner calls it through ``asyncio.to_thread``. Commits of
    one workspace are serialised (a thread lock plus ``flock``), so snapshot numbers only grow.
    ``workers``: threads hashing big files; ``scan_helper``: scan big trees in two processes;
    ``change_hints``: scan only what inotify saw change (changes.py; default on Linux).
    """

    def __init__(
        self,
        root: Path,
        *,
        workers: int | None = None,
        scan_helper: bool | None = None,
        change_hints: bool | None = None,
        cached_workspaces: int = 32,
    ) -> None:
        self.root = Path(root)
        self._workspaces = self.root / "workspaces"
        # The store is the service user's alone (docs/security.md "The home's files"): read
        # views reach its objects through their own links, never through these folders.
        filemodes.private_dir(self.root)
        self._workspaces.mkdir(mode=0o700, exist_ok=True)
        cpus = os.cpu_count() or 1
        self.blobs = ObjectStore(
            self.root / "objects", workers if workers is not None else min(4, cpus)
        )
        if scan_helper is None:
            scan_helper = cpus > 1
        self._helper = ScanHelper() if scan_helper else None
        if change_hints is None:
            change_hints = sys.platform == "linux"
        self._tracker = ChangeTracker() if change_hints else None
        self._walker = TreeWalker(self.blobs, self._helper)
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._states: OrderedDict[str, WorkspaceState] = OrderedDict()
        self._cached_workspaces = cached_workspaces
        self.trees = TreeCache()
        #: Workspaces known to hold no format 1 manifest (migrate.py), in this process.
        self._migrated: set[str] = set()
        #: workspace id → its folder, checked and joined once (``_wdir`` runs a few times per
        #: execution on the loop's thread, docs/benchmarks.md §72): only a name, whether it
        #: exists is looked at where it matters; bounded, since unknown ids are checked too
        self._wdirs: Kept[str, Path] = Kept(self._checked_wdir)
        #: Stats of the most recent commit in this store (any workspace).
        self.last_commit_stats: CommitStats | None = None

    # ------------------------------------------------------------------ public API

    def ensure_workspace(self, workspace_id: str) -> SnapshotInfo:
        """Create the workspace's metadata with the empty snapshot 0 if missing; return head."""
        wdir = self._wdir(workspace_id)
        with self._workspace_lock(workspace_id, wdir):
            return self._load_state(workspace_id, wdir).head_info

    def commit(
        self,
        workspace_id: str,
        tree: Path,
        hints: Hints | None = None,
        budget: HashBudget | None = None,
    ) -> SnapshotInfo:
        """Snapshot ``tree`` as the workspace's next seq (W3), or return the head with
        ``new=False`` when the tree equals it.

        ``hints`` (path → digest and the file's stat as (mtime_ns, ctime_ns, size, inode))
        names files the caller has just written from objects already in this store: a file
        whose stat still matches is taken with that digest instead of being read again (a
        transfer or a restore that copied it out of the store knows its content).

        With change hints on, only the folders changed since this store's last commit of
        the workspace are scanned, when that is known without a gap (changes.py); else,
        and always when the stat cache was reloaded from disk, the whole tree is walked."""
        started = time.perf_counter()
        wdir = self._wdir(workspace_id)
        stats = CommitStats(workspace_id=workspace_id, budget=budget)
        with self._workspace_lock(workspace_id, wdir):
            state = self._load_state(workspace_id, wdir)
            try:
                root_fd = os.open(tree, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            except OSError as exc:
                raise NotFound(
                    f"workspace folder {str(tree)!r} cannot be opened ({exc.strerror}); "
                    f"create the workspace before committing it",
                    workspace_id=workspace_id,
                ) from None
            track = self._tracker.begin(workspace_id, str(tree)) if self._tracker else None
            racy, state.racy = state.racy, None  # unknown until this commit is complete
            if track is not None:
                if racy is None or state.linked:
                    track.changes = None  # not known well enough: walk everything
                else:
                    track.racy, track.linked = racy, set(state.linked)
            try:
                changes = track.changes if track is not None else None
                if changes is not None and not (changes.dirs or changes.subtrees or racy):
                    stats.change_hints = True  # nothing changed since the head was made
                    return self._done(state, stats, track, racy or set(), started)
                clock = self._tick(wdir)
                walked = self._walker.walk(root_fd, state.dirs, clock, stats, hints, track)
            except HashBudgetExceeded:
                self.last_commit_stats = stats  # what it hashed before it stopped
                raise
            finally:
                os.close(root_fd)
            root = walked.root
            # trees first, so a manifest never names a missing one; a full walk makes sure
            # of every tree (the cache may come from before this format), a hinted one writes
            # the trees it sealed anew
            for digest, blob in walked.blobs.items():
                stats.trees_written += write_tree(wdir, digest, blob)
            if not stats.change_hints:
                for rec in [*walked.changed.values(), *state.dirs.values()]:
                    if rec.digest not in walked.blobs and not tree_path(wdir, rec.digest).exists():
                        stats.trees_written += write_tree(wdir, rec.digest, encode_tree(rec))
            if root.digest.hex() != state.head_info.root_hash:
                seq = state.head_info.seq + 1
                created_at = time.time()
                header = pack_header(created_at, root.sub_files, root.sub_total, root.digest)
                atomic_write(wdir / "manifests" / str(seq), header)
                atomic_write(wdir / "HEAD", f"{seq}\n".encode())
                state.head_info = SnapshotInfo(
                    workspace_id=workspace_id,
                    seq=seq,
                    root_hash=root.digest.hex(),
                    files=root.sub_files,
                    bytes=root.sub_total,
                    created_at=created_at,
                    new=False,
                )
                state.head_sig = file_sig(wdir / "HEAD")
                stats.new = True
            apply_delta(state, walked.changed, walked.removed)
            try:
                stats.cache_bytes = save_statcache(wdir, state, walked.changed, walked.removed)
            except OSError as exc:  # only costs re-reading files next time
                log.warning("could not save the stat cache of %s: %s", workspace_id, exc)
                track = None  # the records on disk are not the head's: walk next time
            stats.entries = root.sub_entries
            if self._helper is not None and track is None and stats.entries >= HELPER_MIN_ENTRIES:
                self._helper.start_soon()  # for the next full walks of this big tree
            return self._done(state, stats, track, track.racy if track else set(), started)

    def commit_if_unchanged(self, workspace_id: str, tree: Path) -> SnapshotInfo | None:
        """``commit``'s answer when it is known at once: the head (``new=False``), when the
        change hints show nothing changed since it was committed and nothing of it is racily
        clean or hard-linked: the same answer, and the same state after, as ``commit``'s
        shortcut for that case, which writes nothing either. None: not known at once (a lock
        held elsewhere, the head or stat cache changed on disk, hints unknown or not empty):
        call ``commit``. Never waits (locks are tried, not waited for) and does a few stats
        and at most a short read: the event loop calls it, saving a worker thread's hop per
        command (docs/benchmarks.md §36, "Thread hops")."""
        started = time.perf_counter()
        wdir = self._wdir(workspace_id)
        if self._tracker is None or workspace_id not in self._migrated:
            return None
        with self._try_workspace_lock(workspace_id, wdir) as locked:
            if not locked:
                return None
            with self._guard:
                state = self._states.get(workspace_id)
            if state is None or state.racy is None or state.racy or state.linked:
                return None
            # f-strings, not Path joins: this runs on the loop at every execution's end
            cache_sig = (file_sig(f"{wdir}/statcache"), file_sig(f"{wdir}/statcache.log"))
            if state.head_sig != file_sig(f"{wdir}/HEAD") or state.cache_sig != cache_sig:
                return None  # another store instance committed: ``commit`` reloads it
            if not os.path.isdir(tree) or not self._tracker.unchanged(workspace_id, str(tree)):
                return None
            with self._guard:
                self._states.move_to_end(workspace_id)
            stats = CommitStats(workspace_id=workspace_id, change_hints=True)
            stats.seq = state.head_info.seq
            stats.elapsed_s = time.perf_counter() - started
            self.last_commit_stats = stats
            return state.head_info.model_copy(update={"new": False})

    def _done(
        self,
        state: WorkspaceState,
        stats: CommitStats,
        track: Tracking | None,
        racy: set[str],
        started: float,
    ) -> SnapshotInfo:
        """Finish a commit: what the next one may rely on, its stats, the head it made."""
        if track is not None and self._tracker is not None:
            state.racy, state.linked = racy, track.linked
            self._tracker.finish(track)
        stats.seq = state.head_info.seq
        stats.elapsed_s = time.perf_counter() - started
        self.last_commit_stats = stats
        return state.head_info.model_copy(update={"new": stats.new})

    def head(self, workspace_id: str) -> SnapshotInfo:
        """The workspace's latest committed snapshot."""
        wdir = self._existing_wdir(workspace_id)
        return self._read_info(workspace_id, wdir, self._read_head(wdir, workspace_id))

    def list_snapshots(self, workspace_id: str) -> list[SnapshotInfo]:
        """Every retained snapshot of the workspace, oldest first (W5)."""
        wdir = self._existing_wdir(workspace_id)
        infos: list[SnapshotInfo] = []
        for seq in range(self._read_head(wdir, workspace_id) + 1):
            with contextlib.suppress(NotFound):
                infos.append(self._read_info(workspace_id, wdir, seq))
        return infos

    def manifest(self, workspace_id: str, seq: int | None = None) -> dict[str, PathEntry]:
        """Every entry of a snapshot (files, folders, symlinks) by path; the root is implicit.
        For tests and small snapshots: the product walks ``view`` instead.
        (It holds the whole snapshot: ``view`` reads one folder at a time.)"""
        return {
            e.path: self.blobs.reveal(PathEntry.model_validate(e.model_dump()))
            for e in self.view(workspace_id, seq).entries()
        }

    def stat(self, workspace_id: str, seq: int | None, path: str) -> PathEntry | None:
        """The entry at ``path`` in snapshot ``seq`` (None: head), or None when absent.
        ``""`` is the root folder."""
        rel = normalize_relative(path)
        v = self.view(workspace_id, seq)
        if rel == "":
            return PathEntry(path="", kind="dir", size=0, mode=0o755)
        entry = v.entry(rel)
        return None if entry is None else self.blobs.reveal(entry)

    def read(
        self, workspace_id: str, seq: int | None, path: str, offset: int, limit: int
    ) -> FileChunk:
        """Up to ``limit`` bytes (at most ``MAX_READ_CHUNK``) of a file at ``offset``, from
        snapshot ``seq`` (None: head). Page on with ``next_offset`` until it equals ``size``."""
        if offset < 0 or limit < 0:
            raise InvalidInput(
                f"offset ({offset}) and limit ({limit}) must be zero or more",
                offset=offset,
                limit=limit,
            )
        rel = normalize_relative(path)
        v = self.view(workspace_id, seq)
        where = f"snapshot {v.info.seq} of workspace {workspace_id!r}"
        found = v.find(rel) if rel else None
        if rel == "" or (found is not None and found[0].kinds[found[1]] == KIND_DIR):
            raise InvalidInput(
                f"{rel or '(the root)'!r} is a folder in {where}; read a file inside it, "
                f"or list the folder instead",
                path=rel,
            )
        if found is None:
            raise NotFound(
                f"no file {rel!r} in {where}; check the path (relative to the workspace "
                f"root) or list the snapshot to see what it holds",
                path=rel,
                seq=v.info.seq,
            )
        tree, i = found
        if tree.kinds[i] == KIND_LINK:
            raise InvalidInput(
                f"{rel!r} is a symbolic link to {tree.targets[i]!r} in {where}; links are not "
                f"followed, read the file it points to by its own path",
                path=rel,
            )
        size = tree.sizes[i]
        start = min(offset, size)
        want = min(limit, MAX_READ_CHUNK, size - start)
        data = b""
        if want > 0:
            fd = os.open(self.blobs.object_path(tree.digest(i).hex()), os.O_RDONLY)
            try:
                data = os.pread(fd, want, start)
            finally:
                os.close(fd)
        return FileChunk(data=data, offset=start, next_offset=start + len(data), size=size)

    def retained_digests(self, workspace_id: str) -> set[bytes]:
        """The file digests the workspace's retained snapshots name (for garbage
        collection), walking each distinct folder tree once; format 1 manifests left are
        converted first."""
        wdir = self._wdir(workspace_id)
        if flat_manifests(wdir):
            with self._workspace_lock(workspace_id, wdir):
                migrate_workspace(wdir, workspace_id)
        return reachable(wdir, [d for _, d in manifest_roots(wdir)], self.trees)[1]

    def open_object(self, sha256: str) -> BinaryIO:
        """Open a stored object (by hex sha256) for streaming reads; the caller closes it."""
        return self.blobs.open_object(sha256)

    def forget_changes(self, workspace_id: str) -> None:
        """The tree is reached through a new overlay from now on (runner/own_mounts.py): the
        inotify watches were added through the last one, whose events stop when it goes, so
        its next commit walks it whole instead of trusting them."""
        if self._tracker is not None:
            self._tracker.lose(workspace_id)

    def close(self) -> None:
        """Stop the hashing threads and the scan helper (both restart on demand)."""
        self.blobs.close()
        if self._helper is not None:
            self._helper.close()
        if self._tracker is not None:
            self._tracker.close()  # the next commit of each workspace walks it whole

    # ------------------------------------------------------------------ workspace metadata

    def _wdir(self, workspace_id: str) -> Path:
        if not isinstance(workspace_id, str):  # unhashable for the table
            self._checked_wdir(workspace_id)
        return self._wdirs(workspace_id)

    def _checked_wdir(self, workspace_id: str) -> Path:
        if not isinstance(workspace_id, str) or not _WORKSPACE_ID.fullmatch(workspace_id):
            raise InvalidInput(
                f"workspace id {workspace_id!r} is not valid; use 1-128 letters, digits, "
                f"'.', '_' or '-', starting with a letter or digit",
                workspace_id=str(workspace_id),
            )
        return self._workspaces / workspace_id

    def _existing_wdir(self, workspace_id: str) -> Path:
        wdir = self._wdir(workspace_id)
        if not (wdir / "HEAD").exists():
            raise NotFound(
                f"workspace {workspace_id!r} has no snapshots in this store; create it first",
                workspace_id=workspace_id,
            )
        if workspace_id not in self._migrated:  # once per workspace and process
            if flat_manifests(wdir):
                with self._workspace_lock(workspace_id, wdir):
                    migrate_workspace(wdir, workspace_id)
            self._migrated.add(workspace_id)
        return wdir

    @contextlib.contextmanager
    def _workspace_lock(self, workspace_id: str, wdir: Path) -> Iterator[None]:
        with self._guard:
            lock = self._locks.setdefault(workspace_id, threading.Lock())
        with lock:
            try:
                fd = os.open(wdir / "lock", os.O_RDWR | os.O_CREAT | O_CLOEXEC, 0o600)
            except FileNotFoundError:
                wdir.mkdir(mode=0o700, exist_ok=True)
                (wdir / "manifests").mkdir(mode=0o700, exist_ok=True)
                fd = os.open(wdir / "lock", os.O_RDWR | os.O_CREAT | O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    @contextlib.contextmanager
    def _try_workspace_lock(self, workspace_id: str, wdir: Path) -> Iterator[bool]:
        """``_workspace_lock`` if it is free at once (True), else nothing held (False)."""
        with self._guard:
            lock = self._locks.get(workspace_id)
        if lock is None or not lock.acquire(blocking=False):
            yield False
            return
        try:
            try:
                fd = os.open(f"{wdir}/lock", os.O_RDWR | O_CLOEXEC)  # on the loop: no join
            except FileNotFoundError:
                yield False
                return
            try:
                yield locked_at_once(fd, fcntl.LOCK_EX)
            finally:
                os.close(fd)
        finally:
            lock.release()

    def _read_head(self, wdir: Path, workspace_id: str) -> int:
        try:
            return int((wdir / "HEAD").read_bytes())
        except FileNotFoundError:
            raise NotFound(
                f"workspace {workspace_id!r} has no snapshots in this store; create it first",
                workspace_id=workspace_id,
            ) from None

    def _read_info(self, workspace_id: str, wdir: Path, seq: int) -> SnapshotInfo:
        try:
            with open(wdir / "manifests" / str(seq), "rb") as f:
                raw = f.read(MANIFEST_HEADER.size)
        except FileNotFoundError:
            raise NotFound(
                f"snapshot {seq} of workspace {workspace_id!r} is not retained",
                workspace_id=workspace_id,
                seq=seq,
            ) from None
        return decode_header(workspace_id, seq, raw)

    def _load_state(self, workspace_id: str, wdir: Path) -> WorkspaceState:
        """The workspace's head and stat cache, creating snapshot 0 if missing. Memoised, and
        checked against the files' stat so commits by another store instance are seen."""
        head_sig = file_sig(wdir / "HEAD")
        if head_sig is None:
            self._create_empty(wdir)
            head_sig = file_sig(wdir / "HEAD")
        if workspace_id not in self._migrated:
            migrate_workspace(wdir, workspace_id)
            self._migrated.add(workspace_id)
        cache_sig = (file_sig(wdir / "statcache"), file_sig(wdir / "statcache.log"))
        with self._guard:
            state = self._states.get(workspace_id)
            if state is not None:
                self._states.move_to_end(workspace_id)
        if state is not None and state.head_sig == head_sig and state.cache_sig == cache_sig:
            return state
        info = self._read_info(workspace_id, wdir, self._read_head(wdir, workspace_id))
        state = WorkspaceState(info, head_sig, {}, cache_sig)
        load_statcache(wdir, state)
        with self._guard:
            self._states[workspace_id] = state
            while len(self._states) > self._cached_workspaces:
                self._states.popitem(last=False)
        return state

    def _create_empty(self, wdir: Path) -> None:
        """Snapshot 0, the empty tree; or, if manifests exist without a HEAD (it was lost),
        a HEAD at the latest of them, so numbers never go back."""
        wdir.mkdir(mode=0o700, exist_ok=True)
        (wdir / "manifests").mkdir(mode=0o700, exist_ok=True)
        seqs = [int(n) for n in os.listdir(wdir / "manifests") if n.isdigit()]
        if seqs:
            atomic_write(wdir / "HEAD", f"{max(seqs)}\n".encode())
            return
        write_tree(wdir, EMPTY_DIGEST, EMPTY_TREE)
        atomic_write(wdir / "manifests" / "0", pack_header(time.time(), 0, 0, EMPTY_DIGEST))
        atomic_write(wdir / "HEAD", b"0\n")

    def _tick(self, wdir: Path) -> int:
        """A filesystem timestamp taken now: whatever changes from here on gets an mtime and
        a ctime at or after it."""
        clock = wdir / "clock"
        try:
            os.utime(clock)
        except FileNotFoundError:
            clock.touch(mode=0o600)
        return os.stat(clock).st_mtime_ns

    # ------------------------------------------------------------------ manifests

    def _seq(self, workspace_id: str, seq: int | None) -> tuple[Path, int]:
        wdir = self._existing_wdir(workspace_id)
        head = self._read_head(wdir, workspace_id)
        if seq is None:
            return wdir, head
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0 or seq > head:
            raise NotFound(
                f"snapshot {seq!r} of workspace {workspace_id!r} does not exist; its "
                f"snapshots are numbered 0 to {head}",
                workspace_id=workspace_id,
                seq=str(seq),
            )
        return wdir, seq

    def view(self, workspace_id: str, seq: int | None = None) -> SnapshotView:
        """Snapshot ``seq`` (None: the head), read through its folder trees on demand (the
        workspace's format 1 manifests were converted by ``_existing_wdir``)."""
        wdir, seq = self._seq(workspace_id, seq)
        return SnapshotView(self._read_info(workspace_id, wdir, seq), wdir, self.trees)


__all__ = ["CommitStats", "Hints", "SnapshotStore"]

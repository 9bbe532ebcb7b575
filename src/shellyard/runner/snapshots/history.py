"""Reading committed snapshots (W2, W5, W6): folder listings, diffs, streamed file reads,
tar downloads, and pruning of old manifests. Everything here reads manifests and objects of
the ``SnapshotStore``; nothing reads the live workspace, so a running command's half-written
files are never visible.

Paths are looked up in the manifest, never on disk: a path that goes through a symbolic link
recorded in the snapshot is refused (``PathRefused`` naming the link) rather than resolved.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import tarfile
from collections.abc import Iterator
from typing import BinaryIO

from shellyard.errors import InvalidInput, NotFound
from shellyard.paths import normalize_relative
from shellyard.runner.protocol import (
    MAX_PAGE,
    DiffEntry,
    DiffResult,
    DirListing,
    PathEntry,
    PruneResult,
)
from shellyard.runner.snapshots.format import KIND_DIR, KIND_LINK, Tree
from shellyard.runner.snapshots.store import SnapshotStore
from shellyard.runner.snapshots.trees import SnapshotView, sweep
from shellyard.runner.workspace_paths import link_refused

#: Chunks a streamed read or a tar download yields: 4 MiB, because each chunk costs a hop to
#: a worker thread and back (1 MiB chunks read a 1 GiB file at ~0.55x the speed of ``cat``,
#: 4 MiB chunks at ~0.8x; measured by bench/bench_transfer.py's read benchmark).
STREAM_CHUNK = 4 << 20
_TAR_BLOCK = 512

#: An entry of a snapshot: the tree of its folder and its index there.
Found = tuple[Tree, int]


def manifest(store: SnapshotStore, workspace_id: str, seq: int | None) -> SnapshotView:
    """Snapshot ``seq`` (None: the head), read folder by folder through its trees."""
    return store.view(workspace_id, seq)


def check_links(v: SnapshotView, rel: str) -> None:
    """Refuse ``rel`` when one of its folders is a symbolic link in the snapshot (W6)."""
    if "/" not in rel:
        return
    link = v.first_link(rel)
    if link is not None:
        raise link_refused(rel, link[0], link[1])


def lookup(v: SnapshotView, path: str) -> tuple[str, Found | None]:
    """(normalised path, its entry or None for the root); NotFound when absent."""
    rel = normalize_relative(path)
    if not rel:
        return rel, None
    found = v.find(rel)
    if found is None:
        check_links(v, rel)
        raise NotFound(
            f"no {rel!r} in snapshot {v.info.seq} of workspace {v.info.workspace_id!r}; check "
            f"the path (relative to the workspace root) or list the folder above it",
            path=rel,
            seq=v.info.seq,
        )
    return rel, found


def stat(store: SnapshotStore, workspace_id: str, seq: int | None, path: str) -> PathEntry | None:
    v = manifest(store, workspace_id, seq)
    try:
        rel, found = lookup(v, path)
    except NotFound:
        return None
    if found is None:
        return PathEntry(path="", kind="dir", size=0, mode=0o755)
    return store.blobs.reveal(PathEntry.model_validate(found[0].entry(found[1], rel).model_dump()))


def _page_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidInput(f"limit must be between 1 and {MAX_PAGE}, not {limit!r}")
    return limit


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def list_dir(
    store: SnapshotStore,
    workspace_id: str,
    seq: int | None,
    path: str,
    recursive: bool,
    after: str | None,
    limit: int,
) -> DirListing:
    """The entries below ``path`` (all of them when ``recursive``), one page at a time, in
    the order of the folders' paths then of names within each; read a folder at a time."""
    limit = _page_limit(limit)
    v = manifest(store, workspace_id, seq)
    rel, found = lookup(v, path)
    if found is not None and found[0].kinds[found[1]] != KIND_DIR:
        # a file or a link: its listing is itself, as ls does
        entry = store.blobs.reveal(found[0].entry(found[1], rel))
        return DirListing(workspace_id=workspace_id, seq=v.info.seq, path=rel, entries=[entry])
    mark: tuple[str, str] | None = None
    if after:
        where = normalize_relative(after)
        if not where or v.find(where) is None:
            raise InvalidInput(
                f"'after' {after!r} is not an entry of snapshot {v.info.seq}; pass the "
                f"next_after of the previous page"
            )
        parent, _, name = where.rpartition("/")
        mark = (parent, name)
    entries: list[PathEntry] = []
    next_after = None
    folders = v.folders(rel) if recursive else iter([(rel, v.tree(v.folder_digest(rel) or b""))])
    for folder, tree in folders:
        if mark is not None and folder < mark[0]:
            continue
        for i, name in enumerate(tree.names):
            if mark is not None and (folder, name) <= mark:
                continue
            if len(entries) == limit:
                next_after = entries[-1].path
                break
            entries.append(store.blobs.reveal(tree.entry(i, _join(folder, name))))
        if next_after is not None:
            break
    return DirListing(
        workspace_id=workspace_id, seq=v.info.seq, path=rel, entries=entries, next_after=next_after
    )


def same(a: Found, b: Found) -> bool:
    """Whether two entries are equal for a diff (kind, content, mode, link text)."""
    (ta, i), (tb, j) = a, b
    if ta.kinds[i] != tb.kinds[j] or ta.modes[i] != tb.modes[j]:
        return False
    if ta.kinds[i] == KIND_DIR:
        return True  # a folder's own entry changes with its mode only
    return ta.digest(i) == tb.digest(j) and ta.targets[i] == tb.targets[j]


def pairs(
    va: SnapshotView | None, vb: SnapshotView, rel: str
) -> Iterator[tuple[str, Found | None, Found | None]]:
    """The entries at and below ``rel`` of either snapshot (``va`` None: none), paired by
    path, in path order; a folder equal in both (same tree digest) is not entered. A heap
    of the entries still to give: every path below a folder sorts after the folder's."""
    heap: list[tuple[str, Found | None, Found | None]] = []

    def expand(folder: str, da: bytes | None, db: bytes | None) -> None:
        if da is not None and da == db:
            return
        ta = va.tree(da) if va is not None and da is not None else None
        tb = vb.tree(db) if db is not None else None
        names = set(ta.names if ta else ()) | set(tb.names if tb else ())
        for name in names:
            x = ta.find(name) if ta else None
            y = tb.find(name) if tb else None
            heapq.heappush(
                heap,
                (
                    _join(folder, name),
                    (ta, x) if ta is not None and x is not None else None,
                    (tb, y) if tb is not None and y is not None else None,
                ),
            )

    if rel:
        a, b = va.find(rel) if va is not None else None, vb.find(rel)
        if a is not None or b is not None:
            heap.append((rel, a, b))
    else:
        expand("", va.root if va is not None else None, vb.root)
    while heap:
        path, a, b = heapq.heappop(heap)
        yield path, a, b
        da = a[0].digest(a[1]) if a is not None and a[0].kinds[a[1]] == KIND_DIR else None
        db = b[0].digest(b[1]) if b is not None and b[0].kinds[b[1]] == KIND_DIR else None
        if da is not None or db is not None:
            expand(path, da, db)


def diff(
    store: SnapshotStore,
    workspace_id: str,
    from_seq: int,
    to_seq: int | None,
    path: str,
    after: str | None,
    limit: int,
) -> DiffResult:
    """What changed from snapshot ``from_seq`` to ``to_seq`` (None: the head), below
    ``path``: added, removed and changed entries in path order, one page at a time. Only
    folders whose trees differ are read."""
    limit = _page_limit(limit)
    va = manifest(store, workspace_id, from_seq)
    vb = manifest(store, workspace_id, to_seq)
    rel = normalize_relative(path)
    mark = normalize_relative(after) if after else None
    changes: list[DiffEntry] = []
    next_after = None
    for p, x, y in pairs(va, vb, rel):
        if mark is not None and p <= mark:
            continue
        change = _change(store, x, y, p)
        if change is None:
            continue
        if len(changes) == limit:
            next_after = changes[-1].path
            break
        changes.append(change)
    return DiffResult(
        workspace_id=workspace_id,
        from_seq=va.info.seq,
        to_seq=vb.info.seq,
        changes=changes,
        next_after=next_after,
    )


def _change(store: SnapshotStore, x: Found | None, y: Found | None, p: str) -> DiffEntry | None:
    if x is None:
        assert y is not None
        new = store.blobs.reveal(y[0].entry(y[1], p))
        return DiffEntry(
            path=p,
            change="added",
            kind=new.kind,
            new_size=new.size,
            new_sha256=new.sha256,
            new_content_id=new.content_id,
        )
    old = store.blobs.reveal(x[0].entry(x[1], p))
    if y is None:
        return DiffEntry(
            path=p,
            change="removed",
            kind=old.kind,
            old_kind=old.kind,
            old_size=old.size,
            old_sha256=old.sha256,
            old_content_id=old.content_id,
        )
    if same(x, y):
        return None
    new = store.blobs.reveal(y[0].entry(y[1], p))
    return DiffEntry(
        path=p,
        change="changed",
        kind=new.kind,
        old_kind=old.kind,
        old_size=old.size,
        new_size=new.size,
        old_sha256=old.sha256,
        new_sha256=new.sha256,
        old_content_id=old.content_id,
        new_content_id=new.content_id,
    )


def open_file(
    store: SnapshotStore, workspace_id: str, seq: int | None, path: str
) -> tuple[BinaryIO, PathEntry]:
    """Open a file of a snapshot for reading: (its object, its entry). Folders and links are
    refused with a message that says what to do instead."""
    v = manifest(store, workspace_id, seq)
    rel, found = lookup(v, path)
    where = f"snapshot {v.info.seq} of workspace {workspace_id!r}"
    if found is None or found[0].kinds[found[1]] == KIND_DIR:
        raise InvalidInput(
            f"{rel or '(the root)'!r} is a folder in {where}; read a file inside it, list the "
            f"folder, or download it as a tar archive",
            path=rel,
        )
    tree, i = found
    if tree.kinds[i] == KIND_LINK:
        raise InvalidInput(
            f"{rel!r} is a symbolic link to {tree.targets[i]!r} in {where}; links are not "
            f"followed, read the file it points to by its own path",
            path=rel,
        )
    entry = store.blobs.reveal(PathEntry.model_validate(tree.entry(i, rel).model_dump()))
    assert entry.content_id is not None
    try:
        handle = store.open_object(entry.content_id)
    except NotFound:
        raise NotFound(
            f"the content of {rel!r} in {where} is no longer in the store (the snapshot was "
            f"pruned meanwhile); read it at a retained snapshot",
            path=rel,
        ) from None
    return handle, entry


def read_chunks(handle: BinaryIO, offset: int, end: int) -> Iterator[bytes]:
    """Bytes ``offset..end`` of an open object, in chunks; closes it at the end."""
    fd = handle.fileno()
    try:
        pos = offset
        while pos < end:
            data = os.pread(fd, min(STREAM_CHUNK, end - pos), pos)
            if not data:
                raise OSError(f"object ended at {pos} of {end} bytes")
            pos += len(data)
            yield data
    finally:
        handle.close()


def tar_chunks(
    store: SnapshotStore, workspace_id: str, seq: int | None, path: str
) -> Iterator[bytes]:
    """A POSIX (pax) tar of ``path`` in a snapshot, produced in bounded chunks. Members are
    named below the folder's own name (``src/…`` for ``src``; no prefix for the root);
    symbolic links are members of their own, never followed."""
    v = manifest(store, workspace_id, seq)
    rel, found = lookup(v, path)
    base = rel.rsplit("/", 1)[-1] if rel else ""
    cut = len(rel) + 1 if rel else 0
    mtime = int(v.info.created_at)
    members: Iterator[PathEntry]
    if found is not None and found[0].kinds[found[1]] != KIND_DIR:
        members = iter([found[0].entry(found[1], rel)])
        cut = len(rel) - len(base)
        base = ""
    else:
        # in path order, a folder's trees read as the walk reaches it
        members = (b[0].entry(b[1], p) for p, _, b in pairs(None, v, rel) if b and p != rel)
    buf = bytearray()
    if base:
        info = tarfile.TarInfo(base)
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
        buf += _header(info)
    for entry in members:
        name = entry.path[cut:]
        info = tarfile.TarInfo(f"{base}/{name}" if base else name)
        info.mode, info.mtime = entry.mode, mtime
        if entry.kind == "dir":
            info.type = tarfile.DIRTYPE
            buf += _header(info)
        elif entry.kind == "symlink":
            info.type, info.linkname = tarfile.SYMTYPE, entry.target or ""
            buf += _header(info)
        else:
            assert entry.content_id is not None
            info.size = entry.size
            buf += _header(info)
            with store.open_object(entry.content_id) as handle:
                fd, pos = handle.fileno(), 0
                while pos < entry.size:
                    data = os.pread(fd, min(STREAM_CHUNK, entry.size - pos), pos)
                    if not data:
                        raise OSError(f"object of {entry.path!r} ended early")
                    buf += data
                    pos += len(data)
                    if len(buf) >= STREAM_CHUNK:
                        yield bytes(buf)
                        buf.clear()
            pad = -entry.size % _TAR_BLOCK
            buf += bytes(pad)
        if len(buf) >= STREAM_CHUNK:
            yield bytes(buf)
            buf.clear()
    buf += bytes(2 * _TAR_BLOCK)
    yield bytes(buf)


def _header(info: tarfile.TarInfo) -> bytes:
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def prune(store: SnapshotStore, workspace_id: str, keep: list[int]) -> PruneResult:
    """Delete the manifests of the workspace's snapshots not in ``keep``; the head is always
    kept. Their objects become garbage for ``collect_garbage`` unless another snapshot names
    them."""
    wdir = store._existing_wdir(workspace_id)
    keep_set = {int(s) for s in keep}
    removed: list[int] = []
    retained: list[int] = []
    with store._workspace_lock(workspace_id, wdir):
        head = store._read_head(wdir, workspace_id)
        keep_set.add(head)
        seqs = sorted(int(n) for n in os.listdir(wdir / "manifests") if n.isdigit())
        for seq in seqs:
            if seq in keep_set:
                retained.append(seq)
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(wdir / "manifests" / str(seq))
            removed.append(seq)
        if removed:
            sweep(wdir, store.trees)  # the folder trees no retained snapshot reaches
    return PruneResult(workspace_id=workspace_id, removed=removed, retained=retained)


__all__ = [
    "STREAM_CHUNK",
    "diff",
    "list_dir",
    "lookup",
    "manifest",
    "open_file",
    "pairs",
    "prune",
    "read_chunks",
    "same",
    "stat",
    "tar_chunks",
]

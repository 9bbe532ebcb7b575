"""Reading committed snapshots (W2, W5, W6): folder listings, diffs, streamed file reads,
tar downloads, and pruning of old manifests. Everything here reads manifests and objects of
the ``SnapshotStore``; nothing reads the live workspace, so a running command's half-written
files are never visible.

Paths are looked up in the manifest, never on disk: a path that goes through a symbolic link
recorded in the snapshot is refused (``PathRefused`` naming the link) rather than resolved.
"""

from __future__ import annotations

import contextlib
import os
import tarfile
from collections.abc import Iterator
from typing import BinaryIO, Literal

from shellyard.errors import InvalidInput, NotFound
from shellyard.paths import normalize_relative
from shellyard.runner.fsops import link_refused
from shellyard.runner.protocol import (
    MAX_PAGE,
    DiffEntry,
    DiffResult,
    DirListing,
    PathEntry,
    PruneResult,
)
from shellyard.runner.snapshots.format import (
    KIND_DIR,
    KIND_FILE,
    KIND_LINK,
    Manifest,
    decode_manifest,
)
from shellyard.runner.snapshots.store import SnapshotStore

#: Chunks a streamed read or a tar download yields: 4 MiB, because each chunk costs a hop to
#: a worker thread and back (1 MiB chunks read a 1 GiB file at ~0.55x the speed of ``cat``,
#: 4 MiB chunks at ~0.8x; measured by bench/bench_transfer.py's read benchmark).
STREAM_CHUNK = 4 << 20
_TAR_BLOCK = 512


def manifest(store: SnapshotStore, workspace_id: str, seq: int | None) -> Manifest:
    return store._manifest(workspace_id, seq)


def head_manifest(store: SnapshotStore, workspace_id: str) -> Manifest:
    """The head's manifest for a writer that looks at it once, without entering the store's
    cache of decoded manifests: a transfer of 10,000 files in 10 batches would otherwise
    leave 10 decoded heads (~3 MB each) in it (measured)."""
    wdir = store._existing_wdir(workspace_id)
    seq = store._read_head(wdir, workspace_id)
    with store._guard:
        cached = store._manifests.get((workspace_id, seq))
    if cached is not None:
        return cached
    try:
        raw = (wdir / "manifests" / str(seq)).read_bytes()
    except FileNotFoundError:
        return store._manifest(workspace_id, seq)  # raises the store's own clear error
    return decode_manifest(workspace_id, seq, raw)


_KIND_NAMES: dict[int, Literal["file", "dir", "symlink"]] = {
    KIND_FILE: "file",
    KIND_DIR: "dir",
    KIND_LINK: "symlink",
}


def fast_entry(m: Manifest, i: int) -> PathEntry:
    """``m.entry(i)`` without pydantic's validation (the manifest is ours and well formed):
    a listing of 10,000 entries is one of a transfer's costs (measured ~3x cheaper)."""
    kind = m.kinds[i]
    return PathEntry.model_construct(
        path=m.paths[i],
        kind=_KIND_NAMES[kind],
        size=m.sizes[i],
        mode=m.modes[i],
        sha256=m.digests[32 * i : 32 * i + 32].hex() if kind == KIND_FILE else None,
        target=m.targets[i] if kind == KIND_LINK else None,
    )


def check_links(m: Manifest, rel: str) -> None:
    """Refuse ``rel`` when one of its folders is a symbolic link in the snapshot (W6)."""
    if "/" not in rel:
        return
    index = m.index()
    parts = rel.split("/")
    for depth in range(1, len(parts)):
        prefix = "/".join(parts[:depth])
        i = index.get(prefix)
        if i is None:
            return
        if m.kinds[i] == KIND_LINK:
            raise link_refused(rel, prefix, m.targets[i])


def lookup(m: Manifest, path: str) -> tuple[str, int | None]:
    """(normalised path, manifest index or None for the root); NotFound when absent."""
    rel = normalize_relative(path)
    if not rel:
        return rel, None
    i = m.index().get(rel)
    if i is None:
        check_links(m, rel)
        raise NotFound(
            f"no {rel!r} in snapshot {m.info.seq} of workspace {m.info.workspace_id!r}; check "
            f"the path (relative to the workspace root) or list the folder above it",
            path=rel,
            seq=m.info.seq,
        )
    return rel, i


def stat(store: SnapshotStore, workspace_id: str, seq: int | None, path: str) -> PathEntry | None:
    m = manifest(store, workspace_id, seq)
    try:
        _rel, i = lookup(m, path)
    except NotFound:
        return None
    if i is None:
        return PathEntry(path="", kind="dir", size=0, mode=0o755)
    return m.entry(i)


def _page_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidInput(f"limit must be between 1 and {MAX_PAGE}, not {limit!r}")
    return limit


def list_dir(
    store: SnapshotStore,
    workspace_id: str,
    seq: int | None,
    path: str,
    recursive: bool,
    after: str | None,
    limit: int,
) -> DirListing:
    """The entries below ``path`` (all of them when ``recursive``), one page at a time."""
    limit = _page_limit(limit)
    m = manifest(store, workspace_id, seq)
    rel, i = lookup(m, path)
    if i is not None and m.kinds[i] != KIND_DIR:
        # a file or a link: its listing is itself, as ls does
        return DirListing(workspace_id=workspace_id, seq=m.info.seq, path=rel, entries=[m.entry(i)])
    start = 0
    if after:
        j = m.index().get(normalize_relative(after))
        if j is None:
            raise InvalidInput(
                f"'after' {after!r} is not an entry of snapshot {m.info.seq}; pass the "
                f"next_after of the previous page"
            )
        start = j + 1
    prefix = rel + "/" if rel else ""
    cut = len(prefix)
    entries: list[PathEntry] = []
    next_after = None
    for k in range(start, len(m.paths)):
        p = m.paths[k]
        if not p.startswith(prefix) or (not recursive and "/" in p[cut:]):
            continue
        if len(entries) == limit:
            next_after = entries[-1].path
            break
        entries.append(fast_entry(m, k))
    return DirListing(
        workspace_id=workspace_id, seq=m.info.seq, path=rel, entries=entries, next_after=next_after
    )


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
    ``path``: added, removed and changed entries in path order, one page at a time."""
    limit = _page_limit(limit)
    a = manifest(store, workspace_id, from_seq)
    b = manifest(store, workspace_id, to_seq)
    rel = normalize_relative(path)
    prefix = rel + "/" if rel else ""
    ia, ib = a.index(), b.index()
    names = sorted(p for p in set(ia) | set(ib) if not rel or p == rel or p.startswith(prefix))
    start = 0
    if after:
        import bisect

        start = bisect.bisect_right(names, normalize_relative(after))
    changes: list[DiffEntry] = []
    next_after = None
    for p in names[start:]:
        x, y = ia.get(p), ib.get(p)
        change = _change(a, x, b, y, p)
        if change is None:
            continue
        if len(changes) == limit:
            next_after = changes[-1].path
            break
        changes.append(change)
    return DiffResult(
        workspace_id=workspace_id,
        from_seq=a.info.seq,
        to_seq=b.info.seq,
        changes=changes,
        next_after=next_after,
    )


def _change(a: Manifest, x: int | None, b: Manifest, y: int | None, p: str) -> DiffEntry | None:
    if x is None:
        assert y is not None
        new = b.entry(y)
        return DiffEntry(
            path=p, change="added", kind=new.kind, new_size=new.size, new_sha256=new.sha256
        )
    old = a.entry(x)
    if y is None:
        return DiffEntry(
            path=p,
            change="removed",
            kind=old.kind,
            old_kind=old.kind,
            old_size=old.size,
            old_sha256=old.sha256,
        )
    new = b.entry(y)
    if (old.kind, old.sha256, old.mode, old.target) == (new.kind, new.sha256, new.mode, new.target):
        return None
    return DiffEntry(
        path=p,
        change="changed",
        kind=new.kind,
        old_kind=old.kind,
        old_size=old.size,
        new_size=new.size,
        old_sha256=old.sha256,
        new_sha256=new.sha256,
    )


def open_file(
    store: SnapshotStore, workspace_id: str, seq: int | None, path: str
) -> tuple[BinaryIO, PathEntry]:
    """Open a file of a snapshot for reading: (its object, its entry). Folders and links are
    refused with a message that says what to do instead."""
    m = manifest(store, workspace_id, seq)
    rel, i = lookup(m, path)
    where = f"snapshot {m.info.seq} of workspace {workspace_id!r}"
    if i is None or m.kinds[i] == KIND_DIR:
        raise InvalidInput(
            f"{rel or '(the root)'!r} is a folder in {where}; read a file inside it, list the "
            f"folder, or download it as a tar archive",
            path=rel,
        )
    if m.kinds[i] == KIND_LINK:
        raise InvalidInput(
            f"{rel!r} is a symbolic link to {m.targets[i]!r} in {where}; links are not "
            f"followed, read the file it points to by its own path",
            path=rel,
        )
    entry = m.entry(i)
    assert entry.sha256 is not None
    try:
        handle = store.open_object(entry.sha256)
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
    m = manifest(store, workspace_id, seq)
    rel, i = lookup(m, path)
    base = rel.rsplit("/", 1)[-1] if rel else ""
    cut = len(rel) + 1 if rel else 0
    mtime = int(m.info.created_at)
    if i is not None and m.kinds[i] != KIND_DIR:
        members: list[int] = [i]
        cut = len(rel) - len(base)
        base = ""
    else:
        prefix = rel + "/" if rel else ""
        members = [k for k, p in enumerate(m.paths) if p.startswith(prefix)]
        members.sort(key=m.paths.__getitem__)
    buf = bytearray()
    if base:
        info = tarfile.TarInfo(base)
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
        buf += _header(info)
    for k in members:
        entry = m.entry(k)
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
            assert entry.sha256 is not None
            info.size = entry.size
            buf += _header(info)
            with store.open_object(entry.sha256) as handle:
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
        with store._guard:
            for seq in removed:
                store._manifests.pop((workspace_id, seq), None)
    return PruneResult(workspace_id=workspace_id, removed=removed, retained=retained)


__all__ = [
    "STREAM_CHUNK",
    "diff",
    "list_dir",
    "lookup",
    "manifest",
    "open_file",
    "prune",
    "read_chunks",
    "stat",
    "tar_chunks",
]

"""Folder trees on disk, and snapshots read through them lazily (format 2, format.py).

Layout under a workspace's folder::

    trees/<2 hex>/<62 hex>   one tree blob per distinct folder state, named by its sha256,
                             written once (temp + rename), never changed

Trees are per workspace, beside its manifests, so pruning a workspace's snapshots can delete
the trees no retained snapshot reaches (``sweep``), and a backup copies them with the
manifests that name them. A snapshot is read by walking the trees from its root: looking up
one path reads the trees along it (cached, decoded, by digest), a listing of one folder reads
one tree, and walking a subtree visits its folders one at a time, so nothing needs the whole
snapshot in memory.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

from shellyard.errors import NotFound
from shellyard.runner.protocol import PathEntry, SnapshotInfo
from shellyard.runner.snapshots.format import (
    EMPTY_TREE,
    KIND_DIR,
    KIND_FILE,
    MANIFEST_HEADER,
    MANIFEST_VERSION_FLAT,
    Tree,
    atomic_write,
)

#: Decoded trees kept per store, by their entries (a tree of 100 entries is ~15 KB decoded,
#: so this bounds the cache near 15 MB).
_CACHE_ENTRIES = 100_000


def tree_path(wdir: Path, digest: bytes) -> Path:
    hexed = digest.hex()
    return wdir / "trees" / hexed[:2] / hexed[2:]


def write_tree(wdir: Path, digest: bytes, blob: bytes) -> bool:
    """Store a tree blob unless it is there already; whether it was written."""
    path = tree_path(wdir, digest)
    if path.exists():
        return False
    try:
        atomic_write(path, blob)
    except FileNotFoundError:
        path.parent.parent.mkdir(mode=0o700, exist_ok=True)
        path.parent.mkdir(mode=0o700, exist_ok=True)
        atomic_write(path, blob)
    return True


class TreeCache:
    """Decoded trees by (workspace folder, digest), bounded by their entries. Thread-safe;
    trees never change, so a cached one is always right."""

    def __init__(self, max_entries: int = _CACHE_ENTRIES) -> None:
        self._lock = threading.Lock()
        self._trees: OrderedDict[tuple[str, bytes], Tree] = OrderedDict()
        self._entries = 0
        self._max = max_entries

    def get(self, wdir: Path, digest: bytes) -> Tree:
        key = (str(wdir), digest)
        with self._lock:
            tree = self._trees.get(key)
            if tree is not None:
                self._trees.move_to_end(key)
                return tree
        try:
            raw = tree_path(wdir, digest).read_bytes()
        except FileNotFoundError:
            if digest != EMPTY_DIGEST:
                raise NotFound(
                    f"folder tree {digest.hex()} of workspace {wdir.name!r} is gone: the "
                    f"snapshot being read was pruned meanwhile; read a retained snapshot",
                    workspace_id=wdir.name,
                ) from None
            raw = EMPTY_TREE
        tree = Tree(raw)
        with self._lock:
            if key not in self._trees:
                self._trees[key] = tree
                self._entries += len(tree.names) + 1
            while self._entries > self._max and len(self._trees) > 1:
                _, old = self._trees.popitem(last=False)
                self._entries -= len(old.names) + 1
        return tree


def _empty_digest() -> bytes:
    import hashlib

    return hashlib.sha256(EMPTY_TREE).digest()


EMPTY_DIGEST = _empty_digest()


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


class SnapshotView:
    """One snapshot, read through its trees on demand."""

    __slots__ = ("_cache", "_wdir", "info", "root")

    def __init__(self, info: SnapshotInfo, wdir: Path, cache: TreeCache) -> None:
        self.info = info
        self.root = bytes.fromhex(info.root_hash)
        self._wdir = wdir
        self._cache = cache

    def tree(self, digest: bytes) -> Tree:
        return self._cache.get(self._wdir, digest)

    def find(self, path: str) -> tuple[Tree, int] | None:
        """(the tree of the folder holding ``path``, its index there), or None when absent
        (also when a folder on the way is not a folder). ``path`` is normalised, not ""."""
        tree = self.tree(self.root)
        parts = path.split("/")
        for depth, name in enumerate(parts):
            i = tree.find(name)
            if i is None:
                return None
            if depth == len(parts) - 1:
                return tree, i
            if tree.kinds[i] != KIND_DIR:
                return None
            tree = self.tree(tree.digest(i))
        return None

    def entry(self, path: str) -> PathEntry | None:
        found = self.find(path)
        return None if found is None else found[0].entry(found[1], path)

    def first_link(self, path: str) -> tuple[str, str] | None:
        """(prefix, target) of the first symbolic link among the folders above ``path``."""
        tree = self.tree(self.root)
        parts = path.split("/")
        for depth in range(len(parts) - 1):
            i = tree.find(parts[depth])
            if i is None:
                return None
            if tree.kinds[i] != KIND_DIR:
                if tree.kinds[i] == KIND_FILE:
                    return None
                return "/".join(parts[: depth + 1]), tree.targets[i]
            tree = self.tree(tree.digest(i))
        return None

    def folder_digest(self, path: str) -> bytes | None:
        """The tree digest of the folder at ``path`` ("" the root); None if not a folder."""
        if not path:
            return self.root
        found = self.find(path)
        if found is None or found[0].kinds[found[1]] != KIND_DIR:
            return None
        return found[0].digest(found[1])

    def folders(self, path: str = "") -> Iterator[tuple[str, Tree]]:
        """The folders at and below ``path`` (a folder), in sorted path order — the order of
        format 1's listing — one tree at a time: a heap of the folders still to visit."""
        digest = self.folder_digest(path)
        if digest is None:
            return
        heap: list[tuple[str, bytes]] = [(path, digest)]
        while heap:
            folder, digest = heapq.heappop(heap)
            tree = self.tree(digest)
            yield folder, tree
            for i, kind in enumerate(tree.kinds):
                if kind == KIND_DIR:
                    child = _join(folder, tree.names[i])
                    heapq.heappush(heap, (child, tree.digest(i)))

    def entries(self, path: str = "") -> Iterator[PathEntry]:
        """Every entry below the folder ``path``, in format 1's order (folders in sorted
        path order, names sorted within each)."""
        for folder, tree in self.folders(path):
            for i, name in enumerate(tree.names):
                yield tree.entry(i, _join(folder, name))


def reachable(wdir: Path, roots: list[bytes], cache: TreeCache) -> tuple[set[bytes], set[bytes]]:
    """(tree digests, file digests) reachable from ``roots``; each tree visited once."""
    trees: set[bytes] = set()
    files: set[bytes] = set()
    stack = list(roots)
    while stack:
        digest = stack.pop()
        if digest in trees:
            continue
        trees.add(digest)
        try:
            tree = cache.get(wdir, digest)
        except NotFound:
            continue
        for i, kind in enumerate(tree.kinds):
            if kind == KIND_DIR:
                stack.append(tree.digest(i))
            elif kind == KIND_FILE:
                files.add(tree.digest(i))
    return trees, files


def manifest_roots(wdir: Path) -> Iterator[tuple[int, bytes]]:
    """(seq, root digest) of each retained format 2 manifest of the workspace."""
    with contextlib.suppress(FileNotFoundError), os.scandir(wdir / "manifests") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(entry.path, "rb") as f:
                    raw = f.read(MANIFEST_HEADER.size)
            except FileNotFoundError:
                continue
            _magic, version, _created, _files, _total, digest = MANIFEST_HEADER.unpack_from(raw)
            if version != MANIFEST_VERSION_FLAT:
                yield int(entry.name), digest


def sweep(wdir: Path, cache: TreeCache) -> int:
    """Delete the trees no retained manifest reaches (the caller holds the workspace's
    lock, so no commit is writing trees meanwhile); how many were removed."""
    keep, _ = reachable(wdir, [d for _, d in manifest_roots(wdir)], cache)
    removed = 0
    base = wdir / "trees"
    with contextlib.suppress(FileNotFoundError), os.scandir(base) as prefixes:
        for prefix in prefixes:
            if len(prefix.name) != 2:
                continue
            for entry in os.scandir(prefix.path):
                try:
                    digest = bytes.fromhex(prefix.name + entry.name)
                except ValueError:
                    continue  # a temp file of a tree being written
                if digest not in keep:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                        removed += 1
    return removed


__all__ = [
    "EMPTY_DIGEST",
    "SnapshotView",
    "TreeCache",
    "manifest_roots",
    "reachable",
    "sweep",
    "tree_path",
    "write_tree",
]

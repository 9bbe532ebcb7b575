"""Sparse files in the snapshot store, on real files (R2, docs/limits.md "Sparse files"): a
file with holes is committed, moved between stores and copied out again without its holes
being filled, its sha256 is that of its whole content (zeros where the holes are), and reads
of it stay bounded in memory and give zeros where the holes were."""

from __future__ import annotations

import hashlib
import os
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from shellyard.runner import holes, workspace_paths
from shellyard.runner.snapshots import objects
from shellyard.runner.snapshots.store import SnapshotStore

WS = "ws-sparse"
APPARENT = 256 << 20  # large next to what may be written for it (a few MiB at most)
DATA_AT = 100 << 20  # a data range in the middle
DATA = b"middle of nowhere\n" * 1000
TAIL = b"the last bytes"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SnapshotStore]:
    s = SnapshotStore(tmp_path / "store", scan_helper=False)
    yield s
    s.close()


def _sparse(path: Path) -> str:
    """A file of ``APPARENT`` bytes: a hole, data, a hole, data at its end; its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(APPARENT - len(TAIL))
        f.seek(DATA_AT)
        f.write(DATA)
        f.seek(APPARENT - len(TAIL))
        f.write(TAIL)
    st = path.stat()
    if not holes.has_holes(st):
        pytest.skip(f"the file system under {path} keeps no holes (needed to test them)")
    digest = hashlib.sha256()
    holes.hash_zeros(digest, DATA_AT)
    digest.update(DATA)
    holes.hash_zeros(digest, APPARENT - len(TAIL) - DATA_AT - len(DATA))
    digest.update(TAIL)
    return digest.hexdigest()


def _on_disk(path: str | Path) -> int:
    return int(os.stat(path).st_blocks) * 512


def test_a_sparse_file_is_stored_with_its_holes_and_named_by_its_whole_content(
    store: SnapshotStore, tmp_path: Path
) -> None:
    """R2: the object of a 256 MiB file with 18 KB of data takes about what the file takes
    (not 256 MiB of zeros), its name is the sha256 of all its bytes, and reads give zeros in
    the holes and the data where it is."""
    tree = tmp_path / "tree"
    sha = _sparse(tree / "big")
    tracemalloc.start()
    try:
        info = store.commit(WS, tree)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"peak {peak / (1 << 20):.1f} MiB"
    entry = store.stat(WS, None, "big")
    assert entry is not None and (entry.sha256, entry.size) == (sha, APPARENT)
    assert info.bytes == APPARENT
    stored = store.blobs.object_path(sha)
    assert os.stat(stored).st_size == APPARENT
    assert _on_disk(stored) <= _on_disk(tree / "big") + (1 << 20), _on_disk(stored)
    hole = store.read(WS, None, "big", DATA_AT - 4096, 4096)
    assert hole.data == bytes(4096)
    middle = store.read(WS, None, "big", DATA_AT, len(DATA))
    assert middle.data == DATA
    end = store.read(WS, None, "big", APPARENT - len(TAIL), 4096)
    assert end.data == TAIL and end.next_offset == APPARENT


def test_a_file_that_ends_in_a_hole_keeps_its_size(store: SnapshotStore, tmp_path: Path) -> None:
    """``truncate -s`` alone: no data at all, the object is all hole and as long."""
    tree = tmp_path / "tree"
    tree.mkdir()
    with open(tree / "empty-but-long", "wb") as f:
        f.truncate(APPARENT)
    store.commit(WS, tree)
    entry = store.stat(WS, None, "empty-but-long")
    zeros = hashlib.sha256()
    holes.hash_zeros(zeros, APPARENT)
    assert entry is not None and entry.sha256 == zeros.hexdigest()
    stored = store.blobs.object_path(zeros.hexdigest())
    assert (os.stat(stored).st_size, _on_disk(stored)) == (APPARENT, 0)


def test_a_sparse_object_moved_to_another_store_stays_sparse(
    store: SnapshotStore, tmp_path: Path
) -> None:
    """T2–T4: the pack carries the zeros (its format is unchanged), the importer leaves them
    holes, so the target's object takes no more room than the source's and has its digest."""
    tree = tmp_path / "tree"
    sha = _sparse(tree / "big")
    store.commit(WS, tree)
    target = SnapshotStore(tmp_path / "target", scan_helper=False)
    try:
        importer = objects.PackImporter(target)
        for chunk in objects.pack_chunks(store, [sha]):
            importer.feed(chunk)
        [result] = importer.close()
        assert result.ok and result.size == APPARENT, result
        moved = target.blobs.object_path(sha)
        assert os.stat(moved).st_size == APPARENT
        assert _on_disk(moved) <= _on_disk(tree / "big") + (1 << 20), _on_disk(moved)
        check = hashlib.sha256()
        with target.open_object(sha) as stream:
            while chunk := stream.read(1 << 20):
                check.update(chunk)
        assert check.hexdigest() == sha
    finally:
        target.close()


def test_copying_a_sparse_object_out_keeps_its_holes(store: SnapshotStore, tmp_path: Path) -> None:
    """Restores and read views copy objects with ``workspace_paths.copy_fd``: the copy has the
    object's bytes and size, and no block for its holes."""
    tree = tmp_path / "tree"
    sha = _sparse(tree / "big")
    store.commit(WS, tree)
    copy = tmp_path / "copy"
    src = os.open(store.blobs.object_path(sha), os.O_RDONLY)
    dst = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        assert workspace_paths.copy_fd(src, dst, APPARENT) == APPARENT
    finally:
        os.close(src)
        os.close(dst)
    assert copy.stat().st_size == APPARENT
    assert _on_disk(copy) <= _on_disk(tree / "big") + (1 << 20), _on_disk(copy)
    with open(copy, "rb") as f:
        f.seek(DATA_AT)
        assert f.read(len(DATA)) == DATA
        f.seek(APPARENT - len(TAIL))
        assert f.read() == TAIL

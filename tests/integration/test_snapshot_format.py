"""Snapshot format 2 (trees of folder trees, W2, W3, W5): a store written by the flat format 1
is converted on open with every snapshot's entries unchanged; reads, diffs, listings and
tars walk the trees in the same order as the flat listing did; pruning and garbage
collection keep exactly what retained snapshots reach (docs/files-and-transfers.md,
"Snapshot format").

``data/format1_store.tar.gz`` was made by the code of main before format 2 (three commits of
a small tree: files, folders, an empty folder, a symlink, a mode change, a removed folder,
a link swapped for a file); ``data/format1_store.json`` holds what that code reported for
each snapshot (files, bytes, root hash, every entry)."""

from __future__ import annotations

import json
import shutil
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from shellyard.runner.protocol import SnapshotInfo
from shellyard.runner.snapshots import history, objects
from shellyard.runner.snapshots.format import MANIFEST_HEADER, MANIFEST_VERSION, NO_DIGEST
from shellyard.runner.snapshots.statcache import WorkspaceState, load_statcache
from shellyard.runner.snapshots.store import SnapshotStore

DATA = Path(__file__).parent / "data"
WS = "old-ws"


@pytest.fixture
def old_store(tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    with tarfile.open(DATA / "format1_store.tar.gz") as tar:
        tar.extractall(tmp_path, filter="tar")
    expected = json.loads((DATA / "format1_store.json").read_text())
    return tmp_path / "store", tmp_path / "tree", expected


def _old_shape(entry: Any) -> dict[str, Any]:
    """An entry as the format-1 store's data recorded it: ``not_utf8`` (names that are not
    UTF-8, docs/files-and-transfers.md) came later and is false for every name there, and
    so did ``content_id``, which its files (all under 1 MiB) have equal to their sha256."""
    shaped: dict[str, Any] = entry.model_dump()
    assert shaped.pop("not_utf8", False) is False
    assert shaped.pop("content_id", None) == shaped["sha256"]
    return shaped


def versions(store_root: Path) -> dict[int, int]:
    out = {}
    for path in (store_root / "workspaces" / WS / "manifests").iterdir():
        raw = path.read_bytes()
        out[int(path.name)] = MANIFEST_HEADER.unpack_from(raw)[1]
    return out


def test_w5_format1_store_is_converted_on_open_with_every_snapshot_unchanged(
    old_store: tuple[Path, Path, dict[str, Any]],
) -> None:
    """Every snapshot keeps its number, creation time, files, bytes and every entry; each
    manifest becomes a format 2 header naming a root tree; the old flat listings are gone."""
    root, _tree, expected = old_store
    assert set(versions(root).values()) == {1}
    store = SnapshotStore(root, scan_helper=False)
    try:
        infos = store.list_snapshots(WS)
        assert [i.seq for i in infos] == [0, 1, 2, 3]
        for info in infos:
            want = expected[str(info.seq)]
            assert (info.files, info.bytes) == (want["files"], want["bytes"])
            got = {p: _old_shape(e) for p, e in store.manifest(WS, info.seq).items()}
            assert got == want["entries"]
        assert set(versions(root).values()) == {MANIFEST_VERSION}
        for path in (root / "workspaces" / WS / "manifests").iterdir():
            assert path.stat().st_size == MANIFEST_HEADER.size  # a header, no listing
        # the root hash is now the root tree's: differs from format 1's, equal trees equal
        assert infos[3].root_hash != expected["3"]["root_hash"]
        assert store.view(WS, 3).root.hex() == infos[3].root_hash
    finally:
        store.close()


def test_w3_format1_stat_cache_is_read_with_names_cut_from_paths(
    old_store: tuple[Path, Path, dict[str, Any]],
) -> None:
    """The stat cache of the version before (full paths per entry, no tree digests) loads as
    records of entry names, unsealed, so the first full walk seals every folder."""
    root, _tree, expected = old_store
    wdir = root / "workspaces" / WS
    state = WorkspaceState(
        SnapshotInfo(workspace_id=WS, seq=3, root_hash="0" * 64, files=0, bytes=0, created_at=0.0),
        None,
        {},
        (None, None),
    )
    load_statcache(wdir, state)
    entries = expected["3"]["entries"]
    assert set(state.dirs) == {""} | {p for p, e in entries.items() if e["kind"] == "dir"}
    for path, rec in state.dirs.items():
        names = rec.names.decode().split("\0") if rec.n else []
        prefix = path + "/" if path else ""
        want = sorted(
            p[len(prefix) :]
            for p in entries
            if p.startswith(prefix) and "/" not in p[len(prefix) :]
        )
        assert names == want, path
        assert rec.digest == NO_DIGEST
    assert state.base_size == 0  # rewritten whole by the next save, in the new version


def test_w3_unchanged_tree_after_the_conversion_makes_no_new_snapshot(
    old_store: tuple[Path, Path, dict[str, Any]],
) -> None:
    """The first commit after the upgrade walks the tree (the stat cache is format 1's, its
    inodes another machine's) and finds the head's tree: no new snapshot; a change then makes
    one, which a fresh store without hints agrees with."""
    root, tree, expected = old_store
    store = SnapshotStore(root, scan_helper=False)
    try:
        again = store.commit(WS, tree)
        assert not again.new and again.seq == 3
        got = {p: _old_shape(e) for p, e in store.manifest(WS).items()}
        assert got == expected["3"]["entries"]
        (tree / "src" / "deep" / "x.bin").write_bytes(b"changed")
        changed = store.commit(WS, tree)
        assert changed.new and changed.seq == 4
    finally:
        store.close()
    shutil.copytree(tree, root.parent / "copy", symlinks=True)
    other = SnapshotStore(root.parent / "other", scan_helper=False, change_hints=False)
    try:
        assert other.commit(WS, root.parent / "copy").root_hash == changed.root_hash
    finally:
        other.close()


def test_w5_diffs_reads_and_tars_of_converted_snapshots(
    old_store: tuple[Path, Path, dict[str, Any]],
) -> None:
    """A diff of two converted snapshots says what the entries recorded say changed, in
    path order ("a-b" before "a.txt" before "src/..."); reads give the recorded bytes."""
    root, _tree, expected = old_store
    store = SnapshotStore(root, scan_helper=False)
    try:
        old, new = expected["1"]["entries"], expected["3"]["entries"]
        want = []
        for p in sorted(set(old) | set(new)):
            a, b = old.get(p), new.get(p)
            if a is None:
                want.append((p, "added"))
            elif b is None:
                want.append((p, "removed"))
            elif (a["kind"], a["sha256"], a["mode"], a["target"]) != (
                b["kind"],
                b["sha256"],
                b["mode"],
                b["target"],
            ):
                want.append((p, "changed"))
        result = history.diff(store, WS, 1, 3, "", None, 1000)
        assert [(c.path, c.change) for c in result.changes] == want
        assert ("a-b/z", "removed") in want and ("link", "changed") in want
        page = history.diff(store, WS, 1, 3, "", None, 2)
        rest = history.diff(store, WS, 1, 3, "", page.next_after, 1000)
        assert [c.path for c in page.changes + rest.changes] == [p for p, _ in want]
        for seq in ("1", "3"):
            for path, entry in expected[seq]["entries"].items():
                if entry["kind"] == "file":
                    handle, got = history.open_file(store, WS, int(seq), path)
                    data = b"".join(history.read_chunks(handle, 0, got.size))
                    assert len(data) == entry["size"]
                    assert got.sha256 == entry["sha256"]
        tar = b"".join(history.tar_chunks(store, WS, 1, ""))
        import io

        with tarfile.open(fileobj=io.BytesIO(tar)) as t:
            names = t.getnames()
        assert names == sorted(old)
    finally:
        store.close()


def test_w5_prune_sweeps_trees_and_gc_keeps_what_retained_snapshots_name(
    old_store: tuple[Path, Path, dict[str, Any]],
) -> None:
    """GC right after the conversion removes no object a snapshot names; pruning snapshots 1
    and 2 removes the trees only they reached, and GC then the objects only they named."""
    root, _tree, expected = old_store
    store = SnapshotStore(root, scan_helper=False)
    lock = objects.StoreLock(root)
    try:
        named = {
            e["sha256"]
            for snap in expected.values()
            for e in snap["entries"].values()
            if e["kind"] == "file"
        }
        gc = objects.collect_garbage(store, lock, grace_s=0)
        assert gc.objects_removed == 0
        for digest in named:
            assert Path(store.blobs.object_path(digest)).exists()
        trees = root / "workspaces" / WS / "trees"
        before = {p.name for p in trees.rglob("*") if p.is_file()}
        history.prune(store, WS, [3])
        after = {p.name for p in trees.rglob("*") if p.is_file()}
        assert after < before
        time.sleep(0.01)
        gc = objects.collect_garbage(store, lock, grace_s=0)
        only_old = {
            e["sha256"] for s in ("1", "2") for e in expected[s]["entries"].values() if e["sha256"]
        } - {e["sha256"] for e in expected["3"]["entries"].values() if e["sha256"]}
        assert gc.objects_removed == len(only_old) > 0
        got = {p: _old_shape(e) for p, e in store.manifest(WS, 3).items()}
        assert got == expected["3"]["entries"]
    finally:
        store.close()


def test_w5_conversion_interrupted_half_way_is_finished_by_the_next_open(
    old_store: tuple[Path, Path, dict[str, Any]],
) -> None:
    """A store whose conversion stopped after some manifests (a crash) has format 1 and 2
    manifests side by side: the next open converts the rest, entries unchanged."""
    root, _tree, expected = old_store
    flat = (root / "workspaces" / WS / "manifests" / "2").read_bytes()
    store = SnapshotStore(root, scan_helper=False)
    store.head(WS)
    store.manifest(WS, 1)
    store.close()
    (root / "workspaces" / WS / "manifests" / "2").write_bytes(flat)
    assert versions(root)[2] == 1
    again = SnapshotStore(root, scan_helper=False)
    try:
        got = {p: _old_shape(e) for p, e in again.manifest(WS, 2).items()}
        assert got == expected["2"]["entries"]
        assert set(versions(root).values()) == {MANIFEST_VERSION}
    finally:
        again.close()


def test_w5_listing_and_diff_order_follow_paths_across_tricky_names(tmp_path: Path) -> None:
    """Names that sort around "/" ("a-c", "a.d" before "a/b"; "a0" after) list and diff in
    the order the flat format gave: folders by path, names within; diffs by full path."""
    tree = tmp_path / "tree"
    for rel in ("a/b", "a/c/d", "a-c", "a.d/x", "a0", "b"):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(rel)
    store = SnapshotStore(tmp_path / "store", scan_helper=False)
    try:
        store.commit(WS, tree)
        listing = history.list_dir(store, WS, None, "", True, None, 1000)
        # the flat format's order, from its spec: folders by path, names sorted within each
        by_folder: dict[str, list[str]] = {}
        for path in store.manifest(WS):
            by_folder.setdefault(path.rpartition("/")[0], []).append(path)
        flat_paths = [p for folder in sorted(by_folder) for p in sorted(by_folder[folder])]
        assert [e.path for e in listing.entries] == flat_paths
        paged, after = [], None
        while True:
            page = history.list_dir(store, WS, None, "", True, after, 3)
            paged += [e.path for e in page.entries]
            after = page.next_after
            if after is None:
                break
        assert paged == flat_paths
        for rel in ("a/b", "a/c/d", "a-c", "a.d/x", "a0", "b"):
            (tree / rel).write_text(rel + " 2")
        store.commit(WS, tree)
        changes = history.diff(store, WS, 1, None, "", None, 1000).changes
        assert [c.path for c in changes] == sorted(["a/b", "a/c/d", "a-c", "a.d/x", "a0", "b"])
        below = history.diff(store, WS, 1, None, "a", None, 1000).changes
        assert [c.path for c in below] == ["a/b", "a/c/d"]
    finally:
        store.close()

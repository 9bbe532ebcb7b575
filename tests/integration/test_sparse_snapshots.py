"""Sparse files in the snapshot store, on real files (R2, docs/limits.md "Sparse files"): a
file with holes is committed, moved between stores and copied out again without its holes
being filled, it is named by its content id (a chunk list: contentid.py) computed without
hashing its holes, and reads of it stay bounded in memory and give zeros where the holes were."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from env_fixtures import backend_sdist
from test_attack_pass_41 import _agent
from test_attack_pass_43 import SPARSE_PREFIX
from test_env_tool_rights import _create, _install, _put

from conftest import Yard
from shellyard.contract.executions import ExecutionWait, RunShellRequest
from shellyard.contract.files import FileReadTextQuery
from shellyard.errors import ShellyardError
from shellyard.runner import workspace_paths
from shellyard.runner.protocol import SandboxPolicy
from shellyard.runner.snapshots import objects
from shellyard.runner.snapshots.contentid import ContentId
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
    """A file of ``APPARENT`` bytes: a hole, data, a hole, data at its end; its content id."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(APPARENT - len(TAIL))
        f.seek(DATA_AT)
        f.write(DATA)
        f.seek(APPARENT - len(TAIL))
        f.write(TAIL)
    st = path.stat()
    if not workspace_paths.has_holes(st):
        pytest.skip(f"the file system under {path} keeps no holes (needed to test them)")
    return _expected_id(plain=False)


def _expected_id(plain: bool) -> str:
    """The content (or with ``plain`` the sha256) of the ``_sparse`` layout."""
    digest: Any = hashlib.sha256() if plain else ContentId()
    if not plain:
        digest.chunked()  # its holes cover whole MiBs
    feed = workspace_paths.hash_zeros if plain else (lambda d, n: d.zeros(n))
    feed(digest, DATA_AT)
    digest.update(DATA)
    feed(digest, APPARENT - len(TAIL) - DATA_AT - len(DATA))
    digest.update(TAIL)
    return str(digest.digest().hex())


def _on_disk(path: str | Path) -> int:
    return int(os.stat(path).st_blocks) * 512


def test_a_sparse_file_is_stored_with_its_holes_and_named_by_its_whole_content(
    store: SnapshotStore, tmp_path: Path
) -> None:
    """R2: the object of a 256 MiB file with 18 KB of data takes about what the file takes
    (not 256 MiB of zeros), its name is its content id, computed from its data alone, and
    reads give zeros in the holes and the data where it is."""
    tree = tmp_path / "tree"
    sha = _sparse(tree / "big")
    tracemalloc.start()
    try:
        info = store.commit(WS, tree)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"peak {peak / (1 << 20):.1f} MiB"
    stats = store.last_commit_stats
    assert stats is not None and stats.bytes_hashed <= 3 << 20, stats  # the chunks with data
    entry = store.stat(WS, None, "big")
    assert entry is not None and (entry.content_id, entry.size) == (sha, APPARENT)
    assert entry.sha256 is None  # a chunk-list id is never shown as a sha256
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
    zeros = ContentId()
    zeros.zeros(APPARENT)
    assert entry is not None and entry.content_id == zeros.digest().hex()
    assert store.last_commit_stats is not None and store.last_commit_stats.bytes_hashed == 0
    stored = store.blobs.object_path(entry.content_id)
    assert (os.stat(stored).st_size, _on_disk(stored)) == (APPARENT, 0)


@pytest.mark.parametrize("version", [2, 1])
def test_a_sparse_object_moved_to_another_store_stays_sparse(
    store: SnapshotStore, tmp_path: Path, version: int
) -> None:
    """T2–T4: a pack of version 2 carries the object's data extents, not its holes: the
    stream of a 256 MiB object with 18 KB of data is about its data's blocks, 24 KB (version
    1, still written for an older importer and still read, carried all 256 MiB); the
    importer leaves holes, so the target's object takes no more room than the source's and
    has its content id."""
    tree = tmp_path / "tree"
    sha = _sparse(tree / "big")
    store.commit(WS, tree)
    target = SnapshotStore(tmp_path / "target", scan_helper=False)
    try:
        importer = objects.PackImporter(target)
        wire = 0
        for chunk in objects.pack_chunks(store, [sha], version):
            wire += len(chunk)
            importer.feed(chunk)
        [result] = importer.close()
        assert result.ok and result.size == APPARENT, result
        data = len(DATA) + len(TAIL)
        if version == 2:  # the data's blocks (extents are whole blocks) and a few frames
            assert data < wire <= _on_disk(tree / "big") + 1024, wire
        else:
            assert wire > APPARENT, wire
        moved = target.blobs.object_path(sha)
        assert os.stat(moved).st_size == APPARENT
        assert _on_disk(moved) <= _on_disk(tree / "big") + (1 << 20), _on_disk(moved)
        check = hashlib.sha256()
        with target.open_object(sha) as stream:
            while chunk := stream.read(1 << 20):
                check.update(chunk)
        assert check.hexdigest() == _expected_id(plain=True)
        assert target.blobs.sha256_of(sha, APPARENT) is None  # marked a chunk list there too
    finally:
        target.close()


def test_an_object_named_by_its_sha256_before_content_ids_still_moves(
    store: SnapshotStore, tmp_path: Path
) -> None:
    """A store written before chunk-list ids named a file with a zero MiB by its plain
    sha256: such an object still crosses in a pack of version 2 (the importer checks the
    plain sha256 when the content id does not match), and a corrupt one is still refused."""
    content = b"head" + bytes(3 << 20) + b"tail"
    legacy = hashlib.sha256(content).hexdigest()
    path = store.blobs.object_path(legacy)
    with open(path, "wb") as f:
        f.write(content)
    wrong = "0" * 63 + "1"
    with open(store.blobs.object_path(wrong), "wb") as f:
        f.write(content)
    target = SnapshotStore(tmp_path / "target", scan_helper=False)
    try:
        importer = objects.PackImporter(target)
        for chunk in objects.pack_chunks(store, [legacy, wrong], 2):
            importer.feed(chunk)
        first, second = importer.close()
        assert first.ok and first.sha256 == legacy, first
        assert not second.ok and "content id" in str(second.error), second
        with target.open_object(legacy) as stream:
            assert stream.read() == content
        assert target.blobs.sha256_of(legacy, len(content)) == legacy  # a real sha256
    finally:
        target.close()


def test_a_pack_with_extents_out_of_order_is_refused(store: SnapshotStore) -> None:
    """Bad input: an extent before the last one's end, or past the object's size, stops the
    import with a message naming it (nothing stored)."""
    frame = objects._FRAME.pack(bytes(32), 0, 10)
    for extents in ([(5, 2), (4, 1)], [(8, 4)]):
        importer = objects.PackImporter(store)
        body = b"".join(objects._EXTENT.pack(o, n) + b"x" * n for o, n in extents)
        with pytest.raises(ValueError, match="out of order or past its size"):
            importer.feed(objects.PACK_MAGIC + frame + body)
        importer.close()


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


# ------------------------------------------------------------------ a workspace, end to end

GIB3 = 3 << 30


def _blocks_under(root: Path) -> int:
    """Bytes the files under ``root`` take on disk (the home: stores, workspaces, logs)."""
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return total


async def test_truncate_3g_in_a_workspace_is_committed_read_and_restored_without_3_gib(
    yard: Yard,
) -> None:
    """R2, W3, W5: ``truncate -s 3G`` (a normal thing in tests) is committed within the
    default quota (it counts the apparent size), and neither the commit nor a restore writes
    3 GiB: the home grows by far less than 1 GiB. A read in the hole gives zeros, a streamed
    read across the hole's end into the data gives both, in bounded memory."""
    before = _blocks_under(yard.home)
    started = await yard.run("truncate -s 3G big && printf tail >> big")
    # its commit hashed 3 GiB of zeros before content ids: waited for beyond run_shell's wait
    ended = await yard.plane.executions.wait(started.execution_id, ExecutionWait(timeout_s=600))
    assert ended.exit_code == 0, ended
    made = await yard.run("stat -c '%s %b' big")
    size, blocks = (int(x) for x in made.stdout.split())
    assert size == GIB3 + 4 and blocks * 512 < 1 << 20, made.stdout
    assert _blocks_under(yard.home) - before < 1 << 30
    files, ws = yard.plane.files, made.workspace_id

    text = await files.read_text(
        FileReadTextQuery(path="big", workspace_id=ws, offset=1 << 30, limit=4096)
    )
    assert (text.size, text.encoding, text.data) == (GIB3 + 4, "utf-8", "\0" * 4096)

    start = GIB3 - (8 << 20)
    tracemalloc.start()
    try:
        stream = await files.open("big", workspace_id=ws, offset=start, length=16 << 20)
        digest, count = hashlib.sha256(), 0
        async for chunk in stream.chunks:
            digest.update(chunk)
            count += len(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    expected = hashlib.sha256()
    workspace_paths.hash_zeros(expected, 8 << 20)
    expected.update(b"tail")
    assert (count, digest.hexdigest()) == (8 << 20 | 4, expected.hexdigest())
    assert peak < 32 << 20, f"peak {peak / (1 << 20):.1f} MiB"

    gone = await yard.run("rm big")
    assert made.snapshot_seq is not None and gone.exit_code == 0
    await files.restore(made.snapshot_seq, "", workspace_id=ws)
    back = await yard.run("stat -c '%s %b' big && tail -c 4 big")
    size, blocks, tail = back.stdout.split()
    assert (int(size), tail) == (GIB3 + 4, "tail") and int(blocks) * 512 < 1 << 20, back
    assert _blocks_under(yard.home) - before < 1 << 30


async def test_a_build_cannot_leave_a_file_past_the_file_size_limit(yard_factory: Any) -> None:
    """R2 (docs/limits.md "Sparse files"): a build's prefix has no quota, and its commit
    hashes a sparse file's holes, so package tools run under the commands' file-size limit
    (RLIMIT_FSIZE, ``max_file_size_bytes``): a backend's ``truncate`` past it fails (EFBIG),
    the change with it, and the prefix holds no such file."""
    yard = await yard_factory(SandboxPolicy(max_file_size_bytes=1 << 30))
    agent = await _agent(yard)
    environment_id = await _create(yard, agent, "fsize")
    prefix = yard.home / "home" / "runners" / "local" / "environments" / environment_id
    body = SPARSE_PREFIX.format(prefix=str(prefix / "prefix"), size=2 << 30)
    sdist = backend_sdist("sy-fsize", "1.0", body)
    await _put(yard, agent, {"dist/sy_fsize-1.0.tar.gz": sdist}, {})
    try:
        change = await _install(
            yard, agent, environment_id, manager="pip", specs=["sy-fsize"], index_url="none",
            find_links=["/workspace/dist"],
        )  # fmt: skip
        said = str(change)
    except ShellyardError as exc:
        said = exc.message
    assert "File too large" in said, said
    listed = await yard.plane.executions.run_shell(
        RunShellRequest(
            command="find / -xdev -name sy_zeros.bin 2>/dev/null | wc -l",
            environment_id=environment_id,
            wait_ms=30_000,
        ),
        agent,
    )
    assert str(listed.stdout).strip() == "0", (listed.state, listed.error, listed.stderr)

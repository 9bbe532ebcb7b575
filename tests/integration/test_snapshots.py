"""SnapshotStore on real files: W2 (readers see committed snapshots), W3 (every commit is a
snapshot, numbers only grow), W5 (history: list, read any retained snapshot), W6 (paths
stay inside the workspace; symlinks are recorded, never followed)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from shellyard.errors import InvalidInput, NotFound, PathRefused
from shellyard.runner.protocol import MAX_READ_CHUNK
from shellyard.runner.snapshots.store import SnapshotStore

WS = "ws-1"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SnapshotStore]:
    s = SnapshotStore(tmp_path / "store")
    yield s
    s.close()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    root.mkdir()
    return root


def write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def settle() -> None:
    """Let the filesystem clock move past the files just written, so the next commit does
    not find them racily clean (it would re-read them, correctly, and spoil exact counts)."""
    time.sleep(0.05)


def read_all(store: SnapshotStore, seq: int | None, path: str) -> bytes:
    parts: list[bytes] = []
    offset = 0
    while True:
        chunk = store.read(WS, seq, path, offset, MAX_READ_CHUNK)
        parts.append(chunk.data)
        offset = chunk.next_offset
        if offset >= chunk.size:
            return b"".join(parts)


def populate(root: Path, seed: int = 1) -> dict[str, bytes]:
    rng = random.Random(seed)
    files: dict[str, bytes] = {
        "empty.txt": b"",
        "README.md": b"# hello\n",
        "src/main.py": b"print('hi')\n" * 50,
        "src/pkg/__init__.py": b"",
        "src/pkg/mod.py": rng.randbytes(5000),
        "data/big.bin": rng.randbytes(MAX_READ_CHUNK * 2 + 123),  # streamed, paged reads
        "data/nested/deeper/leaf.txt": b"leaf\n",
        "dup/a.txt": b"same content",
        "dup/b.txt": b"same content",
        "spaces and ü/ñ.txt": "unicode ✓".encode(),
    }
    for rel, data in files.items():
        write(root / rel, data)
    return files


def files_in(store: SnapshotStore, seq: int | None = None) -> dict[str, str]:
    return {
        path: entry.sha256 or ""
        for path, entry in store.manifest(WS, seq).items()
        if entry.kind == "file"
    }


# ---------------------------------------------------------------------------- W3 commits


def test_w3_first_commit_reads_back_every_file_byte_for_byte(
    store: SnapshotStore, tree: Path
) -> None:
    files = populate(tree)
    head0 = store.ensure_workspace(WS)
    assert (head0.seq, head0.files, head0.bytes) == (0, 0, 0)
    info = store.commit(WS, tree)
    assert info.new and info.seq == 1
    assert info.files == len(files)
    assert info.bytes == sum(len(d) for d in files.values())
    assert files_in(store) == {p: hashlib.sha256(d).hexdigest() for p, d in files.items()}
    for rel, data in files.items():
        assert read_all(store, None, rel) == data, rel
        assert read_all(store, 1, rel) == data, rel
    entry = store.stat(WS, None, "src/pkg")
    assert entry is not None and entry.kind == "dir"
    root = store.stat(WS, None, "")
    assert root is not None and root.kind == "dir"
    assert store.stat(WS, None, "missing") is None
    stats = store.last_commit_stats
    assert stats is not None and stats.files_hashed == len(files)
    assert store.head(WS) == info.model_copy(update={"new": False})


def test_w3_objects_are_read_only_copies_never_hardlinks(store: SnapshotStore, tree: Path) -> None:
    populate(tree)
    store.commit(WS, tree)
    entry = store.stat(WS, None, "src/main.py")
    assert entry is not None and entry.sha256 is not None
    obj = store.root / "objects" / entry.sha256[:2] / entry.sha256[2:]
    st = obj.stat()
    assert stat.S_IMODE(st.st_mode) == 0o444
    assert st.st_nlink == 1
    assert st.st_ino != (tree / "src/main.py").stat().st_ino
    # an in-place write to the workspace file cannot change history
    with open(tree / "src/main.py", "r+b") as f:
        f.write(b"XXXXX")
    assert read_all(store, 1, "src/main.py") == b"print('hi')\n" * 50
    with store.open_object(entry.sha256) as stream:
        assert hashlib.sha256(stream.read()).hexdigest() == entry.sha256


def test_w3_unchanged_tree_creates_no_new_seq(store: SnapshotStore, tree: Path) -> None:
    populate(tree)
    settle()
    first = store.commit(WS, tree)
    again = store.commit(WS, tree)
    assert not again.new
    assert (again.seq, again.root_hash) == (first.seq, first.root_hash)
    stats = store.last_commit_stats
    assert stats is not None and stats.files_hashed == 0
    assert [s.seq for s in store.list_snapshots(WS)] == [0, 1]
    # touching a file without changing it re-reads it but still makes no new snapshot
    os.utime(tree / "README.md")
    assert not store.commit(WS, tree).new


def test_w3_one_changed_file_is_the_only_one_read(store: SnapshotStore, tree: Path) -> None:
    files = populate(tree)
    settle()
    store.commit(WS, tree)
    write(tree / "src/pkg/mod.py", b"changed")
    info = store.commit(WS, tree)
    assert info.new and info.seq == 2
    stats = store.last_commit_stats
    assert stats is not None
    assert stats.files_hashed == 1
    assert stats.cache_hits == len(files) - 1
    assert read_all(store, None, "src/pkg/mod.py") == b"changed"
    assert read_all(store, 1, "src/pkg/mod.py") == files["src/pkg/mod.py"]


def test_w3_stat_cache_survives_a_new_store_instance(store: SnapshotStore, tree: Path) -> None:
    """The cache is on disk (base + log): a restarted runner still reads only what changed."""
    populate(tree)
    store.commit(WS, tree)
    for round_no in range(6):  # several log appends, and at least one fold into the base
        write(tree / f"src/new{round_no}.py", b"x" * round_no)
        store.commit(WS, tree)
    settle()
    store.commit(WS, tree)
    write(tree / "README.md", b"changed readme")
    fresh = SnapshotStore(store.root, scan_helper=False)
    info = fresh.commit(WS, tree)
    assert info.new
    stats = fresh.last_commit_stats
    assert stats is not None and stats.files_hashed == 1
    assert read_all(fresh, None, "README.md") == b"changed readme"
    # the first store sees the other instance's commit too
    assert store.commit(WS, tree).seq == info.seq


def test_w3_corrupt_stat_cache_only_costs_a_full_reread(store: SnapshotStore, tree: Path) -> None:
    files = populate(tree)
    store.commit(WS, tree)
    (store.root / "workspaces" / WS / "statcache").write_bytes(b"garbage")
    fresh = SnapshotStore(store.root, scan_helper=False)
    info = fresh.commit(WS, tree)
    assert not info.new
    stats = fresh.last_commit_stats
    assert stats is not None and stats.files_hashed == len(files)


def test_w3_torn_stat_cache_log_is_ignored(store: SnapshotStore, tree: Path) -> None:
    """A crash mid-append leaves a torn log frame: it is skipped, never trusted."""
    files = populate(tree)
    for i in range(3):
        write(tree / f"extra{i}.txt", b"e" * i)
        store.commit(WS, tree)
    log_path = store.root / "workspaces" / WS / "statcache.log"
    with open(log_path, "ab") as f:
        f.write(b"SYSL\x00\x10torn")
    write(tree / "README.md", b"after the crash")
    fresh = SnapshotStore(store.root, scan_helper=False)
    info = fresh.commit(WS, tree)
    assert info.new
    assert read_all(fresh, None, "README.md") == b"after the crash"
    assert len(files_in(fresh)) == len(files) + 3
    # the torn tail was cut off, so what is appended after it is found again
    settle()
    fresh.commit(WS, tree)
    again = SnapshotStore(store.root, scan_helper=False)
    assert not again.commit(WS, tree).new
    stats = again.last_commit_stats
    assert stats is not None and stats.files_hashed == 0


def test_w3_lost_head_never_sends_numbers_back(store: SnapshotStore, tree: Path) -> None:
    for i in range(3):
        write(tree / "f.txt", f"v{i}".encode())
        store.commit(WS, tree)
    (store.root / "workspaces" / WS / "HEAD").unlink()
    fresh = SnapshotStore(store.root, scan_helper=False)
    assert fresh.ensure_workspace(WS).seq == 3  # HEAD rebuilt from the manifests on disk
    write(tree / "f.txt", b"v3")
    assert fresh.commit(WS, tree).seq == 4
    assert [s.seq for s in fresh.list_snapshots(WS)] == [0, 1, 2, 3, 4]


def test_w3_modified_within_the_same_mtime_is_still_seen(store: SnapshotStore, tree: Path) -> None:
    """Same size, mtime forced back to the committed one: ctime still gives it away."""
    write(tree / "f.txt", b"aaaa")
    store.commit(WS, tree)
    before = (tree / "f.txt").stat()
    write(tree / "f.txt", b"bbbb")
    os.utime(tree / "f.txt", ns=(before.st_atime_ns, before.st_mtime_ns))
    after = (tree / "f.txt").stat()
    assert (after.st_mtime_ns, after.st_size) == (before.st_mtime_ns, before.st_size)
    info = store.commit(WS, tree)
    assert info.new
    assert read_all(store, None, "f.txt") == b"bbbb"


def test_w3_racy_clean_file_is_reread(store: SnapshotStore, tree: Path) -> None:
    """git's rule: a file whose mtime is not strictly older than the cache's clock is read
    again even though its stat matches. A future mtime keeps it racy."""
    write(tree / "racy.txt", b"one")
    write(tree / "calm.txt", b"two")
    future = time.time_ns() + 3600 * 10**9
    os.utime(tree / "racy.txt", ns=(future, future))
    settle()
    store.commit(WS, tree)
    again = store.commit(WS, tree)
    assert not again.new
    stats = store.last_commit_stats
    assert stats is not None
    assert (stats.racy, stats.files_hashed) == (1, 1)


def test_w3_chmod_makes_a_new_snapshot(store: SnapshotStore, tree: Path) -> None:
    write(tree / "run.sh", b"#!/bin/sh\necho hi\n")
    (tree / "run.sh").chmod(0o644)
    store.commit(WS, tree)
    (tree / "run.sh").chmod(0o755)
    info = store.commit(WS, tree)
    assert info.new
    entry = store.stat(WS, None, "run.sh")
    assert entry is not None and entry.mode == 0o755
    old = store.stat(WS, 1, "run.sh")
    assert old is not None and old.mode == 0o644


def test_w3_empty_dirs_and_deleted_files(store: SnapshotStore, tree: Path) -> None:
    (tree / "empty/nested/deeper").mkdir(parents=True)
    write(tree / "keep.txt", b"keep")
    write(tree / "gone.txt", b"gone")
    first = store.commit(WS, tree)
    manifest = store.manifest(WS)
    assert {p for p, e in manifest.items() if e.kind == "dir"} == {
        "empty",
        "empty/nested",
        "empty/nested/deeper",
    }
    (tree / "gone.txt").unlink()
    (tree / "empty/nested/deeper").rmdir()
    second = store.commit(WS, tree)
    assert second.new and second.seq == first.seq + 1
    assert store.stat(WS, None, "gone.txt") is None
    assert store.stat(WS, None, "empty/nested/deeper") is None
    assert read_all(store, first.seq, "gone.txt") == b"gone"
    with pytest.raises(NotFound, match=r"no file 'gone\.txt'"):
        store.read(WS, None, "gone.txt", 0, 10)


def test_w3_file_replaced_by_folder_and_back(store: SnapshotStore, tree: Path) -> None:
    write(tree / "x", b"file")
    store.commit(WS, tree)
    (tree / "x").unlink()
    write(tree / "x/inner.txt", b"inner")
    store.commit(WS, tree)
    entry = store.stat(WS, None, "x")
    assert entry is not None and entry.kind == "dir"
    assert read_all(store, None, "x/inner.txt") == b"inner"
    (tree / "x/inner.txt").unlink()
    (tree / "x").rmdir()
    write(tree / "x", b"file again")
    store.commit(WS, tree)
    assert read_all(store, None, "x") == b"file again"
    assert store.stat(WS, None, "x/inner.txt") is None


def test_w3_sockets_and_fifos_are_skipped(store: SnapshotStore, tree: Path) -> None:
    write(tree / "real.txt", b"real")
    os.mkfifo(tree / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tree / "sock"))
        store.commit(WS, tree)  # must not block on the fifo
    finally:
        sock.close()
    assert set(store.manifest(WS)) == {"real.txt"}


def test_w3_concurrent_commits_get_distinct_increasing_seqs(
    store: SnapshotStore, tmp_path: Path
) -> None:
    """Commits of one workspace are serialised: no two take the same seq, none is lost.
    Half go through a second store instance on the same root (the flock)."""
    other = SnapshotStore(store.root, scan_helper=False)
    trees = []
    for i in range(8):
        t = tmp_path / f"tree{i}"
        write(t / "who.txt", f"tree {i}".encode())
        write(t / "common.txt", b"shared")
        trees.append(t)
    store.ensure_workspace(WS)
    barrier = threading.Barrier(len(trees))
    results: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            target = store if i % 2 else other
            info = target.commit(WS, trees[i])
            assert info.new
            results.append((info.seq, i))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(trees))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert sorted(seq for seq, _ in results) == list(range(1, len(trees) + 1))
    for seq, i in results:
        assert read_all(store, seq, "who.txt") == f"tree {i}".encode()
    assert [s.seq for s in store.list_snapshots(WS)] == list(range(len(trees) + 1))
    other.close()


def test_w3_files_vanishing_mid_walk_never_crash_a_commit(store: SnapshotStore, tree: Path) -> None:
    """A writer keeps creating, deleting and swapping files and folders during commits."""
    populate(tree)
    stop = threading.Event()

    def churn() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            d = tree / "churn" / f"d{n % 7}"
            try:
                d.mkdir(parents=True, exist_ok=True)
                (d / f"f{n % 13}").write_bytes(b"x" * (n % 300))
                victim = tree / "churn" / f"d{(n + 3) % 7}"
                for child in list(victim.iterdir()) if victim.exists() else []:
                    child.unlink()
                if n % 5 == 0 and victim.exists():
                    victim.rmdir()
                swap = tree / "churn" / "swap"
                if swap.is_symlink() or swap.is_file():
                    swap.unlink()
                    swap.mkdir()
                elif swap.is_dir():
                    swap.rmdir()
                    swap.symlink_to("/etc")
                else:
                    swap.write_bytes(b"now a file")
            except OSError:
                pass

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        deadline = time.monotonic() + 1.5
        seqs = []
        while time.monotonic() < deadline:
            seqs.append(store.commit(WS, tree).seq)
    finally:
        stop.set()
        worker.join()
    assert seqs == sorted(seqs)
    final = store.commit(WS, tree)
    # once the churn stops, a commit sees exactly what is on disk
    expected = {
        str(p.relative_to(tree)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in tree.rglob("*")
        if p.is_file() and not p.is_symlink()
    }
    if store.commit(WS, tree).seq == final.seq:
        assert files_in(store) == expected


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to run the store as another user",
)
def test_w3_unreadable_entries_are_reported_not_fatal() -> None:
    """A store that is not root meets a file and a folder it may not read (chmod 000): the
    commit still succeeds, leaves them out and names them."""
    base = Path(tempfile.mkdtemp(prefix="snap-unreadable-", dir="/tmp"))
    try:
        write(base / "tree/ok.txt", b"ok")
        write(base / "tree/sub/secret.txt", b"secret")
        write(base / "tree/locked/inner.txt", b"inner")
        (base / "tree/sub/secret.txt").chmod(0)
        (base / "tree/locked").chmod(0)
        for path in [base, *base.rglob("*")]:
            os.lchown(path, 65534, 65534)
        base.chmod(0o755)
        script = (
            "import json, sys; from pathlib import Path; "
            "from shellyard.runner.snapshots.store import SnapshotStore; "
            "s = SnapshotStore(Path(sys.argv[1]) / 'store', scan_helper=False); "
            "info = s.commit('w', Path(sys.argv[1]) / 'tree'); "
            "print(json.dumps([info.files, sorted(s.manifest('w')), "
            "s.last_commit_stats.unreadable]))"
        )
        src = str(Path(__file__).resolve().parents[2] / "src")
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        done = subprocess.run(
            [*as_nobody, sys.executable, "-c", script, str(base)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": src},
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        files, paths, unreadable = json.loads(done.stdout)
        assert files == 1
        assert paths == ["locked", "ok.txt", "sub"]
        assert sorted(unreadable) == ["locked", "sub/secret.txt"]
    finally:
        for path in [base, *base.rglob("*")]:
            with contextlib.suppress(OSError):
                path.chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)


# ---------------------------------------------------------------------------- W6 links


def test_w6_symlinks_are_stored_as_links_never_followed(store: SnapshotStore, tree: Path) -> None:
    write(tree / "real/file.txt", b"inside")
    (tree / "passwd").symlink_to("/etc/passwd")
    (tree / "etc").symlink_to("/etc")
    (tree / "rel").symlink_to("real/file.txt")
    (tree / "dangling").symlink_to("nowhere/at/all")
    store.commit(WS, tree)
    manifest = store.manifest(WS)
    assert {p: (e.kind, e.target) for p, e in manifest.items() if e.kind == "symlink"} == {
        "passwd": ("symlink", "/etc/passwd"),
        "etc": ("symlink", "/etc"),
        "rel": ("symlink", "real/file.txt"),
        "dangling": ("symlink", "nowhere/at/all"),
    }
    assert not any(p.startswith("etc/") for p in manifest)  # never walked into
    entry = manifest["passwd"]
    assert entry.sha256 is None and entry.size == len("/etc/passwd")
    with pytest.raises(InvalidInput, match="symbolic link to '/etc/passwd'"):
        store.read(WS, None, "passwd", 0, 100)
    with pytest.raises(NotFound):
        store.read(WS, None, "etc/passwd", 0, 100)
    # /etc/passwd's bytes were never copied into the store
    secret = hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest()
    assert not (store.root / "objects" / secret[:2] / secret[2:]).exists()


def test_w6_file_swapped_for_a_link_is_not_read_through(store: SnapshotStore, tree: Path) -> None:
    write(tree / "a.txt", b"harmless")
    store.commit(WS, tree)
    (tree / "a.txt").unlink()
    (tree / "a.txt").symlink_to("/etc/passwd")
    store.commit(WS, tree)
    entry = store.stat(WS, None, "a.txt")
    assert entry is not None and (entry.kind, entry.target) == ("symlink", "/etc/passwd")


def test_w6_paths_are_normalised_and_escapes_refused(store: SnapshotStore, tree: Path) -> None:
    write(tree / "a/b.txt", b"b")
    store.commit(WS, tree)
    assert read_all(store, None, "./a//x/../b.txt") == b"b"
    for bad in ("../b.txt", "/a/b.txt", "a/../../etc/passwd", "a\0b"):
        with pytest.raises(PathRefused):
            store.read(WS, None, bad, 0, 10)
        with pytest.raises(PathRefused):
            store.stat(WS, None, bad)


def test_w6_undecodable_names_round_trip(store: SnapshotStore, tree: Path) -> None:
    raw_name = b"caf\xe9.txt"  # latin-1, not UTF-8
    with open(os.path.join(os.fsencode(tree), raw_name), "wb") as f:
        f.write(b"latin")
    store.commit(WS, tree)
    name = os.fsdecode(raw_name)
    assert set(store.manifest(WS)) == {name}
    assert read_all(store, None, name) == b"latin"


# ---------------------------------------------------------------------------- W5 history


def test_w5_older_snapshots_keep_their_content(store: SnapshotStore, tree: Path) -> None:
    versions = [f"version {i}\n".encode() * (i + 1) for i in range(5)]
    seqs = []
    for data in versions:
        write(tree / "doc.txt", data)
        seqs.append(store.commit(WS, tree).seq)
    assert seqs == [1, 2, 3, 4, 5]
    for seq, data in zip(seqs, versions, strict=True):
        assert read_all(store, seq, "doc.txt") == data
    listed = store.list_snapshots(WS)
    assert [s.seq for s in listed] == [0, 1, 2, 3, 4, 5]
    assert len({s.root_hash for s in listed}) == 6
    assert all(not s.new for s in listed)
    assert [s.created_at for s in listed] == sorted(s.created_at for s in listed)


def test_w5_range_reads(store: SnapshotStore, tree: Path) -> None:
    data = bytes(range(256)) * 20_000  # 5,120,000 bytes
    write(tree / "r.bin", data)
    store.commit(WS, tree)
    chunk = store.read(WS, None, "r.bin", 1000, 500)
    assert (chunk.data, chunk.offset, chunk.next_offset, chunk.size) == (
        data[1000:1500],
        1000,
        1500,
        len(data),
    )
    capped = store.read(WS, None, "r.bin", 10, len(data))
    assert len(capped.data) == MAX_READ_CHUNK and capped.data == data[10 : 10 + MAX_READ_CHUNK]
    tail = store.read(WS, None, "r.bin", len(data) - 7, 100)
    assert tail.data == data[-7:] and tail.next_offset == len(data)
    past = store.read(WS, None, "r.bin", len(data) + 50, 100)
    assert (past.data, past.offset, past.next_offset) == (b"", len(data), len(data))
    assert store.read(WS, None, "r.bin", 0, 0).data == b""
    with pytest.raises(InvalidInput, match="must be zero or more"):
        store.read(WS, None, "r.bin", -1, 10)


def test_w5_clear_errors_for_missing_things(store: SnapshotStore, tree: Path) -> None:
    write(tree / "d/f.txt", b"f")
    store.commit(WS, tree)
    with pytest.raises(NotFound, match="snapshots are numbered 0 to 1"):
        store.read(WS, 7, "d/f.txt", 0, 10)
    with pytest.raises(NotFound, match=r"no file 'd/nope\.txt' in snapshot 1"):
        store.read(WS, None, "d/nope.txt", 0, 10)
    with pytest.raises(InvalidInput, match="'d' is a folder"):
        store.read(WS, None, "d", 0, 10)
    with pytest.raises(InvalidInput, match="is a folder"):
        store.read(WS, None, "", 0, 10)
    with pytest.raises(NotFound, match="has no snapshots"):
        store.head("never-made")
    with pytest.raises(InvalidInput, match="workspace id"):
        store.ensure_workspace("../escape")
    with pytest.raises(NotFound, match="no object"):
        store.open_object("0" * 64)
    with pytest.raises(InvalidInput, match="64 lowercase hex"):
        store.open_object("../../etc/passwd")
    with pytest.raises(NotFound, match="cannot be opened"):
        store.commit(WS, tree / "no-such-dir")


# ---------------------------------------------------------------------------- big inputs


def test_w3_big_file_committed_in_bounded_memory(tmp_path: Path, tree: Path) -> None:
    """50 MB in 1 MiB chunks: Python's allocation peak stays far below the file size."""
    digest = hashlib.sha256()
    with open(tree / "big.bin", "wb") as f:
        block = os.urandom(1 << 20)
        for i in range(50):
            piece = block[i:] + block[:i]
            digest.update(piece)
            f.write(piece)
    del block, piece
    store = SnapshotStore(tmp_path / "store", scan_helper=False)
    try:
        tracemalloc.start()
        try:
            info = store.commit(WS, tree)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 20 * (1 << 20), f"peak {peak / (1 << 20):.1f} MiB"
        assert info.bytes == 50 << 20
        entry = store.stat(WS, None, "big.bin")
        assert entry is not None and entry.sha256 == digest.hexdigest()
        check = hashlib.sha256()
        with store.open_object(digest.hexdigest()) as stream:
            while chunk := stream.read(1 << 20):
                check.update(chunk)
        assert check.hexdigest() == digest.hexdigest()
    finally:
        store.close()


def test_w3_big_tree_scanned_with_the_helper_matches_in_process(tmp_path: Path) -> None:
    """Trees past the helper threshold are scanned by two processes from both ends; the
    snapshot is exactly the one a single-process scan makes, and one change is still one
    re-read."""
    tree = tmp_path / "big-tree"
    for i in range(4000):
        write(tree / f"d{i % 40:02d}" / f"s{i % 3}" / f"f{i}.txt", f"file {i}\n".encode())
    settle()
    # the helper serves full walks only: change hints (which skip the walk) stay off here
    helped = SnapshotStore(tmp_path / "helped", scan_helper=True, change_hints=False)
    alone = SnapshotStore(tmp_path / "alone", scan_helper=False)
    try:
        first = helped.commit(WS, tree)
        assert alone.commit(WS, tree).root_hash == first.root_hash
        deadline = time.monotonic() + 30
        round_no = 0
        while True:  # the helper process starts in the background after the first commit
            round_no += 1
            write(tree / "d07/s1/f7.txt", f"round {round_no}\n".encode())
            settle()
            info = helped.commit(WS, tree)
            stats = helped.last_commit_stats
            assert stats is not None and stats.files_hashed == 1
            if stats.dirs_from_helper > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert stats.dirs_from_helper > 0, "the scan helper never answered"
        assert stats.dirs_prescanned == stats.dirs_scanned
        assert alone.commit(WS, tree).root_hash == info.root_hash
        assert read_all(helped, None, "d07/s1/f7.txt") == f"round {round_no}\n".encode()

        # the helper dies: the next commit scans by itself and is just as right
        proc = helped._helper._proc if helped._helper else None
        assert proc is not None
        proc.kill()
        proc.wait()
        write(tree / "d07/s1/f7.txt", b"after the helper died\n")
        settle()
        info = helped.commit(WS, tree)
        stats = helped.last_commit_stats
        assert stats is not None and stats.files_hashed == 1
        assert alone.commit(WS, tree).root_hash == info.root_hash
    finally:
        helped.close()
        alone.close()


def _view_state(root: Path) -> dict[str, tuple[str, bytes | str | None, bool]]:
    """What a reader of a committed view sees: each path's kind, content or link target, and
    whether it is executable."""
    seen: dict[str, tuple[str, bytes | str | None, bool]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                seen[rel] = ("symlink", os.readlink(path), False)
            elif stat.S_ISDIR(mode):
                seen[rel] = ("dir", None, False)
            else:
                seen[rel] = ("file", path.read_bytes(), bool(mode & 0o111))
    return seen


def test_a_patched_read_view_equals_a_fresh_one(store: SnapshotStore, tree: Path) -> None:
    """Issue 17/21: patching the committed view of one snapshot into the next (only what
    differs, walking both trees together) gives exactly the view a reader of the new
    snapshot would get built from scratch, through every kind of change: files added,
    removed, rewritten, made executable; a folder that became a file, a file that became a
    folder, a link retargeted, a whole subtree gone, an unchanged wide folder kept."""
    from shellyard.runner.snapshots import views

    write(tree / "keep" / "same.txt", b"same")
    for i in range(50):
        write(tree / "wide" / f"f{i}.txt", f"{i}".encode())
    write(tree / "dir_to_file" / "inner" / "x.txt", b"x")
    write(tree / "file_to_dir", b"was a file")
    write(tree / "gone" / "deep" / "a" / "b.txt", b"b")
    write(tree / "edit.txt", b"old")
    write(tree / "run.sh", b"#!/bin/sh\n")
    os.symlink("keep/same.txt", tree / "link")
    first = store.commit(WS, tree)
    settle()
    shutil.rmtree(tree / "dir_to_file")
    write(tree / "dir_to_file", b"now a file")
    (tree / "file_to_dir").unlink()
    write(tree / "file_to_dir" / "child.txt", b"now a folder")
    shutil.rmtree(tree / "gone")
    write(tree / "edit.txt", b"new content")
    (tree / "run.sh").chmod(0o755)
    (tree / "link").unlink()
    os.symlink("edit.txt", tree / "link")
    write(tree / "added" / "new.txt", b"added")
    second = store.commit(WS, tree)
    assert second.seq > first.seq

    patched = tree.parent / "patched"
    views.materialise(store, WS, patched, first.seq)
    views.patch(store, WS, patched, first.seq, second.seq)
    fresh = tree.parent / "fresh"
    views.materialise(store, WS, fresh, second.seq)
    assert _view_state(patched) == _view_state(fresh)
    state = _view_state(fresh)
    assert state["dir_to_file"] == ("file", b"now a file", False)
    assert state["file_to_dir/child.txt"] == ("file", b"now a folder", False)
    assert state["run.sh"] == ("file", b"#!/bin/sh\n", True)
    assert state["link"] == ("symlink", "edit.txt", False)
    assert not any(path.startswith("gone") for path in state)
    assert len([p for p in state if p.startswith("wide/")]) == 50


def test_read_views_are_built_and_patched_in_bounded_memory(
    store: SnapshotStore, tree: Path
) -> None:
    """Building a committed view and patching it walk the snapshot one folder's tree at a
    time: their memory does not grow with the number of files (20,000 here, in 200 folders)."""
    from shellyard.runner.snapshots import views

    for d in range(200):
        folder = tree / f"d{d:03}"
        folder.mkdir()
        for f in range(100):
            (folder / f"f{f:03}").write_bytes(b"")
    first = store.commit(WS, tree)
    settle()
    write(tree / "d000" / "f000", b"changed")
    second = store.commit(WS, tree)
    view = tree.parent / "view"
    tracemalloc.start()
    try:
        views.materialise(store, WS, view, first.seq)
        _, built = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        views.patch(store, WS, view, first.seq, second.seq)
        _, patched = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (view / "d000" / "f000").read_bytes() == b"changed"
    assert sum(1 for _ in view.rglob("*")) == 200 * 101
    # A whole-snapshot listing of 20,000 entries took 27 MB (before, 2026-12-01).
    print(f"built {built} B, patched {patched} B")
    assert built < 1 << 20, built
    assert patched < 1 << 20, patched

"""Change hints (W3, W2): a commit scans only what inotify saw change, and is still exactly
the snapshot a full walk of the same tree makes — including after an overflow, a runner
killed -9 mid-command, and changes made while no runner watched (docs/files-and-transfers.md,
"Change hints")."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shellyard.runner.edits.editor import Editor
from shellyard.runner.protocol import ApplyEntry
from shellyard.runner.snapshots import history
from shellyard.runner.snapshots.format import MANIFEST_HEADER
from shellyard.runner.snapshots.objects import StoreLock
from shellyard.runner.snapshots.store import SnapshotStore

WS = "ws-1"
SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture
def base(tmp_path: Path) -> Iterator[Path]:
    """A folder for trees and stores on tmpfs when there is one: making 50,000 files there
    takes ~3 s, against ~60 s on this machine's loaded ext4 (both record the same events)."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="shellyard-hints-", dir=shm))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def make_tree(root: Path, tops: int, subs: int, files: int) -> int:
    """tops x subs folders of ``files`` small files each, written with as few calls as can be."""
    root.mkdir(parents=True)
    rfd = os.open(root, os.O_RDONLY)
    try:
        for i in range(tops):
            os.mkdir(f"d{i:02d}", dir_fd=rfd)
            dfd = os.open(f"d{i:02d}", os.O_RDONLY, dir_fd=rfd)
            try:
                for j in range(subs):
                    os.mkdir(f"s{j}", dir_fd=dfd)
                    sfd = os.open(f"s{j}", os.O_RDONLY, dir_fd=dfd)
                    try:
                        for k in range(files):
                            fd = os.open(f"f{k}.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=sfd)
                            os.write(fd, b"file %d %d %d\n" % (i, j, k))
                            os.close(fd)
                    finally:
                        os.close(sfd)
            finally:
                os.close(dfd)
    finally:
        os.close(rfd)
    return tops * subs * files


def run(tree: Path, command: str) -> None:
    """A command changing the workspace, as an execution's would (another process)."""
    subprocess.run(["bash", "-c", command], cwd=tree, check=True)


def check_exact(store: SnapshotStore, reference: SnapshotStore, tree: Path) -> None:
    """The store's head is what a full walk (a store without hints) makes of the tree."""
    expected = reference.commit(WS, tree)
    assert reference.last_commit_stats is not None
    assert not reference.last_commit_stats.change_hints
    assert store.head(WS).root_hash == expected.root_hash
    assert store.manifest(WS) == reference.manifest(WS)


def test_w3_hinted_commits_of_a_50000_file_tree_equal_full_walks(base: Path) -> None:
    """Every kind of change, one command each, in a 50,000-file workspace: each commit
    scans a handful of folders, and equals a full walk of the same tree."""
    tree = base / "tree"
    assert make_tree(tree, 50, 10, 100) == 50_000
    store = SnapshotStore(base / "store", scan_helper=False)
    reference = SnapshotStore(base / "reference", scan_helper=False, change_hints=False)
    try:
        first = store.commit(WS, tree)
        stats = store.last_commit_stats
        assert stats is not None and not stats.change_hints  # nothing watched before: walk
        assert first.files == 50_000
        check_exact(store, reference, tree)
        cache_size = (base / "store" / "workspaces" / WS / "statcache").stat().st_size
        steps = [
            ("changes one file", "echo more >> d07/s3/f42.txt"),
            ("adds one", "echo new > d11/s0/added.txt"),
            ("deletes one", "rm d12/s9/f99.txt"),
            ("renames a folder", "mv d13 d13-renamed"),
            ("changes a mode", "chmod 600 d14/s1/f1.txt"),
            ("swaps a file for a symlink", "rm d15/s2/f2.txt && ln -s ../s3/f3.txt d15/s2/f2.txt"),
            ("changes a folder's mode", "chmod 700 d16/s4"),
            ("moves a folder into another", "mv d17/s5 d18/s5-moved"),
            ("makes a new subtree", "mkdir -p d19/new/deep && echo x > d19/new/deep/n.txt"),
            ("removes a subtree", "rm -r d20"),
            ("moves a folder back where it was", "mv d13-renamed d13"),
            ("replaces a folder by another", "rm -r d21/s0 && mv d21/s1 d21/s0"),
        ]
        seq = first.seq
        for what, command in steps:
            run(tree, command)
            info = store.commit(WS, tree)
            stats = store.last_commit_stats
            assert stats is not None
            assert stats.change_hints, f"the commit after a command that {what} walked the tree"
            assert stats.dirs_scanned <= 30, f"{what}: scanned {stats.dirs_scanned} folders"
            # format 2: the trees of the changed folders and their ancestors, a manifest of
            # one header, a stat cache log frame of the changed records (not 500 folders')
            assert 1 <= stats.trees_written <= 12, f"{what}: {stats.trees_written} trees"
            manifest = base / "store" / "workspaces" / WS / "manifests" / str(info.seq)
            assert manifest.stat().st_size == MANIFEST_HEADER.size
            assert stats.cache_bytes < cache_size // 20, f"{what}: {stats.cache_bytes} bytes"
            assert info.new and info.seq == seq + 1, what
            seq = info.seq
            check_exact(store, reference, tree)
        # a command that changes nothing: the head as it is; the folders the last commit
        # found racily clean are scanned once more (W3), then none at all
        time.sleep(0.05)  # past the timestamp tick of the last change
        for scanned in (30, 0):
            run(tree, "true")
            assert not store.commit(WS, tree).new
            stats = store.last_commit_stats
            assert stats is not None and stats.change_hints and stats.dirs_scanned <= scanned
        check_exact(store, reference, tree)
    finally:
        store.close()
        reference.close()


def test_w3_writer_operations_on_a_50000_file_tree_commit_what_they_touched(base: Path) -> None:
    """File writes, deletes, moves, restores of one file and transfer batches (W1, W5, T3)
    in a 50,000-file workspace: each commit scans a few folders, writes a few trees, and is
    exactly what a full walk of the same tree makes."""
    tree = base / "tree"
    make_tree(tree, 50, 10, 100)
    store = SnapshotStore(base / "store", scan_helper=False)
    reference = SnapshotStore(base / "reference", scan_helper=False, change_hints=False)
    editor = Editor(store, StoreLock(base / "store"), base / "staging", None, lambda _ws: tree)
    editor.startup()
    try:
        first = editor.commit(WS)
        editor.commit(WS)  # the first commit set the watches up

        def write(path: str, data: bytes) -> None:
            upload = editor.begin_write(WS, path, None)
            upload.write(data)
            upload.finish()

        old = store.stat(WS, None, "d03/s3/f3.txt")
        assert old is not None and old.sha256 is not None
        digest = old.sha256
        operations = [
            ("writes a file", lambda: write("d01/s1/f1.txt", b"written\n")),
            ("writes a new file", lambda: write("d02/new/n.txt", b"new\n")),
            ("deletes a file", lambda: editor.delete(WS, "d03/s3/f3.txt", False)),
            ("moves a folder", lambda: editor.move(WS, "d04/s4", "d05/s4-moved", False)),
            ("restores one file", lambda: editor.restore(WS, first.seq, "d03/s3/f3.txt")),
            ("restores a folder", lambda: editor.restore(WS, first.seq, "d01/s1")),
            (
                "applies a transfer batch",
                lambda: editor.apply(
                    WS,
                    [
                        ApplyEntry(
                            path="d06/s6/copy.txt",
                            kind="file",
                            mode=0o644,
                            size=old.size,
                            sha256=digest,
                        ),
                        ApplyEntry(
                            path="d07/s7/f7.txt",
                            kind="file",
                            mode=0o600,
                            size=old.size,
                            sha256=digest,
                        ),
                    ],
                ),
            ),
        ]
        for what, operation in operations:
            operation()
            stats = store.last_commit_stats
            assert stats is not None and stats.change_hints, f"the commit after {what} walked"
            assert stats.dirs_scanned <= 12, f"{what}: scanned {stats.dirs_scanned} folders"
            assert stats.trees_written <= 12, f"{what}: {stats.trees_written} trees"
            check_exact(store, reference, tree)
        assert store.stat(WS, None, "d03/s3/f3.txt") == old
        diff = history.diff(store, WS, first.seq, None, "", None, 1000)
        assert {c.path for c in diff.changes} >= {"d02/new/n.txt", "d04/s4", "d05/s4-moved"}
    finally:
        editor.close()
        store.close()
        reference.close()


def small_tree(base: Path) -> tuple[Path, SnapshotStore, SnapshotStore]:
    tree = base / "tree"
    make_tree(tree, 10, 4, 50)
    store = SnapshotStore(base / "store", scan_helper=False)
    reference = SnapshotStore(base / "reference", scan_helper=False, change_hints=False)
    store.commit(WS, tree)
    run(tree, "echo 1 >> d01/s1/f1.txt")
    store.commit(WS, tree)
    stats = store.last_commit_stats
    assert stats is not None and stats.change_hints  # the hints are in use before the fault
    return tree, store, reference


def test_w3_event_overflow_falls_back_to_a_full_walk(base: Path) -> None:
    """More events than the kernel queues (fs.inotify.max_queued_events) between two
    commits: the overflow is seen, the commit walks everything, the snapshot is exact."""
    tree, store, reference = small_tree(base)
    try:
        limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
        files = sorted(tree.glob("d*/s*/f*.txt"))
        rounds = limit // len(files) + 2
        # one attribute event per file and round; names alternate, so none merge
        now = time.time()
        for r in range(rounds):
            for f in files:
                os.utime(f, (now - 1000 - r, now - 1000 - r))
        run(tree, "echo changed-amid-the-flood >> d05/s2/f7.txt && rm d06/s0/f0.txt")
        store.commit(WS, tree)
        stats = store.last_commit_stats
        assert stats is not None and not stats.change_hints
        assert stats.dirs_scanned == 1 + 10 + 40  # every folder
        check_exact(store, reference, tree)
        # the walk set the watches up again: the next commit is hinted, and exact
        run(tree, "echo again >> d05/s2/f7.txt")
        store.commit(WS, tree)
        stats = store.last_commit_stats
        assert stats is not None and stats.change_hints
        check_exact(store, reference, tree)
    finally:
        store.close()
        reference.close()


RUNNER = """
import subprocess, sys, time
from pathlib import Path
from shellyard.runner.snapshots import history
from shellyard.runner.edits.editor import Editor
from shellyard.runner.snapshots.objects import StoreLock
from shellyard.runner.protocol import ApplyEntry
from shellyard.runner.snapshots.format import MANIFEST_HEADER
from shellyard.runner.snapshots.store import SnapshotStore
store = SnapshotStore(Path(sys.argv[1]), scan_helper=False)
tree = Path(sys.argv[2])
store.commit("ws-1", tree)
store.commit("ws-1", tree)
command = subprocess.Popen(["bash", "-c", sys.argv[3]], cwd=tree, start_new_session=True)
print(command.pid, flush=True)
time.sleep(600)
"""


def test_w3_runner_killed_mid_command_then_restarted_walks_everything(base: Path) -> None:
    """The runner process (holding the store and its watches) is killed -9 while a command
    is changing the workspace, and the command goes on after it died: the restarted store
    knows nothing of what happened meanwhile, walks everything, and is exact."""
    tree = base / "tree"
    make_tree(tree, 10, 4, 50)
    command = (
        "for i in $(seq 1 40); do echo $i >> d02/s2/f2.txt; mv d03/s$((i % 4)) d03/t$i 2>/dev/null"
        " || true; sleep 0.02; done; mkdir d04/late && echo late > d04/late/x.txt"
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(base / "store"), str(tree), command],
        stdout=subprocess.PIPE,
        env=env,
    )
    assert runner.stdout is not None
    line = runner.stdout.readline()
    assert line.strip().isdigit(), "the runner did not start its command"
    command_pid = int(line)
    time.sleep(0.3)  # mid-command
    runner.send_signal(signal.SIGKILL)
    runner.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the command carries on with nobody watching
        try:
            os.kill(command_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    assert (tree / "d04" / "late" / "x.txt").exists()
    store = SnapshotStore(base / "store", scan_helper=False)
    reference = SnapshotStore(base / "reference", scan_helper=False, change_hints=False)
    try:
        store.commit(WS, tree)
        stats = store.last_commit_stats
        assert stats is not None and not stats.change_hints
        check_exact(store, reference, tree)
    finally:
        store.close()
        reference.close()


def test_w3_changes_while_no_runner_watched_are_found_by_a_full_walk(base: Path) -> None:
    """The store is closed (the runner is down), the workspace changes from outside, a new
    store commits: it walks everything (its hints start empty), then hints again."""
    tree, store, reference = small_tree(base)
    store.close()
    run(tree, "echo outside >> d03/s3/f3.txt && mv d04 d04-moved && chmod 600 d05/s0/f0.txt")
    again = SnapshotStore(base / "store", scan_helper=False)
    try:
        again.commit(WS, tree)
        stats = again.last_commit_stats
        assert stats is not None and not stats.change_hints
        check_exact(again, reference, tree)
        run(tree, "echo watched >> d03/s3/f3.txt")
        again.commit(WS, tree)
        stats = again.last_commit_stats
        assert stats is not None and stats.change_hints
        check_exact(again, reference, tree)
    finally:
        again.close()
        reference.close()


def test_w3_another_store_committing_the_workspace_voids_the_hints(base: Path) -> None:
    """A commit by another store instance (another runner process on the same root) changes
    the stat cache on disk: this store reloads it and walks everything."""
    tree, store, reference = small_tree(base)
    other = SnapshotStore(base / "store", scan_helper=False, change_hints=False)
    try:
        run(tree, "echo other >> d07/s0/f0.txt")
        other.commit(WS, tree)
        run(tree, "echo mine >> d07/s1/f1.txt")
        store.commit(WS, tree)
        stats = store.last_commit_stats
        assert stats is not None and not stats.change_hints
        check_exact(store, reference, tree)
    finally:
        other.close()
        store.close()
        reference.close()


def test_w3_hard_linked_files_keep_full_walks(base: Path) -> None:
    """A file with two names changes through the other name with no event in this folder:
    while a workspace holds hard-linked files its commits walk everything, and see it."""
    tree, store, reference = small_tree(base)
    try:
        run(tree, "ln d08/s0/f0.txt d09/s0/twin.txt")
        store.commit(WS, tree)  # the link's own folder is scanned: it is learnt here
        run(tree, "echo through-the-twin >> d09/s0/twin.txt")
        store.commit(WS, tree)
        stats = store.last_commit_stats
        assert stats is not None and not stats.change_hints
        check_exact(store, reference, tree)
        assert b"through-the-twin" in (tree / "d08" / "s0" / "f0.txt").read_bytes()
        run(tree, "rm d09/s0/twin.txt")
        store.commit(WS, tree)  # a full walk finds no link left
        run(tree, "echo alone >> d08/s0/f0.txt")
        store.commit(WS, tree)
        stats = store.last_commit_stats
        assert stats is not None and stats.change_hints
        check_exact(store, reference, tree)
    finally:
        store.close()
        reference.close()


def test_w3_racily_clean_folders_are_scanned_again_whatever_the_hints(base: Path) -> None:
    """A file changed in the same timestamp tick as the walk that recorded it cannot be
    trusted (W3's racy-clean rule): its folder is scanned by the next commits even when no
    event names it, so a change that keeps size and mtime is still seen."""
    tree, store, reference = small_tree(base)
    try:
        target = tree / "d02" / "s3" / "f9.txt"
        target.write_bytes(b"before\n")
        future = time.time_ns() + 3_600_000_000_000  # an mtime past any walk's clock: racy
        os.utime(target, ns=(future, future))
        store.commit(WS, tree)
        store.commit(WS, tree)  # no event since: only the racy folder is scanned
        stats = store.last_commit_stats
        assert stats is not None and stats.change_hints and stats.dirs_scanned == 1
        assert stats.racy == 1  # ...and its file read again
        with open(target, "r+b") as f:  # same size, same mtime
            f.write(b"AFTER!\n")
        os.utime(target, ns=(future, future))
        store.commit(WS, tree)
        check_exact(store, reference, tree)
        assert store.read(WS, None, "d02/s3/f9.txt", 0, 100).data == b"AFTER!\n"
    finally:
        store.close()
        reference.close()


def test_w3_an_unchanged_workspace_is_answered_at_once_and_only_then(base: Path) -> None:
    """``commit_if_unchanged`` (the event loop's, docs/benchmarks.md §36 "Thread hops")
    answers ``commit``'s head when the hints show nothing changed, and None, at once and
    without waiting, whenever ``commit`` has work or must wait: a change, a lock held
    elsewhere (another commit of the workspace, a GC), another store's commit."""
    import fcntl

    tree, store, reference = small_tree(base)
    lock = StoreLock(base / "store")
    placer = Editor(store, lock, base / "staging", None, lambda _ws: tree)
    try:
        time.sleep(0.02)  # past the timestamp tick of the fixture's last write
        store.commit(WS, tree)  # the folder the fixture changed, scanned again
        head = store.commit(WS, tree)
        same = placer.commit_if_unchanged(WS)
        assert same == head and not same.new
        stats = store.last_commit_stats
        assert stats is not None and stats.change_hints and stats.seq == head.seq
        fd = os.open(base / "store" / "workspaces" / WS / "lock", os.O_RDWR)
        try:  # another process commits the workspace: not waited for
            fcntl.flock(fd, fcntl.LOCK_EX)
            assert placer.commit_if_unchanged(WS) is None
        finally:
            os.close(fd)
        with lock.hold(exclusive=True):  # a GC runs
            assert placer.commit_if_unchanged(WS) is None
        assert placer.commit_if_unchanged(WS) == head
        run(tree, "echo 2 >> d03/s2/f4.txt")
        assert placer.commit_if_unchanged(WS) is None  # a change: ``commit``'s work
        changed = placer.commit(WS)
        assert changed.new and changed.seq == head.seq + 1
        check_exact(store, reference, tree)
        time.sleep(0.02)
        store.commit(WS, tree)  # its racily clean folder, scanned again
        assert placer.commit_if_unchanged(WS) is not None
        other = SnapshotStore(base / "store", scan_helper=False, change_hints=False)
        try:
            run(tree, "echo 3 >> d03/s2/f4.txt")
            other.commit(WS, tree)
            assert placer.commit_if_unchanged(WS) is None  # its stat cache is not ours
        finally:
            other.close()
    finally:
        placer.close()
        store.close()
        reference.close()

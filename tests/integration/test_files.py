"""Workspace files and snapshot history through the control plane, on a local and a direct
runner (the ``yard`` fixture): W1 (file operations are writers), W2 (readers see committed
snapshots only), W3 (every writer ends with a commit; a late update changes nothing), W5
(history, diff, restore, retention and garbage collection), W6 (paths stay inside). Real
sandboxes, a real runner daemon on loopback, real files."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from files_helpers import archive, child_workspace, chunks_of, read_all, run, tree

from conftest import Yard
from shellyard.contract.executions import ExecutionLogsQuery, ExecutionState, ExecutionWait
from shellyard.contract.files import FileDiffQuery, FileHistoryQuery, FileListQuery, TransferWait
from shellyard.errors import InvalidInput, NotFound, PathRefused, WorkspaceBusy
from shellyard.runner import workspace_paths
from shellyard.runner.local import LocalRunner
from shellyard.runner.protocol import ApplyEntry

pytestmark = pytest.mark.timeout(240)

BIG = 200 << 20


# ---------------------------------------------------------------------- W2: readers


REWRITE = """python3 - <<'PY'
import time
chunk = b"{v}" * (10 << 20)
with open("big.bin", "{mode}") as f:
    for _ in range(20):  # in place, slowly: the live file is a mix of versions meanwhile
        f.write(chunk)
        f.flush()
        time.sleep(0.01)
PY"""


async def test_w2_readers_during_a_writer_get_whole_committed_versions(yard: Yard) -> None:
    """A command rewrites a 200 MB file in place, again and again, while readers read it
    through the API: every read is one complete committed version, never a mix."""
    plane, runner_id = yard.plane, yard.runner_id
    first = await run(plane, REWRITE.format(v="A", mode="wb"), runner_id)
    ws = first.workspace_id
    committed = {b"A"}
    reads: list[tuple[bytes, int]] = []
    writing = asyncio.Event()

    async def reader() -> None:
        while True:
            stream = await plane.files.open("big.bin", workspace_id=ws)
            version, total = b"", 0
            async for chunk in stream.chunks:
                if not version:
                    version = chunk[:1]
                assert chunk.count(version) == len(chunk), "a read mixed two versions"
                total += len(chunk)
            assert total == BIG == stream.entry.size
            reads.append((version, stream.seq))
            if not writing.is_set():
                return

    writing.set()
    readers = [asyncio.create_task(reader()) for _ in range(2)]
    # Rewrite until the readers have seen two versions (a read of 200 MB through a runner
    # daemon on a loaded machine can outlast a couple of rewrites), at most seven times.
    for v in b"BCDEFGH":
        latest = bytes([v])
        await run(plane, REWRITE.format(v=latest.decode(), mode="r+b"), runner_id)
        committed.add(latest)
        if len(committed) >= 3 and len({seen for seen, _seq in reads}) >= 2:
            break
    writing.clear()
    await asyncio.gather(*readers)
    print(f"readers: {len(reads)} reads, versions {sorted(set(reads))}")
    # the readers overlapped the rewrites: they saw at least two committed versions
    assert len({v for v, _seq in reads}) >= 2
    assert {v for v, _seq in reads} <= committed
    # one snapshot, one version: the seq a read was served from fixes its content
    by_seq: dict[int, bytes] = {}
    for version, seq in reads:
        assert by_seq.setdefault(seq, version) == version
    last = await plane.files.open("big.bin", workspace_id=ws, offset=BIG - 5, length=5)
    assert b"".join([c async for c in last.chunks]) == latest * 5


# ---------------------------------------------------------------------- W1: writers


async def slow_chunks(data: bytes, pause_s: float, started: asyncio.Event) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 4):
        yield data[i : i + 4]
        started.set()
        await asyncio.sleep(pause_s)


async def test_w1_file_writes_take_the_writer_refused_or_queued(yard: Yard) -> None:
    """W1: a file write while a command runs is refused naming the execution, or waits in
    line with queue; a command while an upload holds the writer is refused naming the edit,
    or queued and started when the upload ends."""
    plane, runner_id = yard.plane, yard.runner_id
    busy = await yard.run("sleep 2; echo done > done.txt", background=True)
    with pytest.raises(WorkspaceBusy) as refused:
        await plane.files.write("a.txt", b"now", runner_id=runner_id)
    assert busy.execution_id in refused.value.message
    assert "queue" in refused.value.message
    queued = await plane.files.write("a.txt", b"after", runner_id=runner_id, queue=True)
    ended = await plane.executions.status(busy.execution_id)
    assert ended.state == ExecutionState.completed
    assert ended.snapshot_seq is not None and queued.snapshot_seq > ended.snapshot_seq
    assert await read_all(plane, "done.txt", runner_id=runner_id) == b"done\n"

    started = asyncio.Event()
    upload = asyncio.create_task(
        plane.files.write(
            "slow.txt", slow_chunks(b"0123456789ab", 0.3, started), runner_id=runner_id
        )
    )
    await started.wait()
    with pytest.raises(WorkspaceBusy) as refused_run:
        await yard.run("true")
    assert "ed_" in refused_run.value.message  # the edit holding the writer is named
    waiting = await yard.run("cat slow.txt", queue=True, background=True)
    assert waiting.state == ExecutionState.queued
    edit = await upload
    after = await plane.executions.wait(waiting.execution_id, ExecutionWait(timeout_s=30))
    assert after.state == ExecutionState.completed
    logs = await plane.executions.logs(waiting.execution_id, ExecutionLogsQuery())
    assert logs.data == "0123456789ab"
    assert edit.snapshot_seq <= (after.snapshot_seq or 0)


async def test_w3_w5_each_writer_commits_and_history_says_what_made_it(yard: Yard) -> None:
    """W3: every writer operation ends with a commit, numbers only grow; W5: history lists
    what made each snapshot; diff gives added/removed/changed with sizes; restore is a writer
    operation that makes a new snapshot and deletes nothing from history."""
    plane, runner_id = yard.plane, yard.runner_id
    ex = await run(plane, "mkdir -p src; echo one > a.txt; echo x > src/m.py", runner_id)
    ws = ex.workspace_id
    wrote = await plane.files.write("b.txt", b"bee\n", runner_id=runner_id, mode=0o600)
    moved = await plane.files.move("b.txt", "docs/c.txt", runner_id=runner_id)
    changed = await plane.files.write("a.txt", b"one, longer\n", runner_id=runner_id)
    deleted = await plane.files.delete("src", recursive=True, runner_id=runner_id)
    seqs = [ex.snapshot_seq, *(e.snapshot_seq for e in (wrote, moved, changed, deleted))]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert wrote.written[0].sha256 == hashlib.sha256(b"bee\n").hexdigest()

    diff = await plane.files.diff(
        FileDiffQuery(from_seq=ex.snapshot_seq, to_seq=None, workspace_id=ws)
    )
    changes = {c.path: c for c in diff.changes}
    assert changes["a.txt"].change == "changed"
    assert (changes["a.txt"].old_size, changes["a.txt"].new_size) == (4, 12)
    assert changes["docs/c.txt"].change == "added" and changes["docs/c.txt"].new_size == 4
    assert changes["src/m.py"].change == "removed" and changes["src"].kind == "dir"
    assert (await tree(plane, ws))["docs/c.txt"].mode == 0o600

    restored = await plane.files.restore(ex.snapshot_seq, workspace_id=ws)
    assert restored.kind == "restore" and restored.snapshot_seq == deleted.snapshot_seq + 1
    before, now = await tree(plane, ws, ex.snapshot_seq), await tree(plane, ws)
    assert now == before
    history = await plane.files.history(FileHistoryQuery(workspace_id=ws))
    made = {s.seq: (s.made_by_kind, s.made_by_id) for s in history.snapshots}
    assert made[0] == ("created", None)
    assert made[ex.snapshot_seq] == ("execution", ex.execution_id)
    assert [made[e.snapshot_seq] for e in (wrote, moved, changed, deleted)] == [
        ("edit", e.operation_id) for e in (wrote, moved, changed, deleted)
    ]
    assert made[restored.snapshot_seq] == ("restore", restored.operation_id)
    assert all(s.retained for s in history.snapshots)  # nothing deleted from history
    assert await read_all(plane, "a.txt", workspace_id=ws, seq=changed.snapshot_seq) == (
        b"one, longer\n"
    )

    # restore of one folder leaves the rest as it is
    await plane.files.write("keep.txt", b"k", workspace_id=ws)
    only = await plane.files.restore(deleted.snapshot_seq, "src", workspace_id=ws)
    final = await tree(plane, ws)
    assert "src" not in final and "keep.txt" in final and "a.txt" in final
    assert only.removed == ["src"]
    # the unchanged case: restoring the head makes no new snapshot
    same = await plane.files.restore(only.snapshot_seq, workspace_id=ws)
    assert not same.new_snapshot and same.snapshot_seq == only.snapshot_seq


async def test_w3_late_record_update_changes_nothing(yard: Yard) -> None:
    """W3: an old operation's record arriving after a newer snapshot (a retried completion
    of a finished execution, a late snapshot record) moves neither the head nor the files."""
    plane, runner_id = yard.plane, yard.runner_id
    ex = await run(plane, "echo old > f.txt", runner_id)
    edit = await plane.files.write("f.txt", b"new\n", runner_id=runner_id)
    old_result = await yard.runner.status(ex.execution_id)
    assert old_result.snapshot is not None and old_result.snapshot.seq == ex.snapshot_seq
    row = await plane.store.get_execution(ex.execution_id)
    assert row is not None
    await plane.executions._complete(row, old_result)  # the completion, delivered again late
    snap = old_result.snapshot
    await plane.store.record_snapshot(
        ex.workspace_id, snap.seq, snap.root_hash, snap.files, snap.bytes, "execution", "late"
    )
    workspace = await plane.store.get_workspace(ex.workspace_id)
    assert workspace is not None and workspace.head_seq == edit.snapshot_seq
    assert (await yard.runner.head(ex.workspace_id)).seq == edit.snapshot_seq
    assert await read_all(plane, "f.txt", workspace_id=ex.workspace_id) == b"new\n"
    again = await plane.executions.status(ex.execution_id)
    assert again.snapshot_seq == ex.snapshot_seq and again.finished_at == ex.finished_at
    made = {
        s.seq: s.made_by_id
        for s in (await plane.files.history(FileHistoryQuery(runner_id=runner_id))).snapshots
    }
    assert made[ex.snapshot_seq] == ex.execution_id and made[edit.snapshot_seq] == edit.operation_id


async def test_uploads_stream_files_and_folders_all_or_nothing(yard: Yard) -> None:
    """A 24 MB upload from a stream of chunks; a tar upload unpacks below a folder; a bad
    archive (a link out of the workspace) changes nothing."""
    plane, runner_id = yard.plane, yard.runner_id
    data = os.urandom(3 << 20) * 8
    edit = await plane.files.write("big/up.bin", chunks_of(data), runner_id=runner_id)
    assert edit.written[0].sha256 == hashlib.sha256(data).hexdigest()
    assert await read_all(plane, "big/up.bin", runner_id=runner_id) == data
    ranged = await plane.files.open("big/up.bin", runner_id=runner_id, offset=5, length=7)
    assert b"".join([c async for c in ranged.chunks]) == data[5:12]

    async def broken() -> AsyncIterator[bytes]:
        yield b"x" * 1000
        raise RuntimeError("the client went away")

    with pytest.raises(RuntimeError, match="went away"):
        await plane.files.write("fail/deep/x.bin", broken(), runner_id=runner_id)
    assert (
        await plane.files.history(FileHistoryQuery(runner_id=runner_id))
    ).head_seq == edit.snapshot_seq
    if yard.daemon is None:  # the live tree: no temp file, no folder made on the way
        left = await run(plane, "ls -A; ls -A fail 2>&1 || true", runner_id)
        listing = (await plane.executions.logs(left.execution_id, ExecutionLogsQuery())).data
        assert "fail" not in listing.split() and "partial" not in listing

    good = archive([("pkg", None, None), ("pkg/a.py", b"a", None), ("pkg/l", None, "a.py")])
    unpacked = await plane.files.upload_archive(chunks_of(good, 100), "vendor", runner_id=runner_id)
    files = await tree(plane, unpacked.workspace_id)
    assert files["vendor/pkg/a.py"].size == 1 and files["vendor/pkg/l"].target == "a.py"
    bad = archive([("ok.txt", b"fine", None), ("out", None, "../../../etc")])
    with pytest.raises(PathRefused, match="outside the workspace"):
        await plane.files.upload_archive(bad, "vendor", runner_id=runner_id)
    assert "vendor/ok.txt" not in await tree(plane, unpacked.workspace_id)
    assert (
        await plane.files.history(FileHistoryQuery(runner_id=runner_id))
    ).head_seq == unpacked.snapshot_seq


# ---------------------------------------------------------------------- W6: paths


async def test_w6_path_attacks_refused_nothing_outside_read_or_written(yard: Yard) -> None:
    """W6: '../', absolute paths, NUL, over-long names, a link to /etc, a chain of links,
    a link climbing out: refused everywhere with a clear error; links are stored as links."""
    plane, runner_id = yard.plane, yard.runner_id
    marker = f"shellyard-w6-{os.getpid()}"
    ex = await run(
        plane,
        "mkdir real; echo in > real/f; ln -s /etc etc; ln -s b a; ln -s /etc b; "
        "ln -s ../.. up; ln -s real inner",
        runner_id,
    )
    ws = ex.workspace_id
    where = {"workspace_id": ws}

    for bad, why in [
        ("../x", "'..' to leave the workspace root"),
        ("real/../../x", "'..' to leave the workspace root"),
        ("/etc/passwd", "absolute"),
        ("a\0b", "NUL byte"),
        ("n" * 300, "at most 255 bytes"),
    ]:
        attempts = [
            plane.files.open(bad, **where),
            plane.files.list(FileListQuery(path=bad, **where)),
            plane.files.write(bad, b"x", **where),
            plane.files.delete(bad, **where),
            plane.files.move("real/f", bad, **where),
            plane.files.move(bad, "z", **where),
            plane.files.restore(ex.snapshot_seq, bad, **where),
            plane.files.archive(bad, **where),
            plane.transfers.start(
                {"source_workspace_id": ws, "paths": [bad], "target_workspace_id": ws}
            ),
        ]
        for attempt in attempts:
            with pytest.raises(PathRefused, match=why):
                await attempt

    with pytest.raises(PathRefused, match=r"crosses the symbolic link 'etc'.*outside"):
        await plane.files.open("etc/passwd", **where)
    with pytest.raises(PathRefused, match="crosses the symbolic link 'etc'"):
        await plane.files.write(f"etc/{marker}", b"x", **where)
    with pytest.raises(PathRefused, match="crosses the symbolic link 'a'"):
        await plane.files.write(f"a/{marker}", b"x", **where)  # a -> b -> /etc
    with pytest.raises(PathRefused, match="crosses the symbolic link 'up'"):
        await plane.files.write(f"up/{marker}", b"x", **where)
    with pytest.raises(PathRefused, match="crosses the symbolic link 'inner'"):
        await plane.files.write("inner/g", b"x", **where)  # even a link inside is not followed
    with pytest.raises(PathRefused):
        await plane.files.move("real", "etc/real", **where)
    with pytest.raises(InvalidInput, match="symbolic link to '/etc'"):
        await plane.files.open("etc", **where)
    assert not Path("/etc", marker).exists()

    # the link itself, not /etc
    listing = await plane.files.list(FileListQuery(path="etc", **where))
    assert [(e.path, e.kind, e.target) for e in listing.entries] == [("etc", "symlink", "/etc")]
    archive = await plane.files.archive("", **where)
    data = b"".join([c async for c in archive.chunks])
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["etc"].issym() and members["etc"].linkname == "/etc"
    assert not any(name.startswith("etc/") for name in members)
    deleted = await plane.files.delete("etc", **where)  # removes the link, never /etc
    assert "etc" not in await tree(plane, ws) and Path("/etc/passwd").exists()
    assert deleted.removed == ["etc"]


async def test_w6_symlink_swapped_in_between_check_and_use() -> None:
    """W6 against a race on the live tree: a folder is swapped for a link to an outside folder
    while the runner writes, moves and applies transfer entries below it. Each operation
    resolves its folders once, without following links, then works relative to the folder
    descriptor it holds: nothing ever lands outside."""
    base = Path(tempfile.mkdtemp(prefix="shellyard-swap-", dir="/tmp"))
    base.chmod(0o711)
    runner = LocalRunner(base / "runner")
    await runner.startup()
    try:
        await runner.ensure_workspace("ws")
        tree_root = runner.workspace_path("ws")
        outside = base / "outside"
        outside.mkdir()
        (tree_root / "d").mkdir()

        # deterministic: the check passes, then the folder becomes a link, then the use
        with (
            workspace_paths.open_root(tree_root) as root,
            workspace_paths.resolve(root, "d/f") as resolved,
        ):
            os.rename(tree_root / "d", tree_root / "d.moved")
            os.symlink(outside, tree_root / "d")
            fd = os.open(resolved.name, workspace_paths.O_NEW, 0o600, dir_fd=resolved.dir_fd)
            os.close(fd)
        assert (tree_root / "d.moved" / "f").exists() and not list(outside.iterdir())
        os.unlink(tree_root / "d")
        os.rename(tree_root / "d.moved", tree_root / "d")

        # racing: a thread flips d between a folder and a link to outside/
        stop = threading.Event()

        def flip() -> None:
            d, parked = tree_root / "d", tree_root / "d.tmp"
            while not stop.is_set():
                try:
                    if not parked.exists():
                        os.rename(d, parked)
                    with contextlib.suppress(FileExistsError):  # the runner made a new d
                        os.symlink(outside, d)
                    if d.is_symlink():
                        os.unlink(d)
                    elif d.exists():
                        shutil.rmtree(d)  # a folder the runner made in the gap
                    os.rename(parked, d)
                except OSError:
                    continue  # the runner changed d meanwhile: flip again

        thread = threading.Thread(target=flip)
        thread.start()
        refused = done = 0
        try:
            for i in range(150):
                try:
                    if i % 3 == 0:
                        await runner.write_file("ws", f"d/w{i}", chunks_of(b"w"), None)
                    elif i % 3 == 1:
                        await runner.apply_entries(
                            "ws", [ApplyEntry(path=f"d/x{i}", kind="dir", mode=0o755)]
                        )
                    else:
                        await runner.move_path("ws", f"d/w{i - 2}", f"d/m{i}", False)
                    done += 1
                except (PathRefused, NotFound, InvalidInput):
                    refused += 1
        finally:
            stop.set()
            thread.join()
        assert done + refused == 150
        print(f"swap race: {done} done, {refused} refused")
        assert not list(outside.iterdir()), "something was written outside the workspace"
        entries = await runner.list_dir("ws", None, "", True, None, 1000)
        assert all(not e.path.startswith("d.tmp") or e.kind != "symlink" for e in entries.entries)
    finally:
        await runner.aclose()
        shutil.rmtree(base, ignore_errors=True)


# ---------------------------------------------------------------------- W5: retention


async def test_w5_retention_keeps_last_n_and_referenced_then_collects(yard: Yard) -> None:
    """Retention keeps each workspace's last N snapshots and every snapshot a record names (an
    execution's commit, a transfer's source, an artifact's); the rest are pruned (still listed,
    marked), then objects no retained snapshot names are deleted. Reading a pruned snapshot
    says so; a kept one reads whole."""
    plane, runner_id = yard.plane, yard.runner_id
    ex = await run(plane, "head -c 100000 /dev/urandom > exec.bin", runner_id)
    ws = ex.workspace_id
    edits = []

    async def edit(i: int) -> None:
        content = f"version {i}\n".encode() * 20_000
        edits.append(await plane.files.write("v.txt", content, workspace_id=ws))

    for i in range(3):
        await edit(i)
    _child, child_ws = await child_workspace(plane, runner_id)
    started = await plane.transfers.start(
        {"source_workspace_id": ws, "paths": ["v.txt"], "target_workspace_id": child_ws}
    )
    assert (
        await plane.transfers.wait(started.transfer_id, TransferWait(timeout_s=60))
    ).state == "completed"
    assert started.source_seq == edits[2].snapshot_seq
    for i in range(3, 6):
        await edit(i)
    referenced = {ex.snapshot_seq, edits[2].snapshot_seq}
    if runner_id == "local":  # artifacts are declared on the local runner only (T5)
        await plane.artifacts.declare("v.txt", seq=edits[1].snapshot_seq)
        referenced.add(edits[1].snapshot_seq)

    result = await plane.files.collect(keep_last=2, grace_s=0)
    assert not result.errors
    history = await plane.files.history(FileHistoryQuery(workspace_id=ws))
    kept = {s.seq for s in history.snapshots if s.retained}
    assert kept == {edits[4].snapshot_seq, edits[5].snapshot_seq} | referenced
    pruned = {s.seq: s for s in history.snapshots if not s.retained}
    assert pruned[edits[0].snapshot_seq].made_by_kind == "edit"  # listed, marked
    assert edits[3].snapshot_seq in pruned and 0 in pruned
    with pytest.raises(NotFound, match="not retained"):
        await plane.files.open("v.txt", workspace_id=ws, seq=edits[0].snapshot_seq)
    collected = result.collected[runner_id]
    assert collected.objects_removed >= 2 and collected.bytes_removed >= 2 * 200_000
    for seq in kept:  # everything retained is whole
        for entry in (await tree(plane, ws, seq)).values():
            if entry.kind == "file":
                data = await read_all(plane, entry.path, workspace_id=ws, seq=seq)
                assert hashlib.sha256(data).hexdigest() == entry.sha256
    if runner_id == "local":
        (artifact,) = await plane.artifacts.list()
        stream = await plane.artifacts.open(artifact.artifact_id)
        data = b"".join([c async for c in stream.chunks])
        assert hashlib.sha256(data).hexdigest() == artifact.sha256


async def test_w5_garbage_collection_is_safe_while_readers_and_writers_run(yard: Yard) -> None:
    """GC runs again and again (keep 1, no grace) while a writer commits new content and a
    reader reads the head: no retained snapshot ever loses an object, and a read returns the
    right bytes or says its snapshot was pruned meanwhile — never wrong bytes."""
    plane, runner_id = yard.plane, yard.runner_id
    first = await plane.files.write("f.txt", b"0" * 50_000, runner_id=runner_id)
    ws = first.workspace_id
    stop = asyncio.Event()
    reads = pruned_meanwhile = 0

    async def writer() -> None:
        for i in range(1, 25):
            await plane.files.write("f.txt", str(i).encode() * 50_000, workspace_id=ws)
            await plane.files.write(f"n{i}.txt", os.urandom(1000), workspace_id=ws)
        stop.set()

    async def reader() -> None:
        nonlocal reads, pruned_meanwhile
        while not stop.is_set():
            try:
                stream = await plane.files.open("f.txt", workspace_id=ws)
                data = b"".join([c async for c in stream.chunks])
            except NotFound as exc:
                assert "retained" in exc.message or "pruned" in exc.message, exc.message
                pruned_meanwhile += 1
                continue
            assert hashlib.sha256(data).hexdigest() == stream.entry.sha256
            reads += 1

    async def collector() -> None:
        while not stop.is_set():
            await plane.files.collect(keep_last=1, grace_s=0)
            await asyncio.sleep(0)

    await asyncio.gather(writer(), reader(), collector())
    await plane.files.collect(keep_last=1, grace_s=0)
    assert reads > 0
    history = await plane.files.history(FileHistoryQuery(workspace_id=ws))
    for s in history.snapshots:
        if not s.retained:
            continue
        for entry in (await tree(plane, ws, s.seq)).values():
            if entry.kind == "file":
                data = await read_all(plane, entry.path, workspace_id=ws, seq=s.seq)
                assert hashlib.sha256(data).hexdigest() == entry.sha256

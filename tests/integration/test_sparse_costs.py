"""What a sparse file costs the runners (R2, W3, T2–T4; docs/limits.md "Sparse files"): a
commit hashes a file's data, never its holes (content ids, runner/snapshots/contentid.py), and
a transfer between runners sends its data extents, not its holes (object packs of version 2).
Costs are counted in bytes hashed and bytes streamed, never in time."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import pytest
from files_helpers import chunks_of, read_all, run
from runner_daemon_fixture import RunnerDaemon

from conftest import Yard
from shellyard.contract.executions import ExecutionWait
from shellyard.contract.files import FileStatQuery, TransferWait
from shellyard.control.plane import ControlPlane
from shellyard.runner.protocol import SandboxPolicy
from shellyard.runner.snapshots.contentid import CHUNK, ContentId

GiB = 1 << 30
NEEDLE_AT = 40 * GiB


def _commit_stats(yard: Yard) -> Any:
    stats = yard.runner._snapshots.last_commit_stats
    assert stats is not None
    return stats


@pytest.mark.runner_kinds("local")
async def test_a_64_gib_truncate_and_two_more_commands_hash_only_data(yard_factory: Any) -> None:
    """A workspace's ``truncate -s 64G`` (the file-size limit) with a few bytes written in
    it: the commit after it and after each of the next two commands hash at most the chunk
    holding data (before: 64 GiB at the first commit and again at the next, its stat being
    racily clean, minutes of the runner's CPU each). The file reads back whole, named by
    its content id. (A quota above it: the default 10 GiB may stop the command under load,
    which is the quota's test, not this one's.)"""
    yard = await yard_factory(SandboxPolicy(workspace_quota_bytes=128 * GiB))
    made = await yard.run(
        "truncate -s 64G big && printf needle | "
        f"dd of=big bs=1 seek={NEEDLE_AT} conv=notrunc status=none",
        wait_ms=30_000,
    )
    assert made.exit_code == 0, made.stderr
    hashed = [_commit_stats(yard).bytes_hashed]
    for command in ("echo one > a", "ls -l big > b"):
        after = await yard.run(command, wait_ms=30_000)
        assert after.exit_code == 0, after.stderr
        hashed.append(_commit_stats(yard).bytes_hashed)
    assert hashed[0] <= CHUNK, hashed
    assert hashed[1] <= CHUNK + 64 and hashed[2] <= CHUNK + 256, hashed

    expected = ContentId()
    expected.zeros(NEEDLE_AT)
    expected.update(b"needle")
    expected.zeros(64 * GiB - NEEDLE_AT - 6)
    entry = await yard.plane.files.stat(FileStatQuery(path="big", workspace_id=made.workspace_id))
    assert (entry.size, entry.content_id, entry.sha256) == (64 * GiB, expected.digest().hex(), None)
    around = await read_all(
        yard.plane, "big", workspace_id=made.workspace_id, offset=NEEDLE_AT - 2, length=10
    )
    assert around == b"\0\0needle\0\0"


async def test_an_upload_answers_the_id_its_snapshot_names_the_file_by(yard: Yard) -> None:
    """W3: an upload holding a MiB of zeros after its data answers the content id the
    committed snapshot names it by (before: a plain sha256 no snapshot held)."""
    data = os.urandom(2 << 20) + bytes(2 << 20) + b"end"
    edit = await yard.plane.files.write("up.bin", chunks_of(data), runner_id=yard.runner_id)
    entry = await yard.plane.files.stat(FileStatQuery(path="up.bin", runner_id=yard.runner_id))
    assert edit.written[0].content_id == entry.content_id != hashlib.sha256(data).hexdigest()
    assert edit.written[0].sha256 is None and entry.sha256 is None
    assert await read_all(yard.plane, "up.bin", runner_id=yard.runner_id) == data


async def test_a_transfer_of_a_1_gib_sparse_file_sends_about_its_data(
    mixed: tuple[ControlPlane, RunnerDaemon],
) -> None:
    """T4: a 1 GiB file holding 3 MiB of data, local → remote: the pack streamed between the
    runners (``bytes_sent``, counted as it passes the control plane) is about its data
    (before: 1 GiB of zeros crossed), and the target's file has its bytes, its holes and
    the source's content id."""
    plane, _daemon = mixed
    local = await run(
        plane,
        "truncate -s 1G sparse && head -c 3145728 /dev/urandom | "
        "dd of=sparse bs=1M seek=700 conv=notrunc status=none",
    )
    remote = await run(plane, "true", "remote")
    started = await plane.transfers.start(
        {
            "source_workspace_id": local.workspace_id,
            "paths": ["sparse"],
            "target_workspace_id": remote.workspace_id,
        }
    )
    done = await plane.transfers.wait(started.transfer_id, TransferWait(timeout_s=300))
    assert done.state == "completed" and done.files_copied == 1, done
    assert 3 << 20 < done.bytes_sent < (3 << 20) + 4096, done.bytes_sent
    there = await plane.files.stat(FileStatQuery(path="sparse", workspace_id=remote.workspace_id))
    here = await plane.files.stat(FileStatQuery(path="sparse", workspace_id=local.workspace_id))
    assert (there.size, there.content_id) == (GiB, here.content_id)
    assert there.sha256 is None and here.sha256 is None  # the chunk-list id is marked there too
    on_disk = []
    for runner_id in ("local", "remote"):
        made = await run(plane, "stat -c %b sparse > blocks", runner_id)
        on_disk.append(int(await read_all(plane, "blocks", workspace_id=made.workspace_id)))
    assert on_disk[1] * 512 < 16 << 20, on_disk  # its holes stayed holes
    window = {"offset": (700 << 20) - 8, "length": 16}
    a = await read_all(plane, "sparse", workspace_id=local.workspace_id, **window)
    b = await read_all(plane, "sparse", workspace_id=remote.workspace_id, **window)
    assert a == b and a[:8] == bytes(8) and a[8:] != bytes(8)


MB = 1_000_000
MiB = 1 << 20
# Four files of 1 GiB, a byte at the end of each MiB: 16 MiB of blocks, 4 GiB to hash.
BYTE_PER_MIB = (
    "python3 -c 'import os\n"
    "for n in range(4):\n"
    '    fd = os.open("f%d" % n, os.O_WRONLY | os.O_CREAT, 0o644)\n'
    "    for i in range(1024):\n"
    '        os.pwrite(fd, b"x", (i + 1) * 1048576 - 1)\n'
    "    os.close(fd)\n"
    "'; echo written"
)


@pytest.mark.runner_kinds("local")
async def test_files_with_a_byte_in_every_mib_stop_at_the_quota_before_their_commit_hashes_them(
    yard_factory: Any,
) -> None:
    """R2, W3 (docs/security.md "Attack pass (session 45)", Phase 2): a command leaves 4 GiB
    to hash in 16 MiB of blocks under a 50 MB quota. Its commit stops at the workspace's
    allowance plus the documented overshoot, before reading past it (before: it hashed all
    4 GiB, and hundreds of such files fit any quota counted in blocks); the record names the
    quota and the sparse charge; nothing of it is committed; the next command deletes them
    and commits. A committed ``truncate -s 60G`` before it does not raise the budget (the
    head's measure counts apparent sizes: a budget from it would have let 60 GiB through)."""
    yard = await yard_factory(SandboxPolicy(workspace_quota_bytes=50 * MB))
    kept = await yard.run("echo kept > kept.txt; truncate -s 60G hole")
    assert kept.exit_code == 0 and kept.error is None
    started = await yard.run(BYTE_PER_MIB, wait_ms=30_000)
    attack = await yard.plane.executions.wait(started.execution_id, ExecutionWait(timeout_s=120))
    assert attack.state.terminal, attack
    record = await yard.runner.status(attack.execution_id)
    assert record.limit == "quota", record
    assert attack.error is not None
    assert "a sparse file is charged for the bytes its commit must read" in attack.error
    assert "Nothing of this command was committed" in attack.error
    stats = _commit_stats(yard)
    assert stats.budget is not None
    assert stats.bytes_hashed <= stats.budget.taken <= stats.budget.limit < 1024 * MiB
    assert attack.snapshot_seq is None or attack.snapshot_seq == kept.snapshot_seq
    head = await yard.runner.head(attack.workspace_id)
    assert await yard.runner.stat_path(attack.workspace_id, head.seq, "f0") is None
    after = await yard.run("rm f0 f1 f2 f3 hole; echo removed", wait_ms=30_000)
    assert after.exit_code == 0 and after.error is None, after
    assert await yard.read_file(after.workspace_id, after.snapshot_seq, "kept.txt") == b"kept\n"


@pytest.mark.runner_kinds("local")
async def test_a_64_gib_truncate_is_free_under_a_small_quota(yard_factory: Any) -> None:
    """R2: whole-MiB holes cost no hashing, so the quota charges nothing for them: a
    ``truncate -s 64G`` under a 50 MB quota runs past the watcher's periodic walk (10 s) and
    is committed without hashing (before: charged 64 GiB, the command was stopped)."""
    yard = await yard_factory(SandboxPolicy(workspace_quota_bytes=50 * MB))
    made = await yard.run("sleep 0.5; truncate -s 64G big; sleep 11; echo done", wait_ms=30_000)
    assert made.exit_code == 0 and made.error is None, made
    assert made.stdout == "done\n"
    assert _commit_stats(yard).bytes_hashed == 0
    entry = await yard.runner.stat_path(made.workspace_id, made.snapshot_seq, "big")
    assert entry is not None and entry.size == 64 * GiB


@pytest.mark.runner_kinds("local")
async def test_a_dense_workspace_under_its_quota_is_committed_whole(yard_factory: Any) -> None:
    """R2, W3: ordinary files under the quota: every command's commit hashes what it wrote,
    within the budget, and nothing says quota."""
    yard = await yard_factory(SandboxPolicy(workspace_quota_bytes=50 * MB))
    for name in ("a", "b"):
        done = await yard.run(f"head -c 15000000 /dev/urandom > {name}; echo ok", wait_ms=30_000)
        assert done.exit_code == 0 and done.error is None and done.stdout == "ok\n", done
        assert (await yard.runner.status(done.execution_id)).limit is None
        stats = _commit_stats(yard)
        assert stats.budget is not None and stats.bytes_hashed == 15_000_000
        entry = await yard.runner.stat_path(done.workspace_id, done.snapshot_seq, name)
        assert entry is not None and entry.size == 15_000_000

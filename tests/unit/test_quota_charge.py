"""The quota's charge for a file is what its commit must hash (R2; docs/limits.md "Sparse
files"), and a command's commit stops at its budget before reading past it.

Real files on the test's filesystem (ext4/xfs/tmpfs all report holes with SEEK_HOLE) and a
real snapshot store; nothing mocked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shellyard.runner import workspace_paths
from shellyard.runner.limits import quota
from shellyard.runner.snapshots.budget import HashBudget, HashBudgetExceeded
from shellyard.runner.snapshots.store import SnapshotStore

MIB = 1 << 20
GIB = 1 << 30


def _byte_per_mib(path: Path, mibs: int, hole_mibs: int = 0) -> None:
    """``hole_mibs`` whole MiB of hole, then ``mibs`` MiB each with one byte at its end: the
    attack's shape (a 4 KiB block per MiB, each MiB hashed whole)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(hole_mibs, hole_mibs + mibs):
            os.pwrite(fd, b"x", (i + 1) * MIB - 1)
    finally:
        os.close(fd)


def _charge(path: Path) -> int:
    return quota.file_charge(str(path), os.lstat(path))


def test_a_64_gib_truncate_is_charged_nothing(tmp_path: Path) -> None:
    """R2: whole-MiB holes cost a commit nothing (content ids), so the quota charges nothing
    for them (before: the apparent size, 64 GiB)."""
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(64 * GIB)
    assert _charge(big) == 0
    assert quota.tree_usage(tmp_path)[0] < MIB  # the folder's blocks only


def test_a_byte_in_every_mib_is_charged_every_mib(tmp_path: Path) -> None:
    """R2: the attack's shape: 32 KiB-ish of blocks, charged its 64 MiB (each MiB is hashed
    whole); after 64 MiB of hole, only the MiB holding data are charged."""
    dense_tail = tmp_path / "a"
    _byte_per_mib(dense_tail, 64)
    assert os.stat(dense_tail).st_blocks * 512 < 64 * MIB // 16
    assert _charge(dense_tail) == 64 * MIB
    after_hole = tmp_path / "b"
    _byte_per_mib(after_hole, 8, hole_mibs=64)
    assert _charge(after_hole) == 8 * MIB  # before: 72 MiB (its apparent size)


def test_an_ordinary_file_is_charged_its_blocks(tmp_path: Path) -> None:
    """R2: a dense file (no hole) is charged as before, without being opened."""
    dense = tmp_path / "dense"
    dense.write_bytes(os.urandom(3 * MIB + 5))
    st = os.stat(dense)
    assert _charge(dense) == max(st.st_size, st.st_blocks * 512)


@pytest.mark.parametrize(
    "shape",
    [
        "truncate",  # no data at all
        "byte_per_mib",  # each MiB holds data
        "hole_then_data",  # whole holes, then data
        "half_mib_hole",  # a hole that covers no whole aligned MiB: plain sha256
        "fragments",  # a byte every 8 KiB for 3 MiB, 4 MiB of hole, a byte, a tail hole
    ],
)
def test_the_charge_is_what_the_commit_hashes(tmp_path: Path, shape: str) -> None:
    """R2, W3: the charge (``hash_cost``) equals the bytes the commit runs through SHA-256,
    measured by the real commit (``CommitStats.bytes_hashed``)."""
    tree = tmp_path / "tree"
    tree.mkdir()
    path = tree / "f"
    if shape == "truncate":
        with open(path, "wb") as f:
            f.truncate(16 * MIB)
    elif shape == "byte_per_mib":
        _byte_per_mib(path, 16)
    elif shape == "hole_then_data":
        _byte_per_mib(path, 3, hole_mibs=5)
    elif shape == "fragments":
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        for offset in range(0, 3 * MIB, 8192):
            os.pwrite(fd, b"f", offset + 100)
        os.pwrite(fd, b"g", 7 * MIB + 5)
        os.ftruncate(fd, 11 * MIB + 77)
        os.close(fd)
    else:
        with open(path, "wb") as f:
            f.write(b"a" * (MIB // 4))
            f.seek(MIB + MIB // 2)
            f.write(b"b")
    fd = os.open(path, os.O_RDONLY)
    try:
        cost = workspace_paths.hash_cost(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    store = SnapshotStore(tmp_path / "store")
    store.ensure_workspace("w")
    store.commit("w", tree)
    assert store.last_commit_stats is not None
    assert store.last_commit_stats.bytes_hashed == cost


def test_a_commit_stops_at_its_budget_before_reading_past_it(tmp_path: Path) -> None:
    """R2, W3: eight files of 64 MiB with a byte in every MiB (2 MiB of disk in all) under a
    100 MiB budget: the commit hashes at most the budget and stops with the numbers; the
    head stays what it was. The same tree with the budget raised commits."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for i in range(8):
        _byte_per_mib(tree / f"f{i}", 64)
    store = SnapshotStore(tmp_path / "store")
    head = store.ensure_workspace("w")
    budget = HashBudget(100 * MIB)
    with pytest.raises(HashBudgetExceeded) as refused:
        store.commit("w", tree, budget=budget)
    assert refused.value.limit == 100 * MIB and refused.value.needed > 100 * MIB
    stats = store.last_commit_stats
    assert stats is not None and stats.bytes_hashed <= budget.taken <= 100 * MIB
    assert store.head("w").seq == head.seq
    done = store.commit("w", tree, budget=HashBudget(8 * 64 * MIB))
    assert done.seq == head.seq + 1 and done.files == 8

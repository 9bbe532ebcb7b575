"""The free-space reserve (R2; docs/limits.md): below it, new executions and writer
operations are refused so the runner's store (and a control plane's database on the same
volume) never hits ENOSPC because of a workspace. One ``statvfs`` per check (~7 µs here).

The reserve is kept in files (inodes) too: on a volume with a fixed inode table (ext4, a
tmpfs with ``nr_inodes``) a command making empty files takes no bytes but can take every
inode, and then nothing on the volume can make a file (a new workspace, an execution's
folder, the snapshot commit's objects), with gigabytes free."""

from __future__ import annotations

import os
from pathlib import Path

from shellyard.errors import LowOnSpace
from shellyard.runner.limits.settings import format_size
from shellyard.runner.protocol import SandboxPolicy

#: The reserve's floor when it is a percentage (the issue's "larger of 2 GiB and 5%").
RESERVE_FLOOR = 2 << 30
#: The inode reserve's floor (the percentage applies to the volume's inodes too), and its
#: ceiling as a share of them: a small volume keeps at most a tenth of its inodes back.
INODE_RESERVE_FLOOR = 1024
INODE_RESERVE_MAX_SHARE = 10


def volume(root: Path) -> tuple[int, int]:
    """(free bytes an unprivileged writer can use, total bytes) of the volume of ``root``."""
    return volume_of(os.statvfs(root))


def volume_of(st: os.statvfs_result) -> tuple[int, int]:
    """``volume`` from a ``statvfs`` already read: a check that wants bytes and inodes (or
    the bytes in use too) reads the volume once, not once for each (docs/benchmarks.md §72)."""
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def used_bytes(root: Path) -> int:
    """Bytes in use on the volume (what every writer on it together has allocated)."""
    return used_of(os.statvfs(root))


def used_of(st: os.statvfs_result) -> int:
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def reserve_bytes(policy: SandboxPolicy, total: int) -> int:
    if policy.free_space_reserve_bytes is not None:
        return policy.free_space_reserve_bytes
    return max(RESERVE_FLOOR, int(total * policy.free_space_reserve_percent / 100))


def inodes(root: Path) -> tuple[int, int]:
    """(free inodes an unprivileged writer can use, total inodes) of the volume of ``root``;
    (0, 0) on a file system without a fixed inode table (btrfs, a tmpfs without a bound)."""
    return inodes_of(os.statvfs(root))


def inodes_of(st: os.statvfs_result) -> tuple[int, int]:
    return st.f_favail, st.f_files


def inode_reserve(policy: SandboxPolicy, total_inodes: int) -> int:
    """Inodes kept free: the byte reserve's percentage of the volume's inodes, at least
    ``INODE_RESERVE_FLOOR``, at most a tenth of them; none when the byte reserve is off."""
    if total_inodes <= 0 or policy.free_space_reserve_bytes == 0:
        return 0
    if policy.free_space_reserve_percent <= 0 and policy.free_space_reserve_bytes is None:
        return 0
    share = int(total_inodes * policy.free_space_reserve_percent / 100)
    return min(total_inodes // INODE_RESERVE_MAX_SHARE, max(INODE_RESERVE_FLOOR, share))


def require_room(root: Path, policy: SandboxPolicy, what: str) -> None:
    """Raise LowOnSpace when the volume's free space, or its free inodes, are below the
    reserve."""
    st = os.statvfs(root)  # one reading for both reserves: every execution's start
    free_inodes, total_inodes = inodes_of(st)
    kept = inode_reserve(policy, total_inodes)
    if free_inodes < kept:
        raise LowOnSpace(
            f"{what} refused: the runner's volume has {free_inodes} files (inodes) free, "
            f"below its reserve of {kept}; retry later, once files are deleted (a workspace "
            f"with many small files: delete or archive them into one tar)",
            free_inodes=free_inodes,
            reserve_inodes=kept,
        )
    free, total = volume_of(st)
    reserve = reserve_bytes(policy, total)
    if free < reserve:
        raise LowOnSpace(
            f"{what} refused: the runner's volume has {format_size(free)} free, below its "
            f"reserve of {format_size(reserve)}; retry later, once space is freed (delete "
            f"files in a workspace, prune snapshots, or raise the volume's size)",
            free_bytes=free,
            reserve_bytes=reserve,
        )

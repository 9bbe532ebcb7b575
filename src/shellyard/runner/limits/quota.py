"""How much of the volume one workspace's live tree holds (the quota's measure, R2).

Each file counts the larger of its allocated blocks and the bytes its commit must hash: its
blocks, because ``fallocate`` with KEEP_SIZE takes space without growing the size; what its
commit hashes (``workspace_paths.hash_cost``: the size less each whole MiB a hole covers),
because a file with one byte in every MiB takes a 4 KiB block per MiB and costs its commit
the whole MiB, so blocks alone would let a workspace within its quota cost every commit
hours of hashing. A file without holes, or under a MiB, is not opened; one with holes is,
and its whole-MiB holes found with ``SEEK_DATA`` (one ``lseek`` per MiB holding data at
most). Folders and links count their blocks; a file with several hard links counts once.
Links are never followed, mount points never crossed (the tree is the workspace only)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from shellyard.runner import workspace_paths

_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def tree_usage(root: Path) -> tuple[int, int]:
    """(bytes, entries) below ``root``; entries that vanish or cannot be read are skipped."""
    total = 0
    entries = 0
    seen: set[int] = set()
    try:
        device = os.lstat(root).st_dev
    except OSError:
        return 0, 0
    stack = [str(root)]
    while stack:
        folder = stack.pop()
        try:
            scan = os.scandir(folder)
        except OSError:
            continue
        with scan:
            for entry in scan:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                entries += 1
                blocks = st.st_blocks * 512
                if stat.S_ISREG(st.st_mode):
                    if st.st_nlink > 1:
                        if st.st_ino in seen:
                            continue
                        seen.add(st.st_ino)
                    size = st.st_size
                    # no open for a file without holes, nor one under a MiB (no whole
                    # MiB can be a hole: its commit hashes its size)
                    if blocks >= size or size < workspace_paths.HOLE_CHUNK:
                        total += max(size, blocks)
                    else:
                        total += file_charge(entry.path, st)
                elif stat.S_ISDIR(st.st_mode):
                    total += blocks
                    if st.st_dev == device:
                        stack.append(entry.path)
                else:
                    total += blocks
    return total, entries


def file_charge(path: str, st: os.stat_result) -> int:
    """A regular file's charge: the larger of its blocks and what its commit hashes. One
    that cannot be opened (gone, swapped) counts its size, the most its commit can hash."""
    blocks = st.st_blocks * 512
    if not workspace_paths.has_holes(st) or st.st_size < workspace_paths.HOLE_CHUNK:
        return max(st.st_size, blocks)
    try:
        fd = os.open(path, _OPEN)
    except OSError:
        return st.st_size
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or now.st_ino != st.st_ino:
            return st.st_size
        return max(blocks, workspace_paths.hash_cost(fd, now.st_size))
    except OSError:
        return st.st_size
    finally:
        os.close(fd)

"""How much of the volume one workspace's live tree holds (the quota's measure, R2).

Each file counts the larger of its size and its allocated blocks: its size, because the
snapshot commit copies that many bytes into the store (a sparse 1 TiB file would otherwise
pass a quota and then fill the disk at commit); its blocks, because ``fallocate`` with
KEEP_SIZE takes space without growing the size. Folders and links count their blocks; a
file with several hard links counts once. Links are never followed, mount points never
crossed (the tree is the workspace only)."""

from __future__ import annotations

import os
import stat
from pathlib import Path


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
                    total += max(st.st_size, blocks)
                elif stat.S_ISDIR(st.st_mode):
                    total += blocks
                    if st.st_dev == device:
                        stack.append(entry.path)
                else:
                    total += blocks
    return total, entries

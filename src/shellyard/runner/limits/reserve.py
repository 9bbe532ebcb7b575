"""The free-space reserve (R2; docs/limits.md): below it, new executions and writer
operations are refused so the runner's store (and a control plane's database on the same
volume) never hits ENOSPC because of a workspace. One ``statvfs`` per check (~7 µs here)."""

from __future__ import annotations

import os
from pathlib import Path

from shellyard.errors import LowOnSpace
from shellyard.runner.limits.settings import format_size
from shellyard.runner.protocol import SandboxPolicy

#: The reserve's floor when it is a percentage (the issue's "larger of 2 GiB and 5%").
RESERVE_FLOOR = 2 << 30


def volume(root: Path) -> tuple[int, int]:
    """(free bytes an unprivileged writer can use, total bytes) of the volume of ``root``."""
    st = os.statvfs(root)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def used_bytes(root: Path) -> int:
    """Bytes in use on the volume (what every writer on it together has allocated)."""
    st = os.statvfs(root)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def reserve_bytes(policy: SandboxPolicy, total: int) -> int:
    if policy.free_space_reserve_bytes is not None:
        return policy.free_space_reserve_bytes
    return max(RESERVE_FLOOR, int(total * policy.free_space_reserve_percent / 100))


def require_room(root: Path, policy: SandboxPolicy, what: str) -> None:
    """Raise LowOnSpace when the volume's free space is below the reserve."""
    free, total = volume(root)
    reserve = reserve_bytes(policy, total)
    if free < reserve:
        raise LowOnSpace(
            f"{what} refused: the runner's volume has {format_size(free)} free, below its "
            f"reserve of {format_size(reserve)}; retry later, once space is freed (delete "
            f"files in a workspace, prune snapshots, or raise the volume's size)",
            free_bytes=free,
            reserve_bytes=reserve,
        )

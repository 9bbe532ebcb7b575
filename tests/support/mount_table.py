"""Reading a mount table (``/proc/<pid>/mountinfo``) the way the detach tests compare them:
mount points as the kernel spells them (field 5, escapes kept: ``\\040`` for a space), so a
test of odd names compares spelling with spelling."""

from __future__ import annotations

from pathlib import Path


def points_below(table: str, below: str | Path) -> set[str]:
    """The mount points of ``table`` strictly below ``below`` (mountinfo field 5)."""
    prefix = f"{below}/"
    return {
        fields[4]
        for fields in (line.split(" ") for line in table.splitlines())
        if len(fields) > 4 and fields[4].startswith(prefix)
    }


def host_points_below(below: str | Path) -> set[str]:
    """``points_below`` of this process's own table (the host's, for a test run as root)."""
    return points_below(Path("/proc/self/mountinfo").read_text(), below)

"""Mounts a test's home is left with (test hygiene, not the product's behaviour): a runner or
``serve`` killed with SIGKILL keeps its workspaces' overlays, the egress tmpfs and the network
namespaces' files mounted until its next start adopts or unmounts them (E11,
docs/security.md "Lifetime"). A test that never starts it again left them on the host for
good, where bwrap copies every one into each later sandbox of the suite (docs/benchmarks.md
§22). Homes are removed through this, after the test."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

_ESCAPED = re.compile(r"\\([0-7]{3})")


def mounts_below(root: Path) -> list[str]:
    """The mount points at or below ``root``, deepest first (mountinfo field 5)."""
    top = str(root).rstrip("/")
    found: list[str] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = _ESCAPED.sub(lambda m: chr(int(m.group(1), 8)), line.split()[4])
        if point == top or point.startswith(top + "/"):
            found.append(point)
    return sorted(found, key=len, reverse=True)


def remove_home(root: Path) -> None:
    """Detach what is still mounted below ``root`` (as root; elsewhere nothing is), then
    remove it."""
    for point in mounts_below(root):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    shutil.rmtree(root, ignore_errors=True)

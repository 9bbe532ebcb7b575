"""Where this process's cgroups are on the host, and the memory it may use (R2; docs/limits.md
"Tenants"): read from ``/proc/self/cgroup`` and ``/proc/self/mountinfo``, for cgroups.py's
probe and the default memory limit per execution.
"""

from __future__ import annotations

import os
from pathlib import Path

from shellyard.runner.limits.cgroup_files import read as _read

V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")


def own_groups() -> dict[str, str]:
    """Controller (or ``""`` for the unified hierarchy) → this process's group path."""
    found: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for name in controllers.split(",") if controllers else [""]:
            found[name] = path
    return found


def mounts() -> dict[str, tuple[str, str]]:
    """Controller (``""``: cgroup2) → (mount point, root of the mount) from mountinfo."""
    found: dict[str, tuple[str, str]] = {}
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        fstype, options = tail[0], tail[2].split(",")
        if fstype == "cgroup2":
            found.setdefault("", (fields[4], fields[3]))
        elif fstype == "cgroup":
            for option in options:
                if option in V1_CONTROLLERS:
                    found.setdefault(option, (fields[4], fields[3]))
    return found


def group_folder(mount: tuple[str, str], path: str) -> Path:
    point, root = mount
    relative = path[len(root) :] if root != "/" and path.startswith(root) else path
    return Path(point + "/" + relative.strip("/")) if relative.strip("/") else Path(point)


def host_memory_bytes() -> int:
    """The host's RAM, or the runner's own memory cgroup limit when that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    own, mounted = own_groups(), mounts()
    candidates = [total]
    if "memory" in own and "memory" in mounted:
        raw = _read(group_folder(mounted["memory"], own["memory"]) / "memory.limit_in_bytes")
        if raw and raw.strip().isdigit():
            candidates.append(int(raw))
    if "" in own and "" in mounted:
        raw = _read(group_folder(mounted[""], own[""]) / "memory.max")
        if raw and raw.strip().isdigit():
            candidates.append(int(raw))
    return min(candidates)


def default_memory_bytes() -> int:
    """Per execution when ``SHELLYARD_MEMORY_LIMIT`` is unset: half the host's RAM (or of
    the runner's own memory limit), so one command cannot take the host (docs/limits.md)."""
    return (host_memory_bytes() // 2) >> 20 << 20  # whole MiB: the kernel keeps pages

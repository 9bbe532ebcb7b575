"""What an execution's groups say at its end (R2; docs/limits.md "Tenants"): peak memory, CPU
seconds, and whether the memory limit or the process limit ended it, read from either backend
of cgroups.py. A group used again (recycle.py) counts from its reset: v2's CPU as a delta from
``cpu_base``, its peak through the descriptor ``peak_fd`` it was reset through.

Read at every execution's end on the event loop's thread: the files are named by f-strings
(``<base>/<workspace>/<execution>/<file>``; both ids are checked names, so the same path a
``Path`` join gives) and not ``Path`` joins, half a dozen per end (docs/benchmarks.md §72).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shellyard.runner.limits import recycle
from shellyard.runner.limits.cgroup_files import keyed as _keyed
from shellyard.runner.limits.cgroup_files import read as _read


@dataclass
class Usage:
    """What an execution's groups say at its end."""

    peak_memory_bytes: int | None = None
    cpu_seconds: float | None = None
    #: The memory limit's OOM killer ended a process of it.
    memory_killed: bool = False
    #: A fork of the workspace failed at its process limit while it ran.
    processes_hit: bool = False


def _pids_max_events(
    v2: bool,
    bases: dict[str, Path],
    controllers: tuple[str, ...],
    workspace_id: str,
    execution_id: str,
    seen: recycle.Seen | None = None,
) -> int:
    """Forks refused at the process limit, counted where they were tried: v1's
    ``pids.events`` and v2's ``pids.events.local`` of the execution's group."""
    if v2:
        if "pids" not in controllers:
            return 0
        folder = f"{bases['']}/{workspace_id}/{execution_id}"
        local = _read(f"{folder}/pids.events.local")
        return _keyed(local if local is not None else _read(f"{folder}/pids.events"), "max")
    base = bases.get("pids")
    if base is None:
        return 0
    events = _read(f"{base}/{workspace_id}/{execution_id}/pids.events")
    if seen is not None:
        seen["pids.events"] = events
    return _keyed(events, "max")


def read(
    v2: bool,
    bases: dict[str, Path],
    controllers: tuple[str, ...],
    workspace_id: str,
    execution_id: str,
    *,
    cpu_base: int = 0,
    peak_fd: int | None = None,
    seen: recycle.Seen | None = None,
) -> Usage:
    """Peak memory, CPU seconds and what ended it, read from the execution's groups.
    ``seen`` (v1): given the raw ``memory.oom_control`` and ``pids.events`` read, for the
    reset that may follow (recycle.py ``v1_reset``) to check without reading them again."""
    usage = Usage()
    if v2:
        folder = f"{bases['']}/{workspace_id}/{execution_id}"
        cpu_stat = _read(f"{folder}/cpu.stat")  # None: no such group (nothing to count)
        if cpu_stat is not None:
            usage.cpu_seconds = (_keyed(cpu_stat, "usage_usec") - cpu_base) / 1e6
        if "memory" in controllers:
            if peak_fd is not None:  # used again: the peak since its reset (recycle.py)
                usage.peak_memory_bytes = recycle.peak_through(peak_fd)
            else:
                peak = _read(f"{folder}/memory.peak")
                usage.peak_memory_bytes = int(peak) if peak and peak.strip().isdigit() else None
            usage.memory_killed = _keyed(_read(f"{folder}/memory.events"), "oom_kill") > 0
    else:
        memory = f"{bases['memory']}/{workspace_id}/{execution_id}"
        peak = _read(f"{memory}/memory.max_usage_in_bytes")
        usage.peak_memory_bytes = int(peak) if peak and peak.strip().isdigit() else None
        control = _read(f"{memory}/memory.oom_control")
        if seen is not None:
            seen["memory.oom_control"] = control
        # oom_kill counts the kills (kernels ≥ 4.13); an older one only has failcnt.
        if control is not None and "oom_kill " in control:
            usage.memory_killed = _keyed(control, "oom_kill") > 0
        else:
            failcnt = _read(f"{memory}/memory.failcnt")
            usage.memory_killed = bool(failcnt and failcnt.strip() not in ("", "0"))
        accounting = bases.get("cpuacct", bases.get("cpu"))
        if accounting is not None:
            raw = _read(f"{accounting}/{workspace_id}/{execution_id}/cpuacct.usage")
            if raw and raw.strip().isdigit():
                usage.cpu_seconds = int(raw) / 1e9
    hit = _pids_max_events(v2, bases, controllers, workspace_id, execution_id, seen)
    usage.processes_hit = hit > 0
    return usage

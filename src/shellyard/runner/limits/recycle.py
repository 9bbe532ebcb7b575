"""An ended execution's groups used again by its workspace (R2; docs/limits.md "Tenants",
"Groups used again").

Removing an execution's groups and making new ones for the next cost each execution three
``rmdir`` and three ``mkdir`` with their limit writes (each waits on the kernel's
``cgroup_mutex``; a memory group's removal also leaves the kernel work on its workqueues),
measured the largest part of what tenants-on cost per run (docs/benchmarks.md §39). So an
execution's groups, once nothing of it is left in them, go back to its workspace's pool
(ready_groups.py ``take_ready``) with their limits still written and their counters reset: v1
``memory.max_usage_in_bytes`` and ``cpuacct.usage`` reset by a write of 0; v2 has neither,
so ``memory.peak`` is reset through a descriptor kept open (per-descriptor reset, Linux 6.12)
and the CPU is read as a delta of ``cpu.stat usage_usec``.

A group is used again only while its counters can start clean: not after an OOM kill or a
refused fork in it (those counts cannot be reset), nor while more than ``LEFTOVER_BYTES`` stay
charged to it once its processes are gone (page cache of files the command wrote: the next
command's peak would start there). Such a group is removed and a fresh one made, as before.

A group's folder is a ``str`` or a ``Path``: on the event loop's thread (``v1_group_reset``,
at every v1 execution's end) its files are named by f-strings, not ``Path`` joins
(docs/benchmarks.md §72); the ids in them are checked names, so the paths are the same.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from shellyard.paths import StrPath
from shellyard.runner.limits.cgroup_files import keyed, read, write

log = logging.getLogger(__name__)

#: What may stay charged to a group used again: its next command's peak may include this much
#: of earlier commands' (kernel objects, page cache they read first). Measured on v1 after a
#: command in a sandbox, the page cache warm: 0.59–0.96 MiB, 0.29–0.48 MiB of it kernel
#: objects; 1.07–1.29 MiB on a loaded machine or after a cache drop (2 MiB first reading
#: Python's files): 1 MiB turned most groups away there (docs/limits.md "Groups used again").
#: It also creeps with a group's uses (kernel objects of earlier sandboxes; likely also the
#: per-CPU charge batch a group keeps while no other group charges on that CPU): one agent's
#: ``true``, 0.8 MiB on average over a group's first 100 uses, 1.6 MiB over its fifth hundred,
#: so this bound is also how long a group lives: ~500 uses at 2 MiB; at 1 MiB 7 % of one
#: agent's spawns got a fresh group, at 2 MiB 0.3 % (docs/benchmarks.md §69).
LEFTOVER_BYTES = 2 << 20
#: How long the pool waits for an ended execution's last processes (the sandbox's init still
#: exiting) before it gives the group up to removal, which ends them.
SETTLE_S = 0.5


def settled(folder: StrPath, v2: bool) -> bool:
    """No live process left in the group (v1: its ``pids`` folder; v2: its one folder)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        # Not v1's pids.current: an exited process not yet reaped (the sandbox's init,
        # reparented) stays counted there, though it holds no memory and runs no more.
        raw = read(f"{folder}/{'cgroup.events' if v2 else 'cgroup.procs'}")
        if raw is None:  # never made, or gone
            return False
        empty = keyed(raw, "populated") == 0 if v2 else not raw.strip()
        if empty:
            return True
        if time.monotonic() > deadline:
            log.info("not using %s again: processes still in it after %.1f s", folder, SETTLE_S)
            return False
        time.sleep(0.001)


def _not_again(folder: StrPath, reason: str) -> None:
    """Why a group is removed instead of used again: told, since a workspace whose groups
    never come back pays the fresh groups' cost on every command (docs/limits.md)."""
    log.info("not using %s again: %s", folder, reason)


def _number(path: StrPath) -> int | None:
    raw = (read(path) or "").strip()
    return int(raw) if raw.isdigit() else None


#: What an end's read of a group's use already holds, by file name (group_usage.py ``read``'s
#: ``seen``): the reset's checks take it instead of reading the same file again.
Seen = dict[str, str | None]


def _seen_or_read(seen: Seen | None, folder: StrPath, name: str) -> str | None:
    if seen is not None and name in seen:
        return seen[name]
    return read(f"{folder}/{name}")


def v1_reset(
    memory: StrPath, pids: StrPath, accounting: StrPath | None, seen: Seen | None = None
) -> bool:
    """Counters to zero; False: the group cannot start clean (remove it). ``seen``: the
    ``memory.oom_control`` and ``pids.events`` an end read once the group was empty
    (cgroups.py ``finish``), taken instead of two more reads (docs/benchmarks.md §75)."""
    control = _seen_or_read(seen, memory, "memory.oom_control")
    # Without the ``oom_kill`` line (a kernel before 4.13) the end is told by ``failcnt``,
    # which a limit's reclaim raises without a kill: such groups are never used again.
    if control is None or "oom_kill " not in control or keyed(control, "oom_kill"):
        _not_again(memory, "an OOM kill in it (or no oom_kill count)")
        return False
    if keyed(_seen_or_read(seen, pids, "pids.events"), "max"):
        _not_again(memory, "a fork refused in it")
        return False
    usage = _number(f"{memory}/memory.usage_in_bytes")
    if usage is None or usage > LEFTOVER_BYTES:
        _not_again(memory, f"{usage} bytes still charged to it")
        return False
    write(f"{memory}/memory.max_usage_in_bytes", "0")  # the peak starts again from usage
    if accounting is not None:
        write(f"{accounting}/cpuacct.usage", "0")
    return True


def v1_group_reset(
    bases: dict[str, Path], workspace_id: str, name: str, seen: Seen | None = None
) -> bool:
    """``v1_reset`` of the group ``<workspace_id>/<name>`` in the v1 hierarchies ``bases``."""
    accounting = bases.get("cpuacct", bases.get("cpu"))
    return v1_reset(
        f"{bases['memory']}/{workspace_id}/{name}",
        f"{bases['pids']}/{workspace_id}/{name}",
        None if accounting is None else f"{accounting}/{workspace_id}/{name}",
        seen,
    )


def reset(
    v2: bool, bases: dict[str, Path], controllers: tuple[str, ...], workspace_id: str, name: str
) -> tuple[int, int | None] | None:
    """The group's counters back to zero once nothing is left in it: v2, as ``v2_reset``;
    v1, ``(0, None)``; None: not used again."""
    if v2:
        folder = f"{bases['']}/{workspace_id}/{name}"
        if not settled(folder, v2=True):
            return None
        return v2_reset(folder, controllers)
    if not settled(f"{bases['pids']}/{workspace_id}/{name}", v2=False):
        return None
    return (0, None) if v1_group_reset(bases, workspace_id, name) else None


def v2_reset(folder: StrPath, controllers: tuple[str, ...]) -> tuple[int, int | None] | None:
    """(CPU µs so far, a descriptor of ``memory.peak`` reset through it), or None: the group
    cannot start clean (remove it)."""
    if "memory" in controllers:
        if keyed(read(f"{folder}/memory.events"), "oom_kill"):
            _not_again(folder, "an OOM kill in it")
            return None
        usage = _number(f"{folder}/memory.current")
        if usage is None or usage > LEFTOVER_BYTES:
            _not_again(folder, f"{usage} bytes still charged to it")
            return None
    if "pids" in controllers:
        local = read(f"{folder}/pids.events.local")
        if keyed(local if local is not None else read(f"{folder}/pids.events"), "max"):
            _not_again(folder, "a fork refused in it")
            return None
    cpu = keyed(read(f"{folder}/cpu.stat"), "usage_usec")
    if "memory" not in controllers:
        return cpu, None
    try:
        fd = os.open(f"{folder}/memory.peak", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        os.write(fd, b"reset")  # refused before Linux 6.12: not used again
    except OSError:
        os.close(fd)
        return None
    return cpu, fd


def peak_through(fd: int) -> int | None:
    """``memory.peak`` as the descriptor that reset it sees it."""
    try:
        raw = os.pread(fd, 64, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(raw) if raw.isdigit() else None

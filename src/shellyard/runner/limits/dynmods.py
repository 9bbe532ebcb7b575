"""The kernel's ``favordynmods`` for a runner that moves every execution into cgroups of its own
(R2 tenants; docs/limits.md "Moving into a group under load").

Every write to a ``cgroup.procs`` file takes the kernel's threadgroup lock for writing. By
default that lock is one per-CPU rwsem for the whole host, which every ``fork``, ``exit`` and
``exec`` anywhere takes for reading: a launcher joining its groups waits for an RCU grace
period and for every fork in flight, and every ``mkdir``/``rmdir`` of a group waits behind it on
``cgroup_mutex``. Under fork load that made 16 agents with tenants on 0.50–0.78× as fast as with
them off (docs/benchmarks.md §25). A hierarchy mounted with ``favordynmods`` switches the
kernel to the slow-reader mode (Linux 6.0) and, from Linux 6.18, to a lock per thread group:
a join then waits only for forks of the process that joins (measured: docs/benchmarks.md §31).

The switch is host-wide, so it is the operator's (``SHELLYARD_CGROUP_FAVORDYNMODS``, on by
default for a root runner using cgroups). It is made without any mount point: a v1 hierarchy
with no controller and a name of its own, created detached (``fsopen``/``fsmount``) and held by
one descriptor for the runner's life. Nothing appears in any mount table; the name shows as
one line of ``/proc/<pid>/cgroup`` while the descriptor is open. From Linux 6.18 the kernel
keeps the per-thread-group lock until reboot once it was on (it logs that it cannot be turned
off); before 6.18 closing the descriptor turns the mode off again.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

#: The name of the runner's empty hierarchy (the same for every runner on the host: a second
#: runner's create finds the first one's root and shares it).
HIERARCHY_NAME = b"shellyard-favordynmods"

# The unified syscall table (every architecture but alpha), Linux 5.2.
_SYS_FSOPEN = 430
_SYS_FSCONFIG = 431
_SYS_FSMOUNT = 432
_FSOPEN_CLOEXEC = 0x1
_FSMOUNT_CLOEXEC = 0x1
_FSCONFIG_SET_FLAG = 0
_FSCONFIG_SET_STRING = 1
_FSCONFIG_CMD_CREATE = 6

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.syscall.restype = ctypes.c_long


def favor_dynamic_changes() -> int | None:
    """The descriptor that keeps ``favordynmods`` on (close it at the runner's stop), or None
    where the kernel refuses (not root in the host's namespaces, no cgroup v1, before 6.0)."""
    context = _libc.syscall(
        ctypes.c_long(_SYS_FSOPEN), ctypes.c_char_p(b"cgroup"), ctypes.c_uint(_FSOPEN_CLOEXEC)
    )
    if context < 0:
        _refused("fsopen", ctypes.get_errno())
        return None
    try:
        for command, key, value in (
            (_FSCONFIG_SET_FLAG, b"none", None),  # no controller: it limits nothing
            (_FSCONFIG_SET_STRING, b"name", HIERARCHY_NAME),
            (_FSCONFIG_SET_FLAG, b"favordynmods", None),
            (_FSCONFIG_CMD_CREATE, None, None),
        ):
            done = _libc.syscall(
                ctypes.c_long(_SYS_FSCONFIG),
                ctypes.c_int(context),
                ctypes.c_uint(command),
                ctypes.c_char_p(key),
                ctypes.c_char_p(value),
                ctypes.c_int(0),
            )
            if done < 0:
                _refused(f"fsconfig {(key or b'create').decode()}", ctypes.get_errno())
                return None
        mounted = _libc.syscall(
            ctypes.c_long(_SYS_FSMOUNT),
            ctypes.c_int(context),
            ctypes.c_uint(_FSMOUNT_CLOEXEC),
            ctypes.c_uint(0),
        )
        if mounted < 0:
            _refused("fsmount", ctypes.get_errno())
            return None
        return int(mounted)
    finally:
        os.close(context)


def _refused(step: str, code: int) -> None:
    log.info(
        "cgroup favordynmods not available (%s: %s): joining a group waits on the host's "
        'threadgroup lock under fork load (docs/limits.md "Moving into a group under load")',
        step,
        os.strerror(code),
    )

"""The seccomp filter every execution runs under (docs/security.md, "System calls").

Built once per runner with libseccomp (``pyseccomp``: ctypes over the system's libseccomp2),
exported as BPF to a file, and handed to bwrap with ``--seccomp FD`` on each spawn (a fresh
descriptor each time: bwrap reads it to the end). The default is to allow; the listed calls
fail with EPERM (``clone3`` with ENOSYS, since its flags live in memory a filter cannot read,
and glibc then falls back to ``clone``, whose flags it can). A system call of another
architecture (32-bit or x32 on x86_64) kills the process: the rules are written for the
native one only, so anything else is refused rather than let through unfiltered.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from shellyard.errors import SandboxUnavailable
from shellyard.runner.policy import SECCOMP_PROFILE

#: Docker's default profile denies these (by leaving them out of its allow-list), plus the
#: kernel's widest surfaces Docker still allows: io_uring, the new mount API, userfaultfd.
DENIED = (
    # kernel keyrings: shared kernel state, a long record of bugs
    "add_key",
    "keyctl",
    "request_key",
    # eBPF, perf: the JIT and kernel memory introspection
    "bpf",
    "perf_event_open",
    # io_uring: a second system-call interface seccomp cannot see into
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "userfaultfd",
    # kernel code and the machine itself
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "get_kernel_syms",
    "query_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "syslog",
    "vhangup",
    "iopl",
    "ioperm",
    "uselib",
    "nfsservctl",
    "_sysctl",
    "sysfs",
    "ustat",
    "lookup_dcookie",
    "quotactl",
    "quotactl_fd",
    # mounts: the sandbox's view of the host is fixed by bwrap before the command starts
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "chroot",
    # the clock is the host's
    "clock_settime",
    "clock_adjtime",
    "settimeofday",
    "stime",
    "adjtimex",
    # file handles bypass path checks (the "shocker" escape)
    "open_by_handle_at",
    "name_to_handle_at",
    # namespaces: no nested sandbox, no new user namespace to regain capabilities
    "unshare",
    "setns",
    # NUMA policy and cross-process comparison
    "mbind",
    "set_mempolicy",
    "move_pages",
    "migrate_pages",
    "kcmp",
    "pidfd_getfd",
    "process_madvise",
    "vm86",
    "vm86old",
)

#: ``clone`` flags that make a namespace (CLONE_NEWNS … CLONE_NEWNET, CLONE_NEWTIME).
NAMESPACE_FLAGS = (
    0x00000080,  # CLONE_NEWTIME
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)

AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
#: Families above this number do not exist yet; any of them is refused too.
AF_MAX = 46
NETLINK_ROUTE = 0

#: personality(2) bits that weaken the address space (Docker allows only plain values).
PERSONALITY_FLAGS = (0x0040000, 0x0400000)  # ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC


def build_filter() -> bytes:
    """The BPF program, or SandboxUnavailable saying what is missing (fail closed: no
    execution starts without its filter)."""
    try:
        import pyseccomp as sc  # type: ignore[import-untyped]
    except (ImportError, OSError) as exc:
        raise SandboxUnavailable(
            f"the seccomp library cannot be loaded ({exc}); install the Debian package "
            f"libseccomp2 and the Python package pyseccomp, then start the runner again"
        ) from None
    eperm = sc.ERRNO(errno.EPERM)
    flt = sc.SyscallFilter(sc.ALLOW)
    # Only the native architecture is in the filter; every other one is killed (fail closed).
    flt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    for name in DENIED:
        try:
            flt.add_rule(eperm, name)
        except (OSError, ValueError, RuntimeError):
            continue  # not a system call of this architecture (vm86 on aarch64, say)
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for flag in NAMESPACE_FLAGS:
        flt.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    # socket(): only AF_UNIX, AF_INET, AF_INET6 and route netlink (what getaddrinfo and `ip`
    # use). Never AF_PACKET (raw frames), AF_ALG, AF_VSOCK, AF_BLUETOOTH, …
    allowed = {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK}
    for family in range(AF_MAX):
        if family not in allowed:
            flt.add_rule(eperm, "socket", sc.Arg(0, sc.EQ, family))
    flt.add_rule(eperm, "socket", sc.Arg(0, sc.GE, AF_MAX))
    flt.add_rule(eperm, "socket", sc.Arg(0, sc.EQ, AF_NETLINK), sc.Arg(2, sc.NE, NETLINK_ROUTE))
    for flag in PERSONALITY_FLAGS:
        flt.add_rule(eperm, "personality", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    with tempfile.TemporaryFile() as handle:
        flt.export_bpf(handle)
        handle.seek(0)
        return handle.read()


class SeccompProfile:
    """The runner's filter on disk; ``open()`` gives bwrap a descriptor positioned at 0."""

    version = SECCOMP_PROFILE

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self) -> None:
        program = build_filter()
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_bytes(program)
        tmp.chmod(0o600)
        os.replace(tmp, self.path)

    def open(self) -> int:
        return os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)

"""What runs in front of bwrap: enter the workspace's network, drop to the sandbox uid, set
the limits (docs/security.md). One exec of ``launch.c``, built once per runner with the
host's C compiler, or — where none is found, or ``SHELLYARD_LAUNCHER=chain`` — the chain of
``nsenter``, ``setpriv`` and ``prlimit`` it replaces, which does the same in three execs
(about 3.5 ms more per command here: docs/benchmarks.md, roundtrip notes).

Both are external execs, not ``preexec_fn`` or Popen's ``user=``: those make CPython fork
the whole service instead of vfork, and a preexec_fn is unsafe with threads running.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import resource
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shellyard import settings_env

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("launch.c")
#: launch.c's MAX_KEEPS: the paths ``--detach`` takes to keep.
MAX_KEEPS = 64
#: prlimit's option of each limit the sandbox sets.
_PRLIMIT = {
    resource.RLIMIT_NPROC: "nproc",
    resource.RLIMIT_NOFILE: "nofile",
    resource.RLIMIT_FSIZE: "fsize",
    resource.RLIMIT_AS: "as",
    resource.RLIMIT_CPU: "cpu",
}


@dataclass(frozen=True)
class Limit:
    resource: int  # RLIMIT_*
    soft: int
    hard: int


def build(directory: Path) -> Path | None:
    """The launcher for this host, compiled into ``directory`` on first use (named by the
    source's hash, so an upgrade builds the new one); None: use the chain."""
    if (settings_env.get("SHELLYARD_LAUNCHER") or "auto").lower() == "chain":
        return None
    return compile_c(directory, SOURCE, musl=True)


def configured_batch() -> bool:
    """``SHELLYARD_SANDBOX_SCHED``: sandboxes run SCHED_BATCH (the default) or SCHED_OTHER.
    Batch tasks do not preempt a running task when they wake, so a sandbox woken on its pipe
    or its child's exit no longer takes the control plane's loop thread off the CPU (16
    agents: docs/benchmarks.md; docs/decisions.md "Sandboxes scheduled SCHED_BATCH")."""
    return (settings_env.get("SHELLYARD_SANDBOX_SCHED") or "batch").lower() != "other"


#: How the C programs are built, most wanted first: with the host's static glibc, which
#: skips the dynamic loader's relocations at each exec (one per command for the launcher, one
#: per warm sandbox for the waiter: 0.15-0.3 ms of CPU, docs/benchmarks.md §79); a host
#: without libc.a builds them dynamically.
_BUILDS: tuple[tuple[str, ...], ...] = (("-O2", "-static"), ("-O2",))
#: The launcher's, first: with musl's static libc where the host has it (Debian's
#: musl-tools): its start-up asks the CPU nothing, glibc's reads the cache sizes with cpuid,
#: a trap to the hypervisor in a virtual machine, 0.4-0.6 ms of CPU a command (§81). Not the
#: waiter's: it runs the command with execvp, whose musl has no /bin/sh fallback for a file
#: without a shebang, as bwrap's glibc has (E1: warm and cold run a command alike).
_MUSL_BUILD = ("-O2", "-static")


def _compilers(musl: bool) -> list[tuple[str, tuple[str, ...]]]:
    """The builds this host can try: (compiler's path, flags). musl's only beside the host's
    cc, in its folder (another on a later PATH entry does not win over it)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return []
    found = [(cc, flags) for flags in _BUILDS]
    beside = shutil.which("musl-gcc", path=os.path.dirname(cc)) if musl else None
    return [(beside, _MUSL_BUILD), *found] if beside is not None else found


def compile_c(directory: Path, path: Path, *, musl: bool = False) -> Path | None:
    """``path`` (a C program of this package) built for this host into ``directory`` once,
    with musl where ``musl`` and the host has it; None where no compiler is found or the
    build fails (logged)."""
    source = path.read_bytes()
    builds = _compilers(musl)
    # the builds this host can try are part of the name: one that gains musl builds anew
    recipe = repr(builds).encode()
    target = directory / f"shellyard-{path.stem}-{hashlib.sha256(source + recipe).hexdigest()[:12]}"
    if target.is_file() and os.access(target, os.X_OK):
        return target
    if not builds:
        log.info("no C compiler for %s (docs/operations.md)", path.name)
        return None
    directory.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + f".{os.getpid()}.tmp")
    failed = ""
    try:
        for compiler, flags in builds:
            done = subprocess.run(
                [compiler, *flags, "-o", str(tmp), str(path)],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if done.returncode == 0:
                break
            failed = done.stderr.strip()[-500:]
        else:
            log.warning("could not build %s: %s", path.name, failed)
            return None
        tmp.chmod(0o755)
        os.replace(tmp, target)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("could not build %s: %s", path.name, exc)
        return None
    finally:
        tmp.unlink(missing_ok=True)
    return target


def prefix(
    launcher: Path | None,
    *,
    network: Path | None,
    ids: tuple[int, int] | None,
    limits: Sequence[Limit],
    cgroups: Sequence[str] = (),
    network_fds: tuple[int | None, int] | None = None,
    batch: bool = False,
    detach: tuple[str, Sequence[str], int | None] | None = None,
) -> list[str]:
    """Put in front of bwrap's argv. ``network``: the workspace's namespace (a file mounted
    by a root runner, or a holder's ``/proc/PID/ns/net``, entered with its user namespace);
    ``network_fds``: the same as descriptors (user namespace or None, network namespace),
    opened and checked by the runner (netns.py ``WorkspaceNetworks.open``) and inherited
    (``pass_fds``): entered in place of ``network``'s paths, which may name another
    namespace by the time they are opened (R2: a holder dead, its pid reused);
    ``ids``: the sandbox uid and gid (a root runner); ``cgroups``: the ``cgroup.procs`` files
    of the execution's groups (cgroups.py), joined first. The chain cannot join them itself:
    the spawner writes bwrap's pid into them right after the spawn (``join``); ``batch``:
    the launcher makes itself SCHED_BATCH before anything else (launch.c), the chain cannot
    either: the spawner sets bwrap's policy right after the spawn (``batch_after``);
    ``detach``: the runner's folder, every path bwrap binds from, and a descriptor of the
    runner's clean namespace (inherited, or None): the launcher starts from that namespace
    with copies of the mounts it binds from, or unmounts the other mounts bwrap needs none
    of in a mount namespace of its own (launch.c);
    the chain leaves them (a dearer spawn, nothing less safe)."""
    userns = network.with_name("user") if network and network.parts[:2] == ("/", "proc") else None
    if launcher is not None:
        argv = [str(launcher)]
        if batch:
            argv += ["--sched", "batch"]
        for procs in cgroups:
            argv += ["--cgroup", procs]
        if detach is not None:
            argv += ["--detach", detach[0]]
            if detach[2] is not None:
                argv += ["--clean-fd", str(detach[2])]
            for path in detach[1]:
                argv += ["--keep", path]
        if network_fds is not None:
            if network_fds[0] is not None:
                argv += ["--userns-fd", str(network_fds[0])]
            argv += ["--netns-fd", str(network_fds[1])]
        else:
            if userns is not None:
                argv += ["--userns", str(userns)]
            if network is not None:
                argv += ["--netns", str(network)]
        if ids is not None:
            argv += ["--ids", f"{ids[0]}:{ids[1]}"]
        for limit in limits:
            argv += ["--rlimit", f"{limit.resource}:{_number(limit.soft)}:{_number(limit.hard)}"]
        return [*argv, "--"]
    argv = []
    if network_fds is not None:
        nsenter = shutil.which("nsenter") or "/usr/bin/nsenter"
        user_fd, net_fd = network_fds
        if user_fd is not None:
            argv += [nsenter, f"--user=/proc/self/fd/{user_fd}", "--preserve-credentials"]
        else:
            argv.append(nsenter)
        # the descriptors stay open in setpriv and prlimit; bwrap closes every descriptor it
        # is not given for its own use before the command runs (launch.c closes them itself)
        argv += [f"--net=/proc/self/fd/{net_fd}", "--"]
    elif network is not None:
        nsenter = shutil.which("nsenter") or "/usr/bin/nsenter"
        if userns is not None:
            argv += [nsenter, f"--user={userns}", f"--net={network}", "--preserve-credentials"]
        else:
            argv += [nsenter, f"--net={network}"]
        argv.append("--")
    if ids is not None:
        setpriv = shutil.which("setpriv") or "/usr/bin/setpriv"
        argv += [setpriv, f"--reuid={ids[0]}", f"--regid={ids[1]}", "--clear-groups"]
    if limits:
        argv.append(shutil.which("prlimit") or "/usr/bin/prlimit")
        argv += [f"--{_PRLIMIT[x.resource]}={_number(x.soft)}:{_number(x.hard)}" for x in limits]
    return argv


def _number(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)


def batch_after(pid: int) -> None:
    """The chain's way to SCHED_BATCH: bwrap's policy set right after the spawn, so what it
    forked before (microseconds) stays SCHED_OTHER; a best effort (a setuid bwrap refuses it,
    and the policy is no limit anyway: docs/limits.md)."""
    with contextlib.suppress(OSError):
        os.sched_setscheduler(pid, os.SCHED_BATCH, os.sched_param(0))


def join(cgroups: Sequence[str], pid: int) -> None:
    """The chain's way into the groups: write bwrap's pid into each right after the spawn
    (a fork in the microseconds before stays outside; the launcher has no such gap)."""
    for procs in cgroups:
        with open(procs, "w") as handle:
            handle.write(str(pid))

"""The bubblewrap command line for one execution (R2).

Only builds argv and the environment; spawning and watching live in ``processes.py``.
Why each choice:
- no ``--die-with-parent``: the sandbox must outlive the service (E11);
- ``--new-session``: the command leads its own session/process group, so cancel can
  signal the group (E7) and the command cannot inject into a terminal;
- ``--unshare-all``: own pid namespace (leftovers die with its init, E8), own ipc/uts/cgroup,
  and no network unless the runner's policy shares it;
- the service's home is covered with a tmpfs and only this workspace is bound back in,
  so the database, tokens, logs, snapshot store and other workspaces are invisible.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from shellyard.errors import SandboxUnavailable
from shellyard.runner.limits import cpu_rlimit_arg
from shellyard.runner.protocol import SandboxPolicy

#: Used when the service runs as root and no uid is configured: a uid no system account uses,
#: so RLIMIT_NPROC counts only sandbox processes and nothing else on the host owns its files.
DEFAULT_SANDBOX_UID = 61000

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def find_bwrap() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed on this runner; install the Debian package "
            "'bubblewrap' (apt-get install bubblewrap) and start the runner again"
        )
    return path


def sandbox_ids(policy: SandboxPolicy) -> tuple[int, int] | None:
    """The (uid, gid) to drop to before bwrap starts, or None when we are not root."""
    if os.geteuid() != 0:
        return None
    uid = policy.sandbox_uid if policy.sandbox_uid is not None else DEFAULT_SANDBOX_UID
    gid = policy.sandbox_gid if policy.sandbox_gid is not None else uid
    if uid == 0 or gid == 0:
        raise SandboxUnavailable(
            "sandbox_uid/sandbox_gid 0 would run commands as the host's root; "
            "configure an unprivileged uid"
        )
    return uid, gid


def drop_privileges_prefix(ids: tuple[int, int] | None) -> list[str]:
    """``setpriv`` switches to the sandbox uid/gid and clears supplementary groups before
    bwrap starts. An exec instead of Popen's ``user=``/``group=``: those make CPython fork
    the whole service (measured ~2.6 ms blocking the event loop in a 90 MiB process) where
    a plain spawn uses vfork (~0.3 ms)."""
    if ids is None:
        return []
    setpriv = shutil.which("setpriv") or "/usr/bin/setpriv"
    return [setpriv, f"--reuid={ids[0]}", f"--regid={ids[1]}", "--clear-groups"]


def rlimit_prefix(policy: SandboxPolicy) -> list[str]:
    """``prlimit`` sets the limits on bwrap itself, inherited by everything inside.

    An external exec instead of ``preexec_fn``: preexec_fn forbids vfork and is unsafe with
    threads running (uvicorn, the snapshot store's pool)."""
    prlimit = shutil.which("prlimit") or "/usr/bin/prlimit"
    args = [
        prlimit,
        f"--nproc={policy.max_processes}",
        f"--nofile={policy.max_open_files}",
        f"--fsize={policy.max_file_size_bytes}",
    ]
    if policy.max_memory_bytes is not None:
        args.append(f"--as={policy.max_memory_bytes}")
    args += cpu_rlimit_arg(policy)  # limits (issue 12): CPU time, soft then hard
    return args


def host_view(hidden: Sequence[Path]) -> list[str]:
    """The host as every sandbox sees it: ``/`` read-only, its own ``/dev`` and ``/proc``,
    private ``/tmp``, ``/var/tmp`` and ``/run``, and the ``hidden`` folders covered by an
    empty tmpfs (a hidden file, such as a token, by an empty file)."""
    argv = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for private in ("/tmp", "/var/tmp", "/run"):
        argv += ["--tmpfs", private]
    for path in hidden:
        if path.is_dir():
            argv += ["--tmpfs", str(path)]
        elif path.exists():
            argv += ["--ro-bind", "/dev/null", str(path)]
    return argv


def bwrap_argv(
    *,
    bwrap: str,
    policy: SandboxPolicy,
    ids: tuple[int, int] | None,
    workspace: Path,
    hidden: Sequence[Path],
    status_fd: int,
    command: Sequence[str],
    read_only_binds: Sequence[Path] = (),
) -> list[str]:
    argv = [*drop_privileges_prefix(ids), *rlimit_prefix(policy), bwrap, "--unshare-all"]
    if policy.network == "on":
        argv.append("--share-net")
    argv += ["--new-session", *host_view(hidden)]
    for path in read_only_binds:
        argv += ["--ro-bind", str(path), str(path)]
    argv += [
        "--bind",
        str(workspace),
        str(workspace),
        "--chdir",
        str(workspace),
        "--hostname",
        "shellyard",
        "--json-status-fd",
        str(status_fd),
        "--",
        *command,
    ]
    return argv


def sandbox_env(workspace: Path, extra: dict[str, str]) -> dict[str, str]:
    """Built from scratch: nothing of the service's own environment leaks in (R2)."""
    env = {
        "PATH": SANDBOX_PATH,
        "HOME": str(workspace),
        "PWD": str(workspace),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "TMPDIR": "/tmp",
        "SHELL": "/bin/bash",
    }
    env.update(extra)
    return env


def tool_argv(
    *,
    bwrap: str,
    network: bool,
    hidden: Sequence[Path],
    writable: Sequence[Path],
    read_only: Sequence[Path],
    chdir: Path,
    command: Sequence[str],
) -> list[str]:
    """The bubblewrap command line for a package tool (uv, Rscript) changing an environment.

    Unlike an execution the tool runs as the runner's own user, for it writes the prefix that
    executions only read; so every capability is dropped (root without capabilities cannot
    write what it does not own, nor mount, nor trace). ``--die-with-parent``: a tool must not
    outlive the change that started it, and after a crash of the runner the kernel kills it
    before the rollback runs. ``/`` is read-only, the runner's home is covered by a tmpfs and
    only ``writable`` (the prefix, the caches, the change's scratch) and ``read_only`` (local
    channels, wheel folders, repositories) are bound back. The umask is set for the tool
    because whatever it creates must be readable by the sandbox uid of executions."""
    argv = [bwrap, "--unshare-all"]
    if network:
        argv.append("--share-net")
    argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", *host_view(hidden)]
    for path in read_only:
        argv += ["--ro-bind", str(path), str(path)]
    for path in writable:
        argv += ["--bind", str(path), str(path)]
    argv += [
        "--chdir",
        str(chdir),
        "--",
        "/bin/sh",
        "-c",
        'umask 022 && exec "$@"',
        "shellyard-tool",
        *command,
    ]
    return argv

"""The bubblewrap command line for one execution or package tool (R2; docs/security.md).

Only builds argv and the environment; spawning and watching live in ``spawn.py`` and
``supervise.py``. Why each choice:
- no ``--die-with-parent`` for executions: the sandbox must outlive the service (E11);
- ``--new-session``: the command leads its own session/process group, so cancel can
  signal the group (E7) and the command cannot inject into a terminal;
- ``--unshare-all``: own pid namespace (leftovers die with its init, E8), own ipc/uts/cgroup
  and network namespace (loopback only) unless the policy says ``host``;
- ``--cap-drop ALL``, ``--disable-userns`` and a seccomp filter (``seccomp.py``): no
  capability, no nested user namespace, none of the kernel's widest interfaces;
- the host is shown from an allow-list (``HostView``): ``/usr``, the ``/bin``/``/lib*`` links,
  ``/etc`` without its secrets, the operator's paths; never ``/home``, ``/root``, ``/srv``…;
- the workspace is bound at ``/workspace`` on every runner, so the host's layout never shows.
"""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from shellyard.errors import SandboxUnavailable
from shellyard.runner.limits.settings import cpu_limit
from shellyard.runner.network.egress_proxy import SANDBOX_PORT, SANDBOX_SOCKET
from shellyard.runner.policy import NetworkMode, SandboxPolicy
from shellyard.runner.sandbox import launch

if TYPE_CHECKING:
    from shellyard.runner.sandbox.clean_namespace import CleanNamespace

#: Used when the service runs as root and no uid is configured: a uid no system account uses,
#: so RLIMIT_NPROC counts only sandbox processes and nothing else on the host owns its files.
DEFAULT_SANDBOX_UID = 61000

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: Where every execution sees its workspace (and starts, E2).
WORKSPACE = "/workspace"
#: Where it sees its workspace's home (docs/contract.md "The home"): kept across that
#: workspace's commands, outside the tree, so in none of its snapshots, diffs or transfers.
HOME = "/home/agent"
#: Where it sees an environment's prefix (V4; runner/environments/seen.py), and where a
#: package tool sees that environment's cache and its change's scratch folder.
ENV = Path("/env")
ENV_CACHE = Path("/env-cache")
ENV_SCRATCH = Path("/env-scratch")
#: Where the base environments are seen (V4, runner/environments/bases.py): one path each,
#: as python-base brings r-base along.
BASE_PYTHON = Path("/base/python")
BASE_R = Path("/base/r")


class Mount(NamedTuple):
    """An environment for an execution (V4): the prefix on the host, the variables a
    command gets, and where the sandbox binds the prefix (read-only); ``also``: more
    (host, seen) read-only binds that come with it (a base's companion)."""

    prefix: Path
    variables: dict[str, str]
    seen: Path
    also: tuple[tuple[Path, Path], ...] = ()


def home_variables() -> dict[str, str]:
    """HOME and the XDG folders a tool writes its caches and settings to, all in HOME."""
    return {
        "HOME": HOME,
        "XDG_CACHE_HOME": f"{HOME}/.cache",
        "XDG_CONFIG_HOME": f"{HOME}/.config",
        "XDG_DATA_HOME": f"{HOME}/.local/share",
        "XDG_STATE_HOME": f"{HOME}/.local/state",
    }


#: The host's top-level entries every program needs; each is bound as the host has it (a
#: merged-/usr host has /bin → usr/bin links, an older one real folders).
SYSTEM_ROOTS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

#: Files of /etc hidden whatever their mode (a runner that is not root could read some).
ETC_SECRETS = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssl/private",
    "/etc/security/opasswd",
    "/etc/krb5.keytab",
    "/etc/ssh",
)

#: Read-only parts of /sys programs ask for (CPU counts for BLAS, R's parallel, nproc).
SYS_PARTS = ("/sys/devices/system/cpu",)


def find_bwrap() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed on this runner; install the Debian package "
            "'bubblewrap' (apt-get install bubblewrap) and start the runner again"
        )
    return path


def bwrap_supports(bwrap: str, option: str) -> bool:
    """Whether this bwrap knows ``option`` (``--disable-userns`` came with 0.8.0)."""
    try:
        text = subprocess.run(
            [bwrap, "--help"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return option in text


def find_socat() -> str:
    path = shutil.which("socat", path=SANDBOX_PATH)
    if path is None:
        raise SandboxUnavailable(
            "network mode 'egress' needs socat inside the sandbox (it relays 127.0.0.1:3128 to "
            "the runner's egress proxy); install the Debian package 'socat' or choose network "
            "'off'"
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


def sandbox_limits(
    policy: SandboxPolicy, cgroups: bool = False, uid_per_workspace: bool = False
) -> list[launch.Limit]:
    """The limits set on bwrap itself, inherited by everything inside (``launch.py`` sets
    them after the privilege drop, as ``prlimit`` did). RLIMIT_NPROC counts every process of
    the uid on the host: with a uid per workspace it is that workspace's; with one uid for all
    and cgroups it is not set (the workspace's ``pids.max`` bounds its processes, and one
    workspace must not use up another's; an unprivileged uid could not raise it anyway). In
    cgroups the cgroup bounds memory, not RLIMIT_AS."""
    nproc = policy.max_processes  # in cgroups pids.max (≤ this) is met first
    limits = (
        [launch.Limit(resource.RLIMIT_NPROC, nproc, nproc)]
        if uid_per_workspace or not cgroups
        else []
    )
    limits += [
        launch.Limit(resource.RLIMIT_NOFILE, policy.max_open_files, policy.max_open_files),
        launch.Limit(resource.RLIMIT_FSIZE, policy.max_file_size_bytes, policy.max_file_size_bytes),
    ]
    if policy.max_memory_bytes is not None and not cgroups:
        limits.append(
            launch.Limit(resource.RLIMIT_AS, policy.max_memory_bytes, policy.max_memory_bytes)
        )
    cpu = cpu_limit(policy)  # limits (R2, docs/limits.md): CPU time, soft then hard
    if cpu is not None:
        limits.append(launch.Limit(resource.RLIMIT_CPU, *cpu))
    return limits


def _etc_secrets() -> list[Path]:
    """What /etc shows nobody else: every entry others cannot read (shadow, ssh host keys,
    sudoers, service configurations with passwords), plus ``ETC_SECRETS`` whatever the mode.
    Walked once per runner, not per spawn."""
    found: list[Path] = [Path(p) for p in ETC_SECRETS if os.path.lexists(p)]
    for folder, dirs, files in os.walk("/etc"):
        for name in [*dirs, *files]:
            path = Path(folder, name)
            try:
                mode = path.lstat().st_mode
            except OSError:
                continue
            if stat.S_ISLNK(mode):
                continue
            if not mode & stat.S_IROTH and path not in found:
                found.append(path)
        # nothing below a hidden folder needs a mount of its own
        dirs[:] = [d for d in dirs if Path(folder, d) not in found]
    return found


def _cover(path: Path, empty: Path, empty_fds: list[int] | None) -> list[str]:
    """A folder by an empty tmpfs, a file by an empty file (not /dev/null: the bind would be
    a device node on a nodev mount, and reading it fails instead of reading nothing). With
    ``empty_fds`` the file is bwrap's own, filled from a descriptor open on /dev/null (bwrap
    reads and closes one per file), so the mount's root in /proc/self/mountinfo names no host
    path (docs/security.md "Host paths"); the runner keeps them open for its life."""
    if path.is_dir() and not path.is_symlink():
        return ["--tmpfs", str(path)]
    if path.exists() or path.is_symlink():
        if empty_fds is not None:
            fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            empty_fds.append(fd)
            return ["--perms", "0444", "--ro-bind-data", str(fd), str(path)]
        return ["--ro-bind", str(empty), str(path)]
    return []


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or root in path.parents for root in roots)


@dataclass(frozen=True)
class HostView:
    """The host as every sandbox of a runner sees it, computed once at start-up: the
    bwrap arguments and the visible host paths (for the error messages and the tests)."""

    argv: tuple[str, ...]
    visible: tuple[Path, ...]
    #: Descriptors the argv names, to pass to every bwrap started with it.
    fds: tuple[int, ...] = ()

    @classmethod
    def build(
        cls,
        host_paths: Sequence[str],
        hidden: Sequence[Path],
        empty: Path,
        own_files: bool = False,
    ) -> HostView:
        """``empty``: an empty file the sandbox uid can read, bound over hidden files; with
        ``own_files`` bwrap makes those files itself (the view's ``fds``, to pass to every
        bwrap and to close with ``close``)."""
        if not empty.exists():
            empty.write_bytes(b"")
        empty.chmod(0o444)
        argv: list[str] = []
        visible: list[Path] = []
        for name in SYSTEM_ROOTS:
            path = Path(name)
            if path.is_symlink():
                argv += ["--symlink", os.readlink(path), name]
            elif path.is_dir():
                argv += ["--ro-bind", name, name]
                visible.append(path)
        argv += ["--ro-bind", "/etc", "/etc"]
        visible.append(Path("/etc"))
        for part in SYS_PARTS:
            argv += ["--ro-bind-try", part, part]
        argv += ["--dev", "/dev", "--proc", "/proc"]
        for private in ("/tmp", "/var/tmp", "/run"):
            argv += ["--tmpfs", private]
        # After the private folders, so an operator's path under /tmp or /run is not covered.
        for raw in host_paths:
            path = Path(raw)
            if not path.exists():
                raise SandboxUnavailable(
                    f"host path {raw} (SHELLYARD_HOST_PATHS or --host-path) does not exist on "
                    f"this runner; create it or remove it from the setting"
                )
            argv += ["--ro-bind", raw, raw]
            visible.append(path)
        # Secrets of /etc, and the runner's own folders (its home, token files) wherever an
        # operator path or /usr would show them.
        covered = [*_etc_secrets(), *(Path(p).absolute() for p in hidden)]
        fds: list[int] | None = [] if own_files else None
        for path in covered:
            if _inside(path, visible):
                argv += _cover(path, empty, fds)
        return cls(tuple(argv), tuple(visible), tuple(fds or ()))

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass(frozen=True)
class Hardening:
    """What every spawn adds for the kernel: the seccomp descriptor's number and whether
    this bwrap can forbid nested user namespaces itself."""

    seccomp_fd: int | None
    disable_userns: bool

    def argv(self) -> list[str]:
        args = ["--cap-drop", "ALL"]
        if self.disable_userns:
            args += ["--unshare-user", "--disable-userns"]
        if self.seccomp_fd is not None:
            args += ["--seccomp", str(self.seccomp_fd)]
        return args


def network_argv(mode: NetworkMode, egress_socket: Path | None) -> list[str]:
    """``--unshare-all`` already gave the sandbox its own loopback-only namespace."""
    if mode == "host":
        return ["--share-net"]
    if mode == "egress":
        if egress_socket is None:
            raise SandboxUnavailable("network 'egress' needs the runner's egress proxy running")
        return ["--bind", str(egress_socket), SANDBOX_SOCKET]
    return []


#: Started first in an ``egress`` sandbox: a relay from 127.0.0.1:3128 to the proxy's socket
#: (detached, so it is the namespace init's child and dies with the namespace), then a wait of
#: shell built-ins until /proc/net/tcp lists the listener, then the command itself.
_EGRESS_WRAPPER = (
    "({socat} TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork UNIX-CONNECT:{sock} "
    "</dev/null >/dev/null 2>&1 &); "
    'n=0; ok=; while [ -z "$ok" ] && [ $n -lt 20000 ]; do '
    "while read -r _ l _ st _; do "
    'if [ "$l" = 0100007F:{hexport} ] && [ "$st" = 0A ]; then ok=1; break; fi; '
    "done </proc/net/tcp; n=$((n+1)); done; "
    '[ -n "$ok" ] || echo "shellyard: the egress relay did not start" >&2; exec "$@"'
)


def egress_command(socat: str, command: Sequence[str]) -> list[str]:
    script = _EGRESS_WRAPPER.format(
        socat=socat, port=SANDBOX_PORT, sock=SANDBOX_SOCKET, hexport=f"{SANDBOX_PORT:04X}"
    )
    return ["/bin/sh", "-c", script, "shellyard-egress", *command]


def proxy_variables(mode: NetworkMode) -> dict[str, str]:
    """Where an ``egress`` sandbox's programs find the proxy (curl reads the lower-case ones,
    pip/uv/R either)."""
    if mode != "egress":
        return {}
    url = f"http://127.0.0.1:{SANDBOX_PORT}"
    local = "localhost,127.0.0.1,::1"
    return {
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "NO_PROXY": local,
        "no_proxy": local,
    }


#: Where a long command's text is inside the sandbox (E1; docs/limits.md "Full disk, ...").
COMMAND_FILE = "/run/shellyard/command"


#: bwrap's options whose next argument is a host path it binds from.
_BIND_SOURCES = frozenset(
    ("--bind", "--ro-bind", "--dev-bind", "--bind-try", "--ro-bind-try", "--dev-bind-try")
)


@dataclass(frozen=True)
class Detach:
    """The runner's folder as the spawner names it (``given``) and as the mount table does
    (``real``, links resolved): the launcher unmounts, in the sandbox's own mount namespace,
    every mount bwrap binds nothing from, below that folder (the other workspaces') and
    elsewhere on the host (launch.c ``--detach``). ``clean``: the runner's clean namespace,
    which the launcher starts from instead while ``busy()`` says the runner's own mounts
    would cost a spawn more than that (clean_namespace.py)."""

    given: str
    real: str
    clean: CleanNamespace | None = None
    busy: Callable[[], bool] = field(default=lambda: False, compare=False)

    @classmethod
    def of(
        cls,
        root: Path,
        clean: CleanNamespace | None = None,
        busy: Callable[[], bool] | None = None,
    ) -> Detach:
        return cls(str(root), os.path.realpath(root), clean, busy or (lambda: False))

    def clean_descriptor(self, keeps: Sequence[str]) -> int | None:
        """A descriptor of the clean namespace for one spawn binding from ``keeps`` (the
        spawn's to close), when the runner is busy enough and it covers them; None: the
        launcher decides the old way."""
        clean = self.clean
        if clean is None or not self.busy() or not clean.covers(keeps):
            return None
        return clean.descriptor()

    def keeps(self, bwrap_options: Sequence[str]) -> list[str] | None:
        """Every source bwrap binds from, those below the folder as the table names them
        (the host's view as given: one through a link keeps every host mount, launch.c);
        None: more than the launcher takes (then nothing is unmounted)."""
        found: dict[str, None] = {}  # once each, in order: the hidden files share one source
        # option_words, as options_end: a --setenv value is the caller's text, and one
        # reading "--bind" made the next word a keep the launcher refused (session 55).
        for index in option_words(bwrap_options, 0):
            if bwrap_options[index] in _BIND_SOURCES and index + 1 < len(bwrap_options):
                value = bwrap_options[index + 1]
                below = value == self.given or value.startswith(self.given + "/")
                found[self.real + value[len(self.given) :] if below else value] = None
        return list(found) if len(found) <= launch.MAX_KEEPS else None


def bwrap_argv(
    *,
    bwrap: str,
    policy: SandboxPolicy,
    ids: tuple[int, int] | None,
    view: HostView,
    hardening: Hardening,
    workspace: Path,
    status_fd: int,
    command: Sequence[str],
    read_only_binds: Sequence[tuple[Path, Path]] = (),
    egress_socket: Path | None = None,
    socat: str | None = None,
    workspace_read_only: bool = False,
    shared_network: bool = False,
    network: Path | None = None,
    launcher: Path | None = None,
    command_fd: int | None = None,
    cgroups: Sequence[str] = (),
    uid_per_workspace: bool = False,
    chdir: str = WORKSPACE,
    setenv: Mapping[str, str] | None = None,
    home: Path | None = None,
    network_fds: tuple[int | None, int] | None = None,
    batch: bool = False,
    detach: Detach | None = None,
    clean_fd: Callable[[Sequence[str]], int | None] | None = None,
) -> list[str]:
    shared_network = shared_network or network is not None
    if policy.network == "egress" and not shared_network:
        # R5: a shared namespace has its relay already (runner/network/ports.py, a holder's:
        # holder.py); a socat of the sandbox's own there would take 127.0.0.1:3128 while the
        # relay is away (a holder killed) and keep the next holder from listening (R2)
        command = egress_command(socat or find_socat(), command)
    argv = [bwrap, "--unshare-all"]
    argv += ["--new-session", *hardening.argv(), *view.argv]
    argv += network_argv(policy.network, egress_socket)
    if shared_network:  # R2: bwrap runs inside the workspace's namespace (netns.py)
        argv.append("--share-net")
    for path, shown in read_only_binds:
        # V4: an environment's prefix, read-only, where its files say it is: the neutral
        # /env (environments/seen.py), or its host path for one built before that.
        argv += ["--ro-bind", str(path), str(shown)]
    if command_fd is not None:
        # E1: a command too long for one argument of execve (spawn.py) is read by bwrap from
        # this descriptor into a read-only file of its own tmpfs; ``command`` sources it.
        argv += ["--perms", "0444", "--ro-bind-data", str(command_fd), COMMAND_FILE]
    if home is not None:  # read-only beside the writer, like the workspace (W2)
        argv += ["--ro-bind" if workspace_read_only else "--bind", str(home), HOME]
    for name, value in (setenv or {}).items():
        # E1 env: set by bwrap inside the sandbox only; the host-side launch chain (nsenter,
        # setpriv, prlimit) never sees a caller's variable (LD_PRELOAD ...).
        argv += ["--setenv", name, value]
    argv += [
        # W2: a read-only execution's committed view (snapshots/views.py) takes no writes
        "--ro-bind" if workspace_read_only else "--bind",
        str(workspace),
        WORKSPACE,
        # The new root is bwrap's tmpfs: read-only once every mount point is made, so nothing
        # but /workspace, /tmp, /var/tmp and /run takes writes.
        "--remount-ro",
        "/",
        "--chdir",
        chdir,
        "--hostname",
        "shellyard",
        "--json-status-fd",
        str(status_fd),
        "--",
        *command,
    ]
    # R2: up to the options' own end; an env value "--" cut the list before the workspace's
    # bind, its overlay was unmounted and bwrap bound the plain folder (a host path shown)
    keeps = detach.keeps(argv[: options_end(argv, 1)]) if detach and launcher else None
    front = launch.prefix(
        launcher,
        network=network,
        ids=ids,
        limits=sandbox_limits(policy, bool(cgroups), uid_per_workspace),
        cgroups=cgroups,
        network_fds=network_fds,  # R2: ``network`` as checked descriptors (netns.py)
        batch=batch,  # SCHED_BATCH from the launcher on (launch.c)
        detach=None
        if keeps is None or detach is None
        else (detach.real, keeps, None if clean_fd is None else clean_fd(keeps)),
    )
    return [*front, *argv]


def options_end(argv: Sequence[str], start: int) -> int:
    """The index of the ``--`` that ends bwrap's options, which begin at ``start``. A
    ``--setenv`` value is the caller's text (E1: ``--`` is a value like any other): its two
    arguments are stepped over, never taken for the end. Every other option's arguments are
    the runner's (absolute paths, numbers, fixed words), never ``--``."""
    return next(index for index in option_words(argv, start) if argv[index] == "--")


def option_words(argv: Sequence[str], start: int) -> Iterator[int]:
    """The indexes of bwrap's words from ``start`` on that the runner wrote: each
    ``--setenv``'s two arguments (the caller's text) are stepped over. ``options_end`` and
    ``Detach.keeps`` read the argv through this one walk, so they cannot drift apart (a
    ``--setenv`` value reading ``--bind`` once made a keep, attack pass session 55)."""
    index = start
    while index < len(argv):
        yield index
        index += 3 if argv[index] == "--setenv" else 1


def options_by_fd(argv: list[str], bwrap: str) -> tuple[list[str], int]:
    """``argv`` with bwrap's options moved into a memfd read by ``--args FD``, and that fd
    (inheritable only through ``pass_fds``; close it once spawned). A sandbox reads its pid
    1's command line (/proc/1/cmdline is bwrap's): it then shows ``bwrap --args N --`` and
    the command, not the host paths of the binds (docs/security.md "Host paths")."""
    start = argv.index(bwrap) + 1
    end = options_end(argv, start)
    fd = os.memfd_create("shellyard-bwrap-args", os.MFD_CLOEXEC)
    try:
        # one encode of the joined options, not one per option (~100 a spawn)
        data = os.fsencode("\0".join([*argv[start:end], ""]))
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return [*argv[:start], "--args", str(fd), *argv[end:]], fd


def sandbox_env(home: str, extra: dict[str, str]) -> dict[str, str]:
    """Built from scratch: nothing of the service's own environment leaks in (R2)."""
    env = {
        "PATH": SANDBOX_PATH,
        "HOME": home,
        "PWD": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "TMPDIR": "/tmp",
        "SHELL": "/bin/bash",
        # Without TZ, R asks systemd's timedatectl for the zone on every start and warns
        # when there is no systemd (as in a sandbox); the host's zone, named (docs/environments.md).
        "TZ": host_time_zone(),
    }
    env.update(extra)
    return env


@functools.cache
def host_time_zone() -> str:
    """The host's zone name (``/etc/timezone``, or where ``/etc/localtime`` links), else UTC."""
    with contextlib.suppress(OSError):
        name = Path("/etc/timezone").read_text().strip()
        if name and Path("/usr/share/zoneinfo", name).is_file():
            return name
    with contextlib.suppress(OSError):
        target = os.readlink("/etc/localtime")
        if "zoneinfo/" in target:
            return target.split("zoneinfo/", 1)[1]
    return "UTC"


def tool_argv(
    *,
    bwrap: str,
    network: NetworkMode,
    view: HostView,
    hardening: Hardening,
    writable: Sequence[tuple[Path, Path]],
    read_only: Sequence[Path],
    chdir: Path,
    command: Sequence[str],
    egress_socket: Path | None = None,
    socat: str | None = None,
    front: Sequence[str] = (),
    mounts: Sequence[tuple[Path, Path]] = (),
    read_only_fds: Sequence[tuple[int, Path]] = (),
) -> list[str]:
    """The bubblewrap command line for a package tool (uv, Rscript) changing an environment.

    ``writable``: (host folder, where the tool sees it) pairs: the prefix at the path its
    files name, the cache and scratch at neutral paths (environments/seen.py, V4).
    ``front``: what drops to the tools' uid before bwrap (``launch.prefix``; on a root runner
    the sandbox uid, which owns the prefix, the environment's cache and the scratch folder),
    so a build backend never runs as the host's root; every capability is dropped too.
    ``--die-with-parent``: a tool must not outlive the change that started it, and after a
    crash of the runner the kernel kills it before the rollback runs. The host view is the
    executions' one; only ``writable`` (the prefix, the caches, the change's scratch) and
    ``read_only`` (the tool itself, a CA) and ``read_only_fds`` (the request's local channels,
    wheel folders, repositories, as descriptors) are bound in beside it. The
    umask is set for the tool because whatever it creates must be readable by executions.
    ``mounts``: (copy, path) pairs, a copy the runner made shown read-only at ``path`` (a
    workspace channel read as the workspace's uid, where the tool's uid cannot read)."""
    argv = [*front, bwrap, "--unshare-all", "--die-with-parent", "--new-session"]
    argv += [*hardening.argv(), *view.argv, *network_argv(network, egress_socket)]
    for path in read_only:
        argv += ["--ro-bind", str(path), str(path)]
    for copy, shown in mounts:
        argv += ["--ro-bind", str(copy), str(shown)]
    for fd, path in read_only_fds:  # the request's sources: a descriptor, never a path walk
        argv += ["--ro-bind-fd", str(fd), str(path)]
    for path, shown in writable:
        argv += ["--bind", str(path), str(shown)]
    argv += ["--remount-ro", "/"]
    inner = ["/bin/sh", "-c", 'umask 022 && exec "$@"', "shellyard-tool", *command]
    if network == "egress":
        inner = egress_command(socat or find_socat(), inner)
    argv += ["--chdir", str(chdir), "--", *inner]
    return argv

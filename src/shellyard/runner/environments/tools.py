"""Running a package tool (uv, Rscript) for one environment change, sandboxed.

The ``ToolRunner`` a manager gets in its ``ManagerContext``: bubblewrap around the tool with
the prefix, the environment's own cache and the change's scratch folder writable and
everything else read-only (``sandbox.tool_argv``). On a root runner the tool runs as the
sandbox uid (``tool_ids``), never as the host's root: a build backend it runs can read only
what that uid can, under the executions' seccomp filter (docs/environments.md, "Package tools
run as the sandbox uid"). Output goes to the change's log file, never through a pipe into this
process, so a chatty tool costs no memory here; the caller gets the exit code and the log's
last ~4 KiB. Every tool's pid is reported to ``on_spawn`` before it can change anything, so the
change journal names what recovery must kill if this process dies.

A tool runs the agent's code (a build backend), so it is held to the runner's free-space
reserve as commands are (docs/limits.md): every ``ROOM_CHECK_S`` while it runs, a volume
below the reserve (bytes or inodes) kills it, fails the change with the reserve's message and
empties the environment's cache, where a build's files stay otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from shellyard.errors import LowOnSpace
from shellyard.runner import processes
from shellyard.runner.environments.seen import Places
from shellyard.runner.limits import reserve
from shellyard.runner.limits.settings import format_size
from shellyard.runner.policy import NetworkMode
from shellyard.runner.sandbox import bwrap as sandbox
from shellyard.runner.sandbox import launch, tenants
from shellyard.runner.sandbox.spawn import Sandboxes
from shellyard.runner.sandbox.tool_groups import ToolGroups
from shellyard.runner.tool_mounts import shown_below

log = logging.getLogger(__name__)

#: On a root runner a finished base's files belong to this uid (group root), not to the
#: sandbox uid the package tools run as, so no tool can write or chmod a base file (an
#: environment made ``--from`` the base by an older release shares them by hard link;
#: runner/environments/derive.py copies now); nothing runs as it, so no local process can
#: either (docs/security.md, "The bases' owner").
BASE_OWNER = tenants.BASES_UID
#: The owner of bases sealed before (nobody): re-owned by the next ``env prepare``, and
#: until then still a base's file to ``give_to_tools``.
LEGACY_BASE_OWNER = 65534
#: How much of a tool's output the manager sees (its whole output is in the log file).
TAIL_BYTES = 4096
#: How often a running tool's volume is held to the free-space reserve (a ``statvfs``).
ROOM_CHECK_S = 0.1
#: What a tool prints when a write met ENOSPC (Python's OSError, C's strerror).
ENOSPC_MARKS = ("No space left on device", "[Errno 28]")

#: Variables of the runner's own environment a tool may need to reach an index through this
#: host's network set-up (a proxy, a private CA) or that tune uv; nothing else leaks in.
PASSED_VARIABLES = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "UV_HTTP_RETRIES",
    "UV_HTTP_TIMEOUT",
    "UV_CONCURRENT_DOWNLOADS",
    "UV_NATIVE_TLS",
)

SpawnHook = Callable[[int, int], None]
#: Gets each line a tool writes on stdout, when the caller talks with it (conda's child).
LineHook = Callable[[str], None]
#: The most a tool may write on stdout to its caller (its records of a prefix's packages).
MAX_ANSWER = 64 << 20


def open_without_links(path: Path) -> int:
    """An ``O_PATH`` descriptor of the folder ``path``, walked from ``/`` one component at a
    time without following a link (OSError naming the link otherwise). The sources an agent
    named were checked as real paths (``sources.check_request``); binding this descriptor
    (``--ro-bind-fd``) rather than the path means a link put there after the check is never
    followed, by bwrap or anyone (docs/security.md, "Attack pass (second engineer)")."""
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open("/", flags | os.O_DIRECTORY)
    try:
        for part in path.parts[1:]:
            if part in ("", ".", ".."):
                raise OSError(f"{path} is not a plain absolute path")
            following = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = following
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise OSError(f"{path}: {part} became a symbolic link after the check")
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(f"{path} is no longer a folder")
    except BaseException:
        os.close(fd)
        raise
    return fd


def tool_ids(sandboxes: Sandboxes) -> tuple[int, int] | None:
    """The (uid, gid) every package tool of this runner runs as: the executions' sandbox uid
    (None: the runner is not root and tools run as its own user). The one place to make it
    per workspace or per environment."""
    return sandboxes.ids


def give_to_tools(path: Path, ids: tuple[int, int] | None) -> None:
    """Make ``path`` (a prefix, a cache, a scratch folder) and everything below it belong to
    the tools' uid, without following a link; a base's hard-linked files (``BASE_OWNER``)
    stay the base's. Run while no tool runs on it (the environment's lock is held)."""
    if ids is None:
        return
    uid, gid = ids

    def own(entry: str | Path, st: os.stat_result) -> None:
        if (st.st_uid, st.st_gid) == (uid, gid) or st.st_uid in (BASE_OWNER, LEGACY_BASE_OWNER):
            return
        if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
            # a hard link the tools could not have made to a file not theirs: it may be a
            # host file's other name; never given away (docs/security.md, "runner reads")
            log.warning("left a hard link of a file not the tools' as it is: %s", entry)
            return
        os.lchown(entry, uid, gid)

    own(path, os.lstat(path))
    folders = [str(path)]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for entry in entries:
                own(entry.path, entry.stat(follow_symlinks=False))
                if entry.is_dir(follow_symlinks=False):
                    folders.append(entry.path)


class SandboxedTools:
    """The ``run_tool`` of one change (see ``managers/base.py``'s ``ToolRunner``)."""

    def __init__(
        self,
        *,
        sandboxes: Sandboxes,
        prefix: Path,
        cache: Path,
        scratch: Path,
        log_path: Path,
        base_env: dict[str, str],
        on_spawn: SpawnHook,
        timeout_s: float,
        groups: ToolGroups | None = None,
        seen: Path | None = None,
    ) -> None:
        """``seen``: where the tools see the prefix, the path its files name (V4, seen.py;
        default its host path); the cache and scratch are seen at neutral paths."""
        self._sandboxes = sandboxes
        #: V4: the host folders and where the tools' sandbox shows them
        self.places = Places(prefix, cache, scratch, seen)
        #: R2 tenants: each tool in a group of its own inside the requesting workspace's.
        self.groups = groups or ToolGroups(None, "", "")
        self._prefix = prefix
        self._cache = cache
        self._scratch = scratch
        self._log_path = log_path
        self._base_env = base_env
        self._on_spawn = on_spawn
        self._timeout_s = timeout_s
        self._live: set[subprocess.Popen[bytes]] = set()
        #: Set once the change is being abandoned: no new tool starts.
        self.stopped = False

    async def __call__(
        self,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        binds: list[Path] | None = None,
        network: bool = True,
        stdin: bytes | None = None,
        lines: LineHook | None = None,
        mounts: dict[Path, Path] | None = None,
    ) -> tuple[int, str]:
        if self.stopped:
            return -signal.SIGKILL, "the change was stopped before this tool could start"
        short = self._below_reserve("starting a package tool")
        if short is not None:
            return 1, short
        # The sources the request named (checked as real paths): bound through descriptors,
        # so neither bwrap (which could not search a workspace of another uid anyway) nor
        # anything else follows a link swapped in since the check.
        sources: list[tuple[int, Path]] = []
        try:
            for path in dict.fromkeys(binds or []):
                sources.append((open_without_links(path), path))
        except OSError as exc:
            for fd, _path in sources:
                os.close(fd)
            return 1, f"refused a package source: {exc}; name a folder of your workspace"
        # R2: the prefix, cache and scratch as writable overlays of their own for this run,
        # so the tool's mountinfo names no folder of the home (tool_mounts.py)
        stack = contextlib.ExitStack()
        try:
            writable = list(self.places.binds)
            if self._sandboxes.tool_mounts is not None:
                overlays = self._sandboxes.tool_mounts.mounted(writable)
                writable = await asyncio.to_thread(stack.enter_context, overlays)
            return await self._run(argv, env, network, sources, writable, stdin, lines, mounts)
        finally:
            await asyncio.to_thread(stack.close)
            for fd, _path in sources:
                os.close(fd)

    async def _run(
        self,
        argv: list[str],
        env: dict[str, str] | None,
        network: bool,
        sources: list[tuple[int, Path]],
        writable: list[tuple[Path, Path]],
        stdin: bytes | None = None,
        lines: LineHook | None = None,
        mounts: dict[Path, Path] | None = None,
    ) -> tuple[int, str]:
        # V4: the paths of the prefix, the cache and the scratch as the sandbox shows them
        shown = [self.places.inside(arg) for arg in argv]
        wanted: list[Path] = []
        if os.path.isabs(argv[0]) and shown[0] == argv[0]:
            # The tool itself may live where the sandbox shows a tmpfs (uv inside a checkout
            # under /tmp, or under the hidden home): bind its file back at its own path.
            wanted.append(Path(argv[0]))
        # A private CA the operator points tools at must be visible to them.
        for variable in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
            value = os.environ.get(variable)
            if value and os.path.isabs(value):
                wanted.append(Path(value))
        read_only = [p for p in dict.fromkeys(wanted) if p.exists()]
        box = self._sandboxes
        mode: NetworkMode = box.policy.tools_network if network else "off"
        seccomp_fd = box.seccomp.open()
        group: str | None = None
        try:
            # R2 tenants: a build backend is the agent's code: its processes count against
            # the workspace's limits from the tool's first instruction (the launcher joins).
            group, joins = self.groups.start()
            # the commands' file-size limit: what a build leaves is committed and a sparse
            # file's holes are hashed, so its apparent size is bounded too (docs/limits.md)
            size = box.policy.max_file_size_bytes
            front = launch.prefix(
                box.launcher,
                network=None,
                ids=tool_ids(box),
                limits=(launch.Limit(resource.RLIMIT_FSIZE, size, size),),
                cgroups=joins,
            )
            command = sandbox.tool_argv(
                bwrap=box.bwrap,
                network=mode,
                view=box.view,
                hardening=sandbox.Hardening(seccomp_fd, box.disable_userns),
                writable=writable,
                read_only=read_only,
                read_only_fds=sources,
                chdir=self.places.shown(self._scratch),
                command=shown,
                egress_socket=box.egress_socket,
                socat=box.socat,
                front=front,
                mounts=[
                    (shown_below(copy, self.places.binds, [at for at, _ in writable]), shown)
                    for shown, copy in (mounts or {}).items()
                ],
            )
            # R2: the tool's pid 1 is bwrap's: its /proc/1/cmdline showed every bind's host
            # path (the prefix's, the workspace's sources'); the options go by a memfd, as
            # the commands' do (docs/security.md "Host paths", attack pass 43)
            command, args_fd = sandbox.options_by_fd(command, box.bwrap)
        except BaseException:
            os.close(seccomp_fd)
            self.groups.remove(group)
            raise
        passed = {k: v for k in PASSED_VARIABLES if (v := os.environ.get(k)) is not None}
        if mode == "egress":
            # the runner's own proxy settings mean nothing inside: the sandbox's relay is the way
            passed = {k: v for k, v in passed.items() if "proxy" not in k.lower()}
        tool_env = self.places.inside_env({
            **sandbox.sandbox_env(str(self._scratch), sandbox.proxy_variables(mode)),
            "PATH": f"{self._prefix}/bin:{sandbox.SANDBOX_PATH}",
            **passed,
            **self._base_env,
            **(env or {}),
        })  # fmt: skip
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        # R2: the tool's /proc/self/fd/2 reads "/environments/changes/<change>/log", no path
        # of the home: through the runner's copy of its root (log_root.py); an operator's
        # build, whose log is elsewhere, through a copy of its own
        log_dir, log_name = self._log_path.parent, (self._log_path.name,)
        (log_fd,) = box.logs.open_files(log_dir, log_name, flags, 0o600)
        try:
            start = os.fstat(log_fd).st_size
            os.write(log_fd, f"$ {' '.join(shown)}\n".encode("utf-8", "replace"))
            # Spawned from the event loop's thread: --die-with-parent follows the thread that
            # forked bwrap, and this one lives as long as the runner.
            popen = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                stdout=log_fd if lines is None else subprocess.PIPE,
                stderr=log_fd,
                env=tool_env,
                cwd="/",
                pass_fds=(seccomp_fd, args_fd, *box.view.fds, *(fd for fd, _ in sources)),
            )
            if joins and box.launcher is None:
                launch.join(joins, popen.pid)
        except BaseException:
            self.groups.remove(group)
            raise
        finally:
            os.close(log_fd)
            os.close(seccomp_fd)
            os.close(args_fd)
        self._live.add(popen)
        talk: asyncio.Future[None] | None = None
        try:
            self._on_spawn(popen.pid, processes.start_time(popen.pid) or 0)
            if stdin is not None or lines is not None:
                talk = asyncio.ensure_future(
                    asyncio.to_thread(_talk, popen, stdin, lines, asyncio.get_running_loop())
                )
            code = await self._wait(popen, start)
            if talk is not None:
                await talk  # the pipes close with the tool
        finally:
            if popen.poll() is None:
                popen.kill()
                await asyncio.to_thread(popen.wait)
            self._live.discard(popen)
            # only now, the tool gone: its group's use says whether a limit stopped it
            note = await asyncio.to_thread(self.groups.finish, group)
            if note is not None:
                with open(self._log_path, "ab") as log:
                    log.write(f"\nshellyard: {note}\n".encode())
        return code, _tail(self._log_path, start)

    def _below_reserve(self, what: str) -> str | None:
        """The reserve's message when the volume of the prefix is below it, else None."""
        try:
            reserve.require_room(self._prefix.parent, self._sandboxes.policy, what)
        except LowOnSpace as exc:
            return exc.message
        except OSError:
            return None
        return None

    def _filled_volume(self, start: int) -> str | None:
        """The reserve's message when a failed tool said ENOSPC: every place it may write
        (prefix, cache, scratch) is on the runner's volume, so the volume was full."""
        try:
            tail = _tail(self._log_path, start)
        except OSError:  # unread (EMFILE): not known to have filled the volume
            return None
        if not any(mark in tail for mark in ENOSPC_MARKS):
            return None
        try:
            free, total = reserve.volume(self._prefix.parent)
        except OSError:
            return None
        kept = reserve.reserve_bytes(self._sandboxes.policy, total)
        return (
            f"the package tool was stopped: it filled the runner's volume (a write failed "
            f"with 'No space left on device'), below its reserve of {format_size(kept)} "
            f"({format_size(free)} free once it ended); the change is dropped with what it "
            f"wrote to the cache. A build that writes this much cannot run here"
        )

    async def _wait(self, popen: subprocess.Popen[bytes], start: int) -> int:
        """Wake on the pidfd when the tool ends; kill it after the change's time limit, or
        when the volume falls below the free-space reserve (see the module's doc)."""
        deadline = time.monotonic() + self._timeout_s
        loop = asyncio.get_running_loop()
        ended = asyncio.Event()
        poller: asyncio.Future[None] | None = None
        try:
            pidfd = os.pidfd_open(popen.pid)
        except ProcessLookupError:
            return popen.wait()
        except OSError:  # no pidfd (EMFILE at the descriptor limit, ENOSYS): polled
            pidfd = -1
            poller = asyncio.ensure_future(_poll_until_ended(popen, ended))
        else:
            loop.add_reader(pidfd, ended.set)
        why = f"killed after {self._timeout_s:.0f} s"
        short = None
        try:
            while not ended.is_set() and (left := deadline - time.monotonic()) > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ended.wait(), min(left, ROOM_CHECK_S))
                if not ended.is_set():
                    short = self._below_reserve("going on with the package tool")
                    if short is not None:
                        why = f"killed: {short}"
                        break
        finally:
            if poller is not None:
                poller.cancel()
            else:
                loop.remove_reader(pidfd)
                os.close(pidfd)
        if popen.poll() is None:
            # Killed first: the log's open may be refused by the full descriptor table that
            # refused the pidfd (EMFILE), and the tool must not run on past its limit for that
            # (docs/security.md "Attack pass (session 50)"); its line is best effort.
            popen.kill()
            with contextlib.suppress(OSError), open(self._log_path, "ab") as log:
                log.write(f"\nshellyard: {why}\n".encode())
        code = await asyncio.to_thread(popen.wait)
        if short is None:
            # A writer faster than a check (a tmpfs takes GB/s) ends on ENOSPC first.
            short = self._below_reserve("keeping what the package tool wrote")
            if short is None and code != 0:
                # ...and the tool may already have removed what it wrote (uv drops a failed
                # build's tree), so the volume is above the reserve again by now.
                short = self._filled_volume(start)
            if short is not None:
                with open(self._log_path, "ab") as log:
                    log.write(f"\nshellyard: {short}\n".encode())
                code = code or 1
        if short is not None:
            # What the build left in the cache (an sdist's tree, its outputs) is what filled
            # the volume: a cache may always be dropped, and no other tool of it starts.
            self.stopped = True
            await asyncio.to_thread(shutil.rmtree, self._cache, True)
        return code

    def kill_all(self) -> None:
        """Stop every running tool (their sandboxes die with them) and refuse new ones."""
        self.stopped = True
        for popen in list(self._live):
            with contextlib.suppress(ProcessLookupError):
                popen.send_signal(signal.SIGKILL)


def _talk(
    popen: subprocess.Popen[bytes],
    data: bytes | None,
    lines: LineHook | None,
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Write ``data`` to the tool's stdin and hand each stdout line to ``lines`` (on the
    loop's thread), at most ``MAX_ANSWER`` bytes: a tool that writes more is killed."""
    if popen.stdin is not None:
        with contextlib.suppress(BrokenPipeError):
            popen.stdin.write(data or b"")
        with contextlib.suppress(BrokenPipeError):
            popen.stdin.close()
    if popen.stdout is None:
        return
    read = 0
    with popen.stdout:
        for raw in popen.stdout:
            read += len(raw)
            if read > MAX_ANSWER:
                popen.kill()
                break
            if lines is not None:
                loop.call_soon_threadsafe(lines, raw.decode("utf-8", "replace"))


def _tail(path: Path, start: int) -> str:
    """The last ``TAIL_BYTES`` of what was appended to ``path`` from ``start`` on."""
    with path.open("rb") as handle:
        end = os.fstat(handle.fileno()).st_size
        begin = max(start, end - TAIL_BYTES)
        handle.seek(begin)
        data = handle.read(end - begin)
    text = data.decode("utf-8", "replace")
    return text if begin == start else "…" + text


def kill_recorded(pids: list[list[int]]) -> None:
    """Recovery: SIGKILL tools a dead runner left behind (normally --die-with-parent already
    did), each only if its pid still names the same process, and wait until they are gone."""
    for pid, started in pids:
        if processes.is_same_process(pid, started):
            processes.signal_process(pid, signal.SIGKILL)
    for pid, started in pids:
        for _ in range(500):
            if not processes.is_same_process(pid, started):
                break
            time.sleep(0.01)


def fresh_private(scratch: Path, cache: Path, ids: tuple[int, int] | None) -> None:
    """An empty scratch folder and the environment's cache, 0700 and the tools' own."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(mode=0o700)
    cache.mkdir(mode=0o700, exist_ok=True)
    for folder in (scratch, cache):
        folder.chmod(0o700)
        give_to_tools(folder, ids)


async def _poll_until_ended(popen: subprocess.Popen[bytes], ended: asyncio.Event) -> None:
    """``ended`` set once the tool has exited, asked every 50 ms (no pidfd to wake on)."""
    while popen.poll() is None:
        await asyncio.sleep(0.05)
    ended.set()

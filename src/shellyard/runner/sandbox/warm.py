"""Warm sandboxes: for a workspace that ran recently, one sandbox made ahead of its next
command (namespaces, mounts, seccomp, limits, cgroups, network: everything but the command),
its first process (``warm.c``) waiting on a pipe for the command (docs/operations.md "Warm
sandboxes"; docs/benchmarks.md).

Single use: a command takes it, the waiter chdirs, sets exactly the command's environment
and execs it, so each command is still a fresh process in a fresh sandbox (E1); the next
one is made once the command has run ``SHELLYARD_WARM_AFTER_MS`` or when it ends, if sooner.
It is used only while everything it was made from is unchanged (its ``Key``: the policy,
the uid, the workspace tree and home, the environment's prefix and variables, the network
namespace, the workspace's limit endings), else discarded;
also after ``SHELLYARD_WARM_IDLE_S`` and under memory pressure; never by another workspace;
at most ``SHELLYARD_WARM_SANDBOXES`` per runner. When that many wait, one gives its place to
another workspace's only once it has waited ``SWAP_FRACTION`` of the idle time: with more busy
workspaces than places, replacing the longest waiting at once threw each away just before its
workspace came back (16 agents, 8 places: 60% of those made, none of them used; a wasted spawn
each, docs/benchmarks.md §13), where keeping them serves as many workspaces as there are places.

Only the runner holds the pipe's write end: when the runner dies (kill -9) the waiter reads
its end and exits without running anything, and the sandbox ends with it; a restart removes
what is left of its folder (``reap``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from shellyard import settings_env
from shellyard.runner import processes
from shellyard.runner.own_mounts import OwnMounts
from shellyard.runner.protocol import StartRequest
from shellyard.runner.sandbox.bwrap import Mount
from shellyard.runner.sandbox.log_root import LogRoot
from shellyard.runner.sandbox.spawn import (
    LOG_FLAGS,
    LOG_NAMES,
    RESULT_TEMPORARY,
    WARM_RECORD,
    LiveExecution,
    Sandboxes,
    SpawnOrder,
    Started,
    inside,
    write_json_once,
)
from shellyard.runner.sandbox.warm_spawn import group_reset, reap_popen, spawn_in_thread

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("warm.c")
MAGIC = b"shellyard-warm-1"
#: A spec up to this size is written at once whatever the waiter is doing (a pipe holds
#: 64 KiB): the start never waits on the sandbox. A longer one starts cold.
PIPE_ROOM = 60 << 10
#: Places per runner. 8 served half of 16 agents' workspaces: the other half's commands found
#: the pool full and started cold, and a bench's 16 workspaces swapped nothing in, so half
#: the spawns stayed on the commands' path (docs/benchmarks.md §65). A place costs ~0.9 MiB
#: (0.43 MiB of its three processes' PSS, ~0.2-0.4 MiB of kernel slab, stacks and page
#: tables), so 16 hold ~14 MiB; ``memory_low`` empties the pool under pressure.
DEFAULT_COUNT = 16
DEFAULT_IDLE_S = 60.0
#: The next warm sandbox is made once the command has run this long, or when it ends if that
#: is sooner: made at the start, its making shared the event loop and the two cores with a
#: short command's end and delayed the answer by ~2 ms (docs/benchmarks.md §55).
DEFAULT_AFTER_MS = 20.0
#: Below this share of MemAvailable in MemTotal the host is short of memory: no warm
#: sandbox is made and those waiting go (each holds a few MiB of kernel and bwrap memory).
MEMORY_LOW_FRACTION = 0.10
#: ``memory_low`` is asked at most this often (seconds): read at every making, /proc/meminfo
#: (the kernel sums it on each read) was 1.5-4.6% of the event loop's thread with 16 agents
#: (docs/benchmarks.md §65); pressure that comes on is still seen within this time.
MEMORY_CHECK_S = 0.25
#: With every place taken, a warm sandbox younger than this share of SHELLYARD_WARM_IDLE_S
#: keeps its place (its workspace is in use: commands come seconds apart), one older makes
#: room for the workspace whose command just started.
SWAP_FRACTION = 0.25
#: Mount identity: a path and its inode, so a tree or prefix replaced under the same name
#: (a rename) is seen as changed.
Identity = tuple[str, int, int]


def configured_count() -> int:
    value = settings_env.get("SHELLYARD_WARM_SANDBOXES")
    try:
        return DEFAULT_COUNT if value is None else max(0, int(value))
    except ValueError:
        log.warning(
            "SHELLYARD_WARM_SANDBOXES=%r is not a whole number; using %d", value, DEFAULT_COUNT
        )
        return DEFAULT_COUNT


def configured_idle_s() -> float:
    value = settings_env.get("SHELLYARD_WARM_IDLE_S")
    try:
        return DEFAULT_IDLE_S if value is None else max(0.001, float(value))
    except ValueError:
        log.warning("SHELLYARD_WARM_IDLE_S=%r is not a number; using %s", value, DEFAULT_IDLE_S)
        return DEFAULT_IDLE_S


def configured_after_s() -> float:
    value = settings_env.get("SHELLYARD_WARM_AFTER_MS")
    try:
        return (DEFAULT_AFTER_MS if value is None else max(0.0, float(value))) / 1000
    except ValueError:
        log.warning("SHELLYARD_WARM_AFTER_MS=%r is not a number; using %s", value, DEFAULT_AFTER_MS)
        return DEFAULT_AFTER_MS / 1000


def memory_low() -> bool:
    """Whether the host is short of memory (/proc/meminfo; unknown: not short)."""
    fields: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines()[:8]:
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0])
    total, available = fields.get("MemTotal"), fields.get("MemAvailable")
    return bool(total and available is not None and available < total * MEMORY_LOW_FRACTION)


def _identity(path: Path) -> Identity | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return (str(path), info.st_dev, info.st_ino)


@dataclass(frozen=True)
class Key:
    """Everything a warm sandbox was made from; a command takes it only when all are equal."""

    workspace_id: str
    ids: tuple[int, int] | None
    policy: str
    tree: Identity | None
    home: Identity | None
    #: the prefix (its inode), where the sandbox shows it (V4, seen.py) and its variables
    mount: (
        tuple[
            Identity | None,
            str,
            tuple[tuple[str, str], ...],
            tuple[tuple[Identity | None, str], ...],
        ]
        | None
    )
    limit_endings: int


@dataclass
class Warm:
    """One warm sandbox, waiting."""

    sandbox_id: str
    key: Key
    directory: Path
    started: Started
    write_fd: int | None
    environment_id: str | None
    #: R2 tenants: its cgroups' name when made ahead (ready_groups.py ``take_ready``), else
    #: they are named by ``sandbox_id``
    group: str | None = None
    made_at: float = field(default_factory=time.monotonic)
    timer: asyncio.TimerHandle | None = None


class WarmPool:
    """The warm sandboxes of one runner, one per workspace at most."""

    def __init__(self, directory: Path, sandboxes: Sandboxes, mounts: OwnMounts) -> None:
        self.directory = directory
        self._sandboxes = sandboxes
        #: R2: a warm sandbox binds its workspace's overlays: held from its spawn until it
        #: is discarded or a command takes it (the command holds its own)
        self._mounts = mounts
        self.count = configured_count()
        self.idle_s = configured_idle_s()
        self.after_s = configured_after_s()
        #: execution id → the timer that makes its workspace's next warm sandbox
        #: (``prepare_after``), until it fires or the execution ends
        self._after: dict[str, tuple[asyncio.TimerHandle, Callable[[], None]]] = {}
        #: how long a waiting one keeps its place in a full pool (SWAP_FRACTION)
        self.swap_after_s = self.idle_s * SWAP_FRACTION
        self._ready: dict[str, Warm] = {}
        #: workspace id → executions that ended at a limit (quota, disk, memory ...)
        self._limit_endings: Counter[str] = Counter()
        #: What happened to warm sandboxes: made, taken, and each reason one was discarded.
        self.stats: Counter[str] = Counter()
        self._closed = False
        #: workspaces whose warm sandbox is being made, and those tasks
        self._making: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        #: (when, what) ``memory_low`` last answered (MEMORY_CHECK_S)
        self._memory: tuple[float, bool] = (-MEMORY_CHECK_S, False)

    # ------------------------------------------------------------------ key

    def _key(self, workspace_id: str, tree: Path, mount: Mount | None) -> Key:
        box = self._sandboxes
        home = None if box.home_of is None else _identity(box.home_of(workspace_id))
        policy = f"{box.policy.model_dump_json()}|{box.seccomp.version}|{box.launcher}"
        return Key(
            workspace_id=workspace_id,
            ids=box.ids_of(workspace_id),
            policy=policy,
            tree=_identity(tree),
            home=home,
            mount=None
            if mount is None
            else (
                _identity(mount.prefix),
                str(mount.seen),
                tuple(sorted(mount.variables.items())),
                tuple((_identity(host), str(seen)) for host, seen in mount.also),
            ),
            limit_endings=self._limit_endings[workspace_id],
        )

    # ------------------------------------------------------------------ take

    def take(self, order: SpawnOrder) -> LiveExecution | None:
        """The workspace's warm sandbox running ``order``'s command as its execution, its
        folder become ``order.directory``; None: none fits (the caller spawns one cold)."""
        request, directory, mount = order.request, order.directory, order.mount
        if request.read_only or not self._ready.get(request.workspace_id):
            return None
        spec = _spec(self._sandboxes.command_env(request, mount), request.cwd, order.command)
        if len(spec) > PIPE_ROOM:
            return None  # more than the pipe holds (a long text goes as a file): cold
        warm = self._ready.pop(request.workspace_id)
        if warm.timer is not None:
            warm.timer.cancel()
        if warm.key != self._key(request.workspace_id, order.tree, mount):
            self._discard(warm, "changed")
            return None
        if warm.started.popen.poll() is not None:
            self._discard(warm, "ended")
            return None
        networks = self._sandboxes.networks
        shared = warm.started.network
        # the execution's own share of the namespace, as a cold spawn takes it (R2)
        joined = (
            None
            if networks is None or shared is None
            else networks.acquire(request.workspace_id, request.execution_id)
        )
        if networks is not None and joined != shared:
            if joined is not None:
                networks.release(request.workspace_id, request.execution_id)
            self._discard(warm, "network")
            return None
        # E10, E11: the folder is the execution's before its command is sent. A kill -9 of
        # the runner between the two then leaves ``ex_<id>`` without meta.json: recovery kills
        # its namespace (the waiter, its pipe's writer gone, ran nothing) and a retried start
        # finds the folder and spawns nothing. Sent first, the command ran in a warm folder
        # that reap removes, and a retried start, finding no ``ex_<id>``, ran it again.
        try:
            os.replace(warm.directory, directory)  # its logs and status, open in bwrap, move
        except OSError:  # its folder is gone or the name taken: nothing was sent, cold
            if networks is not None and shared is not None:
                networks.release(request.workspace_id, request.execution_id)
            self._discard(warm, "folder")
            return None
        try:
            _write_all(warm.write_fd, spec)
        except OSError:
            if networks is not None and shared is not None:
                networks.release(request.workspace_id, request.execution_id)
            try:  # nothing ran: the folder goes back where discard and reap look for it
                os.replace(directory, warm.directory)
            finally:  # failing that, launch removes ``directory`` (SpawnFailed, nothing ran)
                self._discard(warm, "ended")
            return None
        self._close_pipe(warm)
        started = Started(warm.started.popen, warm.started.start_time, time.time(), shared)
        if networks is not None and shared is not None:
            networks.release(request.workspace_id, warm.sandbox_id)
        self._mounts.let_go(request.workspace_id)  # the execution's own hold goes on
        self.stats["taken"] += 1
        return self._sandboxes.record(
            request, directory, started, warm.sandbox_id, cgroup=warm.group
        )

    # ------------------------------------------------------------------ make

    def prepare_after(self, request: StartRequest, tree: Path, mount: Mount | None) -> None:
        """After a writer's start: its workspace's next sandbox, made once the command has
        run ``after_s`` or when it ends (``ended``), whichever comes first. A short command
        (most of an agent's) ends and is answered before the making takes the loop; a long
        one has the next sandbox ready long before it ends."""
        if self.after_s <= 0:
            self.prepare_soon(request, tree, mount)
            return
        if self.count <= 0 or request.read_only or self._closed:
            return
        execution_id = request.execution_id

        def prepare() -> None:
            self._after.pop(execution_id, None)
            self.prepare_soon(request, tree, mount)

        timer = asyncio.get_running_loop().call_later(self.after_s, prepare)
        self._after[execution_id] = (timer, prepare)

    def ended(self, execution_id: str) -> None:
        """The execution has ended (its result is written): its workspace's next sandbox,
        if still to be made, is made now, after what the loop has to do for the end."""
        pending = self._after.pop(execution_id, None)
        if pending is not None:
            timer, prepare = pending
            timer.cancel()
            asyncio.get_running_loop().call_soon(prepare)

    def prepare_soon(self, request: StartRequest, tree: Path, mount: Mount | None) -> None:
        """The workspace's next sandbox, made in a task, so no answer waits for it (its
        cgroups, when made, in a worker thread)."""
        workspace_id = request.workspace_id
        if self.count <= 0 or request.read_only or self._sandboxes.waiter is None:
            return
        if self._closed or workspace_id in self._ready or workspace_id in self._making:
            return
        self._making.add(workspace_id)
        task = asyncio.ensure_future(
            self._prepare(workspace_id, request.environment_id, tree, mount)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _prepare(
        self,
        workspace_id: str,
        environment_id: str | None,
        tree: Path,
        mount: Mount | None,
    ) -> None:
        try:
            if self._memory_low():
                self.stats["memory"] += 1
                self.discard_all("memory")
                return
            while self._ready and len(self._ready) >= self.count:
                oldest = min(self._ready.values(), key=lambda w: w.made_at)
                if time.monotonic() - oldest.made_at < self.swap_after_s:
                    self.stats["full"] += 1  # every place is in use: this one starts cold
                    return
                self.discard_workspace(oldest.key.workspace_id, "full")
            warm = await self._spawn(workspace_id, environment_id, tree, mount)
        except Exception as exc:  # the next command starts cold; nothing else is lost
            log.warning("could not make a warm sandbox for %s: %s", workspace_id, exc)
            self.stats["failed"] += 1
            return
        finally:
            self._making.discard(workspace_id)
        if self._closed or workspace_id in self._ready:
            self._discard(warm, "closed")
            return
        networks = self._sandboxes.networks
        alone = networks is not None and not networks.holders(workspace_id) - {warm.sandbox_id}
        if alone and warm.started.network is not None:
            self._discard(warm, "network")  # its network's linger ended meanwhile
            return
        warm.timer = asyncio.get_running_loop().call_later(
            self.idle_s, self._idle, workspace_id, warm
        )
        self._ready[workspace_id] = warm
        self.stats["made"] += 1

    async def _spawn(
        self,
        workspace_id: str,
        environment_id: str | None,
        tree: Path,
        mount: Mount | None,
    ) -> Warm:
        box = self._sandboxes
        assert box.waiter is not None
        self._mounts.hold(workspace_id)  # before the key: it names the overlay's device
        try:
            return await self._spawn_held(workspace_id, environment_id, tree, mount)
        except BaseException:
            self._mounts.let_go(workspace_id)
            raise

    async def _spawn_held(
        self,
        workspace_id: str,
        environment_id: str | None,
        tree: Path,
        mount: Mount | None,
    ) -> Warm:
        box = self._sandboxes
        assert box.waiter is not None
        sandbox_id = f"warm-{secrets.token_hex(8)}"
        directory = self.directory / sandbox_id
        if box.cgroups is not None and await group_reset(box.cgroups, workspace_id):
            self.stats["group_waited"] += 1
        logs: list[int] | None = await _in_thread(make_folder, box.logs, self.directory, directory)
        try:
            # After the hop, as close to the spawn as before: what it is made from now.
            key = self._key(workspace_id, tree, mount)
            self_fd = os.open(box.waiter, os.O_RDONLY | os.O_CLOEXEC)
            try:
                read_fd, write_fd = os.pipe()
            except BaseException:
                os.close(self_fd)
                raise
        except BaseException:
            _close_all(logs or [])
            shutil.rmtree(directory, ignore_errors=True)
            raise
        group = None
        try:
            env = box.base_env(workspace_id, None, mount)
            env["SHELLYARD_SANDBOX_ID"] = sandbox_id
            # R2 tenants: the workspace's group made ahead or used again (ready_groups.py
            # ``take_ready``), so the spawn makes none; none ready: made in its thread
            group = None if box.cgroups is None else box.cgroups.ready.take_ready(workspace_id)
            handed, logs = logs, None  # prepare_bwrap closes them from here on
            pending = box.prepare_bwrap(
                workspace_id=workspace_id,
                sandbox_id=sandbox_id,
                directory=directory,
                tree=tree,
                command=[f"/proc/self/fd/{self_fd}", str(read_fd), str(self_fd)],
                mount=mount,
                env=env,
                extra_fds=(read_fd, self_fd),
                ids=key.ids,  # asked (and the tree and home checked, R2) for the key just now
                group=group,
                logs=handed,
            )
            try:
                # In a worker thread: the loop's thread blocked in vfork until the child had
                # a CPU and exec'd (0.45 ms p50, 5 ms p90 with 16 agents), CPython releasing
                # the GIL meanwhile; and R2 tenants' cgroup mkdirs, when not made ahead, may
                # wait on cgroup_mutex (docs/benchmarks.md §25, §58).
                started = await spawn_in_thread(pending.spawn)
            except BaseException:
                box.abandon(pending)
                raise
            finally:
                pending.close()
        except BaseException:
            os.close(write_fd)
            _close_all(logs or [])
            shutil.rmtree(directory, ignore_errors=True)
            if group is not None and box.cgroups is not None:  # again is harmless (abandon)
                box.cgroups.remove(workspace_id, group)
            raise
        finally:
            os.close(read_fd)
            os.close(self_fd)
        record = {"sandbox_id": sandbox_id, "pid": started.popen.pid}
        # One write into the empty file made ahead, no rename: reap takes a torn or empty
        # warm.json as no record (the waiter has exited on its pipe's end by then; only the
        # folder is left to remove).
        # Taken, the folder is an execution's and this file's inode its meta.json (spawn.py
        # ``record``): one inode fewer made per run.
        write_json_once(directory / WARM_RECORD, json.dumps(record))
        if box.networks is not None and started.network is not None:
            box.networks.ended(workspace_id, sandbox_id)  # a share, not a live execution
        return Warm(sandbox_id, key, directory, started, write_fd, environment_id, group)

    def _memory_low(self) -> bool:
        now = time.monotonic()
        checked, low = self._memory
        if now - checked >= MEMORY_CHECK_S:
            low = memory_low()
            self._memory = (now, low)
        return low

    # ------------------------------------------------------------------ discard

    def limit_ended(self, workspace_id: str) -> None:
        """An execution of the workspace ended at a limit: what was made before goes."""
        self._limit_endings[workspace_id] += 1
        self.discard_workspace(workspace_id, "limit")

    def network_lingered(self, workspace_id: str, holders: set[str]) -> None:
        """The last execution's share of the workspace's network is let go after its
        linger: a warm sandbox holding it beside that one alone goes too, so the namespace
        lives no longer than it did without warm sandboxes (SHELLYARD_NETWORK_LINGER_S)."""
        warm = self._ready.get(workspace_id)
        if warm is not None and len(holders - {warm.sandbox_id}) <= 1:
            self.discard_workspace(workspace_id, "network")

    def discard_workspace(self, workspace_id: str, reason: str) -> None:
        warm = self._ready.pop(workspace_id, None)
        if warm is not None:
            self._discard(warm, reason)

    def discard_environment(self, environment_id: str) -> None:
        """The environment changes (V5): no warm sandbox keeps its old prefix or variables."""
        for workspace_id, warm in list(self._ready.items()):
            if warm.environment_id == environment_id:
                self.discard_workspace(workspace_id, "environment")

    def discard_all(self, reason: str) -> None:
        for workspace_id in list(self._ready):
            self.discard_workspace(workspace_id, reason)

    def _idle(self, workspace_id: str, warm: Warm) -> None:
        if self._ready.get(workspace_id) is warm:
            self.discard_workspace(workspace_id, "idle")

    def _close_pipe(self, warm: Warm) -> None:
        if warm.write_fd is not None:
            with contextlib.suppress(OSError):
                os.close(warm.write_fd)
            warm.write_fd = None

    def _discard(self, warm: Warm, reason: str) -> None:
        """Its pipe closed (the waiter exits, running nothing) and its network share let go;
        its groups and folder once it is gone."""
        self.stats[f"discarded_{reason}"] += 1
        if warm.timer is not None:
            warm.timer.cancel()
        self._close_pipe(warm)
        box = self._sandboxes
        if box.networks is not None and warm.started.network is not None:
            # at once (a namespace counted gone must be); its processes, ending, need no name
            box.networks.release(warm.key.workspace_id, warm.sandbox_id)
        popen = warm.started.popen
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or self._closed:
            self._let_go(warm, reap_popen(popen))
        else:
            task = loop.run_in_executor(None, reap_popen, popen)
            task.add_done_callback(lambda done: self._let_go(warm, done.result()))

    def _let_go(self, warm: Warm, _gone: bool) -> None:
        box = self._sandboxes
        status = processes.read_bwrap_status(warm.directory / "status")
        init = status.get("child-pid")
        if isinstance(init, int):  # the init's own group, should bwrap have lost it
            processes.signal_process(init, signal.SIGKILL)
        if box.cgroups is not None:
            # one it took from those made ahead is made again, for a cold command to come
            ahead = warm.group is not None and not self._closed
            box.cgroups.remove(warm.key.workspace_id, warm.group or warm.sandbox_id, ahead=ahead)
        shutil.rmtree(warm.directory, ignore_errors=True)
        self._mounts.let_go(warm.key.workspace_id)  # R2: gone, it binds them no longer

    async def drain(self) -> None:
        """The runner stops: none is made any more, those being made are done first."""
        self._closed = True
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def close(self) -> None:
        """The runner stops: no warm sandbox outlives it."""
        self._closed = True
        for timer, _prepare in self._after.values():
            timer.cancel()
        self._after.clear()
        self.discard_all("closed")

    def waiting(self) -> dict[str, str]:
        """workspace id → the id of its warm sandbox (for the tests and the status page)."""
        return {ws: warm.sandbox_id for ws, warm in self._ready.items()}


def make_folder(logs: LogRoot, pool: Path, directory: Path) -> list[int]:
    """A warm sandbox's folder with every inode its run will use, made ahead in a worker
    thread: its logs and status (open, returned in ``LOG_NAMES`` order), its ``warm.json``
    and its result's temporary, both empty. Making an inode on this ext4 costs 80–600 µs of
    CPU (it skips inodes freed moments ago, docs/benchmarks.md §36): six of them on the loop
    thread held up the foreground run this preparation overlaps (§46). None left behind if
    one fails."""
    try:  # the pool's folder only the first time (or if removed)
        os.mkdir(directory, 0o700)
    except FileNotFoundError:
        pool.mkdir(mode=0o700, exist_ok=True)
        os.mkdir(directory, 0o700)
    try:
        fds = logs.open_files(directory, LOG_NAMES, LOG_FLAGS, 0o600)
        try:
            for name in (WARM_RECORD, RESULT_TEMPORARY):
                made = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
                os.close(os.open(directory / name, made, 0o600))
        except BaseException:
            _close_all(fds)
            raise
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return fds


async def _in_thread(
    make: Callable[[LogRoot, Path, Path], list[int]], logs: LogRoot, pool: Path, directory: Path
) -> list[int]:
    """``make`` in a worker thread; cancelled meanwhile (the loop stops), what it made
    still goes once it is done."""
    future = asyncio.get_running_loop().run_in_executor(None, make, logs, pool, directory)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:

        def undo(done: asyncio.Future[list[int]]) -> None:
            if not done.cancelled() and done.exception() is None:
                _close_all(done.result())
                shutil.rmtree(directory, ignore_errors=True)

        future.add_done_callback(undo)
        raise


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def reap(directory: Path) -> int:
    """At start-up (E11): what is left of the warm sandboxes of a runner that died. Their
    waiters saw the pipe close and ran nothing; any process still there is killed (by its
    recorded pid, checked against the marker in its environment) and the folders go."""
    if not directory.is_dir():
        return 0
    found = 0
    for folder in directory.iterdir():
        found += 1
        with contextlib.suppress(OSError, ValueError, KeyError):
            record = json.loads((folder / WARM_RECORD).read_text())
            marker = f"SHELLYARD_SANDBOX_ID={record['sandbox_id']}".encode()
            init = processes.read_bwrap_status(folder / "status").get("child-pid")
            for pid in (record["pid"], init):
                if isinstance(pid, int) and _has_marker(pid, marker):
                    processes.signal_process(pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)
    return found


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _spec(env: dict[str, str], cwd: str | None, command: list[str]) -> bytes:
    """What the waiter reads (warm.c): NUL-separated, ending in ``end``."""
    fields = [MAGIC, os.fsencode(inside(cwd)), str(len(env)).encode()]
    fields += [os.fsencode(f"{name}={value}") for name, value in env.items()]
    fields += [str(len(command)).encode(), *(os.fsencode(part) for part in command), b"end"]
    return b"\0".join(fields) + b"\0"


def _write_all(fd: int | None, data: bytes) -> None:
    if fd is None:
        raise OSError("the warm sandbox's pipe is closed")
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]

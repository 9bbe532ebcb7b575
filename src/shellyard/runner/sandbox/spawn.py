"""Spawning one execution's sandbox: its command line, its environment, its files on disk.

The fast durable path: bwrap is spawned detached in its own session with stdout/stderr
opened straight onto log files and ``--json-status-fd`` onto a status file. No pipes and no
per-execution Python process: if this process dies, the sandbox keeps running, logging and
finally records its exit code (``supervise.py`` re-attaches).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from shellyard.contract.executions import check_env
from shellyard.errors import InvalidInput, NotFound, PathRefused
from shellyard.paths import normalize_relative
from shellyard.runner import processes
from shellyard.runner.limits.cgroups import CgroupTree
from shellyard.runner.network.netns import WorkspaceNetworks
from shellyard.runner.policy import ExecutionPolicy, SandboxPolicy
from shellyard.runner.prefix_mounts import Hold, PrefixMounts
from shellyard.runner.protocol import RunnerExecution, StartRequest
from shellyard.runner.sandbox import bwrap as sandbox
from shellyard.runner.sandbox import launch, terminal
from shellyard.runner.sandbox.bwrap import Mount
from shellyard.runner.sandbox.log_root import LogRoot
from shellyard.runner.sandbox.seccomp import SeccompProfile
from shellyard.runner.tool_mounts import ToolMounts

#: E1: a ``bash -c`` text longer than this goes to the sandbox as a file instead of an
#: argument: the kernel refuses any one argument of execve over MAX_ARG_STRLEN (128 KiB,
#: E2BIG), and all of them together over a quarter of the stack limit. Well below both.
LONG_COMMAND_BYTES = 96 << 10
#: What ``bash -c`` runs instead of a long text: the file bwrap made of it (bwrap.py).
SOURCE_COMMAND = f". {sandbox.COMMAND_FILE}"

INTERPRETER_BY_SUFFIX = {".py": ["python3"], ".R": ["Rscript"], ".r": ["Rscript"], ".sh": ["bash"]}


def execution_marker(execution_id: str) -> bytes:
    """What the environment of a cold sandbox's init holds (``kill_and_wait``)."""
    return f"SHELLYARD_EXECUTION_ID={execution_id}".encode()


class SpawnOrder(NamedTuple):
    """One execution's sandbox to start, as ``Supervisor.launch`` hands it on to a warm
    sandbox (warm.py ``take``) or a cold spawn (``Sandboxes.prepare_cold``). A named tuple
    (as ``Mount``), not a frozen dataclass: made once per command, on the start's path, in a
    third of the time (~0.4 µs against ~1.1 µs measured)."""

    request: StartRequest
    #: its folder: made by a cold spawn, a warm sandbox's renamed to it
    directory: Path
    #: the tree it runs on: the workspace's, or a reader's committed view (W2)
    tree: Path
    command: list[str]
    #: the environment's prefix it mounts (V4), if any
    mount: Mount | None


@dataclass
class LiveExecution:
    """What this process knows about one execution it watches."""

    workspace_id: str
    directory: Path
    pid: int
    start_time: int
    started_at: float
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result: RunnerExecution | None = None
    popen: subprocess.Popen[bytes] | None = None
    pidfd: int | None = None
    cancel_task: asyncio.Task[None] | None = None
    #: The managed environment mounted into the sandbox (V4), if any.
    environment_id: str | None = None
    #: The policy it was started under (None for a record of an older runner).
    policy: ExecutionPolicy | None = None
    #: W2: a reader beside the writer: no writer held, no commit at the end.
    read_only: bool = False
    #: R2: it joined its workspace's shared network namespace (netns.py).
    shared_network: bool = False
    #: A cancel was asked here (its ``cancel`` file may be missing on a full volume).
    cancel_requested: bool = False
    #: A warm sandbox's own id (warm.py): its cgroups and its init's marker are named by it.
    sandbox_id: str | None = None
    #: R2: the name of its cgroups when they were made ahead (ready_groups.py ``take_ready``).
    cgroup: str | None = None
    #: E13: its input's holder: "tty" (a terminal), "pipe" (stdin only), or None.
    interactive: str | None = None

    def marker(self, execution_id: str) -> bytes:
        """What the environment of the sandbox's init holds (``kill_and_wait``)."""
        if self.sandbox_id is not None:
            return f"SHELLYARD_SANDBOX_ID={self.sandbox_id}".encode()
        return execution_marker(execution_id)

    def group(self, execution_id: str) -> str:
        """The name of its cgroups below its workspace's (cgroups.py)."""
        return self.cgroup or self.sandbox_id or execution_id


def write_json_atomic(path: Path, data: str, spare: Path | None = None) -> None:
    """``path`` replaced by ``data``, mode 0600 (an execution's records are the service's).

    ``spare``: a file of the same folder that no reader looks at any more, written over and
    renamed instead of a new ``.tmp`` (no inode made, docs/benchmarks.md §36)."""
    # Still a temporary file and a rename: meta.json and result.json are read after a crash
    # (E11 re-attach, a retried start) and must be whole or absent; written with os.write
    # on bytes, not through a text file object (the per-execution profile,
    # docs/benchmarks.md "Spawn bookkeeping").
    name = os.fspath(path)
    tmp = name + ".tmp" if spare is None else os.fspath(spare)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        _write_fully(fd, data.encode())
    finally:
        os.close(fd)
    os.replace(tmp, name)


#: A warm sandbox's record in its folder (warm.py): its bwrap's pid, for ``warm.reap``.
WARM_RECORD = "warm.json"
#: ``write_json_atomic``'s temporary for result.json: a warm folder has it made ahead, empty
#: (warm.py ``make_folder``), so the result's write at the end makes no inode.
RESULT_TEMPORARY = "result.json.tmp"
#: The files a sandbox inherits: its logs and bwrap's status (``prepare_bwrap``).
LOG_NAMES = ("stdout", "stderr", "status")
LOG_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC


def write_json_once(path: Path, data: str) -> None:
    """``path``, a file made empty ahead (warm.py ``make_folder``), given ``data`` in one
    write, no rename: for a record whose reader takes a missing, empty or torn file as no
    record at all (a warm sandbox's warm.json: ``warm.reap`` then removes the folder, and the
    waiter has exited on its pipe's end). Never makes the file: absent, it raises."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        _write_fully(fd, data.encode())
    finally:
        os.close(fd)


def _write_fully(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@dataclass
class Sandboxes:
    """Everything a spawn needs that is fixed for the runner's life: found and built once in
    ``startup`` (bwrap, the host view, the seccomp filter), so a spawn only fills in argv."""

    policy: SandboxPolicy
    ids: tuple[int, int] | None
    bwrap: str
    view: sandbox.HostView
    seccomp: SeccompProfile
    disable_userns: bool
    egress_socket: Path | None = None
    socat: str | None = None
    #: R2: one network namespace per workspace, when this runner can (netns.py).
    networks: WorkspaceNetworks | None = None
    #: What enters the network, drops privileges and sets limits in one exec (launch.py);
    #: None: the nsenter/setpriv/prlimit chain.
    launcher: Path | None = None
    #: What a warm sandbox runs first, waiting for its command (warm.c); None: no warm ones.
    waiter: Path | None = None
    #: R2 tenants: the execution's cgroups inside its workspace's (cgroups.py); None: rlimits.
    cgroups: CgroupTree | None = None
    #: R2 tenants: the uid and gid of a workspace (tenants.py); None: ``ids`` for all.
    workspace_ids: Callable[[str], tuple[int, int]] | None = None
    #: The workspace's home folder, made on first use (local.py); None: HOME is /workspace.
    home_of: Callable[[str], Path] | None = None
    #: R2: the logs a sandbox inherits, opened through one detached copy of the runner's
    #: root (log_root.py); without a root, a copy per spawn.
    logs: LogRoot = field(default_factory=LogRoot)
    #: R2: the prefixes' overlays bound instead of the prefixes (prefix_mounts.py); None: the
    #: prefixes themselves
    prefixes: PrefixMounts | None = None
    #: R2: a package tool's prefix, cache and scratch bound as writable overlays of their
    #: own (tool_mounts.py); None: the folders themselves
    tool_mounts: ToolMounts | None = None
    #: Non-interactive sandboxes run SCHED_BATCH (SHELLYARD_SANDBOX_SCHED, launch.py)
    batch: bool = field(default_factory=launch.configured_batch)
    #: The runner's folder, for the launcher to unmount what other workspaces mounted below
    #: it before bwrap copies the table (launch.c ``--detach``, bwrap.py ``Detach``); None:
    #: the chain, or a kernel that refused the probe.
    detach: sandbox.Detach | None = None

    def ids_of(self, workspace_id: str) -> tuple[int, int] | None:
        """The host uid and gid the workspace's commands run as (None: this user's)."""
        if self.ids is None or self.workspace_ids is None:
            return self.ids
        return self.workspace_ids(workspace_id)

    def execution_policy(self) -> ExecutionPolicy:
        network = self.policy.network
        digest = self.policy.egress_digest() if network == "egress" else None
        return ExecutionPolicy(
            network=network, egress_digest=digest, seccomp_profile=self.seccomp.version
        )

    def command_env(self, request: StartRequest, mount: Mount | None) -> dict[str, str]:
        """E1: the environment a command starts with (bwrap's ``--setenv`` of the caller's
        variables last); a warm sandbox's waiter sets exactly this (warm.py)."""
        env = self.base_env(request.workspace_id, request.cwd, mount)
        return {**env, "SHELLYARD_EXECUTION_ID": request.execution_id, **request.env}

    def base_env(self, workspace_id: str, cwd: str | None, mount: Mount | None) -> dict[str, str]:
        return sandbox.sandbox_env(
            sandbox.WORKSPACE,
            {
                **(sandbox.home_variables() if self.home_of is not None else {}),
                "PWD": inside(cwd),
                **sandbox.proxy_variables(self.policy.network),
                **environment_variables(mount),
                "SHELLYARD_WORKSPACE_ID": workspace_id,
            },
        )

    def prepare_cold(self, order: SpawnOrder) -> ColdSpawn:
        """An execution's own sandbox (no warm one), all but the spawn: what touches the
        runner's shared state (networks, cgroups, prefixes' holds) is done here, on the loop;
        ``ColdSpawn.run`` then touches none of it (a worker thread's, supervise.py). The
        caller ``close``s it, and ``abandon``s its ``pending`` if it never spawned."""
        request, directory, command = order.request, order.directory, order.command
        command_fd = None
        if len(command) == 3 and command[:2] == ["bash", "-c"]:
            text = command[2].encode("utf-8", "surrogateescape")
            if len(text) > LONG_COMMAND_BYTES:
                # Kept beside the logs (what ran); bwrap copies it into the sandbox.
                (directory / "command").write_bytes(text)
                command_fd = os.open(directory / "command", os.O_RDONLY | os.O_CLOEXEC)
                command = ["bash", "-c", SOURCE_COMMAND]
        channel = None
        try:
            if request.interactive:  # E13: a FIFO, a terminal or pipe, a holder (terminal.py)
                channel = terminal.open_channel(
                    directory, request.tty, request.tty_rows, request.tty_cols
                )
                if request.tty:
                    command = terminal.in_terminal(command)
            env = self.base_env(request.workspace_id, request.cwd, order.mount)
            env["SHELLYARD_EXECUTION_ID"] = request.execution_id
            # R2: groups made ahead by the removal thread, so no mkdir waits on cgroup_mutex
            # here (docs/benchmarks.md §25); None: made in ``PendingSpawn.spawn``
            group = (
                None
                if self.cgroups is None
                else self.cgroups.ready.take_ready(request.workspace_id)
            )
            pending = self.prepare_bwrap(
                group=group,
                workspace_id=request.workspace_id,
                sandbox_id=request.execution_id,
                directory=directory,
                tree=order.tree,
                command=command,
                mount=order.mount,
                env=env,
                read_only=request.read_only,
                chdir=inside(request.cwd),
                setenv=request.env,
                command_fd=command_fd,
                # E13: one someone types into keeps the kernel's default (docs/decisions.md)
                batch=not request.interactive,
            )
        except BaseException:
            if command_fd is not None:
                os.close(command_fd)
            if channel is not None:
                channel.close()
            raise
        if channel is not None:
            pending.stdin = channel.stdin
            if channel.stdout is not None:
                pending.terminal_out = channel.stdout
        return ColdSpawn(request, directory, pending, channel, command_fd, group)

    def spawned(self, cold: ColdSpawn, started: Started) -> LiveExecution:
        """On the loop, after ``cold.run``: meta.json written (E11), the execution known."""
        return self.record(
            cold.request,
            cold.directory,
            started,
            interactive=cold.channel.mode if cold.channel else None,
            cgroup=cold.group,
        )

    def prepare_bwrap(
        self,
        *,
        workspace_id: str,
        sandbox_id: str,
        directory: Path,
        tree: Path,
        command: list[str],
        mount: Mount | None,
        env: dict[str, str],
        read_only: bool = False,
        chdir: str = sandbox.WORKSPACE,
        setenv: dict[str, str] | None = None,
        command_fd: int | None = None,
        extra_fds: tuple[int, ...] = (),
        group: str | None = None,
        ids: tuple[int, int] | None = None,
        logs: Sequence[int] | None = None,
        batch: bool = True,
    ) -> PendingSpawn:
        """Everything of a spawn but the spawn itself (which touches no shared state, so a
        warm sandbox's runs in a worker thread, warm_spawn.py): its logs and status
        opened in ``directory``, the network share and cgroups taken under ``sandbox_id``
        (an execution's id, or a warm sandbox's own, warm.py; the cgroups under ``group``
        when made ahead), the command line built. ``ids``: the workspace's uid and gid as
        this same spawn already asked them (``ids_of``, with its R2 checks of the tree and
        home; the warm pool's key), not asked again. ``logs``: the three of ``LOG_NAMES``
        already open (a warm folder's, made in a worker thread), owned from here on.
        ``batch``: SCHED_BATCH if the runner's sandboxes are (``Sandboxes.batch``)."""
        # R2: opened through the runner's detached copy of its root, so the sandbox's
        # /proc/self/fd/1 reads "/executions/ex_…/stdout", not the home's path (log_root.py)
        if logs is None:
            logs = self.logs.open_files(directory, LOG_NAMES, LOG_FLAGS, 0o600)
        out_fd, err_fd, status_fd = logs
        try:
            seccomp_fd = self.seccomp.open()
        except BaseException:
            for fd in logs:
                os.close(fd)
            raise
        pending = PendingSpawn(workspace_id, sandbox_id, [], env, out_fd, err_fd, [status_fd])
        pending.owned.append(seccomp_fd)
        networks = self.networks
        home = None if self.home_of is None else self.home_of(workspace_id)
        try:
            if networks is not None:
                pending.network = networks.acquire(workspace_id, sandbox_id)
                # R2: entered by these descriptors, checked now; the path could name
                # another namespace by the launcher's turn (a holder dead, its pid reused)
                fds = networks.open(workspace_id, pending.network)
                pending.owned += [fd for fd in fds if fd is not None]
                pending.network_fds = fds
            if self.cgroups is not None:  # made by ``spawn`` (a warm one's: in its thread)
                pending.group = group or sandbox_id
                pending.joins = self.cgroups.plan(workspace_id, pending.group)
                pending.groups = None if group else self.cgroups  # made ahead: made
            argv = sandbox.bwrap_argv(
                bwrap=self.bwrap,
                policy=self.policy,
                ids=ids if ids is not None else self.ids_of(workspace_id),
                view=self.view,
                hardening=sandbox.Hardening(seccomp_fd, self.disable_userns),
                workspace=tree,
                status_fd=status_fd,
                command=command,
                read_only_binds=self._prefix_binds(pending, mount),
                egress_socket=self.egress_socket,
                socat=self.socat,
                workspace_read_only=read_only,
                network=pending.network,
                network_fds=pending.network_fds,
                launcher=self.launcher,
                detach=self.detach,
                clean_fd=lambda keeps: self._clean_descriptor(pending, keeps),
                command_fd=command_fd,
                cgroups=pending.joins,
                uid_per_workspace=self.workspace_ids is not None,
                chdir=chdir,
                setenv=setenv,
                home=home,
                batch=batch and self.batch,
            )
            pending.argv, args_fd = sandbox.options_by_fd(argv, self.bwrap)
            pending.owned.append(args_fd)
        except BaseException:
            self.abandon(pending)
            pending.close()
            raise
        pending.inherited = (
            *pending.owned,
            *self.view.fds,
            *([command_fd] if command_fd else []),
            *extra_fds,
        )
        pending.join_after = bool(pending.joins) and self.launcher is None
        pending.batch_after = batch and self.batch and self.launcher is None
        return pending

    def _clean_descriptor(self, pending: PendingSpawn, keeps: Sequence[str]) -> int | None:
        """The runner's clean namespace for this spawn binding from ``keeps``, when busy
        enough and it covers them (clean_namespace.py): a descriptor ``pending`` owns. Made
        only for a spawn that passes it on as ``--clean-fd``, which the launcher closes: one
        inherited without it reached the command (attack pass, session 56)."""
        fd = None if self.detach is None else self.detach.clean_descriptor(keeps)
        if fd is not None:
            pending.owned.append(fd)
        return fd

    def _prefix_binds(self, pending: PendingSpawn, mount: Mount | None) -> list[tuple[Path, Path]]:
        """V4: the prefix (and a base's companion) to bind read-only where its files say it
        is; on a root runner an overlay of each instead, held for ``pending`` (R2: no host
        path in the sandbox's mountinfo, prefix_mounts.py)."""
        binds = [] if mount is None else [(mount.prefix, mount.seen), *mount.also]
        if not binds or self.prefixes is None:
            return binds
        binds, pending.prefixes = self.prefixes.hold(binds)
        return binds

    def abandon(self, pending: PendingSpawn) -> None:
        """A spawn that did not happen lets go of what ``prepare_bwrap`` took."""
        if self.networks is not None and pending.network is not None:
            # its descriptors, opened by the namespace file's path, keep that mount busy:
            # the last release's umount failed (EBUSY) and left it for ever
            pending.close_network()
            self.networks.release(pending.workspace_id, pending.sandbox_id)
        if self.cgroups is not None and pending.joins:
            self.cgroups.remove(pending.workspace_id, pending.group or pending.sandbox_id)

    def record(
        self,
        request: StartRequest,
        directory: Path,
        started: Started,
        sandbox_id: str | None = None,
        interactive: str | None = None,
        cgroup: str | None = None,
    ) -> LiveExecution:
        """meta.json written (what a restart re-attaches to, E11), the execution known."""
        policy = self.execution_policy()
        popen, shared = started.popen, started.network is not None
        meta = {
            "execution_id": request.execution_id,
            "workspace_id": request.workspace_id,
            "pid": popen.pid,
            "start_time": started.start_time,
            "started_at": started.started_at,
            "environment_id": request.environment_id,
            "policy": policy.model_dump(),
            "read_only": request.read_only,
            "shared_network": shared,
            "interactive": interactive,
            **({"sandbox_id": sandbox_id} if sandbox_id else {}),
            **({"cgroup": cgroup} if cgroup else {}),
        }
        # A warm sandbox's warm.json is read only in the warm folder (``warm.reap``); the
        # folder is the execution's by now (warm.py ``take``): its inode becomes meta.json.
        spare = None if sandbox_id is None else directory / WARM_RECORD
        try:
            write_json_atomic(directory / "meta.json", json.dumps(meta), spare)
        except OSError:
            # No record of it on disk (a full volume): it must not run unwatched.
            processes.signal_group(popen.pid, signal.SIGKILL)
            popen.wait()
            if self.networks is not None and shared:
                self.networks.release(request.workspace_id, request.execution_id)
            raise
        return LiveExecution(
            workspace_id=request.workspace_id,
            directory=directory,
            pid=popen.pid,
            start_time=started.start_time,
            started_at=started.started_at,
            popen=popen,
            environment_id=request.environment_id,
            policy=policy,
            read_only=request.read_only,
            shared_network=shared,
            sandbox_id=sandbox_id,
            interactive=interactive,
            cgroup=cgroup,
        )


@dataclass
class PendingSpawn:
    """A bwrap about to be spawned (``Sandboxes.prepare_bwrap``); ``close`` once spawned."""

    workspace_id: str
    sandbox_id: str
    argv: list[str]
    env: dict[str, str]
    out_fd: int
    err_fd: int
    #: descriptors opened for this spawn alone (status, seccomp, bwrap's options)
    owned: list[int]
    inherited: tuple[int, ...] = ()
    network: Path | None = None
    #: its namespaces as descriptors (user or None, net), in ``owned`` (netns.py ``open``)
    network_fds: tuple[int | None, int] | None = None
    joins: list[str] = field(default_factory=list)
    #: R2 tenants: the name of the groups of ``joins`` (``sandbox_id`` unless made ahead)
    group: str | None = None
    #: R2 tenants: where ``joins`` are made, first thing in ``spawn``
    groups: CgroupTree | None = None
    #: the chain's way into the cgroups (no launcher): written after the spawn
    join_after: bool = False
    #: the chain's way to SCHED_BATCH (no launcher): set after the spawn (launch.py)
    batch_after: bool = False
    #: E13: an interactive execution's stdin (its holder's pipe or the terminal) and the
    #: terminal it writes to (a tty's output is the terminal's, its holder logs it)
    stdin: int | None = None
    terminal_out: int | None = None
    #: R2: the prefixes' overlays it binds, held until its process exits (prefix_mounts.py)
    prefixes: Hold | None = None

    def spawn(self) -> Started:
        if self.groups is not None:  # before the launcher joins them (R2)
            self.groups.make(self.workspace_id, self.sandbox_id)
        started_at = time.time()
        popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL if self.stdin is None else self.stdin,
            stdout=self.out_fd if self.terminal_out is None else self.terminal_out,
            stderr=self.err_fd if self.terminal_out is None else self.terminal_out,
            pass_fds=self.inherited,
            env=self.env,
            cwd="/",
            start_new_session=True,
        )
        if self.prefixes is not None:  # kept until bwrap (set up by then) exits
            self.prefixes.attach(popen.pid)
        if self.join_after:
            launch.join(self.joins, popen.pid)
        if self.batch_after:
            launch.batch_after(popen.pid)
        return Started(popen, processes.start_time(popen.pid) or 0, started_at, self.network)

    def close_network(self) -> None:
        """Close its namespace descriptors now (the spawn is over or never happened)."""
        for fd in self.network_fds or ():
            if fd is not None and fd in self.owned:
                self.owned.remove(fd)
                os.close(fd)
        self.network_fds = None

    def close(self) -> None:
        if self.prefixes is not None:  # never spawned: let go
            self.prefixes.close()
        for fd in (self.out_fd, self.err_fd, *self.owned):
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass
class ColdSpawn:
    """An execution's own sandbox ready to spawn (``Sandboxes.prepare_cold``)."""

    request: StartRequest
    directory: Path
    pending: PendingSpawn
    #: E13: an interactive one's terminal or pipe, handed to its holder after the spawn
    channel: terminal.Channel | None
    #: a long command's file (``LONG_COMMAND_BYTES``), inherited by bwrap
    command_fd: int | None
    #: R2 tenants: its cgroups' name when they were made ahead (``take_ready``)
    group: str | None

    def run(self) -> Started:
        """The spawn (and an interactive one's holder): no state of the runner is touched,
        so it may run in a worker thread (supervise.py)."""
        started = self.pending.spawn()
        if self.channel is not None:
            terminal.start_holder(self.directory, self.channel, started.popen.pid)
        return started

    def close(self) -> None:
        """The descriptors the spawn handed over (bwrap has its copies by now)."""
        try:
            self.pending.close()
        finally:
            if self.command_fd is not None:
                os.close(self.command_fd)
                self.command_fd = None
            if self.channel is not None:
                self.channel.close()


@dataclass(frozen=True)
class Started:
    """A bwrap just spawned: its process, its start time (pid reuse), the network joined."""

    popen: subprocess.Popen[bytes]
    start_time: int
    started_at: float
    network: Path | None


def script_argv(tree: Path, script_path: str) -> list[str]:
    """E1: run a workspace file by its shebang, else by its extension; named by its path
    inside the sandbox (under /workspace)."""
    relative = normalize_relative(script_path)
    if not relative:
        raise InvalidInput("script_path names the workspace root; give a file inside it")
    current = tree
    for part in relative.split("/"):
        current = current / part
        if current.is_symlink():
            raise PathRefused(
                f"script_path {script_path!r} crosses a symbolic link; give the real path"
            )
    if not current.is_file():
        raise NotFound(f"script {script_path!r} does not exist in /workspace")
    inside = f"{sandbox.WORKSPACE}/{relative}"
    with current.open("rb") as handle:
        first = handle.readline(512)
    if first.startswith(b"#!"):
        return [*shlex.split(first[2:].decode("utf-8", "replace").strip()), inside]
    interpreter = INTERPRETER_BY_SUFFIX.get(current.suffix, ["bash"])
    return [*interpreter, inside]


def inside(cwd: str | None) -> str:
    """E1 ``cwd`` (normalised by the control plane) as the sandbox sees it."""
    return f"{sandbox.WORKSPACE}/{cwd}" if cwd else sandbox.WORKSPACE


def check_start(tree: Path, request: StartRequest) -> None:
    """E1: ``env`` names none of the sandbox's own, ``cwd`` is a folder of the workspace
    reached through no link; refused before anything runs (a daemon checks them too)."""
    try:
        check_env(request.env)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    if not request.cwd:
        return
    relative = normalize_relative(request.cwd)
    current = tree
    for part in relative.split("/"):
        current = current / part
        if current.is_symlink():
            raise PathRefused(f"cwd {request.cwd!r} crosses a symbolic link; give the real path")
    if not current.is_dir():
        raise NotFound(
            f"cwd {request.cwd!r} is not a folder of /workspace when the command starts; "
            "create it first (e.g. mkdir -p in an earlier command) or check the path"
        )


def environment_variables(mount: Mount | None) -> dict[str, str]:
    """The environment's variables for the sandbox (V4): its PATH entries go first."""
    if mount is None:
        return {}
    variables = dict(mount.variables)
    variables["PATH"] = f"{variables['PATH']}:{sandbox.SANDBOX_PATH}"
    return variables


def bwrap_error(directory: Path, returncode: int, started: bool = False) -> str | None:
    """bwrap exited without starting the command: its own message is on stderr. None when
    its monitor was killed by a signal once the sandbox was made (``started``: its status
    names the namespace's init): bwrap's own failures exit 1, so the command may have run,
    and how it ended was never recorded (E9: the runner lost it, not "could not start")."""
    if returncode < 0 and started:
        return None
    try:
        with (directory / "stderr").open("rb") as handle:
            message = handle.read(2000).decode("utf-8", "replace").strip()
    except OSError:
        message = ""
    return f"the sandbox could not start (bwrap exit {returncode}): {message or 'no message'}"

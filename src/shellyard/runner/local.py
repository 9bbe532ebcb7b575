"""LocalRunner: runs executions in bubblewrap sandboxes on this host (R1, R2, E7, E8, E11).

The fast durable path (DESIGN.md "How an execution runs"): bwrap is spawned detached in its
own session with stdout/stderr opened straight onto log files and ``--json-status-fd`` onto a
status file. No pipes and no per-execution Python process: if this process dies, the sandbox
keeps running, logging and finally records its exit code; ``startup()`` re-attaches.

On disk, under ``root``::

    workspaces/<workspace_id>/      the live tree, owned by the sandbox uid
    executions/<execution_id>/      meta.json, stdout, stderr, status, cancel, result.json
    snapshots/                      SnapshotStore (content-addressed objects + manifests)
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import queue
import shlex
import signal
import stat
import subprocess
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shellyard import __version__
from shellyard.errors import (
    InvalidInput,
    NotFound,
    OutOfRoom,
    PathRefused,
    SandboxUnavailable,
    WorkspaceBusy,
)
from shellyard.paths import normalize_relative
from shellyard.runner import history, objects, processes, sandbox
from shellyard.runner.edits import Editor
from shellyard.runner.environments import EnvironmentStore
from shellyard.runner.guard import Guard as LimitsGuard  # limits (issue 12)
from shellyard.runner.logcap import read as read_capped_log  # limits (issue 12)
from shellyard.runner.objects import PackImporter, StoreLock, aiter_thread
from shellyard.runner.protocol import (
    MAX_READ_CHUNK,
    ApplyEntry,
    ApplyResult,
    ByteStream,
    DiffResult,
    DirListing,
    EditResult,
    EnvironmentChange,
    EnvironmentChangeRequest,
    EnvironmentInfo,
    FileChunk,
    GcResult,
    LogChunk,
    LogStream,
    ObjectResult,
    PathEntry,
    PruneResult,
    RunnerExecState,
    RunnerExecution,
    RunnerInfo,
    SandboxPolicy,
    SnapshotInfo,
    StartRequest,
)
from shellyard.runner.snapshots import SnapshotStore
from shellyard.runner.space import require_room  # limits (issue 12)

log = logging.getLogger(__name__)

INTERPRETER_BY_SUFFIX = {".py": ["python3"], ".R": ["Rscript"], ".r": ["Rscript"], ".sh": ["bash"]}


@dataclass
class _Live:
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


def _write_json_atomic(path: Path, data: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(data)
    os.replace(tmp, path)


class LocalRunner:
    """The Runner protocol on this host. Call ``startup()`` before use, ``aclose()`` after."""

    def __init__(
        self,
        root: Path,
        policy: SandboxPolicy | None = None,
        *,
        hidden: list[Path] | None = None,
    ) -> None:
        self.root = root.absolute()
        self.policy = policy or SandboxPolicy()
        self._workspaces = self.root / "workspaces"
        self._executions = self.root / "executions"
        self._snapshots = SnapshotStore(self.root / "snapshots")
        self._store_lock = StoreLock(self.root / "snapshots")
        self._editor = Editor(
            self._snapshots,
            self._store_lock,
            self.root / "staging",
            sandbox.sandbox_ids(self.policy),
            self.workspace_path,
        )
        #: Workspaces in the middle of a file operation (write, move, restore, batch, ...).
        self._editing: set[str] = set()
        self._hidden = [self.root, *(hidden or [])]
        self._ids = sandbox.sandbox_ids(self.policy)
        self._live: dict[str, _Live] = {}
        self._busy_workspaces: dict[str, str] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._bwrap = ""
        #: environment id → running executions that mount it (a change waits for none, V5)
        self._environment_users: dict[str, set[str]] = {}
        self._environments = EnvironmentStore(
            self.root / "environments",
            self.policy,
            hidden=self._hidden,
            users=lambda env_id: sorted(self._environment_users.get(env_id, ())),
        )
        # limits (issue 12): workspace quota and log cap while commands run (guard.py)
        self._guard = LimitsGuard(self.root, self.policy, self._snapshots.head)

    # ----------------------------------------------------------------- lifecycle

    async def startup(self) -> None:
        self._bwrap = sandbox.find_bwrap()
        for directory in (self.root, self._workspaces, self._executions):
            directory.mkdir(parents=True, exist_ok=True)
            # Traversable but not listable: bwrap, already running as the sandbox uid,
            # must reach the workspace to bind it; nothing inside can list the others.
            directory.chmod(0o711)
        self._check_traversable(self._workspaces)
        await asyncio.to_thread(self._editor.startup)
        await self._environments.startup(self._bwrap)
        await self._recover()

    def _check_traversable(self, directory: Path) -> None:
        if self._ids is None:
            return
        for ancestor in [directory, *directory.parents]:
            mode = ancestor.stat().st_mode
            if not mode & stat.S_IXOTH:
                raise SandboxUnavailable(
                    f"the sandbox user (uid {self._ids[0]}) cannot reach {directory}: "
                    f"{ancestor} is not searchable by others (mode {oct(mode & 0o777)}). "
                    f"Choose a SHELLYARD_HOME outside it (as root the default is "
                    f"/var/lib/shellyard) or run 'chmod o+x {ancestor}'"
                )

    async def aclose(self) -> None:
        """Stop watching; the sandboxes themselves keep running (E11)."""
        loop = asyncio.get_running_loop()
        for live in self._live.values():
            if live.pidfd is not None:
                loop.remove_reader(live.pidfd)
                os.close(live.pidfd)
                live.pidfd = None
            if live.cancel_task is not None:
                live.cancel_task.cancel()
        for task in list(self._tasks):
            task.cancel()
        self._live.clear()
        await self._guard.aclose()  # limits (issue 12)
        await self._environments.aclose()
        self._editor.close()
        await asyncio.to_thread(self._snapshots.close)

    async def info(self) -> RunnerInfo:
        uid = self._ids[0] if self._ids else os.geteuid()
        return RunnerInfo(
            runner_version=__version__,
            sandbox="bubblewrap",
            network=self.policy.network,
            sandbox_uid=uid,
            limits=self._guard.limits_view(),  # limits (issue 12)
        )

    # ----------------------------------------------------------------- workspaces

    def workspace_path(self, workspace_id: str) -> Path:
        _check_id(workspace_id, "workspace id")
        return self._workspaces / workspace_id

    async def ensure_workspace(self, workspace_id: str) -> SnapshotInfo:
        tree = self.workspace_path(workspace_id)
        if not tree.exists():
            tree.mkdir(mode=0o700)
            if self._ids is not None:
                os.chown(tree, *self._ids)
        return await asyncio.to_thread(self._snapshots.ensure_workspace, workspace_id)

    async def commit(self, workspace_id: str) -> SnapshotInfo:
        if workspace_id in self._busy_workspaces:
            raise WorkspaceBusy(
                f"workspace {workspace_id} is in use by execution "
                f"{self._busy_workspaces[workspace_id]}; its snapshot is committed when it ends",
                holder=self._busy_workspaces[workspace_id],
            )
        return await self._commit(workspace_id)

    async def _commit(self, workspace_id: str) -> SnapshotInfo:
        # under the store's shared lock: a garbage collection never runs mid-commit
        return await asyncio.to_thread(self._editor.commit, workspace_id)

    async def head(self, workspace_id: str) -> SnapshotInfo:
        self._require_workspace(workspace_id)
        return await asyncio.to_thread(self._snapshots.head, workspace_id)

    async def stat_path(self, workspace_id: str, seq: int | None, path: str) -> PathEntry | None:
        self._require_workspace(workspace_id)
        return await asyncio.to_thread(history.stat, self._snapshots, workspace_id, seq, path)

    async def read_file(
        self, workspace_id: str, seq: int | None, path: str, offset: int, limit: int
    ) -> FileChunk:
        self._require_workspace(workspace_id)
        return await asyncio.to_thread(self._snapshots.read, workspace_id, seq, path, offset, limit)

    def _require_workspace(self, workspace_id: str) -> None:
        if not self.workspace_path(workspace_id).is_dir():
            raise NotFound(f"workspace {workspace_id} does not exist on this runner")

    # ----------------------------------------------------------------- files and history
    # Reads come from committed snapshots only (W2); writer operations end with a commit
    # (W1, W3). The logic lives in history.py, edits.py and objects.py.

    async def list_snapshots(self, workspace_id: str) -> list[SnapshotInfo]:
        self._require_workspace(workspace_id)
        return await asyncio.to_thread(self._snapshots.list_snapshots, workspace_id)

    async def list_dir(
        self,
        workspace_id: str,
        seq: int | None,
        path: str,
        recursive: bool,
        after: str | None,
        limit: int,
    ) -> DirListing:
        self._require_workspace(workspace_id)
        return await asyncio.to_thread(
            history.list_dir, self._snapshots, workspace_id, seq, path, recursive, after, limit
        )

    async def diff(
        self,
        workspace_id: str,
        from_seq: int,
        to_seq: int | None,
        path: str,
        after: str | None,
        limit: int,
    ) -> DiffResult:
        self._require_workspace(workspace_id)
        return await asyncio.to_thread(
            history.diff, self._snapshots, workspace_id, from_seq, to_seq, path, after, limit
        )

    async def read_stream(
        self, workspace_id: str, seq: int | None, path: str, offset: int, length: int | None
    ) -> ByteStream:
        self._require_workspace(workspace_id)
        if offset < 0 or (length is not None and length < 0):
            raise InvalidInput(f"offset ({offset}) and length ({length}) must be zero or more")
        handle, entry = await asyncio.to_thread(
            history.open_file, self._snapshots, workspace_id, seq, path
        )
        start = min(offset, entry.size)
        end = entry.size if length is None else min(entry.size, start + length)
        return aiter_thread(history.read_chunks(handle, start, end))

    async def export_tar(self, workspace_id: str, seq: int | None, path: str) -> ByteStream:
        self._require_workspace(workspace_id)

        def check() -> int:
            m = history.manifest(self._snapshots, workspace_id, seq)
            history.lookup(m, path)
            return m.info.seq

        fixed = await asyncio.to_thread(check)
        return aiter_thread(history.tar_chunks(self._snapshots, workspace_id, fixed, path))

    @contextlib.asynccontextmanager
    async def _writing(self, workspace_id: str, frees: bool = False) -> AsyncIterator[None]:
        """One writer operation at a time on the workspace, never beside an execution."""
        self._require_workspace(workspace_id)
        if not frees:  # limits (issue 12): a delete may run below the reserve, it frees space
            require_room(self.root, self.policy, f"a change to workspace {workspace_id}")
        self._guard.forget(workspace_id)  # limits (issue 12): its usage must be measured again
        holder = self._busy_workspaces.get(workspace_id)
        if holder is not None:
            raise WorkspaceBusy(
                f"workspace {workspace_id} is in use by execution {holder}; its files change "
                f"only when it ends",
                holder=holder,
            )
        if workspace_id in self._editing:
            raise WorkspaceBusy(
                f"workspace {workspace_id} is in the middle of another file operation",
                holder="file operation",
            )
        self._editing.add(workspace_id)
        try:
            yield
        except FileNotFoundError as exc:
            # the live tree changed under the operation (nothing but a writer should touch it)
            raise NotFound(
                f"a file or folder of workspace {workspace_id} vanished during the operation "
                f"({exc.strerror}: {exc.filename!r}); nothing was written outside it; try again"
            ) from None
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise OutOfRoom(
                    f"workspace {workspace_id}'s filesystem is out of room ({exc.strerror}); "
                    f"free space or write less"
                ) from None
            raise
        finally:
            self._editing.discard(workspace_id)

    async def write_file(
        self, workspace_id: str, path: str, data: ByteStream, mode: int | None
    ) -> EditResult:
        async with self._writing(workspace_id):
            upload = await asyncio.to_thread(self._editor.begin_write, workspace_id, path, mode)
            try:
                async for chunk in _coalesce(data):
                    await asyncio.to_thread(upload.write, chunk)
            except BaseException:
                await asyncio.to_thread(upload.abort)
                raise
            return await asyncio.to_thread(upload.finish)

    async def write_tar(self, workspace_id: str, path: str, data: ByteStream) -> EditResult:
        async with self._writing(workspace_id):
            chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=8)
            unpacking = asyncio.ensure_future(
                asyncio.to_thread(self._editor.unpack, workspace_id, path, chunks)
            )
            try:
                async for chunk in _coalesce(data):
                    await asyncio.to_thread(chunks.put, chunk)
            finally:
                await asyncio.to_thread(chunks.put, None)
            return await unpacking

    async def delete_path(self, workspace_id: str, path: str, recursive: bool) -> EditResult:
        async with self._writing(workspace_id, frees=True):
            return await asyncio.to_thread(self._editor.delete, workspace_id, path, recursive)

    async def move_path(
        self, workspace_id: str, source: str, destination: str, overwrite: bool
    ) -> EditResult:
        async with self._writing(workspace_id):
            return await asyncio.to_thread(
                self._editor.move, workspace_id, source, destination, overwrite
            )

    async def restore(self, workspace_id: str, seq: int, path: str) -> EditResult:
        async with self._writing(workspace_id):
            return await asyncio.to_thread(self._editor.restore, workspace_id, seq, path)

    async def missing_objects(self, sha256s: list[str]) -> list[str]:
        return await asyncio.to_thread(objects.missing, self._snapshots, list(sha256s))

    async def export_objects(self, sha256s: list[str]) -> ByteStream:
        for sha in sha256s:
            objects.check_sha(sha)
        return aiter_thread(objects.pack_chunks(self._snapshots, list(sha256s)))

    async def import_objects(self, data: ByteStream) -> list[ObjectResult]:
        importer = PackImporter(self._snapshots)
        try:
            async for chunk in _coalesce(data):
                await asyncio.to_thread(importer.feed, chunk)
        except ValueError as exc:
            importer.close()
            raise InvalidInput(f"bad object pack: {exc}") from None
        return importer.close()

    async def apply_entries(self, workspace_id: str, entries: list[ApplyEntry]) -> ApplyResult:
        async with self._writing(workspace_id):
            outcomes, result = await asyncio.to_thread(
                self._editor.apply, workspace_id, list(entries)
            )
        return ApplyResult(outcomes=outcomes, snapshot=result.snapshot)

    async def prune_snapshots(self, workspace_id: str, keep: list[int]) -> PruneResult:
        self._require_workspace(workspace_id)
        return await asyncio.to_thread(history.prune, self._snapshots, workspace_id, list(keep))

    async def collect_garbage(self, grace_s: float) -> GcResult:
        if not grace_s >= 0:
            raise InvalidInput(f"grace_s must be zero or more, not {grace_s!r}")
        return await asyncio.to_thread(
            objects.collect_garbage, self._snapshots, self._store_lock, grace_s
        )

    # ----------------------------------------------------------------- executions

    async def start(self, request: StartRequest) -> RunnerExecution:
        _check_id(request.execution_id, "execution id")
        directory = self._executions / request.execution_id
        if directory.exists():  # E10: a retried start never spawns a second process
            return await self.status(request.execution_id)
        if (request.command is None) == (request.script_path is None):
            raise InvalidInput("give exactly one of command or script_path")
        tree = self.workspace_path(request.workspace_id)
        if not tree.is_dir():
            raise NotFound(f"workspace {request.workspace_id} does not exist on this runner")
        holder = self._busy_workspaces.get(request.workspace_id)
        if holder is not None:
            raise WorkspaceBusy(
                f"workspace {request.workspace_id} is in use by execution {holder}",
                holder=holder,
            )
        if request.workspace_id in self._editing:
            raise WorkspaceBusy(
                f"workspace {request.workspace_id} is in the middle of a file operation",
                holder="file operation",
            )
        command = (
            ["bash", "-c", request.command]
            if request.command is not None
            else _script_argv(tree, request.script_path or "")
        )
        mount = (
            self._environments.mount(request.environment_id)
            if request.environment_id is not None
            else None
        )
        require_room(self.root, self.policy, "a new execution")  # limits (issue 12)
        directory.mkdir()
        live = self._spawn(request, directory, tree, command, mount)
        self._live[request.execution_id] = live
        self._busy_workspaces[request.workspace_id] = request.execution_id
        self._use_environment(live.environment_id, request.execution_id)
        self._watch(request.execution_id, live)
        self._guard.watch(request.execution_id, request.workspace_id, directory, tree, live.pid)
        return self._running(request.execution_id, live)

    def _spawn(
        self,
        request: StartRequest,
        directory: Path,
        tree: Path,
        command: list[str],
        mount: tuple[Path, dict[str, str]] | None = None,
    ) -> _Live:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        out_fd = os.open(directory / "stdout", flags, 0o600)
        err_fd = os.open(directory / "stderr", flags, 0o600)
        status_fd = os.open(directory / "status", flags, 0o600)
        try:
            argv = sandbox.bwrap_argv(
                bwrap=self._bwrap,
                policy=self.policy,
                ids=self._ids,
                workspace=tree,
                hidden=self._hidden,
                status_fd=status_fd,
                command=command,
                read_only_binds=[mount[0]] if mount is not None else (),
            )
            env = sandbox.sandbox_env(
                tree,
                {
                    **_environment_variables(mount),
                    **request.env,
                    "SHELLYARD_EXECUTION_ID": request.execution_id,
                    "SHELLYARD_WORKSPACE_ID": request.workspace_id,
                },
            )
            started_at = time.time()
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out_fd,
                stderr=err_fd,
                pass_fds=(status_fd,),
                env=env,
                cwd="/",
                start_new_session=True,
            )
        finally:
            os.close(out_fd)
            os.close(err_fd)
            os.close(status_fd)
        pid_start = processes.start_time(popen.pid) or 0
        meta = {
            "execution_id": request.execution_id,
            "workspace_id": request.workspace_id,
            "pid": popen.pid,
            "start_time": pid_start,
            "started_at": started_at,
            "environment_id": request.environment_id,
        }
        _write_json_atomic(directory / "meta.json", json.dumps(meta))
        return _Live(
            workspace_id=request.workspace_id,
            directory=directory,
            pid=popen.pid,
            start_time=pid_start,
            started_at=started_at,
            popen=popen,
            environment_id=request.environment_id,
        )

    def _watch(self, execution_id: str, live: _Live) -> None:
        """Wake on the pidfd when bwrap exits; no thread and no poll loop per execution."""
        try:
            live.pidfd = os.pidfd_open(live.pid)
        except ProcessLookupError:
            self._spawn_task(self._finish(execution_id, live))
            return
        loop = asyncio.get_running_loop()

        def on_exit() -> None:
            if live.pidfd is not None:
                loop.remove_reader(live.pidfd)
                os.close(live.pidfd)
                live.pidfd = None
            self._spawn_task(self._finish(execution_id, live))

        loop.add_reader(live.pidfd, on_exit)

    def _spawn_task(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _finish(self, execution_id: str, live: _Live) -> None:
        """E8: the main process is gone. Make sure nothing of the sandbox is left, commit the
        workspace, then (and only then) write the final result."""
        returncode = live.popen.poll() if live.popen is not None else None
        if returncode is None:
            processes.reap_if_child(live.pid)
        status = processes.read_bwrap_status(live.directory / "status")
        init_pid = status.get("child-pid")
        if isinstance(init_pid, int):
            # bwrap's monitor exits when the command does, while the namespace's init may live
            # on with leftovers (E8). Killing the init kills the rest; wait until it is gone.
            marker = f"SHELLYARD_EXECUTION_ID={execution_id}".encode()
            if not await processes.kill_and_wait(init_pid, marker):
                log.warning("the sandbox of %s did not end after SIGKILL", execution_id)
        exit_code = status.get("exit-code")
        cancelled = (live.directory / "cancel").exists()
        error = None
        if not isinstance(exit_code, int):
            exit_code = None
            if returncode is not None and not cancelled:
                error = _bwrap_error(live.directory, returncode)
        try:
            snapshot: SnapshotInfo | None = await self._commit(live.workspace_id)
        except Exception as exc:  # a commit failure must still finish the record
            log.exception("snapshot commit failed", extra={"execution_id": execution_id})
            snapshot = None
            error = f"snapshot commit failed: {exc}"
        state = RunnerExecState.finished
        if exit_code is None and not cancelled and error is None:
            state = RunnerExecState.lost
            error = "the sandbox ended without recording an exit code"
        ending = self._guard.finish(execution_id, live.directory, exit_code, snapshot)  # limits
        error = ending.error(error, exit_code)
        result = RunnerExecution(
            execution_id=execution_id,
            workspace_id=live.workspace_id,
            state=state,
            exit_code=exit_code,
            cancelled=cancelled,
            snapshot=snapshot,
            started_at=live.started_at,
            finished_at=time.time(),
            error=error,
            limit=ending.limit,
            logs_cut=ending.logs_cut,
        )
        _write_json_atomic(live.directory / "result.json", result.model_dump_json())
        live.result = result
        if live.cancel_task is not None:
            live.cancel_task.cancel()
        if self._busy_workspaces.get(live.workspace_id) == execution_id:
            del self._busy_workspaces[live.workspace_id]
        if live.environment_id is not None:
            users = self._environment_users.get(live.environment_id, set())
            users.discard(execution_id)
            if not users:
                self._environment_users.pop(live.environment_id, None)
        live.done.set()

    def _running(self, execution_id: str, live: _Live) -> RunnerExecution:
        return RunnerExecution(
            execution_id=execution_id,
            workspace_id=live.workspace_id,
            state=RunnerExecState.running,
            cancelled=(live.directory / "cancel").exists(),
            started_at=live.started_at,
        )

    async def status(self, execution_id: str) -> RunnerExecution:
        live = self._live.get(execution_id)
        if live is not None:
            return live.result or self._running(execution_id, live)
        _check_id(execution_id, "execution id")
        result_file = self._executions / execution_id / "result.json"
        if result_file.exists():
            return RunnerExecution.model_validate_json(result_file.read_text())
        return RunnerExecution(
            execution_id=execution_id,
            workspace_id="",
            state=RunnerExecState.lost,
            error="this runner holds no trace of the execution",
        )

    async def wait(self, execution_id: str, timeout_s: float) -> RunnerExecution:
        live = self._live.get(execution_id)
        if live is not None and live.result is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(live.done.wait(), timeout=max(0.0, timeout_s))
        return await self.status(execution_id)

    async def cancel(self, execution_id: str) -> RunnerExecution:
        """E7: SIGTERM the command's process group; after the grace period kill the whole
        pid namespace. The result turns final only after every process is gone and the
        snapshot is committed (``_finish``)."""
        live = self._live.get(execution_id)
        if live is None or live.result is not None:
            return await self.status(execution_id)
        cancel_file = live.directory / "cancel"
        if not cancel_file.exists():
            cancel_file.write_text(str(time.time()))
        if live.cancel_task is None:
            live.cancel_task = asyncio.ensure_future(self._cancel(live, time.time()))
        return self._running(execution_id, live)

    async def _cancel(self, live: _Live, requested_at: float) -> None:
        status = processes.read_bwrap_status(live.directory / "status")
        init_pid = status.get("child-pid")
        if not isinstance(init_pid, int):
            # bwrap has not finished its setup yet; give it a moment to report.
            await asyncio.sleep(0.05)
            status = processes.read_bwrap_status(live.directory / "status")
            init_pid = status.get("child-pid")
        if isinstance(init_pid, int):
            # bwrap --new-session calls setsid() in the namespace's init, so the command runs
            # in the init's process group (measured: pgid == child-pid). The init ignores
            # SIGTERM from outside; a child that made its own session gets its own signal.
            processes.signal_group(init_pid, signal.SIGTERM)
            for command_pid in processes.children(init_pid):
                processes.signal_group(command_pid, signal.SIGTERM)
        remaining = self.policy.cancel_grace_s - (time.time() - requested_at)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(live.done.wait(), timeout=max(0.0, remaining))
        if live.result is None:
            if isinstance(init_pid, int):
                processes.signal_process(init_pid, signal.SIGKILL)
            else:
                processes.signal_group(live.pid, signal.SIGKILL)

    # ----------------------------------------------------------------- environments (V1–V8)

    def _use_environment(self, environment_id: str | None, execution_id: str) -> None:
        if environment_id is not None:
            self._environment_users.setdefault(environment_id, set()).add(execution_id)

    async def environment_change(self, request: EnvironmentChangeRequest) -> EnvironmentChange:
        return await self._environments.change(request)

    async def environment_change_status(self, change_id: str) -> EnvironmentChange:
        return await self._environments.status(change_id)

    async def environment_change_wait(self, change_id: str, timeout_s: float) -> EnvironmentChange:
        return await self._environments.wait(change_id, timeout_s)

    async def environment_info(self, environment_id: str) -> EnvironmentInfo:
        return await self._environments.info(environment_id)

    # ----------------------------------------------------------------- logs

    def _log_path(self, execution_id: str, stream: LogStream) -> Path:
        _check_id(execution_id, "execution id")
        if stream not in ("stdout", "stderr"):
            raise InvalidInput(f"unknown log stream {stream!r}; use 'stdout' or 'stderr'")
        path = self._executions / execution_id / stream
        if not path.exists():
            raise NotFound(f"no logs for execution {execution_id} on this runner")
        return path

    async def log_size(self, execution_id: str, stream: LogStream) -> int:
        return self._log_path(execution_id, stream).stat().st_size

    async def read_log(
        self, execution_id: str, stream: LogStream, offset: int, limit: int
    ) -> LogChunk:
        if offset < 0 or limit < 0:
            raise InvalidInput("offset and limit must be zero or positive")
        path = self._log_path(execution_id, stream)
        finished = (await self.status(execution_id)).state != RunnerExecState.running
        # limits (issue 12): a cut log reads as head, marker, tail (logcap.py)
        data, start, next_offset, size = read_capped_log(path, offset, min(limit, MAX_READ_CHUNK))
        return LogChunk(
            data=data,
            offset=start,
            next_offset=next_offset,
            size=size,
            complete=finished and next_offset >= size,
        )

    # ----------------------------------------------------------------- recovery

    async def _recover(self) -> None:
        """E11: re-attach to sandboxes that outlived the previous runner process."""
        for directory in sorted(self._executions.iterdir()):
            if (directory / "result.json").exists():
                continue
            meta_file = directory / "meta.json"
            if not meta_file.exists():
                # Crashed between mkdir and spawn bookkeeping: nothing of ours can be running
                # under a known pid; kill a namespace bwrap may already have reported.
                status = processes.read_bwrap_status(directory / "status")
                if isinstance(status.get("child-pid"), int):
                    processes.signal_process(status["child-pid"], signal.SIGKILL)
                continue
            meta = json.loads(meta_file.read_text())
            live = _Live(
                workspace_id=meta["workspace_id"],
                directory=directory,
                pid=meta["pid"],
                start_time=meta["start_time"],
                started_at=meta["started_at"],
                environment_id=meta.get("environment_id"),
            )
            execution_id = directory.name
            self._live[execution_id] = live
            self._busy_workspaces[live.workspace_id] = execution_id
            self._use_environment(live.environment_id, execution_id)
            if processes.is_same_process(live.pid, live.start_time):
                self._watch(execution_id, live)
                tree = self.workspace_path(live.workspace_id)  # limits (issue 12)
                self._guard.watch(execution_id, live.workspace_id, directory, tree, live.pid)
                if (directory / "cancel").exists():
                    requested = float((directory / "cancel").read_text() or time.time())
                    live.cancel_task = asyncio.ensure_future(self._cancel(live, requested))
            else:
                self._spawn_task(self._finish(execution_id, live))


async def _coalesce(data: ByteStream, size: int = 1 << 20) -> AsyncIterator[bytes]:
    """Regroup a stream's chunks (HTTP bodies arrive in small pieces) into about ``size``
    bytes each, so each worker-thread hop moves a useful amount."""
    buf = bytearray()
    async for chunk in data:
        if not buf and len(chunk) >= size:
            yield bytes(chunk)
            continue
        buf += chunk
        if len(buf) >= size:
            yield bytes(buf)
            buf.clear()
    if buf:
        yield bytes(buf)


def _check_id(value: str, what: str) -> None:
    if not value or not all(ch.isalnum() or ch in "-_" for ch in value) or len(value) > 128:
        raise InvalidInput(f"invalid {what} {value!r}: use letters, digits, '-' and '_'")


def _script_argv(tree: Path, script_path: str) -> list[str]:
    """E1: run a workspace file by its shebang, else by its extension."""
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
        raise NotFound(f"script {script_path!r} does not exist in the workspace")
    with current.open("rb") as handle:
        first = handle.readline(512)
    if first.startswith(b"#!"):
        return [*shlex.split(first[2:].decode("utf-8", "replace").strip()), str(current)]
    interpreter = INTERPRETER_BY_SUFFIX.get(current.suffix, ["bash"])
    return [*interpreter, str(current)]


def _environment_variables(mount: tuple[Path, dict[str, str]] | None) -> dict[str, str]:
    """The environment's variables for the sandbox (V4): its PATH entries go first."""
    if mount is None:
        return {}
    variables = dict(mount[1])
    variables["PATH"] = f"{variables['PATH']}:{sandbox.SANDBOX_PATH}"
    return variables


def _bwrap_error(directory: Path, returncode: int) -> str:
    """bwrap exited without starting the command: its own message is on stderr."""
    try:
        with (directory / "stderr").open("rb") as handle:
            message = handle.read(2000).decode("utf-8", "replace").strip()
    except OSError:
        message = ""
    return f"the sandbox could not start (bwrap exit {returncode}): {message or 'no message'}"

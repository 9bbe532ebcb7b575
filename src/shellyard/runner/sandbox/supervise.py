"""Watching executions: the pidfd wake-up when a sandbox ends, the final result, cancel,
logs, and re-attaching after a restart (E7, E8, E10, E11).

``Supervisor`` owns what is known about running executions (which workspace each holds,
which environment each mounts); ``LocalRunner`` asks it before a file operation or an
environment change and hands it each new execution to launch.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import re
import shutil
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from shellyard import settings_env
from shellyard.contract.interactive import ScreenView, check_terminal_size
from shellyard.errors import Conflict, InvalidInput, NotFound, SpawnFailed
from shellyard.runner import processes
from shellyard.runner.limits.logcap import read as read_capped_log  # limits (R2, docs/limits.md)
from shellyard.runner.limits.watcher import Guard  # limits (R2, docs/limits.md)
from shellyard.runner.own_mounts import OwnMounts
from shellyard.runner.policy import ExecutionPolicy
from shellyard.runner.protocol import (
    MAX_READ_CHUNK,
    LogChunk,
    LogStream,
    RunnerExecState,
    RunnerExecution,
    SnapshotInfo,
    StartRequest,
    untraced,
)
from shellyard.runner.sandbox import terminal
from shellyard.runner.sandbox.bwrap import Mount
from shellyard.runner.sandbox.spawn import (
    RESULT_TEMPORARY,
    LiveExecution,
    Sandboxes,
    SpawnOrder,
    Started,
    bwrap_error,
    execution_marker,
    write_json_atomic,
)
from shellyard.runner.sandbox.warm import WarmPool
from shellyard.runner.sandbox.warm import reap as reap_warm
from shellyard.runner.sandbox.warm_spawn import end_execution_spawn, spawn_in_thread
from shellyard.runner.snapshots import views
from shellyard.runner.snapshots.budget import HashBudget, HashBudgetExceeded
from shellyard.runner.snapshots.store import SnapshotStore

log = logging.getLogger(__name__)

#: How long a workspace's network namespace outlives its last execution (docs/benchmarks.md): making
#: one (``unshare``, loopback up) and removing it (``umount``) cost ~9 ms per execution when
#: an agent runs commands one after another, more than the whole sandbox spawn.
NETWORK_LINGER_S = 30.0
#: How often a result the volume had no room for is tried again (``_persist``).
RESULT_RETRY_S = 1.0


def network_linger_s() -> float:
    """``NETWORK_LINGER_S``, or ``SHELLYARD_NETWORK_LINGER_S`` (0: let go at once, as a test
    that counts namespaces wants; an operator who wants none left behind)."""
    value = settings_env.get("SHELLYARD_NETWORK_LINGER_S")
    try:
        return NETWORK_LINGER_S if value is None else max(0.0, float(value))
    except ValueError:
        log.warning(
            "SHELLYARD_NETWORK_LINGER_S=%r is not a number; using %s", value, NETWORK_LINGER_S
        )
        return NETWORK_LINGER_S


class Supervisor:
    """The executions of one runner. ``commit`` snapshots a workspace after its sandbox."""

    def __init__(
        self,
        executions: Path,
        sandboxes: Sandboxes,
        commit: Callable[[str, HashBudget | None], Awaitable[SnapshotInfo]],
        cancel_grace_s: float,
        guard: Guard,
        workspace_path: Callable[[str], Path],
        snapshots: SnapshotStore,
        mounts: OwnMounts,
    ) -> None:
        self._executions = executions
        #: W2: where a read-only execution's committed view comes from
        self._snapshots = snapshots
        #: W2: views shared by the readers of one snapshot content (snapshots/views.py)
        self.views = views.ReadViews(executions.parent / "views", snapshots, mounts)
        #: R2: each execution holds its workspace's overlays from its start (the runner's
        #: hold) to the end of ``_finish``; one adopted at restart from ``recover``
        self._mounts = mounts
        #: limits (R2, docs/limits.md): the workspace quota and the log cap while a command runs
        self._guard = guard
        self._workspace_path = workspace_path
        self.sandboxes = sandboxes
        self._commit = commit
        self._cancel_grace_s = cancel_grace_s
        self._live: dict[str, LiveExecution] = {}
        #: The runner folder's state id (runner/state_id.py), set at start-up: said with each
        #: ``NO_TRACE`` so the plane knows which state holds no trace (E9).
        self.state_id: str | None = None
        #: execution id → done once its cold spawn in flight has started it or failed
        self._spawning: dict[str, asyncio.Future[None]] = {}
        #: workspace id → the execution holding it
        self.busy_workspaces: dict[str, str] = {}
        #: environment id → running executions that mount it (a change waits for none, V5)
        self.environment_users: dict[str, set[str]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: execution id → the timer that lets go of its share of the workspace's network
        self._lingering: dict[str, tuple[str, asyncio.TimerHandle]] = {}
        #: E13: the emulated screens of tty executions (terminal.py)
        self.screens = terminal.Screens()
        #: the next sandbox of each recently used workspace, made ahead (warm.py)
        self.warm = WarmPool(executions.parent / "sandbox" / "warm", sandboxes, mounts)

    async def launch(
        self,
        request: StartRequest,
        tree: Path,
        command: list[str],
        mount: Mount | None,
    ) -> RunnerExecution:
        directory = self._executions / request.execution_id
        order = SpawnOrder(request, directory, tree, command, mount)
        live = None
        if not request.interactive and not request.read_only:
            # E13: an interactive one's stdin is its holder's, never a warm sandbox's pipe.
            # A warm sandbox's folder is renamed to ``directory``, which is not made first:
            # renaming over an empty folder cost ~0.4 ms CPU per run (docs/benchmarks.md
            # "Spawn bookkeeping"). A restart sees its warm folder (reaped; its command was
            # not sent yet, warm.py ``take``) or this one without meta.json, as for a cold
            # spawn that crashed before its bookkeeping.
            if os.path.lexists(directory):  # one folder per execution, as mkdir refuses
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(directory))
            try:
                live = self.warm.take(order)
            except OSError as exc:
                raise self._not_started(request.execution_id, directory, exc) from None
        if live is None:
            live, tree = await self._launch_cold(order)
        self._live[request.execution_id] = live
        if not request.read_only:
            self.busy_workspaces[request.workspace_id] = request.execution_id
        self._use_environment(live.environment_id, request.execution_id)
        self._watch(request.execution_id, live)
        marker = live.marker(request.execution_id)
        self._guard.watch(
            request.execution_id, request.workspace_id, directory, tree, live.pid, marker
        )
        self.warm.prepare_after(request, tree, mount)
        return self._running(request.execution_id, live)

    async def _launch_cold(self, order: SpawnOrder) -> tuple[LiveExecution, Path]:
        """An execution's own sandbox, spawned in a worker thread when the loop has other
        work (``_off_loop``), else on it; the tree it runs on (a reader's: its view, W2).

        Whatever awaits meanwhile sees it as it will be once running: its workspace's
        writer held (E1, E3: a second command, a warm sandbox's take, a file operation are
        refused as busy), its environment in use (V5: a change waits for it), and a status,
        wait, cancel or retried start of it waits for the spawn's end (``_spawning``)."""
        request, directory, tree = order.request, order.directory, order.tree
        directory.mkdir(mode=0o700)  # the service user's alone (filemodes.py)
        execution_id, workspace_id = request.execution_id, request.workspace_id
        writer = not request.read_only
        if writer:
            self.busy_workspaces[workspace_id] = execution_id
        self._use_environment(request.environment_id, execution_id)
        spawning = asyncio.get_running_loop().create_future()
        self._spawning[execution_id] = spawning
        viewing = False
        try:
            if request.read_only:  # the committed view, never the live tree (W2)
                tree = self.views.acquire(workspace_id, execution_id, directory / views.VIEW)
                viewing = True
                order = order._replace(tree=tree)
            live = await self._spawn_cold(order)
        except BaseException as exc:
            if viewing:  # it never ran: it uses the view no longer
                self.views.release(directory / views.VIEW, execution_id)
            if writer and self.busy_workspaces.get(workspace_id) == execution_id:
                del self.busy_workspaces[workspace_id]
            self._forget_environment(request.environment_id, execution_id)
            if isinstance(exc, OSError):
                raise self._not_started(execution_id, directory, exc) from None
            if isinstance(exc, asyncio.CancelledError):
                # Cancelled in flight: what it spawned is gone (``end_execution_spawn``),
                # nobody was told it ran; no folder a restart would take for a lost one.
                shutil.rmtree(directory, ignore_errors=True)
            raise
        finally:
            del self._spawning[execution_id]
            spawning.set_result(None)
        return live, tree

    async def _spawn_cold(self, order: SpawnOrder) -> LiveExecution:
        """The spawn itself: in a worker thread (``_off_loop``), else on the loop's."""
        box = self.sandboxes
        off_loop = self._off_loop()
        cold = box.prepare_cold(order)
        try:
            if off_loop:
                # The loop's thread blocked in vfork until bwrap had a CPU and exec'd: with 16
                # agents the cold Popen was the loop's largest share (docs/benchmarks.md §62).
                marker = execution_marker(order.request.execution_id)

                def undo(started: Started) -> None:  # in a worker thread: cancelled in flight
                    end_execution_spawn(started, order.directory / "status", marker)

                started = await spawn_in_thread(cold.run, undo)
            else:
                started = cold.run()
        except BaseException:
            box.abandon(cold.pending)
            raise
        finally:
            cold.close()
        return box.spawned(cold, started)

    def _off_loop(self) -> bool:
        """Whether a cold spawn goes to a worker thread: when other executions run or start
        here (their work waits on this loop meanwhile). A lone run's stays on the loop: nothing
        else waits, and the hop's worth for it was not resolved (docs/benchmarks.md §62)."""
        return bool(self._live) or len(self._spawning) > 1  # this one's is in it

    @staticmethod
    def _not_started(execution_id: str, directory: Path, exc: OSError) -> SpawnFailed:
        """Never started: the kernel refused the spawn (E2BIG, ENOMEM, EAGAIN ...). The
        folder goes (no trace a restart would take for a lost sandbox) and the caller ends
        the record ``failed`` with the reason; the writer is never taken here."""
        shutil.rmtree(directory, ignore_errors=True)
        log.warning("could not spawn %s: %s", execution_id, exc)
        return SpawnFailed(
            f"the command could not be started: {exc.strerror or exc} "
            f"(errno {exc.errno}); nothing ran",
            errno=exc.errno,
        )

    def close(self) -> None:
        """Stop watching; the sandboxes themselves keep running (E11); no warm one does."""
        self.warm.close()
        self.views.unmount_unused()  # R2: own_mounts.py
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
        # Not left mounted past this runner (a home in a temporary folder must be removable).
        for execution_id, (workspace_id, handle) in list(self._lingering.items()):
            handle.cancel()
            self._release_network(workspace_id, execution_id)

    def _watch(self, execution_id: str, live: LiveExecution) -> None:
        """Wake on the pidfd when bwrap exits; no thread and no poll loop per execution."""
        try:
            live.pidfd = os.pidfd_open(live.pid)
        except OSError:  # gone (ESRCH), or no pidfd (EMFILE, ENOSYS): polled, never left
            # unwatched, its workspace busy for ever (E1, E8)
            self._spawn_task(self._finish(execution_id, live, polled=True))
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

    async def _finish(self, execution_id: str, live: LiveExecution, polled: bool = False) -> None:
        """E8: the main process is gone (``polled``: once it is). Make sure nothing of the
        sandbox is left, commit the workspace, then (and only then) write the final result."""
        if polled:
            await processes.gone(live.pid, live.start_time)
        returncode = live.popen.poll() if live.popen is not None else None
        if returncode is None:
            processes.reap_if_child(live.pid)
        status = processes.read_bwrap_status(live.directory / "status")
        init_pid = status.get("child-pid")
        # bwrap's monitor exits when the command does, while the namespace's init may live
        # on with leftovers (E8). Killing the init kills the rest; wait until it is gone.
        if isinstance(init_pid, int):
            marker = live.marker(execution_id)
            if not await processes.kill_and_wait(init_pid, marker):
                log.warning("the sandbox of %s did not end after SIGKILL", execution_id)
        if live.interactive == "tty":  # E13: the terminal's last output reaches the log
            await terminal.drained(live.directory)
        usage = None
        cgroups = self.sandboxes.cgroups
        if cgroups is not None:  # R2 tenants: what it used, what ended it; its groups go
            # On the loop: a few reads of the kernel's cgroup files (tens of µs), the removal
            # queued to its own thread; a hop to a worker thread cost more CPU than the work
            # (~37 µs a hop, docs/benchmarks.md §36).
            usage = cgroups.finish(live.workspace_id, live.group(execution_id), ahead=True)
        exit_code = status.get("exit-code")
        cancelled = live.cancel_requested or (live.directory / "cancel").exists()
        error = None
        if not isinstance(exit_code, int):
            exit_code = None
            if returncode is not None and not cancelled:
                error = bwrap_error(live.directory, returncode, isinstance(init_pid, int))
        snapshot: SnapshotInfo | None = None
        refused: tuple[int, int] | None = None
        try:
            if live.read_only:  # W2: a reader makes no snapshot; its view goes
                link = live.directory / views.VIEW
                await asyncio.to_thread(self.views.release, link, execution_id)
            else:
                limit = self._guard.commit_budget()
                budget = HashBudget(limit) if limit is not None else None
                snapshot = await self._commit(live.workspace_id, budget)
        except HashBudgetExceeded as exc:  # R2: the record says so (Guard.finish)
            refused = (exc.needed, exc.limit)
        except Exception as exc:  # a commit failure must still finish the record
            log.exception("snapshot commit failed", extra={"execution_id": execution_id})
            snapshot = None
            error = f"snapshot commit failed: {exc}"
        state = RunnerExecState.finished
        if exit_code is None and not cancelled and error is None:
            state = RunnerExecState.lost
            error = "the sandbox ended without recording an exit code"
        ending = self._guard.finish(
            execution_id, live.directory, exit_code, snapshot, usage, refused
        )
        self._mounts.let_go(live.workspace_id)  # R2: committed, unwatched: its overlays may go
        if ending.limit is not None:  # what the next sandbox was made from has changed
            self.warm.limit_ended(live.workspace_id)
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
            policy=live.policy,
            limit=ending.limit,
            logs_cut=ending.logs_cut,
            peak_memory_bytes=usage.peak_memory_bytes if usage else None,
            cpu_seconds=usage.cpu_seconds if usage else None,
        )
        live.result = result
        durable = self._write_result(live.directory, result)
        if live.cancel_task is not None:
            live.cancel_task.cancel()
        if self.busy_workspaces.get(live.workspace_id) == execution_id:
            del self.busy_workspaces[live.workspace_id]
        self._forget_environment(live.environment_id, execution_id)
        if live.shared_network and self.sandboxes.networks is not None:
            self.sandboxes.networks.ended(live.workspace_id, execution_id)
            # R2: the last one takes it along, NETWORK_LINGER_S later, so the next
            # command of the workspace joins it instead of making a new one. Nothing of the
            # sandbox is left in it (killed above); only its loopback stays up meanwhile.
            handle = asyncio.get_running_loop().call_later(
                network_linger_s(), self._release_network, live.workspace_id, execution_id
            )
            self._lingering[execution_id] = (live.workspace_id, handle)
        live.popen = None
        live.done.set()
        self.warm.ended(execution_id)  # after the end's own work: the next one's making
        # result.json answers from now on: a finished execution holds no memory here.
        # Until it is written (a full volume), the result in memory answers (``_persist``).
        if not durable:
            self._spawn_task(self._persist(execution_id, live))
        elif self._live.get(execution_id) is live:
            del self._live[execution_id]

    def _write_result(self, directory: Path, result: RunnerExecution) -> bool:
        try:
            # over the empty temporary a warm folder was made with: no inode made here
            spare = directory / RESULT_TEMPORARY
            write_json_atomic(directory / "result.json", result.model_dump_json(), spare)
        except OSError as exc:
            log.error(
                "cannot write the result of %s (%s); it is kept in memory and written again "
                "once the volume has room",
                result.execution_id,
                exc,
                extra={"action": "disk_full", "execution_id": result.execution_id},
            )
            return False
        return True

    async def _persist(self, execution_id: str, live: LiveExecution) -> None:
        """A full volume refused result.json: the record ends all the same (from memory);
        the file follows as soon as it can be written."""
        while live.result is not None and not self._write_result(live.directory, live.result):
            await asyncio.sleep(RESULT_RETRY_S)
        if self._live.get(execution_id) is live:
            del self._live[execution_id]

    def _release_network(self, workspace_id: str, execution_id: str) -> None:
        self._lingering.pop(execution_id, None)
        networks = self.sandboxes.networks
        if networks is not None:
            # R2: a warm sandbox does not keep the namespace past its linger either
            self.warm.network_lingered(workspace_id, networks.holders(workspace_id))
            try:
                networks.release(workspace_id, execution_id)
            except OSError:  # a timer callback has no caller to tell; the next start retries
                log.exception("could not remove the network of workspace %s", workspace_id)

    def _running(self, execution_id: str, live: LiveExecution) -> RunnerExecution:
        return RunnerExecution(
            execution_id=execution_id,
            workspace_id=live.workspace_id,
            state=RunnerExecState.running,
            cancelled=(live.directory / "cancel").exists(),
            started_at=live.started_at,
            policy=live.policy,
            awaiting_input=(
                terminal.awaiting_input(live.pid, live.interactive == "tty")
                if live.interactive
                else None
            ),
        )

    def execution_folder(self, execution_id: str) -> Path:
        """An execution's folder on this runner (NotFound when it holds none)."""
        check_id(execution_id, "execution id")
        directory = self._executions / execution_id
        if not directory.is_dir():
            raise NotFound(f"no execution {execution_id} on this runner")
        return directory

    def watches(self, execution_id: str) -> bool:
        """Whether this execution is still live here (its folder must stay)."""
        return execution_id in self._live

    async def _spawned(self, execution_id: str) -> None:
        """A cold spawn in flight (``_launch_cold``) waited for: answered before it, the
        execution would read as unknown here (no record yet), a cancel would find nothing to
        cancel and a retried start (E10) would report it lost while it starts."""
        spawning = self._spawning.get(execution_id)
        if spawning is not None:
            await asyncio.shield(spawning)

    async def spawned(self, execution_id: str) -> None:
        """Once no cold spawn of ``execution_id`` is in flight (a retried start's wait,
        ``LocalRunner.start``)."""
        await self._spawned(execution_id)

    async def status(self, execution_id: str) -> RunnerExecution:
        await self._spawned(execution_id)
        live = self._live.get(execution_id)
        if live is not None:
            return live.result or self._running(execution_id, live)
        check_id(execution_id, "execution id")
        result_file = self._executions / execution_id / "result.json"
        if result_file.exists():
            return RunnerExecution.model_validate_json(result_file.read_text())
        # a folder left without a record: a start cut before its bookkeeping (recover)
        cut = (self._executions / execution_id).is_dir()
        return untraced(execution_id, cut, self.state_id)

    async def wait(self, execution_id: str, timeout_s: float) -> RunnerExecution:
        await self._spawned(execution_id)
        live = self._live.get(execution_id)
        if live is not None and live.result is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(live.done.wait(), timeout=max(0.0, timeout_s))
        if live is not None and live.result is not None:
            # the record just written to result.json (``_finish``), not read back from it
            return live.result
        return await self.status(execution_id)

    async def cancel(self, execution_id: str) -> RunnerExecution:
        """E7: SIGTERM the command's process group; after the grace period kill the whole
        pid namespace. The result turns final only after every process is gone and the
        snapshot is committed (``_finish``). One asked while its spawn is in flight is
        cancelled once it has started (``_spawned``)."""
        await self._spawned(execution_id)
        live = self._live.get(execution_id)
        if live is None or live.result is not None:
            return await self.status(execution_id)
        cancel_file = live.directory / "cancel"
        live.cancel_requested = True
        if not cancel_file.exists():
            try:
                cancel_file.write_text(str(time.time()))
            except OSError as exc:  # a full volume: the cancel goes on, known in memory
                log.error("cannot record the cancel of %s: %s", execution_id, exc)
        if live.cancel_task is None:
            live.cancel_task = asyncio.ensure_future(self._cancel(live, time.time()))
        return self._running(execution_id, live)

    async def _cancel(self, live: LiveExecution, requested_at: float) -> None:
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
        remaining = self._cancel_grace_s - (time.time() - requested_at)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(live.done.wait(), timeout=max(0.0, remaining))
        if live.result is None:
            if isinstance(init_pid, int):
                processes.signal_process(init_pid, signal.SIGKILL)
            else:
                processes.signal_group(live.pid, signal.SIGKILL)

    def _use_environment(self, environment_id: str | None, execution_id: str) -> None:
        if environment_id is not None:
            self.environment_users.setdefault(environment_id, set()).add(execution_id)

    def _forget_environment(self, environment_id: str | None, execution_id: str) -> None:
        if environment_id is not None:
            users = self.environment_users.get(environment_id, set())
            users.discard(execution_id)
            if not users:
                self.environment_users.pop(environment_id, None)

    def _log_path(self, execution_id: str, stream: LogStream) -> Path:
        check_id(execution_id, "execution id")
        if stream not in ("stdout", "stderr", "stdin"):
            raise InvalidInput(f"unknown log stream {stream!r}; use 'stdout' or 'stderr'")
        path = self._executions / execution_id / stream
        if not path.exists() and stream == "stdin" and path.with_name("stdout").exists():
            raise NotFound(f"execution {execution_id} took no input: it was not interactive")
        if not path.exists():
            if (self._executions / execution_id / "result.json").exists():
                raise NotFound(f"the logs of execution {execution_id} were deleted by retention")
            raise NotFound(f"no logs for execution {execution_id} on this runner")
        return path

    async def log_size(self, execution_id: str, stream: LogStream) -> int:
        check_id(execution_id, "execution id")
        if stream in ("stdout", "stderr", "stdin"):  # one stat when it is there (every run's)
            with contextlib.suppress(FileNotFoundError):
                return os.stat(self._executions / execution_id / stream).st_size
        return self._log_path(execution_id, stream).stat().st_size

    async def read_log(
        self, execution_id: str, stream: LogStream, offset: int, limit: int
    ) -> LogChunk:
        if offset < 0 or limit < 0:
            raise InvalidInput("offset and limit must be zero or positive")
        path = self._log_path(execution_id, stream)
        finished = (await self.status(execution_id)).state != RunnerExecState.running
        # limits (R2, docs/limits.md): a cut log reads as head, marker, tail (logcap.py)
        data, start, next_offset, size = read_capped_log(path, offset, min(limit, MAX_READ_CHUNK))
        return LogChunk(
            data=data,
            offset=start,
            next_offset=next_offset,
            size=size,
            complete=finished and next_offset >= size,
        )

    def live_workspaces(self) -> set[str]:
        """The workspaces whose sandboxes run now (writers and readers alike)."""
        return {live.workspace_id for live in self._live.values()}

    def live_ids(self) -> set[str]:
        """The names of the groups of the executions watched now (their sandboxes run on)."""
        return {live.group(execution_id) for execution_id, live in self._live.items()}

    async def recover(self) -> None:
        """E11: re-attach to sandboxes that outlived the previous runner process."""
        await asyncio.to_thread(reap_warm, self.warm.directory)  # none waits unwatched
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
            live = LiveExecution(
                workspace_id=meta["workspace_id"],
                directory=directory,
                pid=meta["pid"],
                start_time=meta["start_time"],
                started_at=meta["started_at"],
                environment_id=meta.get("environment_id"),
                policy=ExecutionPolicy.model_validate(meta["policy"]) if "policy" in meta else None,
                read_only=bool(meta.get("read_only", False)),
                shared_network=bool(meta.get("shared_network", False)),
                interactive=meta.get("interactive"),
                sandbox_id=meta.get("sandbox_id"),
                cgroup=meta.get("cgroup"),
            )
            execution_id = directory.name
            networks = self.sandboxes.networks
            if live.shared_network and networks is not None:
                # E11: a re-attached execution keeps its namespace (still mounted on its file)
                networks.acquire(live.workspace_id, execution_id)
            self._live[execution_id] = live
            self._mounts.hold(live.workspace_id)  # R2: the overlays it binds, adopted (E11)
            if self.sandboxes.cgroups is not None:  # R2 tenants: its groups are still there
                self.sandboxes.cgroups.adopt(live.workspace_id, live.group(execution_id))
            if not live.read_only:
                self.busy_workspaces[live.workspace_id] = execution_id
            self._use_environment(live.environment_id, execution_id)
            view = (
                self.views.adopt(directory / views.VIEW, execution_id) if live.read_only else None
            )
            if processes.is_same_process(live.pid, live.start_time):
                self._watch(execution_id, live)
                tree = self._workspace_path(live.workspace_id)  # limits (R2, docs/limits.md)
                if live.read_only:
                    tree = view or directory / views.VIEW
                marker = live.marker(execution_id)
                self._guard.watch(
                    execution_id, live.workspace_id, directory, tree, live.pid, marker
                )
                if (directory / "cancel").exists():
                    requested = float((directory / "cancel").read_text() or time.time())
                    live.cancel_task = asyncio.ensure_future(self._cancel(live, requested))
            else:
                self._spawn_task(self._finish(execution_id, live))
        if self.sandboxes.cgroups is not None:
            # R2 tenants, E11: groups of executions that ended while no runner watched (or
            # never started) go; those re-attached above stay until their end.
            gone = await asyncio.to_thread(self.sandboxes.cgroups.sweep, self.live_ids())
            if gone:
                log.info("removed the cgroups of %d ended executions", len(gone))


#: What ``check_id`` lets through: one to 128 of letters, digits (``str.isalnum``: ``\w`` is
#: exactly that and ``_`` in ``re``), ``-`` and ``_``. One match instead of a generator over
#: the characters: a foreground run checks ids about 16 times (docs/benchmarks.md §33).
_ID = re.compile(r"[\w-]{1,128}")


def check_id(value: str, what: str) -> None:
    if _ID.fullmatch(value) is None:
        raise InvalidInput(f"invalid {what} {value!r}: use letters, digits, '-' and '_'")


class TerminalDoor:
    """E13, the Runner protocol's interactive calls, answered from a runner's ``_runs``."""

    _runs: Supervisor

    async def send_input(self, execution_id: str, data: bytes, eof: bool) -> int:
        directory = self._runs.execution_folder(execution_id)
        self._runs.screens.typed(directory)
        return await terminal.send(directory, execution_id, data, eof)

    async def screen(self, execution_id: str) -> ScreenView:
        directory = self._runs.execution_folder(execution_id)
        if not (directory / terminal.SIZE).exists():
            raise Conflict(f"execution {execution_id} has no terminal (it was not tty)")
        await self._runs.screens.echoed(directory)
        return await asyncio.to_thread(self._runs.screens.view, directory)

    async def resize(self, execution_id: str, rows: int, cols: int) -> ScreenView:
        check_terminal_size(rows, cols)
        directory = self._runs.execution_folder(execution_id)
        if not (directory / terminal.SIZE).exists():
            raise Conflict(f"execution {execution_id} has no terminal (it was not tty)")
        terminal.resize(directory, execution_id, rows, cols)
        return await self.screen(execution_id)

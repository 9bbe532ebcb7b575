"""Durable executions (E1–E12, W1): accept, take the writer, start on the runner, watch,
finalize, release, dispatch the next queued writer. A read-only execution (W2) takes
no writer and waits for none: it starts at once beside the writer, on the committed snapshot."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from shellyard.contract.executions import (
    ExecutionCancelQuery,
    ExecutionResultQuery,
    ExecutionState,
    ExecutionView,
    ExecutionWait,
    RunShellRequest,
    RunShellResult,
)
from shellyard.control.agents import AgentResolver
from shellyard.control.executions import interactive, options, unstarted
from shellyard.control.executions.foreground import ForegroundWaits
from shellyard.control.executions.hooks import LEASE_KIND as LEASE_KIND
from shellyard.control.executions.hooks import EnvironmentGate, WatchLeases
from shellyard.control.executions.output import capped_output
from shellyard.control.executions.reads import OwnedReads
from shellyard.control.executions.state_log import log_state
from shellyard.control.executions.store_retry import while_store_full
from shellyard.control.executions.view import execution_view, run_shell_result
from shellyard.control.runners import LOCAL_RUNNER_ID, RunnerRegistry
from shellyard.errors import (
    LowOnSpace,
    NotFound,
    RunnerOutdated,
    RunnerUnavailable,
    ShellyardError,
    WorkspaceBusy,
)
from shellyard.paths import normalize_relative
from shellyard.runner.protocol import (
    Runner,
    RunnerExecState,
    RunnerExecution,
    StartRequest,
)
from shellyard.store import Store
from shellyard.store.db import new_id
from shellyard.store.executions import Execution

log = logging.getLogger(__name__)

#: E9: after this many consecutive retryable status-query failures the state is unknown.
MAX_QUERY_FAILURES = 5
#: Long-poll length of one runner ``wait`` call.
WAIT_SLICE_S = 20.0
#: (agent, runner) → workspace ids remembered; the oldest is forgotten beyond this.
WORKSPACE_CACHE = 4096


#: Told of each execution's terminal record and whether its notice was read at once (N3).
FinishObserver = Callable[[Execution, bool], Awaitable[None]]


class ExecutionService(OwnedReads):
    def __init__(
        self,
        store: Store,
        runners: RunnerRegistry,
        agents: AgentResolver,
        *,
        environments: EnvironmentGate,
        leases: WatchLeases,
        on_finished: Sequence[FinishObserver],
        on_signal: Callable[[str], None],
        on_timing: Callable[[str, float], None],
        cancel_timers_at_finish: bool,
    ) -> None:
        # All given when built (docs/architecture.md "Wiring").
        self.store = store
        self.runners = runners
        self.agents = agents
        self._finished: dict[str, asyncio.Event] = {}
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._foreground: dict[str, int] = {}
        self._workspaces: dict[tuple[str, str], str] = {}
        self._closing = False
        self.retry_base_s = 0.5
        #: Called after the record is final: the changes gated on it (V5), wakes (N2) and
        #: reminders naming the execution (N6), in this order.
        self.on_finished = list(on_finished)
        #: Managed environments (V4–V6): validation and the start gate.
        self.environments = environments
        #: execution id → the runner's note from its start (no default base, docs/environments.md),
        #: handed to the run_shell answer once
        self._notes: dict[str, str] = {}
        #: execution id → its final record, kept while a foreground caller waits for it, so
        #: the caller answers without reading it again (docs/benchmarks.md: transactions per run)
        self._ended: dict[str, Execution] = {}
        #: Leases (docs/operations.md): one replica watches each execution; the keeper hands
        #: this one those of dead replicas and of the previous process (E11), and the queues
        #: nobody hands on.
        self.leases = leases
        leases.register(LEASE_KIND, self.adopt, self.forget, dispatch=self.dispatch)
        runners.on_removing.append(
            functools.partial(unstarted.runner_removed, store, self._watchers, self._end)
        )
        #: Called with an execution id whose waiters were woken here: the fan-out tells
        #: the other replicas' waiters too (a no-op with one replica).
        self.on_signal = on_signal
        #: Called with ("spawn" | "commit", seconds): the start call; exit to final record.
        self.on_timing = on_timing
        #: Foreground waits recorded for another replica's finalizer (N3 across replicas).
        self.foreground_waits = ForegroundWaits(store, leases.ttl_s)
        #: N6 in the finishing transaction (the final record then says ``timers_cancelled``):
        #: where every end asks the store (PostgreSQL replicas).
        self.cancel_timers_at_finish = cancel_timers_at_finish

    # ------------------------------------------------------------------ lifecycle

    async def adopt(self, execution_id: str) -> None:
        """This replica took over the execution's lease (its holder died, docs/operations.md, or
        this home's previous process left it: the lease keeper's start-up claims those, E11):
        watch it as a restart would, or hand its workspace on when it is already final."""
        row = await self.store.get_execution(execution_id)
        if row is None:
            await self._release(execution_id)
            return
        if row.runner_id not in self.runners.ids():  # registered on another replica
            await self.runners.load_registered()
        state = ExecutionState(row.state)
        # A final ``unknown`` (its runner removed, E9) keeps its end: the lease left by a
        # replica that died watching it is no reason to ask the runner, added again, anew.
        if row.finished_at is None and state in (ExecutionState.running, ExecutionState.unknown):
            self._watch(row)
            return
        await self.dispatch(row.workspace_id)
        if execution_id not in self._watchers:
            await self._release(execution_id)

    def forget(self, execution_id: str) -> None:
        """Another replica took the lease: stop watching (it finalizes)."""
        task = self._watchers.pop(execution_id, None)
        if task is not None:
            task.cancel()

    async def _release(self, execution_id: str) -> None:
        await self.leases.release(LEASE_KIND, execution_id)

    async def aclose(self) -> None:
        self._closing = True
        for task in list(self._watchers.values()):
            task.cancel()
        for task in list(self._watchers.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._watchers.clear()

    # ------------------------------------------------------------------ submit

    async def run_shell(
        self, request: RunShellRequest, agent_id: str | None = None
    ) -> RunShellResult:
        owner = await self.agents.id(agent_id)
        if request.idempotency_key is not None:
            existing = await self.store.find_idempotent(owner, request.idempotency_key)
            if existing is not None:  # E10: the same execution, never a second process
                return await self._respond(existing, request)
        runner_id = request.runner_id or LOCAL_RUNNER_ID
        if request.environment_id is not None:
            # Exists, same session; runs on the environment's runner (V4).
            runner_id = await self.environments.check_usable(
                request.environment_id, owner, request.runner_id
            )
        if runner_id not in self.runners.ids():  # perhaps registered on another replica
            await self.runners.load_registered()
        runner = self.runners.get(runner_id)
        workspace_id = await self._workspace(owner, runner_id)
        if request.script_path is not None:
            path = normalize_relative(request.script_path)
            entry = await runner.stat_path(workspace_id, None, path)
            if entry is None or entry.kind != "file":
                raise NotFound(
                    f"script_path {request.script_path!r} is not a file in the workspace's "
                    "committed files; create it first (e.g. with a command) or check the path"
                )
        values: dict[str, Any] = {
            "id": new_id("ex"),
            "agent_id": owner,
            "workspace_id": workspace_id,
            "runner_id": runner_id,
            "environment_id": request.environment_id,
            "command": request.command,
            "script_path": request.script_path,
            "background": request.background,
            "idempotency_key": request.idempotency_key,
            "read_only": request.read_only,
            "run_options": options.record(request),
        }
        # The lease is taken with the record when it starts now (one transaction fewer); on
        # SQLite it has no row at all (control/replicas/leases.py).
        terms = self.leases.terms(runner_id)
        try:
            row, holder = await self.store.submit_execution(
                values, queue=request.queue, lease=terms
            )
        except Exception:
            if request.idempotency_key is not None:  # a concurrent retry won the race
                existing = await self.store.find_idempotent(owner, request.idempotency_key)
                if existing is not None:
                    return await self._respond(existing, request)
            raise
        if row is None or (holder is not None and not request.queue):
            # Refused: nothing was recorded (the store returns no record then).
            raise WorkspaceBusy(
                f"workspace {workspace_id} is busy: {holder} holds its writer. Wait for it "
                "(execution_status), cancel it (execution_cancel), pass queue: true to run "
                "after it, or use another workspace",
                holder=holder,
            )
        if holder is None:
            self.leases.taken(LEASE_KIND, row.id)
            row = await self._launch(row, refuse=True, leased=True)
        return await self._respond(row, request, started=holder is None)

    async def _launch(
        self, row: Execution, refuse: bool = False, leased: bool = False
    ) -> Execution:
        """Start a record that holds its workspace's writer. Safe to repeat (E10).

        ``refuse``: a runner below its free-space reserve raises to the submitter (retry
        later; CLI exit 75) after the record is made failed with the same message.
        ``leased``: ``row`` was just submitted with its lease (nobody else can have moved it)."""
        execution_id = row.id
        # One replica starts and watches it; another replica's dispatch of the same
        # queue loses here and leaves it alone.
        if not leased and not await self.leases.acquire(LEASE_KIND, execution_id, row.runner_id):
            return await self._finalized(row)
        try:
            return await self._launch_leased(row, refuse, submitted=leased)
        except BaseException:
            # Not started after all (the database failed us, or we are stopping): let
            # go, so a round of the lease keeper (here or on a replica) starts it.
            if execution_id not in self._watchers:
                await asyncio.shield(self._release(execution_id))
            raise

    async def _launch_leased(self, row: Execution, refuse: bool, submitted: bool) -> Execution:
        execution_id = row.id
        runner = self.runners.get(row.runner_id)
        if not submitted:
            row = await self._finalized(row)
            if row.state != ExecutionState.queued:  # started or ended meanwhile
                if row.state == ExecutionState.running:
                    self._watch(row)
                else:
                    # Ended on another replica after this dispatch took the writer for it.
                    await self.store.release_writer(row.workspace_id, execution_id)
                    await self._release(execution_id)
                return row
        environment_id = row.environment_id
        if environment_id is not None and row.environment_revision is None:
            # V5/V6 gate: queued behind a pending change, or the latest revision resolved.
            verdict, row = await self.environments.gate(execution_id, str(environment_id))
            if row.state != ExecutionState.queued or verdict == "wait":
                # Waiting for an environment change: its end dispatches it, no watch needed.
                if row.state == ExecutionState.queued:
                    await self._release(execution_id)
                return row
            if verdict == "failed":
                await self._end(
                    row,
                    ExecutionState.failed,
                    error=f"environment {environment_id} could not be created; create another",
                )
                return await self._finalized(row)
        # E9: the state this start goes to, read before it is sent (a heartbeat during the
        # call may already see the state that replaced it: unstarted.py)
        sent_to = self.runners.state_id(row.runner_id)
        spawn_began = time.monotonic()
        try:
            result = await runner.start(
                StartRequest(
                    execution_id=execution_id,
                    workspace_id=row.workspace_id,
                    command=row.command,
                    script_path=row.script_path,
                    environment_id=environment_id,
                    read_only=row.read_only,
                    **options.start_fields(row),
                    # a queued record is started by its predecessor's end: nobody waits there
                    detached=row.background or not refuse,
                )
            )
        except RunnerUnavailable as exc:
            # The start's answer never came (the daemon died with it): unknown at once, and
            # watched, so the runner is asked about this id once back (unstarted.py).
            await unstarted.record_asking(self.store, execution_id, exc, sent_to)
            asked = await self._finalized(row)
            if asked.state == ExecutionState.unknown:
                self._watch(asked)
            return asked
        except ShellyardError as exc:
            await self._end(row, ExecutionState.failed, error=exc.message)
            if refuse and isinstance(exc, LowOnSpace | RunnerOutdated):  # R2, docs/runners.md
                raise
            return await self._finalized(row)
        except Exception as exc:
            # Every input that cannot run gets a terminal record (docs/limits.md "Full disk"): an
            # unforeseen start failure ends ``failed``, frees the writer, never stays queued.
            log.exception("the runner failed to start %s", execution_id)
            await self._end(
                row, ExecutionState.failed, error=f"the runner could not start it: {exc}"
            )
            return await self._finalized(row)
        started: dict[str, Any] = {}
        self.on_timing("spawn", time.monotonic() - spawn_began)
        if result.base_environment is not None and environment_id is None:
            # The runner's default base (docs/environments.md): the record says what it ran in (V6),
            # written with the start (one transaction fewer per execution, docs/benchmarks.md).
            started = {
                "environment_id": result.base_environment,
                "environment_revision": result.base_revision,
            }
        if result.note is not None and refuse:
            # ``refuse``: the run_shell path, whose answer pops the note (nobody for a queued one)
            self._notes[execution_id] = result.note
        began = result.started_at or time.time()
        fresh = await while_store_full(  # it runs: recorded so, once there is room (R2)
            lambda: self.store.start_execution(execution_id, began, started), execution_id
        )
        assert fresh is not None
        await log_state(self.store, fresh)
        if fresh.state == ExecutionState.running:
            self._watch(fresh)
        return fresh

    async def _finalized(self, row: Execution) -> Execution:
        fresh = await self.store.get_execution(row.id)
        assert fresh is not None
        return fresh

    # ------------------------------------------------------------------ watch

    def _watch(self, row: Execution) -> None:
        """Watch a running execution until its end; the caller holds its lease, so nobody
        else watches it."""
        execution_id = row.id
        if execution_id in self._watchers or self._closing:
            return
        task = asyncio.create_task(self._watch_guarded(row), name=f"watch-{execution_id}")
        self._watchers[execution_id] = task

        def done(finished: asyncio.Task[None]) -> None:
            if self._watchers.get(execution_id) is finished:
                del self._watchers[execution_id]

        task.add_done_callback(done)

    async def _watch_guarded(self, row: Execution) -> None:
        """A watcher that fails (the database went away) lets its lease go: a round re-attaches."""
        try:
            await while_store_full(lambda: self._watch_loop(row), f"the end of {row.id}")
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("watching %s failed; its lease is let go", row.id)
            await self._release(row.id)

    async def _watch_loop(self, row: Execution) -> None:
        execution_id = row.id
        runner = self.runners.get(row.runner_id)
        failures = row.query_failures
        deadline, timed_out = options.deadline(row), row.ended_by_limit == options.TIMEOUT
        # unknown since its start call: whether the runner took the start is not known yet
        unconfirmed = row.state == ExecutionState.unknown and row.started_at is None
        while True:
            left = WAIT_SLICE_S if deadline is None or timed_out else deadline - time.time()
            try:
                if left <= 0:  # E1 timeout_ms: a cancel on the caller's behalf (E5)
                    timed_out = await options.expire(self.store, runner, execution_id)
                    continue
                result = await runner.wait(execution_id, min(WAIT_SLICE_S, left))
            except RunnerUnavailable as exc:
                failures += 1
                unknown = failures >= MAX_QUERY_FAILURES
                values: dict[str, Any] = {"query_failures": failures}
                if unknown:
                    error = unstarted.asking(exc) if unconfirmed else str(exc)
                    values.update(state="unknown", was_unknown=True, error=error)
                await self.store.update_execution(
                    execution_id, from_states=("running", "unknown"), **values
                )
                if unknown:
                    self._signal(execution_id)
                # E9: keep asking about the same id (never resubmit), backing off.
                cap = unstarted.ASK_CAP_S if unconfirmed else 30.0
                await asyncio.sleep(min(cap, self.retry_base_s * 2 ** min(failures, 6)))
                continue
            if unconfirmed:
                if unstarted.never_took(result):  # failed, or unknown from another state
                    state, error = unstarted.untraced_end(row.runner_state, result)
                    await self._end(row, state, error=error)
                    return
                if result.state != RunnerExecState.lost:  # it ran: running from then on
                    await unstarted.confirmed(self.store, execution_id, result)
                    self._signal(execution_id)
                unconfirmed, failures = False, 0
            if failures:
                # R3: the runner answers again. A record that turned unknown is running
                # again while its sandbox still runs (was_unknown keeps the trace).
                back = failures >= MAX_QUERY_FAILURES
                failures = 0
                await self.store.update_execution(
                    execution_id,
                    from_states=("running", "unknown"),
                    query_failures=0,
                    **({"state": "running", "error": None} if back else {}),
                )
                if back:
                    self._signal(execution_id)
            if result.state == RunnerExecState.running:
                continue
            if timed_out and result.cancelled:
                result = result.model_copy(update={"limit": "timeout", "error": None})
            await self._complete(row, result)
            return

    async def _complete(self, row: Execution, result: RunnerExecution) -> None:
        state, error = options.outcome(row, result)
        snapshot = result.snapshot
        if snapshot is not None and snapshot.new:
            await self.store.record_snapshot(
                snapshot.workspace_id,
                snapshot.seq,
                snapshot.root_hash,
                snapshot.files,
                snapshot.bytes,
                "execution",
                row.id,
            )
        await self._end(
            row,
            state,
            error=error,
            exit_code=result.exit_code if state == ExecutionState.completed else None,
            snapshot_seq=snapshot.seq if snapshot else None,
            finished_at=result.finished_at or time.time(),
            sandbox_policy=result.policy.model_dump_json() if result.policy else None,
            ended_by_limit=result.limit,
            peak_memory_bytes=result.peak_memory_bytes,
            cpu_seconds=result.cpu_seconds,
        )
        if result.finished_at:
            self.on_timing("commit", max(0.0, time.time() - result.finished_at))

    async def _end(
        self,
        row: Execution,
        state: ExecutionState,
        *,
        from_states: tuple[str, ...] = ("queued", "running", "unknown"),
        **values: Any,
    ) -> None:
        """Make the record terminal, post its notice, release the writer (one transaction),
        then wake waiters and run the next queued writer. ``from_states``: the states it
        ends from (a record that left them meanwhile is left alone)."""
        execution_id = row.id
        values.setdefault("finished_at", time.time())
        exit_code = values.get("exit_code")
        summary = f"execution {execution_id} {state.value}" + (
            f" with exit code {exit_code}" if exit_code is not None else ""
        )
        # N3: a foreground caller is waiting and sees the result now.
        notice_read = self._foreground.get(execution_id, 0) > 0
        # Across replicas: a caller on another replica may wait too; the transaction reads
        # its row and says whether the notice was posted read. The lease goes with it.
        final, queued, notice_read = await self.store.finish_execution(
            row,
            {"state": state.value, **values},
            summary,
            notice_read=notice_read,
            from_states=from_states,
            lease_holder=self.leases.letting_go(LEASE_KIND, execution_id),
            cancel_timers=self.cancel_timers_at_finish,
        )
        if final is not None and notice_read and execution_id in self._finished:
            self._ended[execution_id] = final  # with its notice posted read
        self._signal(execution_id)
        if final is not None:
            await log_state(self.store, final)
        for observer in self.on_finished:
            try:
                if final is not None:
                    await observer(final, notice_read)
            except Exception:
                log.exception("an on_finished observer failed for %s", execution_id)
        if queued is not None:
            # A replica dying before this line leaves a stalled queue: the lease keeper's
            # rounds (and a restart's, for the local runner) dispatch it.
            await self.dispatch(row.workspace_id)

    def _signal(self, execution_id: str) -> None:
        self.signal(execution_id)
        self.on_signal(execution_id)

    def waited(self) -> list[str]:
        """The executions someone waits for on this replica."""
        return list(self._finished)

    def signal(self, execution_id: str) -> None:
        """Wake this replica's waiters of the execution (they read its record again)."""
        event = self._finished.pop(execution_id, None)
        if event is not None:
            event.set()

    async def writer_released(self, workspace_id: str) -> None:
        """Another kind of writer (a file operation, a transfer) released the workspace:
        start the executions queued behind it (W1)."""
        await self.dispatch(workspace_id)

    async def dispatch(self, workspace_id: str) -> None:
        """W1 queue: hand the writer to the oldest queued execution, in submission order.
        Read-only ones not started yet need no writer: they start first (W2)."""
        for reader in await self.store.queued_readers(workspace_id):
            await self._launch(reader)
        while True:
            row = await self.store.next_queued(workspace_id)
            if row is None:
                return
            workspace = await self.store.get_workspace(workspace_id)
            assert workspace is not None
            if workspace.writer_id not in (None, row.id):
                return
            if workspace.writer_id is None and not await self.store.take_writer(
                workspace_id, "execution", row.id
            ):
                return
            launched = await self._launch(row)
            # Running, or queued behind an environment change (it keeps the writer).
            if launched.state in (ExecutionState.running, ExecutionState.queued):
                return

    # ------------------------------------------------------------------ respond

    async def _respond(
        self, row: Execution, request: RunShellRequest, started: bool = False
    ) -> RunShellResult:
        """``started``: ``row`` is what this call's start wrote (no await since)."""
        execution_id = row.id
        seen_ending = None
        if not request.background and not ExecutionState(row.state).terminal:
            # Running and watched here since its start: no end can have been signalled yet.
            current = started and row.state == "running" and execution_id in self._watchers
            seen_ending = await self._wait_watched(
                execution_id, request.wait_ms / 1000, current, self._prompts(row)
            )
            row = seen_ending or await self._finalized(row)
        view = result = run_shell_result(row)
        if view.interactive:  # E13: whether it waits for input now
            view.awaiting_input = await interactive.awaiting_input(self._runner(row), row)
        result.note = self._notes.pop(execution_id, None)
        if request.background or view.state in (ExecutionState.queued,):
            return result
        if view.state.terminal and seen_ending is None:
            # N3: the caller sees the finished result now, so its notice is read (one that
            # ended while this caller waited was posted read already: ``_end``).
            await self.store.mark_notice_read("execution", execution_id)
        if view.state == ExecutionState.unknown and not (
            unstarted.answered(row) and view.runner_id in self.runners.ids()
        ):
            # Its runner did not answer (unstarted.py ``answered``): reading its output would
            # wait on that runner for a request's whole timeout (30 s), far past the caller's
            # budget, for a log that may not exist. The record's error says how it is followed.
            return result
        runner = self.runners.get(view.runner_id)
        with contextlib.suppress(ShellyardError):
            result.stdout, result.stderr, result.output_truncated = await capped_output(
                runner, execution_id, request.max_output_length
            )
        return result

    # ------------------------------------------------------------------ queries

    async def status(self, execution_id: str, agent_id: str | None = None) -> ExecutionView:
        row = await self._owned(execution_id, agent_id)
        view = execution_view(row)
        if view.interactive:  # E13: whether it waits for input now
            view.awaiting_input = await interactive.awaiting_input(self._runner(row), row)
        if view.state.terminal:
            await self.store.mark_notice_read("execution", execution_id)
        return view

    async def wait(
        self, execution_id: str, request: ExecutionWait, agent_id: str | None = None
    ) -> ExecutionView:
        row = await self._owned(execution_id, agent_id)
        if not ExecutionState(row.state).terminal:
            await self._wait_watched(execution_id, request.timeout_s, prompts=self._prompts(row))
        return await self.status(execution_id, agent_id)

    async def result(
        self, execution_id: str, request: ExecutionResultQuery, agent_id: str | None = None
    ) -> RunShellResult:
        """What run_shell answers about an execution now, without waiting (MCP tasks)."""
        row = await self._owned(execution_id, agent_id)
        now = RunShellRequest.model_construct(
            background=False, wait_ms=0, max_output_length=request.max_output_length
        )
        return await self._respond(row, now)

    def _prompts(self, row: Execution) -> Runner | None:
        """E13: the runner to ask whether an interactive execution waits for input (a wait
        ends then)."""
        return self._runner(row) if options.of(row).get("interactive") else None

    async def _wait_watched(
        self,
        execution_id: str,
        timeout_s: float,
        current: bool = False,
        prompts: Runner | None = None,
    ) -> Execution | None:
        """Wait for the end with a caller watching: a result that arrives during the wait is
        seen by that caller, so its notice is posted already read and wakes nobody (N3).
        The final record when this process ended it during the wait, else None."""
        # The event lives only while someone waits for it (never past the execution's end):
        # registered first, then the record read again, so an end committed in between is
        # seen either by ``_signal`` or by that read.
        event = self._finished.setdefault(execution_id, asyncio.Event())
        self._foreground[execution_id] = self._foreground.get(execution_id, 0) + 1
        waiter: str | None = None
        try:
            if self._finalized_elsewhere(execution_id):
                # Another replica watches it, so its finalizer cannot see ``_foreground``: a
                # row tells it (read in its finishing transaction, store/executions.py).
                waiter = await self.foreground_waits.begin(execution_id)
            fresh = None if current else await self.store.get_execution(execution_id)
            if current or (fresh is not None and not ExecutionState(fresh.state).terminal):
                waiting = self.foreground_waits.wait(event, execution_id, waiter, timeout_s)
                await interactive.until_prompt(waiting, prompts, execution_id)
                return self._ended.get(execution_id)
            return None
        finally:
            self._foreground[execution_id] -= 1
            if not self._foreground[execution_id]:
                del self._foreground[execution_id]
                self._ended.pop(execution_id, None)
                if self._finished.get(execution_id) is event:
                    del self._finished[execution_id]
            if (
                waiter is not None
            ):  # before the caller's final read (control/executions/foreground.py)
                await self.foreground_waits.end(execution_id, waiter)

    def _finalized_elsewhere(self, execution_id: str) -> bool:
        """Whether another replica may finalize the execution (PostgreSQL replicas: this one
        does not watch it). SQLite is one replica, whose waits cost no write."""
        return not self.store.is_sqlite and execution_id not in self._watchers

    async def cancel(
        self, execution_id: str, request: ExecutionCancelQuery, agent_id: str | None = None
    ) -> ExecutionView:
        """E7: a finished execution comes back unchanged; a running one gets SIGTERM, then the
        whole sandbox is killed after the grace period; ``cancelled`` only once committed."""
        row = await self._owned(execution_id, agent_id)
        state = ExecutionState(row.state)
        if state.terminal:
            return execution_view(row)
        await self.store.update_execution(execution_id, cancel_requested=True)
        if state == ExecutionState.queued and row.started_at is None:
            workspace = await self.store.get_workspace(row.workspace_id)
            # Queued behind an environment change (V5): it holds the writer but never started.
            gated = row.waiting_for is not None
            if workspace is None or workspace.writer_id != execution_id or gated:
                await self._end(row, ExecutionState.cancelled)
                return await self.status(execution_id, agent_id)
        runner = self.runners.get(row.runner_id)
        await runner.cancel(execution_id)
        if request.wait_s > 0:
            return await self.wait(execution_id, ExecutionWait(timeout_s=request.wait_s), agent_id)
        return execution_view(await self._finalized(row))

    async def _workspace(self, agent_id: str, runner_id: str) -> str:
        """The agent's workspace on the runner, created on first use (records and runner)."""
        key = (agent_id, runner_id)
        workspace_id = self._workspaces.get(key)
        if workspace_id is None:
            row, _created = await self.store.workspace_for(agent_id, runner_id)
            workspace_id = row.id
            # Idempotent; once per process so a runner that lost the folder gets it back.
            await self.runners.get(runner_id).ensure_workspace(workspace_id)
            if len(self._workspaces) >= WORKSPACE_CACHE:  # agents come and go for months
                del self._workspaces[next(iter(self._workspaces))]
            self._workspaces[key] = workspace_id
        return workspace_id

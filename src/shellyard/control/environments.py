"""Managed environments (V1–V8): records, revisions and the waiting rule.

A change (create, install, uninstall) is recorded ``waiting``; a driver task claims it when
nothing holds the environment (the claim is one locked transaction in the store, so the rule
holds across control-plane processes), sends it to the runner (idempotent by change id), and
watches it like executions are watched, retrying a runner that cannot be asked (E9-style). A
change that succeeds records revision N+1 and the environment's new revision together; one
that fails records its error and no revision. When a change ends, the executions queued
behind it are dispatched.

With several replicas on one database (docs/operations.md) a change is driven by the one replica
holding its lease (``leases``); a replica that dies leaves the lease to expire and another adopts
the change: it asks the runner about it by its id (the runner never starts a change twice) and sees
it to its end, as a restart does. Waits on other replicas read the record."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from shellyard.contract.environments import (
    ChangeView,
    EnvironmentChangeBody,
    EnvironmentCreateRequest,
    EnvironmentListQuery,
    EnvironmentRevisionsQuery,
    EnvironmentView,
    RevisionSummary,
    RevisionView,
)
from shellyard.contract.sources import names_workspace
from shellyard.control.agents import AgentResolver
from shellyard.control.executions.hooks import WatchLeases
from shellyard.control.runners import LOCAL_RUNNER_ID, RunnerRegistry
from shellyard.errors import (
    ChangeFailed,
    Conflict,
    InvalidInput,
    NotFound,
    RunnerUnavailable,
    ShellyardError,
    SourceUnreachable,
)
from shellyard.runner.protocol import (
    EnvChangeState,
    EnvironmentChange,
    EnvironmentChangeRequest,
)
from shellyard.store import Store
from shellyard.store.db import new_id
from shellyard.store.environments import (
    PENDING_CHANGE_STATES,
    Change,
    Environment,
    Revision,
)
from shellyard.store.executions import Execution
from shellyard.store.leases import CHANGE
from shellyard.store.owners import Agent
from shellyard.store.records import field_names, values_of

log = logging.getLogger(__name__)

#: How often a waiting change re-checks the database: an execution that ends in another
#: control-plane process cannot signal this one.
WAITING_POLL_S = 1.0
#: Long-poll length of one runner ``environment_change_wait`` call. The runner answers early
#: only when the change ends, so this is also how often the recorded progress line refreshes.
WAIT_SLICE_S = 1.0
#: A wait answered ``running`` at once (well within its slice) with no new progress: the runner
#: is not working on the change though its record says ``running`` (its close abandoned it; the
#: runner's next start rolls it back and records it ``interrupted``). Asking straight away again
#: would spin, so the next wait is put off by this much, doubling up to ``QUIET_BACKOFF_MAX_S``
#: (the longest an end then goes unseen), and not at all once progress moves again.
QUIET_BACKOFF_MIN_S = 0.1
QUIET_BACKOFF_MAX_S = 5.0


class EnvironmentService:
    def __init__(
        self,
        store: Store,
        runners: RunnerRegistry,
        agents: AgentResolver,
        dispatch: Callable[[str], Awaitable[None]],
        *,
        leases: WatchLeases,
    ) -> None:
        self.store = store
        self.runners = runners
        self.agents = agents
        #: Starts the executions queued on a workspace (the execution service's dispatch):
        #: called when a change ended and executions gated on it may go.
        self._dispatch = dispatch
        self.retry_base_s = 0.5
        self._drivers: dict[str, asyncio.Task[None]] = {}
        #: Set when something that may unblock an environment's waiting change happened.
        self._wakeups: dict[str, asyncio.Event] = {}
        #: Set when a change ended (for callers waiting on it in this process).
        self._ended: dict[str, asyncio.Event] = {}
        self._closing = False
        #: Which replica drives each change (docs/operations.md); it hands this one the changes
        #: of dead replicas.
        self.leases = leases
        leases.register(CHANGE, self.adopt, self.forget, sweep=self._sweep)

    # ------------------------------------------------------------------ lifecycle

    async def startup(self) -> None:
        """Re-attach to changes the previous control plane left running (asking the runner),
        and re-evaluate the waiting ones."""
        for change in await self.store.pending_environment_changes():
            self._drive(change, reattach=change.state == "running")

    async def adopt(self, change_id: str) -> None:
        """This replica took over the change's lease (its driver died): drive it on."""
        change = await self.store.get_environment_change(change_id)
        if change is None or change.state not in PENDING_CHANGE_STATES:
            await self._release(change_id)
            return
        await self.runners.load_registered()  # its runner may be another replica's add
        self._drive(change, reattach=change.state == "running")

    def forget(self, change_id: str) -> None:
        """Another replica took the lease: stop driving here; the new holder asks the runner."""
        task = self._drivers.pop(change_id, None)
        if task is not None:
            task.cancel()

    async def _sweep(self) -> None:
        """Pending changes nobody drove for a lease time, on shared runners: driven here. A
        change is leased as it is recorded; this catches what an older release or a failed
        lease write left (its replica died between the two)."""
        for change_id in await self.store.unleased_changes(self.leases.ttl_s, LOCAL_RUNNER_ID):
            await self.adopt(change_id)

    async def _lease(self, change_id: str, environment_id: str) -> bool:
        env = await self._required_env(environment_id)
        return await self.leases.acquire(CHANGE, change_id, env.runner_id)

    async def _release(self, change_id: str) -> None:
        await self.leases.release(CHANGE, change_id)

    async def aclose(self) -> None:
        self._closing = True
        tasks = list(self._drivers.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._drivers.clear()

    # ------------------------------------------------------------------ requests

    async def create(
        self, request: EnvironmentCreateRequest, agent_id: str | None = None
    ) -> EnvironmentView:
        """V1: record the environment and its ``create`` change, start it, and wait up to
        ``wait_ms`` for it (then return it as it stands; its change id follows it)."""
        agent = await self._agent(agent_id)
        runner_id = request.runner_id or LOCAL_RUNNER_ID
        self.runners.get(runner_id)  # NotFound naming the registered runners
        environment_id = new_id("env")
        change_id = new_id("chg")
        _env, change = await self.store.create_environment(
            {
                "id": environment_id,
                "session_id": agent.session_id,
                "created_by": agent.id,
                "runner_id": runner_id,
                "name": request.name,
                "language": request.language,
            },
            {
                "id": change_id,
                "environment_id": environment_id,
                "agent_id": agent.id,
                "action": "create",
                "options": {"language": request.language, "base": request.base},
            },
        )
        self._drive(change)
        change = await self._await_change(change_id, request.wait_ms)
        if change.state == "failed":
            raise _error_for(change, await self._required_env(environment_id))
        view = await self._view(await self._required_env(environment_id))
        view.change_id = change_id
        return view

    async def install(
        self, environment_id: str, request: EnvironmentChangeBody, agent_id: str | None = None
    ) -> ChangeView:
        return await self._change("install", environment_id, request, agent_id)

    async def uninstall(
        self, environment_id: str, request: EnvironmentChangeBody, agent_id: str | None = None
    ) -> ChangeView:
        return await self._change("uninstall", environment_id, request, agent_id)

    async def _change(
        self,
        action: str,
        environment_id: str,
        body: EnvironmentChangeBody,
        agent_id: str | None,
    ) -> ChangeView:
        """V2, V5, V8: record the change (waiting), start its driver, wait up to
        ``wait_ms``. A change that failed within that time raises the mapped error."""
        agent = await self._agent(agent_id)
        env = await self._owned(environment_id, agent)
        if env.state == "failed":
            raise Conflict(
                f"environment {environment_id} could not be created ({env.error}); create "
                "another one"
            )
        change_id = new_id("chg")
        options = body.options()
        if names_workspace(body):
            # Local sources under /workspace/ are the caller's workspace on the environment's
            # runner (as inside its commands); the runner resolves them against this id.
            workspace, _created = await self.store.workspace_for(agent.id, env.runner_id)
            options["workspace_id"] = workspace.id
        change = await self.store.add_environment_change(
            {
                "id": change_id,
                "environment_id": environment_id,
                "agent_id": agent.id,
                "action": action,
                "manager": body.manager,
                "specs": body.specs,
                "options": options,
            }
        )
        self._drive(change)
        change = await self._await_change(change_id, body.wait_ms)
        if change.state == "failed":
            raise _error_for(change, env)
        return _change_view(change)

    # ------------------------------------------------------------------ queries

    async def list_environments(
        self, request: EnvironmentListQuery, agent_id: str | None = None
    ) -> list[EnvironmentView]:
        agent = await self._agent(agent_id)
        rows = await self.store.environments_of_session(agent.session_id, request.runner_id)
        return [_env_view(r) for r in rows]

    async def show(self, environment_id: str, agent_id: str | None = None) -> EnvironmentView:
        """The environment with a summary of its revisions and its pending changes."""
        env = await self._owned(environment_id, await self._agent(agent_id))
        view = await self._view(env)
        view.revisions = [
            RevisionSummary(
                revision=r.revision,
                change_id=r.change_id,
                action=str(r.request.get("action", "")),
                manager=r.request.get("manager"),
                specs=list(r.request.get("specs", [])),
                packages=len(r.packages),
                created_at=r.created_at,
            )
            for r in await self.store.environment_revisions(environment_id)
        ]
        if env.state == "ready":
            with contextlib.suppress(ShellyardError):
                info = await self.runners.get(env.runner_id).environment_info(environment_id)
                # V4: where commands see the prefix (/env), never its host path; a runner
                # that does not say (older) binds it at its own path
                view.prefix = info.mounted_at or info.prefix
        return view

    async def revisions(
        self,
        environment_id: str,
        request: EnvironmentRevisionsQuery,
        agent_id: str | None = None,
    ) -> list[RevisionView]:
        """V2: every revision (or one) with its full package list and request."""
        revision = request.revision
        await self._owned(environment_id, await self._agent(agent_id))
        rows = await self.store.environment_revisions(environment_id)
        if revision is not None:
            rows = [r for r in rows if r.revision == revision]
            if not rows:
                raise NotFound(
                    f"environment {environment_id} has no revision {revision}; "
                    "list them with environment_show"
                )
        return [_revision_view(r) for r in rows]

    async def change_status(self, change_id: str, agent_id: str | None = None) -> ChangeView:
        change = await self.store.get_environment_change(change_id)
        agent = await self._agent(agent_id)
        if change is None:
            raise _no_change(change_id)
        try:
            await self._owned(change.environment_id, agent)
        except NotFound:
            raise _no_change(change_id) from None
        return _change_view(change)

    async def wait(
        self, change_id: str, timeout_s: float, agent_id: str | None = None
    ) -> ChangeView:
        await self.change_status(change_id, agent_id)
        await self._await_change(change_id, int(max(0.0, timeout_s) * 1000))
        return await self.change_status(change_id, agent_id)

    # ------------------------------------------------------------------ executions (V4–V6)

    async def check_usable(self, environment_id: str, agent_id: str, runner_id: str | None) -> str:
        """Validate ``run_shell``'s ``environment_id`` before anything is recorded; returns
        the runner the execution must run on (the environment's, when none was named)."""
        agent = await self._agent(agent_id)
        env = await self._owned(environment_id, agent)
        if env.state == "failed":
            raise Conflict(
                f"environment {environment_id} could not be created ({env.error}); create "
                "another one with environment_create"
            )
        home = env.runner_id
        if runner_id is not None and runner_id != home:
            raise InvalidInput(
                f"environment {environment_id} ({env.name}) lives on runner {home!r}; pass "
                f"runner_id {home!r}, or create an environment on {runner_id!r} with "
                "environment_create"
            )
        return home

    async def gate(self, execution_id: str, environment_id: str) -> tuple[str, Execution]:
        """V5/V6: may a queued execution start on its environment now (see the records)."""
        return await self.store.gate_on_environment(execution_id, environment_id)

    async def execution_finished(self, row: Execution, _read: bool) -> None:
        """An execution ended (an ``on_finished`` observer): a change waiting for the
        environment's users may go now."""
        if row.environment_id:
            self._wake(row.environment_id)

    # ------------------------------------------------------------------ the driver

    def _drive(self, change: Change, *, reattach: bool = False) -> None:
        change_id = change.id
        if change_id in self._drivers or self._closing:
            return
        self._ended.setdefault(change_id, asyncio.Event())
        task = asyncio.create_task(self._run(change, reattach), name=f"env-change-{change_id}")
        self._drivers[change_id] = task
        # Only this task's entry: after a lost lease a later adoption may have a new one.
        task.add_done_callback(
            lambda t: self._drivers.pop(change_id) if self._drivers.get(change_id) is t else None
        )

    async def _run(self, change: Change, reattach: bool) -> None:
        change_id = change.id
        environment_id = change.environment_id
        failures = 0
        if not await self._lease(change_id, environment_id):
            # Another live replica drives it: waits here poll the record (_await_change).
            event = self._ended.pop(change_id, None)
            if event is not None:
                event.set()
            return
        try:
            while True:
                try:
                    await self._to_the_end(change_id, environment_id, reattach)
                    break
                except asyncio.CancelledError:
                    raise
                except Exception:
                    # A database or runner hiccup must not strand the change (and the
                    # executions queued behind it) until the next restart: start over from
                    # the record, asking the runner if it was already sent.
                    failures += 1
                    log.exception("environment change %s: retrying after an error", change_id)
                    await asyncio.sleep(min(30.0, self.retry_base_s * 2 ** min(failures, 6)))
                    reattach = True
        finally:
            event = self._ended.pop(change_id, None)
            if event is not None:
                event.set()
        # Ended (the loop only leaves by its end; a stop or a lost lease cancels the task).
        await self._release(change_id)
        self._wake(environment_id)  # the next change of the environment may go now
        if not self._closing:
            for workspace_id in await self.store.gated_workspaces(environment_id):
                await self._dispatch(workspace_id)

    async def _to_the_end(self, change_id: str, environment_id: str, reattach: bool) -> None:
        """Claim (or re-attach to) the change and see it through the runner to its end;
        return at once if it already ended (in another control plane)."""
        while True:
            if reattach:
                change = await self.store.get_environment_change(change_id)
                assert change is not None
                if change.state == "waiting":
                    reattach = False
                    continue
            else:
                change = await self._claim_when_free(change_id, environment_id)
            if change.state != "running":
                return
            if await self._on_runner(change, reattach) is not None:
                return
            reattach = False  # the runner refused it for now: wait again
            await self._sleep_or_wake(environment_id, WAITING_POLL_S)

    async def _claim_when_free(self, change_id: str, environment_id: str) -> Change:
        while True:
            change = await self.store.claim_environment_change(change_id)
            if change.state != "waiting":
                return change
            await self._sleep_or_wake(environment_id, WAITING_POLL_S)

    async def _on_runner(self, change: Change, reattach: bool) -> Change | None:
        """Send the claimed change to the runner and watch it to its end; record the end.
        Returns the ended record, or None when the runner refused it for now (Conflict)."""
        change_id = change.id
        env = await self._required_env(change.environment_id)
        # Removed? Else reached here too when added on another replica (one read of the records)
        if not await self.runners.registered(env.runner_id):
            return await self._runner_removed(change_id, env.runner_id)
        runner = self.runners.get(env.runner_id)
        request = _runner_request(change, env)
        sent = False
        failures = 0
        progress = change.progress
        quiet = 0.0  # the back-off after waits answered at once without progress
        while True:
            quick = False  # a wait the runner answered well within its slice
            try:
                if reattach and not sent:
                    result = await runner.environment_change_status(change_id)
                    sent = True
                elif not sent:
                    result = await runner.environment_change(request)
                    sent = True
                else:
                    asked = time.monotonic()
                    result = await runner.environment_change_wait(change_id, WAIT_SLICE_S)
                    quick = time.monotonic() - asked < WAIT_SLICE_S / 2
            except RunnerUnavailable as exc:
                if await self.runners.removed(env.runner_id):
                    return await self._runner_removed(change_id, env.runner_id)
                failures += 1
                await self.store.set_change_progress(
                    change_id, f"runner {env.runner_id} cannot be asked ({exc}); retrying"
                )
                # Same change id every time: the runner never starts it twice.
                await asyncio.sleep(min(30.0, self.retry_base_s * 2 ** min(failures, 6)))
                continue
            except Conflict as exc:
                await self.store.unclaim_environment_change(change_id, f"waiting: {exc.message}")
                return None
            except ShellyardError as exc:
                return await self.store.finish_environment_change(
                    change_id,
                    packages=None,
                    error=exc.message,
                    error_kind=_kind_of(exc),
                )
            failures = 0
            if result.state != EnvChangeState.running:
                return await self._record_end(change_id, result)
            if result.progress != progress:
                progress = result.progress
                await self.store.set_change_progress(change_id, progress)
                quiet = 0.0
            elif not quick:  # a long poll that waited its slice, or the first answer
                if quiet:  # working again: the runner's own line, not the note, stands
                    await self.store.set_change_progress(change_id, progress)
                quiet = 0.0
            else:
                if not quiet:  # said once per quiet spell, in the record the caller reads
                    await self.store.set_change_progress(change_id, _abandoned(env.runner_id))
                quiet = min(QUIET_BACKOFF_MAX_S, max(QUIET_BACKOFF_MIN_S, quiet * 2))
                await asyncio.sleep(quiet)

    async def _runner_removed(self, change_id: str, runner_id: str) -> Change | None:
        """The change's runner was removed while the change was on it: nobody will answer
        about it, so it ends with the reason instead of being asked about for ever (it held
        its environment, and the commands queued behind it, with it)."""
        return await self.store.finish_environment_change(
            change_id,
            packages=None,
            error=(
                f"runner {runner_id} was removed while this change was on it, so whether it "
                "ran there is not known; add the runner again (`shellyard runner add`) and "
                "look at the environment, or make one on another runner"
            ),
            error_kind="failed",
        )

    async def _record_end(self, change_id: str, result: EnvironmentChange) -> Change:
        if result.state == EnvChangeState.succeeded:
            return await self.store.finish_environment_change(
                change_id,
                packages=[p.model_dump(mode="json") for p in result.packages],
                finished_at=result.finished_at,
            )
        if result.state == EnvChangeState.lost:
            error, kind = (
                "interrupted: the runner holds no trace of this change (it restarted, or the "
                "control plane stopped before sending it); the environment is unchanged",
                "interrupted",
            )
        else:
            error, kind = result.error or "the change failed", result.error_kind or "failed"
        return await self.store.finish_environment_change(
            change_id, packages=None, error=error, error_kind=kind, finished_at=result.finished_at
        )

    # ------------------------------------------------------------------ helpers

    def _wake(self, environment_id: str) -> None:
        event = self._wakeups.pop(environment_id, None)
        if event is not None:
            event.set()

    async def _sleep_or_wake(self, environment_id: str, timeout_s: float) -> None:
        event = self._wakeups.setdefault(environment_id, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=timeout_s)

    async def _await_change(self, change_id: str, wait_ms: int) -> Change:
        deadline = time.monotonic() + wait_ms / 1000
        event = self._ended.get(change_id)
        if event is not None and wait_ms > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=wait_ms / 1000)
        change = await self.store.get_environment_change(change_id)
        assert change is not None
        if change.state in PENDING_CHANGE_STATES and wait_ms > 0:
            # Driven by another process (another replica, or this one's driver stopped when
            # another took its lease over): poll the record for the rest of the budget.
            while change.state in PENDING_CHANGE_STATES and time.monotonic() < deadline:
                await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
                change = await self.store.get_environment_change(change_id)
                assert change is not None
        return change

    async def _agent(self, agent_id: str | None) -> Agent:
        return await self.agents.record(agent_id)

    async def _owned(self, environment_id: str, agent: Agent) -> Environment:
        env = await self.store.get_environment(environment_id)
        # Another session's environment is reported exactly like a missing one.
        if env is None or env.session_id != agent.session_id:
            raise NotFound(
                f"no environment {environment_id!r}; list yours with environment_list, or "
                "create one with environment_create"
            )
        return env

    async def _required_env(self, environment_id: str) -> Environment:
        env = await self.store.get_environment(environment_id)
        assert env is not None, environment_id
        return env

    async def _view(self, env: Environment) -> EnvironmentView:
        view = _env_view(env)
        view.pending_changes = [
            _change_view(c)
            for c in await self.store.environment_changes(env.id, PENDING_CHANGE_STATES)
        ]
        return view


def _no_change(change_id: str) -> NotFound:
    return NotFound(
        f"no environment change {change_id!r}; environment_show lists an environment's "
        "pending changes"
    )


def _runner_request(change: Change, env: Environment) -> EnvironmentChangeRequest:
    options = change.options
    return EnvironmentChangeRequest(
        change_id=change.id,
        environment_id=env.id,
        action=change.action,
        language=env.language if change.action == "create" else None,
        base=options.get("base") if change.action == "create" else None,
        manager=change.manager,
        specs=list(change.specs),
        channels=list(options.get("channels") or []),
        index_url=options.get("index_url"),
        extra_index_urls=list(options.get("extra_index_urls") or []),
        find_links=list(options.get("find_links") or []),
        repos=list(options.get("repos") or []),
        workspace_id=options.get("workspace_id"),
        for_agent=True,
    )


def _abandoned(runner_id: str) -> str:
    """The progress line of a change its runner holds ``running`` without working on it."""
    return (
        f"runner {runner_id} reports this change running but is not working on it (cut short "
        f"there, as its close does past its grace); the runner's next start rolls the "
        f"environment back and ends the change 'interrupted'; asked again every "
        f"{QUIET_BACKOFF_MAX_S:g} s at most"
    )


def _kind_of(exc: ShellyardError) -> str:
    """A runner's synchronous refusal as a change's error kind (V8)."""
    if isinstance(exc, InvalidInput):
        return "invalid_spec"
    if isinstance(exc, NotFound):  # e.g. create --from a base not prepared there
        return "not_found"
    return "failed"


def _error_for(change: Change, env: Environment) -> ShellyardError:
    """V8: the error a failed change raises: what went wrong (the runner's words), that the
    environment is unchanged, and what to do."""
    kind = change.error_kind or "failed"
    what = change.action if change.manager is None else (f"{change.action} with {change.manager}")
    unchanged = (
        "the environment was not created"
        if change.action == "create"
        else f"environment {env.id} is unchanged (still revision {env.revision})"
    )
    message = f"{what} failed (change {change.id}): {change.error}; {unchanged}"
    details = {"change_id": change.id, "environment_id": env.id, "error_kind": kind}
    if kind == "invalid_spec":
        return InvalidInput(f"{message}. Fix the package spec and try again", **details)
    if kind == "not_found":
        return NotFound(
            f"{message}. Check the package name and the channels / index / repos searched",
            **details,
        )
    if kind == "unreachable":
        return SourceUnreachable(
            f"{message}. Check the channel / index / repository URL and that the runner "
            "can reach it, then try again",
            **details,
        )
    if kind == "interrupted":
        return ChangeFailed(f"{message}. Nothing was applied; run the change again", **details)
    return ChangeFailed(
        f"{message}. Read the error above, adjust the specs, and try again", **details
    )


#: D3: the fields each record shares with its view, listed once (the view's id is ``id``).
_CHANGE_VIEW_FIELDS = field_names(Change, ChangeView.model_fields)
_ENV_VIEW_FIELDS = field_names(Environment, EnvironmentView.model_fields)
_REVISION_VIEW_FIELDS = field_names(Revision, RevisionView.model_fields)


def _change_view(row: Change) -> ChangeView:
    return ChangeView.model_validate(
        {
            **values_of(row, _CHANGE_VIEW_FIELDS),
            "change_id": row.id,
            # options left empty are not shown
            "options": {k: v for k, v in row.options.items() if v},
        }
    )


def _env_view(row: Environment) -> EnvironmentView:
    return EnvironmentView.model_validate(
        {**values_of(row, _ENV_VIEW_FIELDS), "environment_id": row.id}
    )


def _revision_view(row: Revision) -> RevisionView:
    return RevisionView.model_validate(values_of(row, _REVISION_VIEW_FIELDS))

"""The ControlPlane: one object that owns the store, the runners and the services on them.
The REST app and the web page's routers call it (the other doors go through REST); it never
does I/O details itself.

``build(settings)`` opens and starts everything and returns the plane with every service a
plain field (docs/architecture.md "Wiring"): there is no plane that exists but has not started."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

from shellyard import filemodes
from shellyard.config import Settings
from shellyard.control.agents import AgentResolver
from shellyard.control.environments import EnvironmentService
from shellyard.control.executions.service import ExecutionService
from shellyard.control.files.access import WorkspaceAccess
from shellyard.control.files.artifacts import ArtifactService
from shellyard.control.files.service import FileService
from shellyard.control.files.transfers import TransferService
from shellyard.control.metrics import Metrics
from shellyard.control.notify.inbox import InboxService
from shellyard.control.notify.sessions import SessionService
from shellyard.control.notify.timers import TimerService
from shellyard.control.notify.wakes import WakeService
from shellyard.control.ports import PortService
from shellyard.control.replicas.fanout import Fanout
from shellyard.control.replicas.leases import LeaseKeeper, home_scope, ttl_from_env
from shellyard.control.replicas.wiring import publishers, wire
from shellyard.control.retention import RetentionService
from shellyard.control.runners import LOCAL_RUNNER_ID, RunnerRegistry
from shellyard.control.tokens import TokenService
from shellyard.runner.local import LocalRunner
from shellyard.store import Store


# eq=False: a plane is itself, never equal to another (and hashable by identity).
@dataclass(frozen=True, eq=False)
class ControlPlane:
    """What ``build`` made, every service started (docs/architecture.md "Wiring")."""

    settings: Settings
    store: Store
    # Runner registration, health, removal (R1, R4); the local runner is "local".
    runners: RunnerRegistry
    executions: ExecutionService
    # Sessions, agents and the host's turn protocol; the inbox; wakes and their channels
    # (add_callback for in-process hosts); timers (N1–N11).
    sessions: SessionService
    inbox: InboxService
    wakes: WakeService
    timers: TimerService
    # Workspace files and snapshot history, transfers, artifacts (W1–W6, T1–T5).
    files: FileService
    transfers: TransferService
    artifacts: ArtifactService
    # Managed environments: records, revisions, the waiting rule (V1–V8).
    environments: EnvironmentService
    # Bearer tokens and the principal of a request (admin, session, agent).
    tokens: TokenService
    # Ports of the runner's host forwarded into a workspace's network (R5).
    ports: PortService
    retention: RetentionService
    # Replicas on one database (docs/operations.md): leases, fan-out, and what /metrics reads.
    leases: LeaseKeeper
    fanout: Fanout
    metrics: Metrics
    #: What ``aclose`` undoes, in the order ``build`` registered it (see there).
    closing: AsyncExitStack = field(repr=False)

    async def aclose(self) -> None:
        """Stop everything ``build`` started: retention, transfers, files, timers, wakes,
        environments, executions, then the lease keeper (after the watchers stopped: it hands
        their leases over), the fan-out, the runners and the store."""
        await self.closing.aclose()

    @classmethod
    @asynccontextmanager
    async def running(cls, settings: Settings) -> AsyncIterator[ControlPlane]:
        plane = await build(settings)
        try:
            yield plane
        finally:
            await plane.aclose()


async def build(settings: Settings) -> ControlPlane:
    """Open the store, make the lease keeper, the fan-out, the runners and the services in
    that order, start them, and return the plane. A failure part-way closes what was opened
    (the store, the runners with the local one, the services started) before it is raised:
    the caller has no plane to close.

    Each close is registered on one exit stack, which the plane keeps for ``aclose``. The
    stack unwinds last-in first-out, so a close is registered where it gives ``aclose``'s
    order rather than right where its object is made: the runners' before the fan-out's and
    the keeper's (the three are made together; none opens anything when made), and the
    executions' before those of the environments, wakes and timers it is built from."""
    # 0700 and the service user's alone (docs/security.md "The home's files")
    filemodes.secure_home(settings.home)
    closing = AsyncExitStack()
    try:
        store = await Store.open(
            settings.effective_database_url, schema_name=settings.database_schema
        )
        closing.push_async_callback(store.close)
        await store.prepare_incremental_vacuum()  # SQLite: incremental vacuum on
        # The lease keeper and the fan-out first: every service gets them (or what they
        # publish through) when built (docs/architecture.md "Wiring").
        leases = LeaseKeeper(
            store,
            home_scope(str(settings.local_runner_root)),
            LOCAL_RUNNER_ID,
            ttl_s=ttl_from_env(os.environ),
        )
        url = None if store.is_sqlite else settings.effective_database_url
        fanout = Fanout(url, settings.database_schema, leases.replica_id)
        publish = publishers(fanout)
        runners = RunnerRegistry(store, on_change=publish.runners_changed)
        closing.push_async_callback(runners.aclose)
        closing.push_async_callback(fanout.aclose)
        closing.push_async_callback(leases.aclose)
        tokens = TokenService(store, agent_tokens_per_session=settings.agent_tokens_per_session)
        local = LocalRunner(
            settings.local_runner_root, settings.local_policy, hidden=[settings.home]
        )
        await local.startup()
        await runners.add_local(local)
        await runners.load_registered()
        runners.start_heartbeats()
        agents = AgentResolver(store)
        await agents.default_id()  # the default session exists before any door asks
        metrics = Metrics()
        wakes = WakeService(
            store,
            settings.notifications,
            leases=leases,
            on_emitted=publish.wake_emitted,
            on_notify=publish.agent_may_wake,
            on_webhooks=publish.webhooks_changed,
        )
        sessions = SessionService(store, wakes, agents)
        timers = TimerService(
            sessions,
            wakes,
            settings.notifications,
            announce=publish.timer_created,
            on_change=publish.timers_changed,
        )
        inbox = InboxService(store, agents)

        # Environments gate executions (V4–V6) and dispatch the ones queued behind a change:
        # the one circle of the wiring, closed by this name bound just below (a change ends
        # only after build), so that neither service imports the other.
        async def dispatch(workspace_id: str) -> None:
            await executions.dispatch(workspace_id)

        environments = EnvironmentService(store, runners, agents, dispatch, leases=leases)
        executions = ExecutionService(
            store,
            runners,
            agents,
            environments=environments,
            leases=leases,
            on_finished=[
                environments.execution_finished,
                wakes.execution_finished,
                timers.execution_finished,
            ],
            on_signal=publish.execution_ended,
            on_timing=metrics.observe,
            cancel_timers_at_finish=timers.folded_into_finish,
        )
        closing.push_async_callback(executions.aclose)
        closing.push_async_callback(environments.aclose)
        closing.push_async_callback(wakes.aclose)
        closing.push_async_callback(timers.aclose)
        access = WorkspaceAccess(store, runners, executions)
        files = FileService(store, access, settings.retention)
        transfers = TransferService(
            store,
            access,
            leases=leases,
            on_signal=publish.transfer_changed,
            max_entries=settings.transfer_max_entries,
        )
        closing.push_async_callback(files.aclose)
        closing.push_async_callback(transfers.aclose)
        artifacts = ArtifactService(store, access)
        ports = PortService(access)
        wire(executions, wakes, transfers, fanout, timers)
        await fanout.start()
        # Every service that adopts leased work is built: the keeper's first round hands
        # them what this home's previous process and dead replicas left (E11).
        await leases.startup()
        await environments.startup()
        await files.startup()
        await transfers.startup()
        retention = RetentionService(store, runners, settings.retention, settings.home, files)
        closing.push_async_callback(retention.aclose)
        await retention.start()
        # After the executions re-attached: a reminder and a completion that both happened
        # while the service was down are ordered by their recorded times (N6, N7).
        await wakes.start()
        await timers.start()
        return ControlPlane(
            settings=settings,
            store=store,
            runners=runners,
            executions=executions,
            sessions=sessions,
            inbox=inbox,
            wakes=wakes,
            timers=timers,
            files=files,
            transfers=transfers,
            artifacts=artifacts,
            environments=environments,
            tokens=tokens,
            ports=ports,
            retention=retention,
            leases=leases,
            fanout=fanout,
            metrics=metrics,
            # built: the plane's aclose takes over what this stack would undo on a failure
            closing=closing,
        )
    except BaseException:
        await closing.aclose()
        raise

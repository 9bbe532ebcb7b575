"""The ControlPlane: one object that owns the store, the runners and the services on them.
The REST app and the web page's routers call it (the other doors go through REST); it never
does I/O details itself."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

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
from shellyard.store.files import FileRecords
from shellyard.store.retention import RetentionRecords


@dataclass(frozen=True)
class _Notify:
    """The notification services, made together at start (N1–N11)."""

    sessions: SessionService
    inbox: InboxService
    wakes: WakeService
    timers: TimerService


@dataclass(frozen=True)
class _Files:
    """The file services, made together at start (W1–W6, T1–T5)."""

    files: FileService
    transfers: TransferService
    artifacts: ArtifactService


class ControlPlane:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store: Store | None = None
        self._runners: RunnerRegistry | None = None
        self._executions: ExecutionService | None = None
        self._notify: _Notify | None = None
        self._files: _Files | None = None
        self._environments: EnvironmentService | None = None
        self._tokens: TokenService | None = None
        self.retention: RetentionService | None = None
        self._ports: PortService | None = None
        # Replicas on one database (docs/operations.md): leases, fan-out, and what /metrics reads.
        self.leases: LeaseKeeper | None = None
        self.fanout: Fanout | None = None
        self.metrics = Metrics()

    @property
    def executions(self) -> ExecutionService:
        assert self._executions is not None, "ControlPlane.start() was not called"
        return self._executions

    # Managed environments: records, revisions, the waiting rule (V1–V8).
    @property
    def environments(self) -> EnvironmentService:
        assert self._environments is not None, "ControlPlane.start() was not called"
        return self._environments

    @property
    def runners(self) -> RunnerRegistry:
        assert self._runners is not None, "ControlPlane.start() was not called"
        return self._runners

    # Sessions, agents and the host's turn protocol; the inbox; wakes and their channels
    # (add_callback for in-process hosts); timers (N1–N11).
    @property
    def sessions(self) -> SessionService:
        assert self._notify is not None, "ControlPlane.start() was not called"
        return self._notify.sessions

    @property
    def inbox(self) -> InboxService:
        assert self._notify is not None, "ControlPlane.start() was not called"
        return self._notify.inbox

    @property
    def wakes(self) -> WakeService:
        assert self._notify is not None, "ControlPlane.start() was not called"
        return self._notify.wakes

    @property
    def timers(self) -> TimerService:
        assert self._notify is not None, "ControlPlane.start() was not called"
        return self._notify.timers

    # Workspace files and snapshot history, transfers, artifacts (W1–W6, T1–T5).
    @property
    def files(self) -> FileService:
        assert self._files is not None, "ControlPlane.start() was not called"
        return self._files.files

    @property
    def transfers(self) -> TransferService:
        assert self._files is not None, "ControlPlane.start() was not called"
        return self._files.transfers

    @property
    def artifacts(self) -> ArtifactService:
        assert self._files is not None, "ControlPlane.start() was not called"
        return self._files.artifacts

    # Bearer tokens and the principal of a request (admin, session, agent).
    @property
    def tokens(self) -> TokenService:
        assert self._tokens is not None, "ControlPlane.start() was not called"
        return self._tokens

    # Ports of the runner's host forwarded into a workspace's network (R5).
    @property
    def ports(self) -> PortService:
        assert self._ports is not None, "ControlPlane.start() was not called"
        return self._ports

    async def start(self) -> None:
        settings = self.settings
        # 0700 and the service user's alone (docs/security.md "The home's files")
        filemodes.secure_home(settings.home)
        self.store = await Store.open(
            settings.effective_database_url, schema_name=settings.database_schema
        )
        await RetentionRecords(self.store).prepare()  # SQLite: incremental vacuum on
        # The lease keeper and the fan-out first: every service gets them (or what they
        # publish through) when built (docs/architecture.md "Wiring").
        self.leases = LeaseKeeper(
            self.store,
            home_scope(str(settings.local_runner_root)),
            LOCAL_RUNNER_ID,
            ttl_s=ttl_from_env(os.environ),
        )
        url = None if self.store.is_sqlite else settings.effective_database_url
        fanout = self.fanout = Fanout(url, settings.database_schema, self.leases.replica_id)
        publish = publishers(fanout)
        self._runners = RunnerRegistry(self.store, on_change=publish.runners_changed)
        self._tokens = TokenService(self.store)
        local = LocalRunner(
            settings.local_runner_root, settings.local_policy, hidden=[settings.home]
        )
        await local.startup()
        await self._runners.add_local(local)
        await self._runners.load_registered()
        self._runners.start_heartbeats()
        agents = AgentResolver(self.store)
        await agents.default_id()  # the default session exists before any door asks
        wakes = WakeService(
            self.store,
            settings.notifications,
            leases=self.leases,
            on_emitted=publish.wake_emitted,
            on_notify=publish.agent_may_wake,
            on_webhooks=publish.webhooks_changed,
        )
        sessions = SessionService(self.store, wakes, agents)
        timers = TimerService(
            sessions,
            wakes,
            settings.notifications,
            announce=publish.timer_created,
            on_change=publish.timers_changed,
        )
        self._notify = _Notify(sessions, InboxService(self.store, agents), wakes, timers)

        # Environments gate executions (V4–V6) and dispatch the ones queued behind a change:
        # the one circle of the wiring, closed by this name bound just below (a change ends
        # only after start), so that neither service imports the other.
        async def dispatch(workspace_id: str) -> None:
            await executions.dispatch(workspace_id)

        self._environments = EnvironmentService(
            self.store, self._runners, agents, dispatch, leases=self.leases
        )
        executions = self._executions = ExecutionService(
            self.store,
            self._runners,
            agents,
            environments=self._environments,
            leases=self.leases,
            on_finished=[
                self._environments.execution_finished,
                wakes.execution_finished,
                timers.execution_finished,
            ],
            on_signal=publish.execution_ended,
            on_timing=self.metrics.observe,
            cancel_timers_at_finish=timers.folded_into_finish,
        )
        records = FileRecords(self.store)
        access = WorkspaceAccess(self.store, records, self._runners, self._executions)
        self._files = _Files(
            FileService(self.store, records, access, settings.retention),
            TransferService(
                self.store,
                records,
                access,
                leases=self.leases,
                on_signal=publish.transfer_changed,
                max_entries=settings.transfer_max_entries,
            ),
            ArtifactService(records, access),
        )
        self._ports = PortService(access)
        wire(executions, wakes, self.transfers, fanout, timers)
        await self.fanout.start()
        # Every service that adopts leased work is built: the keeper's first round hands
        # them what this home's previous process and dead replicas left (E11).
        await self.leases.startup()
        await self._environments.startup()
        await self.files.startup()
        await self.transfers.startup()
        self.retention = RetentionService(
            self.store, self._runners, settings.retention, settings.home, self.files
        )
        await self.retention.start()
        # After the executions re-attached: a reminder and a completion that both happened
        # while the service was down are ordered by their recorded times (N6, N7).
        await wakes.start()
        await timers.start()

    async def aclose(self) -> None:
        if self.retention is not None:
            await self.retention.aclose()
        if self._files is not None:
            await self.transfers.aclose()
            await self.files.aclose()
        if self._notify is not None:
            await self.timers.aclose()
            await self.wakes.aclose()
        if self._environments is not None:
            await self._environments.aclose()
        if self._executions is not None:
            await self._executions.aclose()
        if self.leases is not None:  # after the watchers stopped: hand their leases over
            await self.leases.aclose()
        if self.fanout is not None:
            await self.fanout.aclose()
        if self._runners is not None:
            await self._runners.aclose()
        if self.store is not None:
            await self.store.close()

    @classmethod
    @asynccontextmanager
    async def running(cls, settings: Settings) -> AsyncIterator[ControlPlane]:
        plane = cls(settings)
        await plane.start()
        try:
            yield plane
        finally:
            await plane.aclose()
